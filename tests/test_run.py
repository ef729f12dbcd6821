"""common/cli.py, run.py, loop.py, outputs.py: the CLI from a config dataclass, epochs in chunks,
the metrics logger and wandb failures, metrics.jsonl on --resume, load_agent, the one-line errors of
main; train() on the tiny ppo_joint run: resume equal to the uninterrupted run, divergence, input
refused before any write."""

import dataclasses
import importlib
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from common import checkpoints, cli, devices, loop, outputs, run
from helpers import (
    PPO_RUN,
    RESUME_FLAGS,
    SCRIPTS,
    Config,
    initial_state,
    make_trainer,
    run_keys,
    script_env,
)


@dataclasses.dataclass(frozen=True)
class Toy(cli.RunConfig):
    n_samples: int = 1
    """action samples per state"""
    q_value: bool = False
    """use a Q critic"""
    hidden: tuple[int, ...] = (64, 64)
    """layer widths"""
    agg: Literal["mean", "max"] = "mean"
    """aggregate"""
    lr: float = 1e-3
    """learning rate"""


def test_flags_come_from_fields_with_their_docstrings():
    parser = cli.build_parser(Toy, "toy")
    text = " ".join(parser.format_help().split())
    assert "--n-samples INT action samples per state (default: 1)" in text
    assert "--q-value [BOOL] use a Q critic (default: False)" in text
    assert "--n_samples" not in text  # the snake_case alias is accepted but hidden


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_script_takes_and_checks_the_shared_training_flags(script):
    module = importlib.import_module(f"algos.{script}")
    assert issubclass(module.Config, cli.TrainConfig)
    with pytest.raises(cli.ConfigError, match=r"^--gamma 1.5: use a value in \[0, 1\]$"):
        module.Config(gamma=1.5)
    with pytest.raises(cli.ConfigError, match="^--num-envs must be at least 1$"):
        module.Config(num_envs=0)
    with pytest.raises(cli.ConfigError, match="^--num-steps must be at least 1$"):
        module.Config(num_steps=-1)
    with pytest.raises(cli.ConfigError, match="^--max-grad-norm -1.0: use 0 .off. or more$"):
        module.Config(max_grad_norm=-1.0)


def test_a_script_gives_a_shared_flag_its_own_default_and_keeps_its_help():
    from algos import dqn_value, ppo_joint, reinforce

    shared = cli.field_docs(cli.TrainConfig)
    assert (dqn_value.Config().num_envs, ppo_joint.Config().num_envs) == (10, 8)
    # declared again without a docstring: TrainConfig's is its --help
    assert cli.field_docs(dqn_value.Config)["num_envs"] == shared["num_envs"]
    text = " ".join(cli.build_parser(dqn_value.Config, "").format_help().split())
    assert f"--num-envs INT {shared['num_envs']} (default: 10)" in text
    # declared again with one: its own
    assert cli.field_docs(reinforce.Config)["num_steps"].endswith("returns stop at its end")


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--n-samples", "4", "--q-value"], dict(n_samples=4, q_value=True)),
        # as a wandb sweep agent passes values: --key=value, Python str() formatting
        (
            ["--n_samples=4", "--q_value=True", "--lr=1e-05"],
            dict(n_samples=4, q_value=True, lr=1e-05),
        ),
        (
            ["--q-value=False", "--hidden", "32", "16", "--agg", "max"],
            dict(q_value=False, hidden=(32, 16), agg="max"),
        ),
    ],
)
def test_parse_config(argv, expected):
    config = cli.parse_config(Toy, argv)
    for key, value in expected.items():
        assert getattr(config, key) == value


