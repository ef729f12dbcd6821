"""Run safety (issue 12): the cases where a user lost work, each reproduced as the user meets it.

CLI cases run `python algos/ppo_joint.py ...` in a subprocess, from another
directory, sharing one compilation cache (the same tiny program compiles once).
"""

import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import PPO_CLI_TINY, PPO_RUN, command, run_script, script_env

ROOT = Path(__file__).resolve().parents[1]
TINY = PPO_CLI_TINY


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


def env(cache):
    return script_env(XDG_CACHE_HOME=str(cache))


def cli(cache, *args, cwd=None):
    """`python algos/ppo_joint.py ARGS` from `cwd` (else `cache`), compiling into `cache`."""
    return run_script("ppo_joint", *args, cwd=cwd or cache, XDG_CACHE_HOME=str(cache))


def refused(out, *phrases):
    """Exited non-zero with one message line holding `phrases`, before compiling, no traceback."""
    assert out.returncode not in (0, None), out.stdout
    assert "Traceback" not in out.stderr, out.stderr
    for phrase in phrases:
        assert phrase in out.stderr, out.stderr
    assert "compiled in" not in out.stdout


def lines(run_dir: Path) -> list:
    return (run_dir / "metrics.jsonl").read_text().splitlines()


# 1. A new run into an existing run directory
@pytest.mark.slow  # a whole run in a new process: CI runs it, the fast suite does not
def test_a_new_run_refuses_a_directory_holding_a_run(cache, tmp_path):
    run_dir = tmp_path / "run"
    assert cli(cache, *TINY, "--out-dir", run_dir).returncode == 0
    before = {
        name: (run_dir / name).read_bytes()
        for name in ("config.json", "metrics.jsonl", "summary.json")
    }
    ckpts = sorted((run_dir / "checkpoints").iterdir())
    out = cli(cache, *TINY, "--seed", "7", "--out-dir", run_dir)
    refused(out, f"--out-dir {run_dir} already holds a run", "--resume", "--overwrite")
    # nothing of it touched
    assert {name: (run_dir / name).read_bytes() for name in before} == before
    assert sorted((run_dir / "checkpoints").iterdir()) == ckpts
    # --overwrite replaces it: the old checkpoints go, so --resume cannot continue the old state
    (run_dir / "checkpoints" / "epoch_000099.npz").write_bytes(b"the old run's")
    out = cli(cache, *TINY, "--seed", "7", "--overwrite", "--out-dir", run_dir)
    assert out.returncode == 0, out.stderr
    assert (
        json.loads((run_dir / "config.json").read_text())["seed"] == 7 and len(lines(run_dir)) == 10
    )
    assert not (run_dir / "checkpoints" / "epoch_000099.npz").exists()


def open_and_release(run_dir: Path, **flags):
    """`outputs.open_run_dir` as a new run (or `flags`) would call it; the lock released at once."""
    from common import cli, outputs

    outputs.open_run_dir(run_dir, cli.RunConfig(out_dir=str(run_dir), **flags)).close()


def test_overwrite_deletes_only_the_files_a_run_writes(tmp_path):
    """A user's file in a run directory (even in checkpoints/) survives --overwrite; the run's files
    go."""
    from common import cli, outputs

    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "config.json").write_text(
        json.dumps({"env": "CartPole-v1", "seed": 0, "out_dir": str(run_dir)})
    )
    run_written = [
        "config.json",
        "metrics.jsonl",
        "summary.json",
        "changes.jsonl",
        ".tmp_config.json",
        "checkpoints/epoch_000001.npz",
        "checkpoints/.tmp_epoch_000002.npz",
    ]
    for name in run_written[1:]:
        (run_dir / name).write_text("the run's")
    mine = ["notes.txt", "checkpoints/model.pt", "checkpoints/epoch_best.pt"]
    for name in mine:
        (run_dir / name).write_text("mine")
    with pytest.raises(
        cli.ConfigError, match="already holds a run .*--overwrite to delete that run's files"
    ):
        open_and_release(run_dir)
    assert all((run_dir / name).exists() for name in run_written + mine)  # refused: nothing touched
    open_and_release(run_dir, overwrite=True)
    assert [name for name in run_written if (run_dir / name).exists()] == []
    assert all((run_dir / name).read_text() == "mine" for name in mine)
    assert outputs.run_files(run_dir) == []


