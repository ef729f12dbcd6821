"""What several test files share: moving results to the host, running a script as a user does,
the NumPy references they check against, and tiny configs.

Each reference is a plain loop in float64, written independently of the code under test. The tiny
ppo_joint trainer is the one run that the tests of common/ (checkpoints, train) drive.
"""

import contextlib
import dataclasses
import functools
import importlib
import io
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import jax
import jax.extend.core
import jax.numpy as jnp
import numpy as np
import pytest

from algos.ppo_joint import Config, make_trainer
from common import devices, run, sweep

ROOT = Path(__file__).resolve().parents[1]


def host(tree):
    """A pytree of device arrays as NumPy arrays on the host."""
    return jax.tree.map(np.asarray, jax.device_get(tree))


def first(tree):
    """Device 0, seed 0 of a `[n_devices, num_seeds, ...]` tree, on the host."""
    return jax.tree.map(lambda x: np.asarray(x)[0, 0], jax.device_get(tree))


def script_env(n_devices: int = 1, **extra) -> dict:
    """The environment for a script a test starts: this process's, with one CPU device as a user has
    (or `n_devices`), the tests' other XLA flags (conftest.py), no wandb account, and `extra`."""
    flags = [
        flag
        for flag in os.environ.get("XLA_FLAGS", "").split()
        if not flag.startswith("--xla_force_host_platform_device_count")
    ]
    if n_devices > 1:
        flags.append(f"--xla_force_host_platform_device_count={n_devices}")
    return {
        **os.environ,
        "XLA_FLAGS": " ".join(flags),
        "JAX_PLATFORMS": "cpu",
        "WANDB_MODE": "disabled",
        **extra,
    }


def slow_for(names, *slow) -> list:
    """`names` as pytest parameters, those in `slow` marked slow: the fast suite checks a family of
    per-script tests on the scripts whose programs compile in seconds, CI on every script."""
    return [pytest.param(name, marks=pytest.mark.slow) if name in slow else name for name in names]


def command(script: str | types.ModuleType, *args, cwd) -> subprocess.CompletedProcess:
    """`python algos/SCRIPT.py ARGS` run from `cwd` in this process: its exit status, stdout and
    stderr as `subprocess.run` returns them, without the seconds a new process spends importing JAX.
    For command lines that end before anything compiles (--help, a refused flag); an exception that
    is not a user's error propagates, as a traceback would print. `script` may be a module: a copy
    of a script, loaded from its file."""
    if isinstance(script, types.ModuleType):
        module, script = script, script.__name__
    else:
        module = importlib.import_module(f"algos.{script}")
    stdout, stderr, status = io.StringIO(), io.StringIO(), 0
    with (
        contextlib.chdir(cwd),
        contextlib.redirect_stdout(stdout),
        contextlib.redirect_stderr(stderr),
    ):
        try:
            argv = list(map(str, args))
            # skip_transformer's own, which adds the return at every depth
            if hasattr(module, "main"):
                module.main(argv)
            else:
                run.main(
                    module.Config,
                    module.make_trainer,
                    script,
                    module.__doc__.split("\n\n")[0],
                    argv,
                )
        # as Python ends a process: a message goes to stderr with status 1
        except SystemExit as exit:
            if isinstance(exit.code, str):
                print(exit.code, file=sys.stderr)
            status = 1 if isinstance(exit.code, str) else exit.code or 0
    return subprocess.CompletedProcess(
        [script, *args], status, stdout.getvalue(), stderr.getvalue()
    )