@pytest.mark.parametrize(
    "argv",
    [
        ["--agg", "median"],
        ["--n-samples", "x"],
        ["--num-seeds", "0"],
        ["--eval-only"],
        ["--q-value=maybe"],
    ],
)
def test_bad_flags_exit_with_usage_error(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.parse_config(Toy, argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "error:" in err and "--help lists every flag" in err
    # the message alone, not a usage block of every flag before it
    assert len(err.strip().splitlines()) == 1, err


def test_resume_takes_the_saved_config_and_run_flags_from_the_command_line(tmp_path, capsys):
    saved = Toy(n_samples=3, hidden=(8,), out_dir=str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps(dataclasses.asdict(saved)))
    config = cli.parse_config(
        Toy, ["--resume", str(tmp_path), "--n-samples", "3", "--lr", "0.01", "--eval-only"]
    )
    assert (
        config.n_samples == 3 and config.hidden == (8,) and config.eval_only and config.lr == 0.01
    )
    with pytest.raises(SystemExit):  # a flag the checkpoint's state or the run depends on
        cli.parse_config(Toy, ["--resume", str(tmp_path), "--n-samples", "9"])
    assert "cannot change --n-samples: start a new run" in capsys.readouterr().err
    (tmp_path / "config.json").write_text(json.dumps({**dataclasses.asdict(saved), "typo_flag": 1}))
    with pytest.raises(SystemExit):
        cli.parse_config(Toy, ["--resume", str(tmp_path)])


def test_epochs_per_call_and_records():
    assert loop.epochs_per_call(1024, 488) == 64
    assert loop.epochs_per_call(100_000, 488) == 1
    assert loop.epochs_per_call(500, 10) == 10
    metrics = {
        "loss": np.array([[[1.0, 2.0, 9.0], [3.0, 4.0, 9.0]]]),  # [devices, seeds, epochs]
        "episode/return": np.array([[[np.nan, 5.0, 0.0], [7.0, np.nan, 0.0]]]),
    }
    records = loop.records(metrics, 2)
    per_seed = [r.pop("episode/return_per_seed") for r in records]
    assert records == [{"loss": 2.0, "episode/return": 7.0}, {"loss": 3.0, "episode/return": 5.0}]
    # each seed, for common.plot
    np.testing.assert_array_equal(per_seed, [[np.nan, 7.0], [5.0, np.nan]])
    diverged = loop.records({"loss": np.array([[[1.0], [np.nan]]])}, 1)  # one seed's loss is NaN
    assert math.isnan(diverged[0]["loss"])
    assert math.isnan(loop.records({"x": np.full((1, 2, 1), np.nan)}, 1)[0]["x"])


def test_chunk_epochs_runs_exactly_n_epochs():
    import jax
    import jax.numpy as jnp

    def epoch(count, values):
        return count + values["step"], {"count": count + values["step"]}

    chunk = jax.jit(loop.chunk_epochs(epoch, 5))
    count, metrics = chunk(jnp.float32(0), {"step": jnp.float32(2)}, 3)
    assert float(count) == 6.0
    np.testing.assert_array_equal(np.asarray(metrics["count"]), [2.0, 4.0, 6.0, 0.0, 0.0])


def test_a_failing_wandb_never_stops_training(tmp_path, monkeypatch, capsys):
    import wandb

    def broken_init(**_):
        raise RuntimeError("no network")

    monkeypatch.setattr(wandb, "init", broken_init)
    logger = outputs.Logger(Toy(track=True), tmp_path, is_chief=True)
    assert logger.wandb is None
    assert "wandb disabled: no network" in capsys.readouterr().err

    class BrokenRun:
        def log(self, *_, **__):
            raise RuntimeError("disk full")

    logger.wandb = BrokenRun()
    record = {"epoch": 1, "env_steps": 10, "sps": 1.0, "episode/return": float("nan")}
    logger.log(record)
    logger.log({**record, "epoch": 2})
    assert logger.wandb is None
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [line["epoch"] for line in lines] == [1, 2] and lines[0]["episode/return"] is None


def test_resume_drops_epochs_after_the_checkpoint_and_a_torn_last_line(tmp_path, capsys):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"epoch": e}) + "\n" for e in range(1, 8)))
    outputs.trim_metrics(path, 5)
    assert [json.loads(line)["epoch"] for line in path.read_text().splitlines()] == [1, 2, 3, 4, 5]
    assert "dropped 2 line(s) past the checkpoint's epoch 5" in capsys.readouterr().err
    path.write_text(path.read_text() + '{"epoch": 6, "env_st')  # the write of epoch 6 cut short
    outputs.trim_metrics(path, 5)
    assert [json.loads(line)["epoch"] for line in path.read_text().splitlines()] == [1, 2, 3, 4, 5]
    err = capsys.readouterr().err
    assert "dropped its last line, cut short" in err and str(path) in err and "past" not in err
    path.write_text('{"epoch": 1}\nnot json\n{"epoch": 2}\n')
    with pytest.raises(cli.ConfigError, match=r"metrics.jsonl, line 2, is not a metrics record"):
        outputs.trim_metrics(path, 5)


