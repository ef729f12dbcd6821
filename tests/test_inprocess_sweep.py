"""--sweep: float flags swept as a vmapped axis of the seed dimension, in one compiled program."""

import dataclasses
import importlib
import importlib.util
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from algos import ppo_joint
from common import checkpoints, cli, devices, run, sweep
from helpers import PPO_RUN, command

ROOT = Path(__file__).resolve().parents[1]
TINY = dict(PPO_RUN, total_steps=4 * 16 * 3, eval_every=0, eval_episodes=4)
TINY_FLAGS = [f"--{k.replace('_', '-')}={v}" for k, v in TINY.items()]


def test_members_are_the_grid_in_order():
    config = cli.parse_config(
        ppo_joint.Config, ["--sweep", "lr=1e-3,3e-4", "ent-coef=0,0.01", "--num-seeds", "3"]
    )
    assert cli.sweep_members(config) == [
        {"lr": 1e-3, "ent_coef": 0.0},
        {"lr": 1e-3, "ent_coef": 0.01},
        {"lr": 3e-4, "ent_coef": 0.0},
        {"lr": 3e-4, "ent_coef": 0.01},
    ]
    assert sweep.n_runs(config) == 12 and sweep.n_runs(ppo_joint.Config(num_seeds=3)) == 3
    assert cli.sweep_members(ppo_joint.Config()) == [{}]


@pytest.mark.parametrize(
    "sweep, message",
    [
        (["lr=1e-3,abc"], "--sweep 'lr=1e-3,abc': '1e-3,abc' holds a value that is not a number"),
        (["lr"], "use NAME=V1,V2,..., e.g. --sweep lr=1e-3,3e-4"),
        (["num_envs=4,8"], "num_envs is not a float flag of this script; sweep one of"),
        (["lr=1e-3", "lr=3e-4"], "lr is swept twice"),
        (
            ["lr=1e-3,1e-3"],
            "--sweep 'lr=1e-3,1e-3': 0.001 given twice, which would train identical members",
        ),
        (["lr=1e-3,0.001,3e-4"], "0.001 given twice"),
        # each member's flags are checked as the flag itself would be
        (
            ["lr=1e-3,-1"],
            "--lr -1.0",
        ),
    ],
)
def test_bad_sweeps_are_rejected_before_compiling(capsys, sweep, message):
    with pytest.raises(SystemExit):
        cli.parse_config(ppo_joint.Config, ["--sweep", *sweep])
    assert message in capsys.readouterr().err


def test_resume_refuses_to_change_a_swept_flag_and_takes_the_others(tmp_path, capsys):
    """A swept flag given on --resume would be recorded but not trained (each member keeps its
    value): refused in one line. A float flag that is not swept applies to every member."""
    import dataclasses
    import json

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    saved = ppo_joint.Config(sweep=("lr=1e-3,3e-4",), out_dir=str(run_dir))
    (run_dir / "config.json").write_text(json.dumps(dataclasses.asdict(saved)))
    with pytest.raises(SystemExit):
        cli.parse_config(ppo_joint.Config, ["--resume", str(run_dir), "--lr", "5e-3"])
    assert "--lr is swept in that run (--sweep lr=1e-3,3e-4)" in capsys.readouterr().err
    config = cli.parse_config(ppo_joint.Config, ["--resume", str(run_dir), "--ent-coef", "0.02"])
    assert config.ent_coef == 0.02 and cli.sweep_members(config) == [{"lr": 1e-3}, {"lr": 3e-4}]


def final_params(out_dir, config):
    trainer, values = sweep.build(config, ppo_joint.make_trainer, 1)
    keys, _ = sweep.run_keys(0, config, 1)
    template = jax.eval_shape(devices.map_init(trainer.init), keys, values)
    state, _ = checkpoints.load(checkpoints.latest(out_dir / "checkpoints"), template)
    return trainer.policy(devices.unreplicate(state))  # [runs, ...]


def test_each_member_trains_as_its_own_run(tmp_path):
    """Members x seeds in one program end where separate runs of each value end (same keys)."""
    swept = ppo_joint.Config(
        **TINY, num_seeds=2, sweep=("lr=0.01,0.001",), out_dir=str(tmp_path / "swept")
    )
    summary = run.train(swept, ppo_joint.make_trainer, "ppo_joint").summary
    together = final_params(tmp_path / "swept", swept)
    for m, lr in enumerate([0.01, 0.001]):
        alone_config = dataclasses.replace(
            swept, sweep=(), lr=lr, out_dir=str(tmp_path / f"lr{lr}")
        )
        alone_summary = run.train(alone_config, ppo_joint.make_trainer, "ppo_joint").summary
        alone = final_params(tmp_path / f"lr{lr}", alone_config)
        for s in range(2):
            chex_close(
                jax.tree.map(lambda x, i=2 * m + s: x[i], together),
                jax.tree.map(lambda x, i=s: x[i], alone),
            )
        member = summary["sweep"][m]
        assert member["lr"] == lr and len(member["eval_return_per_seed"]) == 2
        np.testing.assert_allclose(
            member["eval_return_per_seed"], alone_summary["eval_return_per_seed"], atol=1.0
        )
    # the members really differ
    assert not np.allclose(together.params["policy"]["w"][0], together.params["policy"]["w"][2])