@pytest.mark.parametrize("config_json", [None, "not json", json.dumps({"lr": 0.1})])
def test_a_directory_that_is_not_a_run_is_never_deleted(tmp_path, config_json):
    """Without a run's config.json a directory is not a run: `--overwrite` deletes nothing there. A
    file with a name a run writes is refused in one line; files with other names are left beside the
    new run's."""
    from common import cli

    theirs = tmp_path / "theirs"
    (theirs / "checkpoints").mkdir(parents=True)
    # the reported case: `--overwrite` removed it
    (theirs / "checkpoints" / "model.pt").write_text("x")
    open_and_release(theirs, overwrite=True)
    open_and_release(theirs)
    assert (theirs / "checkpoints" / "model.pt").read_text() == "x"
    (theirs / "metrics.jsonl").write_text("mine")
    if config_json is not None:
        (theirs / "config.json").write_text(config_json)
    for flags in ({}, {"overwrite": True}):
        with pytest.raises(
            cli.ConfigError, match=r"holds .*metrics.jsonl, names a run writes, but is not a run"
        ):
            open_and_release(theirs, **flags)
    assert (theirs / "metrics.jsonl").read_text() == "mine" and (
        theirs / "checkpoints" / "model.pt"
    ).exists()
    assert config_json is None or (theirs / "config.json").read_text() == config_json


def test_programs_larger_than_memory_are_refused_before_anything_is_written(tmp_path, monkeypatch):
    """A rollout beyond memory is refused before compiling; a compiled epoch or evaluation beyond
    it is refused before it runs (an evaluation out of memory used to lose the epochs since the
    last checkpoint). Nothing is written but the lock, so the same --out-dir takes the corrected
    command."""
    from algos import ppo_joint
    from common import cli, run

    def refused(match, **flags):
        config = ppo_joint.Config(**{**RUN, "out_dir": str(tmp_path / "run"), **flags})
        with pytest.raises(cli.ConfigError, match=match):
            run.train(config, ppo_joint.make_trainer)
        assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["run.lock"]

    refused(
        r"the evaluation of --eval-episodes 1000000000 x 1 runs needs [\d,.]+ GiB per device, more than the "
        r".* GiB here: lower --eval-episodes",
        eval_episodes=10**9,
    )
    monkeypatch.setattr(run, "memory_here", lambda n_devices: 2**24)  # 16 MiB a device
    refused(
        r"an epoch of 4096 environments x 32 steps x 1 runs needs .* GiB per device, more than the 0.0 GiB "
        r"here: lower --num-envs or --num-steps",
        num_envs=4096,
        num_steps=32,
        total_steps=4096 * 32,
    )
    monkeypatch.setattr(run, "memory_here", lambda n_devices: 2**26)
    refused(
        r"an epoch's rollout needs at least .* GiB \(128,000,000 transitions of --num-envs 250000 x "
        r"--num-steps 512 x 1 runs, observations of 4 numbers\).*: lower --num-envs or --num-steps",
        num_envs=250_000,
        num_steps=512,
        total_steps=128 * 10**6,
    )


def test_a_gradient_step_count_past_32_bits_is_one_line(tmp_path):
    from algos import ppo_joint
    from common import cli, run

    config = ppo_joint.Config(
        **{
            **RUN,
            "out_dir": str(tmp_path / "run"),
            "total_steps": 2**31 - 1,
            "num_envs": 1,
            "num_steps": 1,
            "num_minibatches": 1,
            "update_passes": 100,
        }
    )
    with pytest.raises(
        cli.ConfigError,
        match=r"--total-steps 2,147,483,647 makes a count of this run .* larger "
        r"than 32-bit integers hold .*: lower --total-steps",
    ):
        run.train(config, ppo_joint.make_trainer)
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["run.lock"]


# 2. Two runs in one directory
HOLD = """
import sys, time
from pathlib import Path
sys.path.insert(0, {root!r})
from common import cli, outputs
lock = outputs.open_run_dir(Path({run_dir!r}), cli.RunConfig(out_dir={run_dir!r}))  # as a run holds it, all its life
print("holding", flush=True)
time.sleep(600)
"""