def test_load_agent_acts_as_the_saved_policy(tmp_path, monkeypatch):
    import jax

    from algos import ppo_joint

    monkeypatch.chdir(tmp_path)  # no --out-dir: the run's own directory, which train returns
    config = ppo_joint.Config(
        num_envs=4,
        num_steps=16,
        total_steps=128,
        num_seeds=2,
        n_devices=2,
        eval_every=0,
        eval_episodes=2,
    )
    run_dir = run.train(config, ppo_joint.make_trainer, "ppo_joint").run_dir
    assert run_dir.parent == Path("runs") and run_dir.name.startswith(
        "ppo_joint-CartPole-v1-seed0-"
    )
    assert (run_dir / "summary.json").is_file()
    act = checkpoints.load_agent(run_dir, ppo_joint.Config, ppo_joint.make_trainer)
    obs = np.random.default_rng(0).normal(size=(5, 4)).astype(np.float32)
    both = np.asarray(act(obs))
    assert both.shape == (2, 5) and np.asarray(act(obs[0])).shape == (2,)
    first = checkpoints.load_agent(run_dir, ppo_joint.Config, ppo_joint.make_trainer, seed=1)
    np.testing.assert_array_equal(first(obs), both[1])
    # the same actions as the trainer's own greedy policy on the checkpoint's parameters (device 0,
    # seed 1)
    trainer = ppo_joint.make_trainer(config)
    state, _ = checkpoints.load(
        checkpoints.latest(run_dir / "checkpoints"),
        jax.eval_shape(
            devices.map_init(trainer.init), devices.seed_keys(jax.random.PRNGKey(0), 2, 2)
        ),
    )
    policy = jax.tree.map(lambda x: x[0, 1], trainer.policy(state))
    np.testing.assert_array_equal(both[1], [int(trainer.act(policy, o, None)) for o in obs])
    with pytest.raises(cli.ConfigError, match="the run has 2 seed"):
        checkpoints.load_agent(run_dir, ppo_joint.Config, ppo_joint.make_trainer, seed=2)
    with pytest.raises(cli.ConfigError, match="no checkpoint"):
        (tmp_path / "empty").mkdir()
        (tmp_path / "empty" / "config.json").write_text((run_dir / "config.json").read_text())
        checkpoints.load_agent(tmp_path / "empty", ppo_joint.Config, ppo_joint.make_trainer)


@pytest.mark.parametrize(
    "error", [ValueError("a bug"), OSError(5, "Input/output error"), KeyError("a bug")]
)
def test_main_turns_only_a_config_error_into_one_line(tmp_path, error):
    def mistake(config):
        raise cli.ConfigError("--lr 5.0: use less")

    def bug(config):
        raise error

    config = Toy(out_dir=str(tmp_path / "run"), compile_cache=False)
    with pytest.raises(SystemExit, match=r"^error: --lr 5.0: use less$"):
        run.launch(config, mistake, "toy")
    with pytest.raises(type(error)):  # a bug keeps its traceback
        run.launch(config, bug, "toy")


def test_a_failed_write_of_config_json_is_one_line(tmp_path, monkeypatch):
    import errno

    from algos import ppo_joint

    def full_disk(path, text):
        raise OSError(errno.ENOSPC, "No space left on device")

    # config.json: after the compile, before any epoch
    monkeypatch.setattr(outputs, "write_atomic", full_disk)
    config = ppo_joint.Config(
        num_envs=4,
        num_steps=16,
        total_steps=128,
        n_devices=1,
        compile_cache=False,
        out_dir=str(tmp_path / "run"),
    )
    with pytest.raises(SystemExit) as info:
        run.launch(config, ppo_joint.make_trainer, "ppo_joint")
    assert str(info.value.code) == (
        f"error: cannot write {tmp_path / 'run' / 'config.json'} (No space left on "
        f"device); no checkpoint was written yet: make room and start again"
    )