def run_script(script: str, *args, cwd, n_devices: int = 1, timeout: float = 300, **env):
    """`python algos/SCRIPT.py ARGS` in a new process from `cwd`, as a user runs it: its exit status,
    stdout and stderr. `n_devices` CPU devices, `env` added to its environment (`script_env`)."""
    return subprocess.run(
        [sys.executable, str(ROOT / "algos" / f"{script}.py"), *map(str, args)],
        cwd=cwd,
        env=script_env(n_devices, **env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def run_outputs(run_dir: Path) -> tuple[dict, list[dict], dict]:
    """A finished run's config.json, metrics.jsonl records and summary.json, checked against the
    run-output contract: one record an epoch from epoch 1, a summary with a finite greedy return (one
    per seed), times and speed, and a checkpoint of the last epoch."""
    config = json.loads((run_dir / "config.json").read_text())
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert [line["epoch"] for line in lines] == list(range(1, len(lines) + 1))
    assert summary["env_steps"] == lines[-1]["env_steps"]
    for key in ("eval_return", "wall_time_s", "compile_time_s", "sps", "wall_sps"):
        assert np.isfinite(summary[key]), key
    assert len(summary["eval_return_per_seed"]) == config["num_seeds"]
    assert (run_dir / "checkpoints" / f"epoch_{len(lines):06d}.npz").exists()
    return config, lines, summary


def help_text(script: str, cwd) -> str:
    """`SCRIPT --help`'s output (`command`) with white space folded, checked to exit 0 and to name
    a flag for every field of the script's Config."""
    out = command(script, "--help", cwd=cwd)
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())
    for field in dataclasses.fields(importlib.import_module(f"algos.{script}").Config):
        flag = "--" + field.name.replace("_", "-")
        assert flag in text, f"{script} --help does not list {flag}"
    return text


def count_primitive(jaxpr, name: str) -> int:
    """Occurrences of primitive `name` in a jaxpr and every jaxpr nested in it."""
    count = 0
    for eqn in jaxpr.eqns:
        count += eqn.primitive.name == name
        for value in eqn.params.values():
            for sub in value if isinstance(value, (list, tuple)) else [value]:
                if isinstance(sub, jax.extend.core.ClosedJaxpr):
                    count += count_primitive(sub.jaxpr, name)
                elif isinstance(sub, jax.extend.core.Jaxpr):
                    count += count_primitive(sub, name)
    return count


def random_batch(batch_type, seed: int, n: int, obs_dim=4, n_actions=2, target_scale=1.0):
    """A `batch_type` (obs, action, log_prob, advantage, target) of `n` random samples: log-probs
    near log 1/2, advantages around 0.3, targets normal times `target_scale`."""
    rng = np.random.default_rng(seed)
    return batch_type(
        obs=jnp.asarray(rng.normal(size=(n, obs_dim)), jnp.float32),
        action=jnp.asarray(rng.integers(0, n_actions, size=n), jnp.int32),
        log_prob=jnp.asarray(np.log(0.5) + rng.normal(size=n) * 0.3, jnp.float32),
        advantage=jnp.asarray(rng.normal(size=n) + 0.3, jnp.float32),
        target=jnp.asarray(rng.normal(size=n) * target_scale, jnp.float32),
    )


def np_gae(rewards, values, next_values, terminated, dones, gamma, lam):
    """GAE over time-major `[T, B]` arrays, as a plain loop: returns `(advantages, targets)`.

    A_t = r_t + gamma (1 - terminated_t) V(s'_t) - V(s_t) + gamma lam (1 - done_t) A_{t+1}, and the
    value targets are A_t + V(s_t). A truncated step (done, not terminated) bootstraps from V(s'_t)
    but stops the trace; a terminated one does neither.
    """
    advantages, next_advantage = np.zeros_like(rewards, np.float64), np.zeros(rewards.shape[1])
    for t in reversed(range(len(rewards))):
        delta = rewards[t] + gamma * (1 - terminated[t]) * next_values[t] - values[t]
        next_advantage = delta + gamma * lam * (1 - dones[t]) * next_advantage
        advantages[t] = next_advantage
    return advantages, advantages + values


def np_log_softmax(logits):
    """log softmax over the last axis, in float64."""
    logits = np.asarray(logits, np.float64)
    shifted = logits - logits.max(-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))


def np_ppo_loss(logits, values, batch, config) -> dict:
    """The PPO loss and its metrics for a discrete policy's `logits` and `values` on `batch`, in
    float64: `{"loss/joint": ..., "loss/policy": ..., "ppo/clip_fraction": ...}`.

    The clipped surrogate of the (with `config.normalize_advantages`, normalized) advantages, plus
    `vf_coef` times the squared error to the targets, minus `ent_coef` times the entropy.
    """
    log_pi = np_log_softmax(logits)
    log_prob = log_pi[np.arange(len(log_pi)), np.asarray(batch.action)]
    adv = np.asarray(batch.advantage, np.float64)
    if config.normalize_advantages:
        adv = (adv - adv.mean()) / (adv.std() + 1e-8)
    ratio = np.exp(log_prob - np.asarray(batch.log_prob))
    eps = config.clip_eps
    policy_loss = -np.mean(np.minimum(ratio * adv, np.clip(ratio, 1 - eps, 1 + eps) * adv))
    value_loss = np.mean((np.asarray(values, np.float64) - np.asarray(batch.target)) ** 2)
    entropy = np.mean(-(np.exp(log_pi) * log_pi).sum(-1))
    return {
        "loss/joint": policy_loss + config.vf_coef * value_loss - config.ent_coef * entropy,
        "loss/policy": policy_loss,
        "loss/value": value_loss,
        "policy/entropy": entropy,
        "policy/log_prob_mean": log_prob.mean(),
        "policy/outside_box": 0.0,  # a categorical has no box
        "ppo/approx_kl": np.mean(ratio - 1 - np.log(ratio)),
        "ppo/clip_fraction": np.mean(np.abs(ratio - 1) > eps),
    }


