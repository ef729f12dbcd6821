"""What every script promises about a run: a non-finite loss term stops it, --resume continues it
exactly, load_agent acts as it trained, and --sweep members train as runs of their values.

Tiny configurations (an epoch is a few hundred steps); the runs share the session's compile
cache."""

import dataclasses
import importlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import jax
import numpy as np
import pytest

from common import checkpoints, cli, devices, envs, run, sweep
from helpers import SCRIPTS, TINY_BY_SCRIPT, slow_for

RUN = dict(n_devices=1, eval_every=0, eval_episodes=2, compile_cache=False)


def config(name, out_dir, epochs=3, **overrides):
    """`(module, Config)`: the script's tiny run of `epochs` epochs on one device, writing to
    `out_dir`."""
    module = importlib.import_module(f"algos.{name}")
    tiny = TINY_BY_SCRIPT[name]
    steps = tiny["num_envs"] * tiny["num_steps"]
    return module, module.Config(
        **{**tiny, **RUN, "total_steps": epochs * steps, "out_dir": str(out_dir), **overrides}
    )


# ----------------------------------------------------------------------------
# A run flag's bad value is refused before anything compiles or is written
# ----------------------------------------------------------------------------
@pytest.mark.parametrize("name", SCRIPTS)
@pytest.mark.parametrize(
    "overrides, match",
    [
        (dict(num_envs=3, n_devices=2), r"^--num-envs 3 is not divisible by --n-devices 2"),
        (dict(total_steps=10), r"^--total-steps 10 is less than one epoch"),
        (dict(env="CartPole-v7"), r"^--env 'CartPole-v7' is not a gymnax environment"),
    ],
)
def test_a_bad_run_flag_is_refused_before_compiling(tmp_path, name, overrides, match):
    module, cfg = config(name, tmp_path / "run", **overrides)
    with pytest.raises(cli.ConfigError, match=match):
        run.train(cfg, module.make_trainer, name)
    assert not (tmp_path / "run").exists()


# ----------------------------------------------------------------------------
# A non-finite loss term stops the run
# ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "name, overrides",
    [
        # Sampling AWR weighs the policy with the critic's copy from the epoch's start, and
        # actor_critic's advantages come from the value net before its update: a diverged critic
        # reaches their policy loss only in the next epoch (and never in a run of one epoch)
        ("awr", dict(value_lr=1e30, q_value=True, n_samples=2)),
        ("actor_critic", dict(value_lr=1e30)),
    ],
)
def test_a_non_finite_value_loss_stops_the_run_in_its_epoch(tmp_path, name, overrides):
    """An absurd value learning rate throws the critic's parameters to ~1e30 at its first Adam step,
    so loss/value is not finite in the first epoch while loss/policy still is: the run stops there,
    naming it, without a checkpoint."""
    module, cfg = config(name, tmp_path / "run", epochs=1, **overrides)
    with pytest.raises(SystemExit) as info:
        run.train(cfg, module.make_trainer, name)
    message = str(info.value.code)
    assert re.match(r"loss/value is (nan|inf) at epoch 1: training diverged", message), message
    assert "No checkpoint was saved" in message
    assert checkpoints.latest(tmp_path / "run" / "checkpoints") is None


# ----------------------------------------------------------------------------
# --resume continues a run exactly: after Ctrl-C and after kill -9
# ----------------------------------------------------------------------------
# the replay rings (awr: 2 epochs, dqn_value: 3) wrap; skip_transformer skips blocks from its first
# gradient step
EPOCHS, CHECKPOINT_EVERY = 4, 2


def resume_config(name, out_dir, **overrides):
    return config(name, out_dir, epochs=EPOCHS, checkpoint_every=CHECKPOINT_EVERY, **overrides)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """`run_dir(name)`: the run of `resume_config(name)` from start to end, trained once per
    module."""
    runs = {}

    def run_dir(name):
        if name not in runs:
            runs[name] = tmp_path_factory.mktemp(f"{name}_whole") / "run"
            module, cfg = resume_config(name, runs[name])
            assert run.train(cfg, module.make_trainer, name).summary["epoch"] == EPOCHS
        return runs[name]

    return run_dir