def test_target_return_ends_the_run_at_the_first_evaluation_that_reaches_it(tmp_path):
    """Every seed at or above --target-return ends the run there, with a checkpoint; else it trains
    on."""
    from algos import ppo_joint

    config = ppo_joint.Config(
        num_envs=4,
        num_steps=16,
        total_steps=256,
        num_seeds=2,
        n_devices=1,
        eval_every=2,
        eval_episodes=2,
        out_dir=str(tmp_path / "low"),
        target_return=1.0,
    )
    # CartPole's return is >= 1
    summary = run.train(config, ppo_joint.make_trainer, "ppo_joint").summary
    assert summary["epoch"] == 2 and summary["env_steps"] == 128, summary
    assert summary["target_return"]["reached"] and summary["target_return"]["epoch"] == 2
    assert 0 < summary["target_return"]["seconds"] <= summary["wall_time_s"]
    assert checkpoints.latest(tmp_path / "low" / "checkpoints").name == "epoch_000002.npz"
    lines = (tmp_path / "low" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["epoch"] for line in lines] == [1, 2]
    config = dataclasses.replace(config, out_dir=str(tmp_path / "high"), target_return=1e6)
    summary = run.train(config, ppo_joint.make_trainer, "ppo_joint").summary
    assert summary["epoch"] == 4 and summary["target_return"] == {"return": 1e6, "reached": False}
    with pytest.raises(cli.ConfigError, match="--eval-every 1 or more"):
        dataclasses.replace(config, eval_every=0)


# ----------------------------------------------------------------------------
# train() on the tiny ppo_joint run: resume, divergence, bad input
# ----------------------------------------------------------------------------
RUN = dict(PPO_RUN, total_steps=4 * 16 * 6, **RESUME_FLAGS)  # each test sets n_devices


def run_config(out_dir, **overrides) -> Config:
    return Config(**{**RUN, "out_dir": str(out_dir), **overrides})


def final_arrays(run_dir: Path) -> dict:
    path = checkpoints.latest(run_dir / "checkpoints")
    with np.load(path, allow_pickle=False) as data:
        return path.name, {k: data[k] for k in data.files}


def metric_lines(run_dir: Path) -> list:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("n_devices", [1, pytest.param(0, marks=pytest.mark.slow)])
def test_resume_gives_the_uninterrupted_run(tmp_path, n_devices, capsys):
    """n_devices 0 means every local device: two here."""
    whole = run.train(run_config(tmp_path / "whole", n_devices=n_devices), make_trainer).summary
    assert whole["epoch"] == 6
    part = run.train(
        run_config(tmp_path / "part", n_devices=n_devices), make_trainer, max_epochs=2
    ).summary
    assert part["epoch"] == 2
    assert checkpoints.latest(tmp_path / "part" / "checkpoints").name == "epoch_000002.npz"
    resumed = run.train(
        run_config(tmp_path / "part", n_devices=n_devices, resume=str(tmp_path / "part")),
        make_trainer,
    ).summary
    assert "resumed" in capsys.readouterr().out
    assert resumed["epoch"] == 6
    name_whole, arrays_whole = final_arrays(tmp_path / "whole")
    name_part, arrays_part = final_arrays(tmp_path / "part")
    assert name_whole == name_part == "epoch_000006.npz"
    assert arrays_whole.keys() == arrays_part.keys()
    for key in arrays_whole:
        np.testing.assert_array_equal(arrays_whole[key], arrays_part[key], err_msg=key)
    # the metrics file holds each epoch once, with the same numbers as the uninterrupted run
    lines_whole, lines_part = metric_lines(tmp_path / "whole"), metric_lines(tmp_path / "part")
    assert (
        [r["epoch"] for r in lines_part] == [r["epoch"] for r in lines_whole] == [1, 2, 3, 4, 5, 6]
    )
    for a, b in zip(lines_whole, lines_part):
        assert {k: v for k, v in a.items() if k != "sps"} == {
            k: v for k, v in b.items() if k != "sps"
        }
    assert resumed["eval_return"] == whole["eval_return"]