# ----------------------------------------------------------------------------
# Every script at tiny sizes: an epoch of a few hundred steps
# ----------------------------------------------------------------------------
SCRIPTS = ["ppo_joint", "awr", "actor_critic", "reinforce", "dqn_value", "skip_transformer"]
TINY_BY_SCRIPT = {
    "ppo_joint": dict(num_envs=4, num_steps=16, num_minibatches=2, update_passes=2),
    "awr": dict(
        num_envs=4,
        num_steps=16,
        policy_steps=4,
        value_steps=4,
        policy_batch_size=32,
        value_batch_size=32,
        n_replay_epochs=2,
    ),
    "actor_critic": dict(
        num_envs=4, num_steps=16, policy_batch_size=32, value_batch_size=32, value_steps=4
    ),
    "reinforce": dict(num_envs=4, num_steps=16, batch_size=32),
    "dqn_value": dict(num_envs=4, num_steps=4, update_steps=4, batch_size=8, n_replay_epochs=3),
    "skip_transformer": dict(
        num_envs=4, num_steps=16, num_minibatches=2, update_passes=1, skip_warmup_steps=0
    ),
}
# The metrics of a PPO epoch's updates, in ppo_joint and skip_transformer alike
PPO_LOSS_KEYS = (
    "loss/joint",
    "loss/policy",
    "loss/value",
    "policy/entropy",
    "policy/log_prob_mean",
    "policy/outside_box",
    "ppo/approx_kl",
    "ppo/clip_fraction",
    "optim/grad_norm",
    "value/advantage_mean",
    "value/advantage_norm",
    "value/explained_variance",
    "policy/preferred_move",
)
# ppo_joint's command line at tiny sizes: 10 epochs of 4 envs x 32 steps, evaluated at the end
PPO_CLI_TINY = (
    "--num-envs 4 --num-steps 32 --total-steps 1280 --eval-every 0 --eval-episodes 4".split()
)
# ppo_joint at its tiny sizes as the tests of train() run it: on one device, without turning on the
# compilation cache itself (the session's serves, conftest.py). A test adds its epochs and evals.
PPO_RUN = dict(TINY_BY_SCRIPT["ppo_joint"], n_devices=1, compile_cache=False)
# What the resume tests add: 2 seeds from --seed 3, an evaluation every 3 epochs, and checkpoints
# only where a run stops (its last epoch or max_epochs).
RESUME_FLAGS = dict(
    num_seeds=2, eval_every=3, eval_episodes=2, checkpoint_every=50, compile_cache=False, seed=3
)


def quick_compile(make_trainer, config, keys):
    """`(trainer, init, epoch)` for `config`: init and epoch mapped as train() maps them (the epoch
    without donating its input, so a test may run it again from the same state) and compiled with
    XLA's backend optimisation off, as a test runs them a few times only. `init(keys)` starts the
    run."""
    trainer = make_trainer(config)
    init = devices.map_init(trainer.init).lower(keys)
    epoch = devices.map_epoch(trainer.epoch, config.n_devices, donate=False).lower(init.out_info)
    return trainer, init.compile(run.FAST_COMPILE), epoch.compile(run.FAST_COMPILE)


# ----------------------------------------------------------------------------
# A tiny ppo_joint trainer, compiled once per test process
# ----------------------------------------------------------------------------
# 4 envs x 32 steps: random CartPole episodes (about 20 steps) finish inside one epoch.
TINY = dict(num_envs=4, num_steps=32, num_minibatches=2, update_passes=2, total_steps=4 * 32 * 20)
NUM_SEEDS = 2


def tiny(**overrides) -> Config:
    return Config(**{**TINY, "n_devices": 1, **overrides})


def run_keys(seed: int, num_seeds: int = NUM_SEEDS, n_devices: int = 1):
    """The init keys `train()` builds for `--seed seed`."""
    keys, _ = sweep.run_keys(sweep.seed_input(seed), Config(num_seeds=num_seeds), n_devices)
    return keys


class Compiled:
    """A trainer with its init and epoch compiled by `map_epoch`; `traces` counts epoch traces."""

    def __init__(self, config: Config):
        self.config = config
        self.trainer = make_trainer(config)
        init = devices.map_init(self.trainer.init)  # as train() does: on one device
        # then spread over the devices as the epoch's pmap returns it (else its next call retraces)
        spread = jax.pmap(lambda state: state, axis_name=devices.DEVICE_AXIS)
        self.init = init if config.n_devices == 1 else lambda keys: spread(init(keys))
        self.traces = 0

        def epoch(state):
            self.traces += 1
            return self.trainer.epoch(state)

        self.epoch = devices.map_epoch(epoch, config.n_devices)


@functools.lru_cache(maxsize=None)
def compiled(**overrides) -> Compiled:
    return Compiled(tiny(**overrides))


@functools.lru_cache(maxsize=None)
def initial_state():
    """The tiny trainer (2 seeds, one device) and its state after init from `run_keys(0)`."""
    c = compiled()
    return c, c.init(run_keys(0))
