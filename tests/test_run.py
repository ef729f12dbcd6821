"""common/cli.py, run.py, loop.py, outputs.py: the CLI from a config dataclass, epochs in chunks, the metrics
logger and wandb failures, metrics.jsonl on --resume, load_agent, the one-line errors of main."""
import dataclasses
import json
import math
from pathlib import Path
from typing import Literal

import numpy as np
import pytest

from common import checkpoints, cli, devices, envs, loop, outputs, run


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


@pytest.mark.parametrize("argv, expected", [
    (["--n-samples", "4", "--q-value"], dict(n_samples=4, q_value=True)),
    # as a wandb sweep agent passes values: --key=value, Python str() formatting
    (["--n_samples=4", "--q_value=True", "--lr=1e-05"], dict(n_samples=4, q_value=True, lr=1e-05)),
    (["--q-value=False", "--hidden", "32", "16", "--agg", "max"], dict(q_value=False, hidden=(32, 16), agg="max")),
])
def test_parse_config(argv, expected):
    config = cli.parse_config(Toy, argv)
    for key, value in expected.items():
        assert getattr(config, key) == value


@pytest.mark.parametrize("argv", [["--agg", "median"], ["--n-samples", "x"], ["--num-seeds", "0"],
                                  ["--eval-only"], ["--q-value=maybe"]])
def test_bad_flags_exit_with_usage_error(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.parse_config(Toy, argv)
    assert exit_info.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_resume_takes_the_saved_config_and_run_flags_from_the_command_line(tmp_path, capsys):
    saved = Toy(n_samples=3, hidden=(8,), out_dir=str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps(dataclasses.asdict(saved)))
    config = cli.parse_config(Toy, ["--resume", str(tmp_path), "--n-samples", "3", "--lr", "0.01", "--eval-only"])
    assert config.n_samples == 3 and config.hidden == (8,) and config.eval_only and config.lr == 0.01
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
    metrics = {"loss": np.array([[[1.0, 2.0, 9.0], [3.0, 4.0, 9.0]]]),  # [devices, seeds, epochs]
               "episode/return": np.array([[[np.nan, 5.0, 0.0], [7.0, np.nan, 0.0]]])}
    records = loop.records(metrics, 2)
    per_seed = [r.pop("episode/return_per_seed") for r in records]
    assert records == [{"loss": 2.0, "episode/return": 7.0}, {"loss": 3.0, "episode/return": 5.0}]
    np.testing.assert_array_equal(per_seed, [[np.nan, 7.0], [5.0, np.nan]])  # each seed, for common.plot
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
    lines = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [l["epoch"] for l in lines] == [1, 2] and lines[0]["episode/return"] is None


def test_resume_drops_epochs_after_the_checkpoint_and_a_torn_last_line(tmp_path, capsys):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"epoch": e}) + "\n" for e in range(1, 8)))
    outputs.trim_metrics(path, 5)
    assert [json.loads(l)["epoch"] for l in path.read_text().splitlines()] == [1, 2, 3, 4, 5]
    assert "dropped 2 line(s) past the checkpoint's epoch 5" in capsys.readouterr().err
    path.write_text(path.read_text() + '{"epoch": 6, "env_st')  # the write of epoch 6 cut short
    outputs.trim_metrics(path, 5)
    assert [json.loads(l)["epoch"] for l in path.read_text().splitlines()] == [1, 2, 3, 4, 5]
    err = capsys.readouterr().err
    assert "dropped its last line, cut short" in err and str(path) in err and "past" not in err
    path.write_text('{"epoch": 1}\nnot json\n{"epoch": 2}\n')
    with pytest.raises(cli.ConfigError, match=r"metrics.jsonl, line 2, is not a metrics record"):
        outputs.trim_metrics(path, 5)