def chex_close(a, b):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize(
    "name, flag",
    [
        ("awr", "beta"),
        ("actor_critic", "policy_lr"),
        ("reinforce", "lr"),
        ("dqn_value", "eps_decay"),
        ("skip_transformer", "ent_coef"),
    ],
)
def test_every_script_sweeps_in_one_program(name, flag):
    module = importlib.import_module(f"algos.{name}")
    # a default of 0 halved is 0 again: a member given twice
    value = getattr(module.Config(), flag) or 0.01
    config = module.Config(n_devices=1, num_seeds=2, sweep=(f"{flag}={value},{value / 2}",))
    trainer, values = sweep.build(config, module.make_trainer, 1)
    keys, _ = sweep.run_keys(0, config, 1)
    init = devices.map_init(trainer.init).lower(keys, values)
    state, metrics = jax.eval_shape(
        devices.map_epoch(trainer.epoch, 1, n_mapped=2), init.out_info, values
    )
    assert jax.tree.leaves(metrics)[0].shape[:2] == (1, 4)  # [devices, members x seeds]


@pytest.mark.parametrize(
    "name, swept, message",
    [
        (
            "ppo_joint",
            "max_grad_norm=0,0.5",
            "--max-grad-norm 0 switches its term off, a constant of the programs",
        ),
        (
            "skip_transformer",
            "skip_fraction=0.2,0.4",
            "--skip-fraction shapes the programs, a constant of the programs",
        ),
    ],
)
def test_a_constant_of_the_programs_cannot_be_swept(name, swept, message):
    module = importlib.import_module(f"algos.{name}")
    config = module.Config(n_devices=1, sweep=(swept,))
    with pytest.raises(cli.ConfigError, match=f"{message}, so it cannot be swept in one program"):
        sweep.build(config, module.make_trainer, 1)


def test_a_switch_above_0_is_an_input():
    config = ppo_joint.Config(n_devices=1, sweep=("max_grad_norm=0.25,0.5",))
    values = sweep.build(config, ppo_joint.make_trainer, 1)[1]
    np.testing.assert_array_equal(values["max_grad_norm"], [[0.25, 0.5]])
    assert "max_grad_norm" not in sweep.input_names(ppo_joint.Config(max_grad_norm=0.0))
    assert "skip_fraction" not in sweep.input_names(
        importlib.import_module("algos.skip_transformer").Config()
    )


BRANCH = "if config.ent_coef > 0:  # a researcher's edit\n"
PLANTS = {  # where a copy of ppo_joint.py gets the branch: make_trainer's body, or its epoch's
    "make_trainer": ("    config = config.resolved()\n", "    "),
    "epoch": ("    def epoch(state: RunnerState):\n", "        "),
}


@pytest.mark.parametrize("where, flags", [("make_trainer", ()), ("epoch", ("--ent-coef", "0.01"))])
def test_a_python_branch_on_an_input_float_is_refused_in_one_line(
    tmp_path, monkeypatch, where, flags
):
    """Float flags are traced inputs of the programs: `if config.ent_coef > 0:` in a copy of a
    script ends, before anything is written, in one line that names the file and line, the flag and
    the fixes (and with --sweep the same)."""
    source = (ROOT / "algos" / "ppo_joint.py").read_text()
    anchor, indent = PLANTS[where]
    assert source.count(anchor) == 1
    fork = tmp_path / f"ppo_fork_{where}.py"
    fork.write_text(source.replace(anchor, f"{anchor}{indent}{BRANCH}{indent}    pass\n"))
    line = fork.read_text().splitlines().index(f"{indent}{BRANCH.strip()}") + 1
    spec = importlib.util.spec_from_file_location(fork.stem, fork)
    module = importlib.util.module_from_spec(spec)
    # as `python ppo_fork.py` imports it (dataclasses look it up)
    monkeypatch.setitem(sys.modules, fork.stem, module)
    spec.loader.exec_module(module)
    for sweep_flags in ((), ("--sweep", "ent-coef=0.01,0.02")):
        out_dir = tmp_path / f"run{len(sweep_flags)}"
        args = (*TINY_FLAGS, *flags, *sweep_flags, "--out-dir", out_dir)
        out = command(module, *args, cwd=tmp_path)
        assert out.returncode == 1 and out.stderr.count("\n") == 1, out.stderr
        assert out.stderr.startswith(f"error: {fork.name}:{line}: `{BRANCH.strip()}`"), out.stderr
        for words in ("--ent-coef", "jnp.where", "jax.lax.cond", "STATIC_FLOATS"):
            assert words in out.stderr, (words, out.stderr)
        assert not (out_dir / "config.json").exists()