def assert_same_run(whole: Path, resumed: Path):
    """The newest checkpoints hold the same arrays, bit for bit; the metrics files the same epochs
    and numbers."""
    a, b = checkpoints.latest(whole / "checkpoints"), checkpoints.latest(resumed / "checkpoints")
    assert a.name == b.name == f"epoch_{EPOCHS:06d}.npz"
    with np.load(a, allow_pickle=False) as x, np.load(b, allow_pickle=False) as y:
        assert x.files == y.files
        for key in x.files:
            np.testing.assert_array_equal(x[key], y[key], err_msg=key)
    lines = [
        [
            {k: v for k, v in json.loads(line).items() if k != "sps"}
            for line in (d / "metrics.jsonl").read_text().splitlines()
        ]
        for d in (whole, resumed)
    ]
    assert [r["epoch"] for r in lines[1]] == list(range(1, EPOCHS + 1))
    assert lines[0] == lines[1]


# ppo_joint's and dqn_value's own test files resume them after max_epochs (tests/test_ppo_joint.py,
# tests/test_dqn_value.py)
@pytest.mark.parametrize(
    "name", slow_for(["awr", "actor_critic", "reinforce", "skip_transformer"], "skip_transformer")
)
def test_resume_after_ctrl_c_ends_as_the_uninterrupted_run(tmp_path, uninterrupted, name):
    """`max_epochs` stops as Ctrl-C does (a checkpoint at the epoch reached); --resume then ends bit
    for bit where the uninterrupted run ends: awr's replay ring, skip_transformer's depth key and
    gradient step count, every optimiser and environment state and key travel in the checkpoint."""
    module, cfg = resume_config(name, tmp_path / "run")
    assert (
        run.train(cfg, module.make_trainer, name, max_epochs=CHECKPOINT_EVERY + 1).summary["epoch"]
        == 3
    )
    assert checkpoints.latest(tmp_path / "run" / "checkpoints").name == "epoch_000003.npz"
    run.train(dataclasses.replace(cfg, resume=str(tmp_path / "run")), module.make_trainer, name)
    assert_same_run(uninterrupted(name), tmp_path / "run")


KILLED = """
import sys, time
sys.path.insert(0, {root!r})
import jax
for name, value in {cache!r}.items():
    jax.config.update(name, value)
from common import outputs, run
from algos import {name} as module

log = outputs.Logger.log


def log_then_hang(self, record, force_print=False):  # the parent kills this process here
    log(self, record, force_print)
    if record["epoch"] == {hang_at}:
        print("logged", record["epoch"], flush=True)
        time.sleep(600)


outputs.Logger.log = log_then_hang
run.train(module.Config(**{config!r}), module.make_trainer, {name!r})
"""