def test_load_agent_acts_as_the_saved_policy(tmp_path, monkeypatch):
    import jax

    from algos import ppo_joint

    monkeypatch.chdir(tmp_path)  # no --out-dir: the run's own directory, which train returns
    config = ppo_joint.Config(num_envs=4, num_steps=16, total_steps=128, num_seeds=2, n_devices=2, eval_every=0,
                              eval_episodes=2)
    run_dir = run.train(config, ppo_joint.make_trainer, "ppo_joint").run_dir
    assert run_dir.parent == Path("runs") and run_dir.name.startswith("ppo_joint-CartPole-v1-seed0-")
    assert (run_dir / "summary.json").is_file()
    act = checkpoints.load_agent(run_dir, ppo_joint.Config, ppo_joint.make_trainer)
    obs = np.random.default_rng(0).normal(size=(5, 4)).astype(np.float32)
    both = np.asarray(act(obs))
    assert both.shape == (2, 5) and np.asarray(act(obs[0])).shape == (2,)
    first = checkpoints.load_agent(run_dir, ppo_joint.Config, ppo_joint.make_trainer, seed=1)
    np.testing.assert_array_equal(first(obs), both[1])
    # the same actions as the trainer's own greedy policy on the checkpoint's parameters (device 0, seed 1)
    trainer = ppo_joint.make_trainer(config)
    state, _ = checkpoints.load(checkpoints.latest(run_dir / "checkpoints"), jax.eval_shape(
        devices.map_init(trainer.init), devices.seed_keys(jax.random.PRNGKey(0), 2, 2)))
    policy = envs.Policy(params=jax.tree.map(lambda x: x[0, 1], state.params))
    np.testing.assert_array_equal(both[1], [int(trainer.act(policy, o, None)) for o in obs])
    with pytest.raises(cli.ConfigError, match="the run has 2 seed"):
        checkpoints.load_agent(run_dir, ppo_joint.Config, ppo_joint.make_trainer, seed=2)
    with pytest.raises(cli.ConfigError, match="no checkpoint"):
        (tmp_path / "empty").mkdir()
        (tmp_path / "empty" / "config.json").write_text((run_dir / "config.json").read_text())
        checkpoints.load_agent(tmp_path / "empty", ppo_joint.Config, ppo_joint.make_trainer)


@pytest.mark.parametrize("error", [ValueError("a bug"), OSError(5, "Input/output error"), KeyError("a bug")])
def test_main_turns_only_a_config_error_into_one_line(tmp_path, error):
    def mistake(config):
        raise cli.ConfigError("--lr 5.0: use less")

    def bug(config):
        raise error

    config = Toy(out_dir=str(tmp_path / "run"), no_compile_cache=True)
    with pytest.raises(SystemExit, match=r"^error: --lr 5.0: use less$"):
        run.launch(config, mistake, "toy")
    with pytest.raises(type(error)):  # a bug keeps its traceback
        run.launch(config, bug, "toy")


def test_a_failed_write_of_config_json_is_one_line(tmp_path, monkeypatch):
    import errno

    from algos import ppo_joint

    def full_disk(path, text):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(outputs, "write_atomic", full_disk)  # before anything compiles
    config = ppo_joint.Config(num_envs=4, num_steps=16, total_steps=128, n_devices=1, no_compile_cache=True,
                              out_dir=str(tmp_path / "run"))
    with pytest.raises(SystemExit) as info:
        run.launch(config, ppo_joint.make_trainer, "ppo_joint")
    assert str(info.value.code) == (f"error: cannot write {tmp_path / 'run' / 'config.json'} (No space left on "
                                    f"device); no checkpoint was written yet: make room and start again")


def test_target_return_ends_the_run_at_the_first_evaluation_that_reaches_it(tmp_path):
    """Every seed at or above --target-return ends the run there, with a checkpoint; else it trains on."""
    from algos import ppo_joint
    config = ppo_joint.Config(num_envs=4, num_steps=16, total_steps=256, num_seeds=2, n_devices=1, eval_every=2,
                              eval_episodes=2, out_dir=str(tmp_path / "low"), target_return=1.0)
    summary = run.train(config, ppo_joint.make_trainer, "ppo_joint").summary  # CartPole's return is >= 1
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