def test_divergence_stops_with_last_good_checkpoint(tmp_path):
    run_dir = tmp_path / "run"
    run.train(run_config(run_dir, n_devices=1, checkpoint_every=1), make_trainer, max_epochs=2)
    good = run_dir / "checkpoints" / "epoch_000002.npz"
    assert checkpoints.latest(run_dir / "checkpoints") == good
    # an absurd learning rate from here on: the first Adam step throws the parameters to ~1e30
    absurd = run_config(run_dir, n_devices=1, checkpoint_every=1, lr=1e30, resume=str(run_dir))
    with pytest.raises(SystemExit) as info:
        run.train(absurd, make_trainer)
    message = str(info.value.code)
    assert "loss/joint" in message and "epoch 3" in message and "diverged" in message
    assert f"Last good checkpoint: {good}" in message
    assert checkpoints.latest(run_dir / "checkpoints") == good  # the diverged state was not saved
    template = jax.eval_shape(devices.map_init(make_trainer(absurd).init), run_keys(3))
    state, epoch = checkpoints.load(good, template)
    assert epoch == 2
    assert all(np.all(np.isfinite(x)) for x in jax.tree.leaves(state.params))
    # from scratch, divergence in the first epoch: there is no checkpoint to point to
    with pytest.raises(
        SystemExit, match="No checkpoint was saved: start a new run with a lower learning rate"
    ):
        run.train(run_config(tmp_path / "fresh", n_devices=1, lr=1e30), make_trainer)


def test_a_finite_checkpoint_of_a_diverged_policy_is_not_offered_for_resume(tmp_path):
    """Parameters that grow by 1e20 an epoch: epoch 1 saves a finite but absurd state, epoch 2's
    loss overflows."""

    def make_exploding_trainer(config):
        trainer = make_trainer(config)

        def epoch(state):
            state, metrics = trainer.epoch(state)
            return state._replace(params=jax.tree.map(lambda p: p * 1e20, state.params)), metrics

        return trainer._replace(epoch=epoch)

    run_dir = tmp_path / "run"
    with pytest.raises(SystemExit) as info:
        run.train(run_config(run_dir, n_devices=1, checkpoint_every=1), make_exploding_trainer)
    message = str(info.value.code)
    saved = run_dir / "checkpoints" / "epoch_000001.npz"
    assert checkpoints.latest(run_dir / "checkpoints") == saved
    assert "diverged" in message and f"The newest checkpoint, {saved}, is finite" in message, (
        message
    )
    assert "--resume" not in message and f"--out-dir {run_dir} --overwrite" in message, message


def test_divergence_of_one_seed_stops_the_run(tmp_path):
    config = run_config(tmp_path / "run", n_devices=1, checkpoint_every=1)
    doomed = run_keys(config.seed, num_seeds=2)[0, 0]  # the first seed's key, as train() derives it

    def make_poisoned_trainer(config):
        trainer = make_trainer(config)

        def init(key):  # NaN parameters for the first seed only
            state = trainer.init(key)
            poison = jnp.where(jnp.all(key == doomed), jnp.nan, 1.0)
            return state._replace(params=jax.tree.map(lambda p: p * poison, state.params))

        return trainer._replace(init=init)

    state = devices.map_init(make_poisoned_trainer(config).init)(run_keys(config.seed, 2))
    w = np.asarray(state.params["torso"][0]["w"])
    # the poison hits exactly one seed
    assert np.isnan(w[0, 0]).all() and np.isfinite(w[0, 1]).all()
    with pytest.raises(SystemExit, match="diverged"):
        run.train(config, make_poisoned_trainer)


TWO_BY_TWO = """
import sys
sys.path.insert(0, {root!r})
from algos import ppo_joint
from common import run
config = ppo_joint.Config(num_envs=4, num_steps=16, num_minibatches=2, update_passes=1, num_seeds=2, n_devices=2,
                          total_steps=128, eval_episodes=2, compile_cache=False, out_dir={out!r})
print("epochs", run.train(config, ppo_joint.make_trainer).summary["epoch"])
"""