@pytest.mark.slow  # a whole run in a new process: CI runs it, the fast suite does not
def test_a_second_run_in_a_live_run_directory_is_refused(cache, tmp_path):
    from algos import ppo_joint

    run_dir = tmp_path / "run"
    first = subprocess.Popen(
        [sys.executable, "-c", HOLD.format(root=str(ROOT), run_dir=str(run_dir))],
        env=env(cache),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert first.stdout.readline() == "holding\n"
        (run_dir / "config.json").write_text(
            json.dumps(dataclasses.asdict(ppo_joint.Config(out_dir=str(run_dir))))
        )
        for args in ([*TINY, "--out-dir", run_dir], ["--resume", run_dir]):
            refused(cli(cache, *args), f"another run (pid {first.pid}) is using this directory")
    finally:
        first.kill()  # SIGKILL: no clean-up runs
        first.wait(timeout=60)
    # the dead run's lock file stays behind and blocks nothing
    assert (run_dir / "run.lock").read_text().strip() == str(first.pid)
    out = cli(cache, *TINY, "--overwrite", "--out-dir", run_dir)
    assert out.returncode == 0, out.stderr
    assert len(lines(run_dir)) == 10


# 3. A non-finite state is never saved, and a run that ends in one does not exit 0
RUN = dict(
    PPO_RUN,
    update_passes=1,
    total_steps=4 * 16 * 3,
    eval_every=0,
    eval_episodes=2,
    checkpoint_every=1,
)


def nan_params_after_epoch(config, epoch_number):
    """ppo_joint whose epoch `epoch_number` ends with NaN parameters (its loss, computed before, is
    finite)."""
    from algos import ppo_joint

    trainer = ppo_joint.make_trainer(config)

    def epoch(state):
        state, metrics = trainer.epoch(state)
        # Adam's step count
        poison = jnp.where(state.opt_state[1][0].count >= epoch_number, jnp.nan, 1.0)
        return state._replace(params=jax.tree.map(lambda p: p * poison, state.params)), metrics

    return trainer._replace(epoch=epoch)


def test_a_non_finite_state_is_not_saved_and_the_run_fails(tmp_path):
    from algos import ppo_joint
    from common import checkpoints, run

    config = ppo_joint.Config(**RUN, out_dir=str(tmp_path / "run"))
    # the last epoch ends with NaN parameters, its loss finite
    with pytest.raises(SystemExit) as info:
        run.train(config, lambda c: nan_params_after_epoch(c, 6))  # 2 Adam steps an epoch: epoch 3
    message = str(info.value.code)
    assert (
        "state at epoch 3 is not finite" in message
        and "params" in message
        and "not saved" in message
    )
    ckpts = tmp_path / "run" / "checkpoints"
    assert checkpoints.latest(ckpts).name == "epoch_000002.npz"
    for path in ckpts.glob("epoch_*.npz"):  # what is kept is finite
        with np.load(path) as data:
            assert all(
                np.isfinite(data[k]).all() for k in data.files if data[k].dtype.kind == "f"
            ), path
    assert not (tmp_path / "run" / "summary.json").exists()


# 4. Several checkpoints: a corrupt newest one leaves an older one to resume from
@pytest.mark.slow  # a whole run in a new process: CI runs it, the fast suite does not
def test_resume_falls_back_to_the_newest_readable_checkpoint(cache, tmp_path):
    run_dir = tmp_path / "run"
    assert cli(cache, *TINY, "--checkpoint-every", "2", "--out-dir", run_dir).returncode == 0
    ckpts = run_dir / "checkpoints"
    # default 3
    assert sorted(p.name for p in ckpts.iterdir()) == [f"epoch_{e:06d}.npz" for e in (6, 8, 10)]
    uninterrupted = (ckpts / "epoch_000010.npz").read_bytes()
    (ckpts / "epoch_000010.npz").write_bytes(uninterrupted[:1000])  # cut short
    out = cli(cache, "--resume", run_dir)
    assert out.returncode == 0, out.stderr
    assert f"checkpoint {ckpts / 'epoch_000010.npz'} is unreadable or corrupt" in out.stderr
    assert f"resumed {run_dir} at epoch 8" in out.stdout
    # epochs 9 and 10 again, the same
    assert (ckpts / "epoch_000010.npz").read_bytes() == uninterrupted
    assert [json.loads(line)["epoch"] for line in lines(run_dir)] == list(range(1, 11))


# 5. A write cut short: a torn metrics line, a full disk
def test_a_full_disk_stops_with_one_line_and_resume_drops_the_torn_line(
    tmp_path, monkeypatch, capsys
):
    import builtins
    import errno

    from algos import ppo_joint
    from common import checkpoints, outputs, run

    run_dir = tmp_path / "run"
    config = ppo_joint.Config(**RUN, out_dir=str(run_dir))
    resume = dataclasses.replace(config, resume=str(run_dir))
    run.train(config, ppo_joint.make_trainer, max_epochs=1)
    full = OSError(errno.ENOSPC, "No space left on device")

    # the disk fills up half-way through a metrics line
    def torn_write(path, mode="r", *args, **kwargs):
        fh = builtins.open(path, mode, *args, **kwargs)
        if Path(path).name == "metrics.jsonl" and mode == "a":
            fh.write('{"epoch": 2, "env_st')
            fh.close()
            raise full
        return fh

    monkeypatch.setattr(outputs, "open", torn_write, raising=False)
    with pytest.raises(SystemExit) as info:
        run.train(resume, ppo_joint.make_trainer)
    monkeypatch.undo()
    intact = f"the last checkpoint, {run_dir / 'checkpoints' / 'epoch_000001.npz'}, is intact"
    assert str(info.value.code) == (
        f"error: cannot write {run_dir / 'metrics.jsonl'} (No space left on device); "
        f"{intact}: make room, then --resume {run_dir}"
    )

    def no_space(fd):
        raise full

    # the disk is full when the checkpoint of epoch 2 is written
    monkeypatch.setattr(checkpoints.os, "fsync", no_space)
    with pytest.raises(
        SystemExit, match=f"cannot write .*epoch_000002.npz \\(No space left on device\\); {intact}"
    ):
        run.train(resume, ppo_joint.make_trainer)
    monkeypatch.undo()
    assert "dropped its last line, cut short" in capsys.readouterr().err
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["epoch_000001.npz"]
    run.train(resume, ppo_joint.make_trainer)
    assert "dropped 1 line(s) past the checkpoint's epoch 1" in capsys.readouterr().err
    assert [json.loads(line)["epoch"] for line in lines(run_dir)] == [1, 2, 3]


# 6. Divergence advice that can be followed: --resume takes the float flags and records the change
def test_resume_takes_a_lower_learning_rate_after_a_divergence(tmp_path, capsys):
    from algos import ppo_joint
    from common import cli, run  # this file's cli() runs the script

    run_dir = tmp_path / "run"
    run.train(ppo_joint.Config(**RUN, out_dir=str(run_dir)), ppo_joint.make_trainer, max_epochs=1)
    # --lr unset: config.json holds the rate the run used
    assert json.loads((run_dir / "config.json").read_text())["lr"] == 0.0025
    with pytest.raises(SystemExit) as info:  # the first Adam steps throw the parameters to ~1e30
        run.train(
            cli.parse_config(
                ppo_joint.Config, ["--resume", str(run_dir), "--n-devices", "1", "--lr", "1e30"]
            ),
            ppo_joint.make_trainer,
        )
    advice = f"--resume {run_dir} --lr 1e+29"
    assert "diverged" in str(info.value.code) and advice in str(info.value.code)
    out = run.train(
        cli.parse_config(
            ppo_joint.Config, ["--resume", str(run_dir), "--n-devices", "1", "--lr", "0.0025"]
        ),
        ppo_joint.make_trainer,
    ).summary
    assert out["epoch"] == 3
    printed = capsys.readouterr().out
    assert "--resume changes --lr 0.0025 -> 1e+30 from epoch 1" in printed
    assert "--resume changes --lr 1e+30 -> 0.0025 from epoch 1" in printed
    changes = [json.loads(line) for line in (run_dir / "changes.jsonl").read_text().splitlines()]
    assert changes == [{"epoch": 1, "lr": [0.0025, 1e30]}, {"epoch": 1, "lr": [1e30, 0.0025]}]
    assert json.loads((run_dir / "config.json").read_text())["lr"] == 0.0025
    with pytest.raises(SystemExit):  # a flag that shapes the state is refused, not ignored
        cli.parse_config(ppo_joint.Config, ["--resume", str(run_dir), "--hidden", "16"])
    assert "cannot change --hidden: start a new run" in capsys.readouterr().err


# 7. Messages, not tracebacks
@pytest.mark.parametrize(
    "args, message",
    [
        (["--out-dir", "{file}"], "--out-dir {file} is a file, not a directory"),
        (["--out-dir", "{file}/run"], "--out-dir {file}/run: cannot write there (Not a directory)"),
        (["--out-dir", "/proc/jtrax"], "--out-dir /proc/jtrax: cannot write there"),
        (
            ["--out-dir", "run", "--n-devices", "1", "--hidden", "300000", "300000"],
            "its largest array, .params['torso'][1]['w'] (1, 1, 300000, 300000), is sized by "
            "--hidden: make it smaller",
        ),
        (
            ["--out-dir", "run", "--seed", "100000000000000000000"],
            "--seed 100000000000000000000: too large",
        ),
    ],
)
def test_bad_places_and_sizes_are_messages(tmp_path, args, message):
    (tmp_path / "file").write_text("not a directory")
    out = command(
        "ppo_joint", *TINY, *[a.format(file=tmp_path / "file") for a in args], cwd=tmp_path
    )
    refused(out, message.format(file=tmp_path / "file"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


@pytest.mark.parametrize(
    "damage, message",
    [
        ("{", "config.json is not JSON"),
        ("[1, 2]", "config.json holds no flags (list)"),
        ({"lr": "fast"}, 'config.json sets lr to "fast", not a float'),
        ({"num_envs": None}, "config.json sets num_envs to null, not a int"),
        ({"hidden": 64}, "config.json sets hidden to 64, not a list of int"),
        ({"hidden": [64, "x"]}, 'config.json sets hidden to [64, "x"], not a list of int'),
        (
            {"advantage": "td"},
            'config.json sets advantage to "td", not one of "gae", "monte-carlo"',
        ),
        (
            {"gae_lambda": "delete"},
            "config.json lacks gae_lambda; add them (this script's defaults: gae_lambda: 0.95)",
        ),
        (
            {"gamma": 5},
            "config.json holds a value this script refuses (--gamma 5.0: use a value in [0, 1]); "
            "repair",
        ),
    ],
)
def test_a_damaged_config_json_is_named_on_resume(tmp_path, capsys, damage, message):
    from algos import ppo_joint
    from common import cli

    if isinstance(damage, dict):
        saved = {**dataclasses.asdict(ppo_joint.Config()), **damage}
        damage = json.dumps({k: v for k, v in saved.items() if v != "delete"})
    (tmp_path / "config.json").write_text(damage)
    with pytest.raises(SystemExit):
        cli.parse_config(ppo_joint.Config, ["--resume", str(tmp_path)])
    err = capsys.readouterr().err
    assert f"{tmp_path / 'config.json'}" in err and message in err, err


@pytest.mark.parametrize("script", ["ppo_joint", "actor_critic", "awr", "skip_transformer"])
def test_a_run_written_before_reward_normalization_resumes_as_it_ran(tmp_path, script):
    """Its config.json lacks the flag: the run learned from raw rewards, so it resumes with
    normalize_reward false."""
    import importlib

    from common import cli

    module = importlib.import_module(f"algos.{script}")
    saved = {
        k: v for k, v in dataclasses.asdict(module.Config()).items() if k != "normalize_reward"
    }
    (tmp_path / "config.json").write_text(json.dumps(saved))
    assert cli.load_config(module.Config, tmp_path).normalize_reward is False


@pytest.mark.parametrize("script", ["ppo_joint", "actor_critic", "awr", "reinforce"])
def test_a_run_written_before_lasting_noise_and_the_box_penalty_resumes_as_it_ran(tmp_path, script):
    """Its config.json lacks --noise-memory and --box-coef: its noise was independent and its loss
    had no penalty, so it resumes with both at 0."""
    import importlib

    from common import cli

    module = importlib.import_module(f"algos.{script}")
    saved = {
        k: v
        for k, v in dataclasses.asdict(module.Config()).items()
        if k not in ("noise_memory", "box_coef")
    }
    (tmp_path / "config.json").write_text(json.dumps(saved))
    config = cli.load_config(module.Config, tmp_path)
    assert (config.noise_memory, config.box_coef) == (0.0, 0.0)


@pytest.mark.parametrize("loss, noise_memory", [("a2c", 0.0), ("ppo", 0.002)])
def test_an_actor_critic_run_written_with_noise_memory_minus_one_resumes_as_it_ran(
    tmp_path, loss, noise_memory
):
    """`--noise-memory -1` let `--loss` pick (0.002 for ppo, 0 for a2c) and is gone: such a run
    resumes with the value its loss picked."""
    from algos import actor_critic
    from common import cli

    saved = {**dataclasses.asdict(actor_critic.Config(loss=loss)), "noise_memory": -1.0}
    (tmp_path / "config.json").write_text(json.dumps(saved))
    assert cli.load_config(actor_critic.Config, tmp_path).noise_memory == noise_memory


def test_a_run_written_before_the_conv_torso_resumes_with_its_mlp(tmp_path):
    """Its config.json lacks --torso: it flattened image observations into the MLP, and resumes
    so."""
    from algos import dqn_value
    from common import cli

    saved = {
        k: v
        for k, v in dataclasses.asdict(dqn_value.Config(env="Breakout-MinAtar")).items()
        if k != "torso"
    }
    (tmp_path / "config.json").write_text(json.dumps(saved))
    assert cli.load_config(dqn_value.Config, tmp_path).torso == "mlp"


def test_a_skip_transformer_run_written_with_its_torso_flag_resumes_without_it(tmp_path):
    """skip_transformer's --torso took only mlp and is gone (`cli.RETIRED`): a config.json that
    holds it resumes, and the flag is no longer one of the script's."""
    from algos import skip_transformer
    from common import cli

    saved = {**dataclasses.asdict(skip_transformer.Config()), "torso": "mlp"}
    (tmp_path / "config.json").write_text(json.dumps(saved))
    assert cli.load_config(skip_transformer.Config, tmp_path) == skip_transformer.Config()
    parser = cli.build_parser(skip_transformer.Config, "")
    assert "--torso" not in parser._option_string_actions


# 8. Bad values refused before anything compiles
@pytest.mark.parametrize(
    "args, message",
    [
        (["--lr", "inf"], "--lr inf: use a finite number"),
        (["--clip-eps", "-1"], "--clip-eps -1.0: use a positive value"),
        (["--lr", "1e-3", "--lr", "1e-4"], "--lr is given twice; give it once"),
    ],
)
def test_bad_values_are_refused_on_the_command_line(tmp_path, args, message):
    refused(
        command("ppo_joint", *TINY, *args, "--out-dir", tmp_path / "run", cwd=tmp_path), message
    )
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "script, overrides, message",
    [
        ("ppo_joint", dict(clip_eps=float("nan")), "--clip-eps nan: use a finite number"),
        ("ppo_joint", dict(vf_coef=-5.0), "--vf-coef -5.0: use 0 (off) or more"),
        ("ppo_joint", dict(ent_coef=-0.1), "--ent-coef -0.1: use 0 (off) or more"),
        ("ppo_joint", dict(gamma=float("-inf")), "--gamma -inf: use a finite number"),
        ("dqn_value", dict(eps_decay=float("nan")), "--eps-decay nan: use a finite number"),
        ("awr", dict(beta=float("inf")), "--beta inf: use a finite number"),
        ("awr", dict(ent_coef=-1.0), "--ent-coef -1.0: use 0 (off) or more"),
        ("reinforce", dict(max_grad_norm=float("inf")), "--max-grad-norm inf: use a finite number"),
        ("actor_critic", dict(clip_eps=0.0), "--clip-eps 0.0: use a positive value"),
        (
            "actor_critic",
            dict(advantage="td-k", td_k=200),
            "--td-k 200 is longer than the rollout (--num-steps 32)",
        ),
        ("skip_transformer", dict(vf_coef=-1.0), "--vf-coef -1.0: use 0 (off) or more"),
        ("ppo_joint", dict(num_envs=2**31), "--num-envs 2147483648: too large"),
    ],
)
def test_bad_values_are_refused_by_the_config(script, overrides, message):
    import importlib

    Config = importlib.import_module(f"algos.{script}").Config
    with pytest.raises(ValueError, match="^" + re.escape(message)):
        Config(**overrides)


@pytest.mark.parametrize(
    "script, overrides, message",
    [
        (
            "awr",
            dict(policy_batch_size=5000),
            "--policy-batch-size 5000 is larger than the replay: 4 epochs x 8 envs x "
            "128 steps = 4096 transitions per device; use at most 4096",
        ),
        (
            "skip_transformer",
            dict(context_len=600),
            "--context-len 600 is longer than an episode of CartPoleNoVel-v1 "
            "(500 steps); use at most 500",
        ),
        (
            "dqn_value",
            dict(torso="conv"),
            "--torso conv needs image observations [H, W, C] with H, W >= 3; these are "
            "[4]: use --torso mlp",
        ),
    ],
)
def test_sizes_that_do_not_fit_the_data_are_refused(script, overrides, message):
    import importlib

    module = importlib.import_module(f"algos.{script}")
    with pytest.raises(ValueError, match=re.escape(message)):
        module.make_trainer(module.Config(n_devices=1, **overrides))


# 9. Small losses
@pytest.mark.slow  # a whole run in a new process: CI runs it, the fast suite does not
def test_resuming_a_finished_run_keeps_its_summary_and_removes_leftovers(cache, tmp_path):
    run_dir = tmp_path / "run"
    assert cli(cache, *TINY, "--out-dir", run_dir).returncode == 0
    summary = (run_dir / "summary.json").read_bytes()
    leftover = run_dir / "checkpoints" / ".tmp_000007.npz"  # a checkpoint write killed half-way
    leftover.write_bytes(b"half a checkpoint")
    out = cli(cache, "--resume", run_dir)
    assert out.returncode == 0, out.stderr
    assert (
        f"{run_dir} finished at epoch 10: nothing to train" in out.stdout
        and "compiled in" not in out.stdout
    )
    assert (run_dir / "summary.json").read_bytes() == summary
    assert not leftover.exists()


def test_an_unknown_env_is_matched_against_the_scripts_own_environments():
    from algos import skip_transformer

    with pytest.raises(ValueError) as info:
        skip_transformer.make_trainer(skip_transformer.Config(env="CartPoleNoVel-v2", n_devices=1))
    message = str(info.value)
    assert "Did you mean CartPoleNoVel-v1" in message and message.endswith(", CartPoleNoVel-v1")


# 10. A checkpoint of an older layout of the script's state (e.g. `--normalize-obs` once saved the
# statistics beside the runner state, not in it): --resume says so in one line
@pytest.mark.slow  # a whole run in a new process: CI runs it, the fast suite does not
def test_a_checkpoint_of_an_older_state_layout_is_one_line_on_resume(cache, tmp_path):
    from common import checkpoints

    run_dir = tmp_path / "run"
    assert cli(cache, *TINY, "--out-dir", run_dir).returncode == 0
    newest = checkpoints.latest(run_dir / "checkpoints")
    # the same arrays, wrapped with statistics as the older layout held them
    with np.load(newest) as data:
        runner = [data[name] for name in sorted(data.files) if name.startswith("leaf_")]
    checkpoints.save(newest.parent, (runner, {"mean": np.zeros(4), "var": np.ones(4)}), epoch=10)
    out = cli(cache, "--resume", run_dir)
    refused(
        out,
        f"error: --resume {run_dir}: checkpoint {newest} holds a different state structure",
        "an older layout of this script's state",
        "start a new run",
        "use the commit that wrote it",
    )
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