@pytest.mark.slow  # a fresh process per script: 10-30 s each
@pytest.mark.parametrize("name", SCRIPTS)
def test_resume_after_kill_9_ends_as_the_uninterrupted_run(tmp_path, uninterrupted, name):
    """A run killed with SIGKILL after logging epoch 3 (its newest checkpoint: epoch 2) resumes from
    that checkpoint, drops epoch 3 from metrics.jsonl, and ends bit for bit as the uninterrupted
    run."""
    module, cfg = resume_config(name, tmp_path / "run")
    cache = {
        k: getattr(jax.config, k)
        for k in (
            "jax_compilation_cache_dir",
            "jax_persistent_cache_min_compile_time_secs",
            "jax_persistent_cache_min_entry_size_bytes",
        )
    }
    code = KILLED.format(
        root=str(Path(__file__).resolve().parents[1]),
        cache=cache,
        name=name,
        hang_at=CHECKPOINT_EVERY + 1,
        config=dataclasses.asdict(cfg),
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=os.environ.copy(),
    )
    # a child that never logs epoch 3 fails the test, not CI
    timer = threading.Timer(240, child.kill)
    timer.start()
    try:
        lines = []
        for line in child.stdout:
            lines.append(line)
            if line.startswith("logged 3"):
                os.kill(child.pid, signal.SIGKILL)
                break
        assert child.wait() == -signal.SIGKILL, "".join(lines) + child.stderr.read()[-3000:]
    finally:
        timer.cancel()
        child.kill()
    assert (
        checkpoints.latest(tmp_path / "run" / "checkpoints").name
        == f"epoch_{CHECKPOINT_EVERY:06d}.npz"
    )
    assert (
        len((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()) == CHECKPOINT_EVERY + 1
    )
    run.train(dataclasses.replace(cfg, resume=str(tmp_path / "run")), module.make_trainer, name)
    assert_same_run(uninterrupted(name), tmp_path / "run")


# ----------------------------------------------------------------------------
# load_agent: Box actions and a swept run
# ----------------------------------------------------------------------------
def test_load_agent_of_a_swept_box_action_run_picks_members_in_order(tmp_path):
    """ppo_joint on Pendulum-v1 (a Box action) with --sweep lr=... and 2 seeds: `seed=i` is entry
    i of the member-major seed axis (member i // 2, seed i % 2), whose swept value `sweep.build`
    feeds its programs; its actions are the trainer's greedy (clipped mean) actions on those
    parameters."""
    from algos import ppo_joint

    cfg = ppo_joint.Config(
        env="Pendulum-v1",
        num_envs=4,
        num_steps=16,
        num_minibatches=2,
        update_passes=2,
        total_steps=128,
        num_seeds=2,
        sweep=("lr=0.01,0.001",),
        **RUN,
        out_dir=str(tmp_path),
    )
    run.train(cfg, ppo_joint.make_trainer, "ppo_joint")
    trainer, values = sweep.build(cfg, ppo_joint.make_trainer, 1)
    keys, _ = sweep.run_keys(0, cfg, 1)
    inner, _ = checkpoints.load(
        checkpoints.latest(tmp_path / "checkpoints"),
        jax.eval_shape(devices.map_init(trainer.init), keys, values),
    )
    np.testing.assert_array_equal(values["lr"][0], np.float32([0.01, 0.01, 0.001, 0.001]))
    obs = np.random.default_rng(0).normal(size=(5, 3)).astype(np.float32)
    every = np.asarray(
        checkpoints.load_agent(tmp_path, ppo_joint.Config, ppo_joint.make_trainer)(obs)
    )
    assert every.shape == (4, 5, 1) and every.dtype == np.float32
    assert np.all(np.abs(every) <= 2.0)  # Pendulum's torque bound
    for i in range(4):
        act = checkpoints.load_agent(tmp_path, ppo_joint.Config, ppo_joint.make_trainer, seed=i)
        # device 0, entry i
        policy = envs.Policy(params=jax.tree.map(lambda x, i=i: x[0, i], inner.params))
        want = np.stack([np.asarray(trainer.act(policy, o, None)) for o in obs])
        np.testing.assert_allclose(act(obs), want, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(every[i], want, rtol=1e-6, atol=1e-6)
        assert np.asarray(act(obs[0])).shape == (1,)  # one observation, one action
    assert not np.allclose(every[0], every[2])  # the members learned differently


# ----------------------------------------------------------------------------
# --sweep: a member trains as the run with its value
# ----------------------------------------------------------------------------
SWEPT = {
    "awr": "beta",
    "actor_critic": "value_lr",
    "reinforce": "lr",
    "dqn_value": "lr",
    "skip_transformer": "lr",
}


# ppo_joint's: tests/test_inprocess_sweep.py, through run.train
@pytest.mark.parametrize("name", slow_for(sorted(SWEPT), "skip_transformer"))
def test_a_swept_member_trains_as_the_run_with_its_value(name):
    """--sweep FLAG=default,default/2: member 1 ends 2 epochs where a run with FLAG=default/2 ends
    (same keys), and apart from member 0: the traced value reaches the math, in member order."""
    flag = SWEPT[name]
    module, cfg = config(name, "", epochs=2)
    value = getattr(cfg, flag) / 2
    swept = dataclasses.replace(cfg, sweep=(f"{flag}={getattr(cfg, flag)},{value}",))
    alone = dataclasses.replace(cfg, **{flag: value})

    def train(cfg):  # the run's parameters after 2 epochs, [runs, ...]
        trainer, values = sweep.build(cfg, module.make_trainer, 1)
        keys, _ = sweep.run_keys(0, cfg, 1)
        quick = lambda fn, *args: fn.lower(*args).compile(run.FAST_COMPILE)  # noqa: E731
        state = quick(devices.map_init(trainer.init), keys, values)(keys, values)
        epoch = quick(devices.map_epoch(trainer.epoch, 1, donate=False, n_mapped=2), state, values)
        for _ in range(2):
            state, _ = epoch(state, values)
        return trainer.policy(devices.unreplicate(state))

    together, by_itself = train(swept), train(alone)
    member = lambda params, i: jax.tree.map(lambda x: np.asarray(x[i]), params)  # noqa: E731
    for x, y in zip(jax.tree.leaves(member(together, 1)), jax.tree.leaves(member(by_itself, 0))):
        np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-6)
    assert not all(
        np.allclose(x, y)
        for x, y in zip(jax.tree.leaves(member(together, 0)), jax.tree.leaves(member(together, 1)))
    )