@pytest.mark.slow  # a whole run in a new process: CI runs it, the fast suite does not
def test_two_devices_two_seeds(tmp_path):
    """`--num-seeds 2` on 2 devices trains.

    In a subprocess with a timeout, because the failure this guards against is a
    hang: jaxlib 0.10's batched QR (of `jax.nn.initializers.orthogonal` over several
    seeds) deadlocks XLA's 2-thread pool on a 2-core host; `nets.orthogonal` avoids it.
    """
    code = TWO_BY_TWO.format(
        root=str(Path(__file__).resolve().parents[1]), out=str(tmp_path / "run")
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=script_env(2), capture_output=True, text=True, timeout=90
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "epochs 2" in out.stdout


def test_bad_input_fails_before_anything_is_written(tmp_path):
    with pytest.raises(ValueError, match="--num-minibatches 3"):
        run.train(run_config(tmp_path / "a", n_devices=1, num_minibatches=3), make_trainer)
    with pytest.raises(ValueError, match="--n-devices 3"):
        run.train(run_config(tmp_path / "b", n_devices=3), make_trainer)
    assert not any(tmp_path.iterdir())


def test_resume_without_checkpoint_exits(tmp_path):
    (tmp_path / "run").mkdir()
    with pytest.raises(
        cli.ConfigError,
        match="no checkpoint in .*, the run stopped before its first; start it again "
        "with its flags and --out-dir .* --overwrite",
    ):
        run.train(
            run_config(tmp_path / "run", n_devices=1, resume=str(tmp_path / "run")), make_trainer
        )


def test_resume_with_other_flags_exits_with_the_fix(tmp_path):
    c, state = initial_state()  # hidden (64, 64), 2 seeds: not what the run below builds
    run_dir = tmp_path / "run"
    checkpoints.save(run_dir / "checkpoints", state, 1)
    with pytest.raises(cli.ConfigError, match="--out-dir"):
        run.train(run_config(run_dir, n_devices=1, hidden=(16,), resume=str(run_dir)), make_trainer)


def strict_json(text: str):
    """json.loads that refuses NaN and Infinity, as a strict parser (JavaScript's JSON.parse)
    does."""

    def refuse(constant):
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


def test_every_file_a_run_writes_is_strict_json(tmp_path):
    """A NaN (no episode ended in the last epoch) or an infinity is written as null, in summary.json
    as in metrics.jsonl."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    outputs.write_json(
        run_dir / "summary.json",
        {"episode_return": math.nan, "per_seed": [1.0, -math.inf], "nested": {"x": math.inf}},
        run_dir,
    )
    assert strict_json((run_dir / "summary.json").read_text()) == {
        "episode_return": None,
        "per_seed": [1.0, None],
        "nested": {"x": None},
    }
    logger = outputs.Logger(cli.RunConfig(out_dir=str(run_dir)), run_dir, is_chief=True)
    logger.log(
        {
            "epoch": 1,
            "env_steps": 8,
            "sps": 1.0,
            "episode/return": math.nan,
            "loss/x": [math.inf, 2.0],
        }
    )
    assert strict_json((run_dir / "metrics.jsonl").read_text()) == {
        "epoch": 1,
        "env_steps": 8,
        "sps": 1.0,
        "episode/return": None,
        "loss/x": [None, 2.0],
    }


@pytest.mark.parametrize(
    "seconds, text", [(0, "0s"), (42.4, "42s"), (312, "5m12s"), (7380, "2h03m")]
)
def test_durations_read_as_a_person_writes_them(seconds, text):
    assert outputs.clock(seconds) == text


def test_summary_episode_return_is_from_the_newest_epoch_in_which_episodes_ended(tmp_path):
    """Pendulum's episodes last 200 steps: one environment of 32 steps an epoch ends its first in
    epoch 7."""
    long_episodes = dict(
        env="Pendulum-v1",
        num_envs=1,
        num_steps=32,
        total_steps=32 * 8,
        n_devices=1,
        num_seeds=1,
        eval_every=0,
    )
    run_dir = tmp_path / "run"
    first = run.train(run_config(run_dir, **long_episodes), make_trainer, max_epochs=6).summary
    assert first["episode_return"] is None and first["episode_return_epoch"] is None
    assert first["episode_return_note"] == "no training episode ended in epochs 1 to 6"
    resumed = run.train(
        run_config(run_dir, **long_episodes, resume=str(run_dir)), make_trainer
    ).summary
    assert (
        resumed["epoch"] == 8
        and resumed["episode_return_epoch"] == 7
        and "episode_return_note" not in resumed
    )
    [seventh] = [r for r in metric_lines(run_dir) if r["epoch"] == 7]
    assert (
        seventh["episode/count"] > 0 and resumed["episode_return"] == seventh["episode/return"] < 0
    )
    assert strict_json((run_dir / "summary.json").read_text())["episode_return_epoch"] == 7
