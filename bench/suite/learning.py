"""The long learning checks: each script's defaults at their full budget reach the task's goal.

Run with `python -m pytest -q bench/suite/learning.py` (about 25 minutes on 2 cores). CI does not run
this file: tests/test_learning.py trains every script for a short budget and asserts a return far
above a random policy's; docs/results.md has 8 seeds of every script on every task of the gymnax
suite."""

import importlib

import pytest

from common import run


def train(script, tmp_path, **flags):
    """The summary of a run of `script` with the defaults and `flags` on one device, evaluated at
    the end."""
    module = importlib.import_module(f"algos.{script}")
    config = module.Config(
        **{"seed": 0, "n_devices": 1, "eval_every": 0, "out_dir": str(tmp_path), **flags}
    )
    return run.train(config, module.make_trainer, script).summary


# ----------------------------------------------------------------------------
# CartPole-v1 at full budget: a return of 475 or more
# ----------------------------------------------------------------------------
CARTPOLE = [  # script, flags, what the mean must reach
    ("ppo_joint", {}, 475),
    ("actor_critic", dict(total_steps=200_000), 475),
    ("actor_critic", dict(loss="ppo", total_steps=200_000), 475),
    ("awr", {}, 475),
    ("reinforce", dict(baseline=True, total_steps=300_000), 400),
]


@pytest.mark.parametrize(
    "script, flags, goal",
    CARTPOLE,
    ids=[f"{s}-{'-'.join(f'{k}={v}' for k, v in f.items())}" for s, f, _ in CARTPOLE],
)
def test_cartpole_at_full_budget(tmp_path, script, flags, goal):
    summary = train(script, tmp_path, **flags)
    assert summary["eval_return"] >= goal, summary


def test_awr_headline_command_learns_cartpole_on_every_seed(tmp_path):
    """`awr.py --q-value --n-samples 4`, 8 seeds in one program: every seed reaches 475.

    Sampling K = 4 of CartPole's 2 actions left seed 9 of these stuck at return 9 (a
    near-deterministic behaviour policy gives 4 copies of one action, so every A_k is 0); K >= 2
    now enumerates the actions. With --beta 1, seed 9 stayed near 10 until 300k steps and seed 8
    fell from 500 to 130 in the last 40k (rounding differences alone moved it); --beta 2 is the
    default."""
    summary = train("awr", tmp_path, q_value=True, n_samples=4, seed=100, num_seeds=8)
    assert min(summary["eval_return_per_seed"]) >= 475, summary["eval_return_per_seed"]


def test_dqn_learns_cartpole(tmp_path):
    """The defaults, 4 seeds in one program: every seed's greedy return >= 400, their mean >= 475.
    (With the earlier defaults, lr 1e-3 and 100k steps, 3 seeds in 8 reached 475.)"""
    summary = train("dqn_value", tmp_path, env="CartPole-v1", num_seeds=4, checkpoint_every=10_000)
    assert min(summary["eval_return_per_seed"]) >= 400 and summary["eval_return"] >= 475, summary


def test_awr_learns_pendulum_with_the_defaults(tmp_path):
    summary = train("awr", tmp_path, env="Pendulum-v1", total_steps=300_000)
    assert summary["eval_return"] >= -200, summary


# ----------------------------------------------------------------------------
# Memory matters on CartPoleNoVel-v1
# ----------------------------------------------------------------------------
def test_transformer_beats_a_memoryless_policy(tmp_path):
    """Same flags and budget (the defaults: 200k steps); --context-len 1 sees only the current (x,
    theta).

    Measured at --context-len 4: seed 0 reaches 499, the memory-less net 43 (seeds 1-3 of the
    Transformer: 421, 250, 203); at 8, the default now, docs/results.md has 8 seeds of it."""
    transformer = train("skip_transformer", tmp_path / "t")
    memoryless = train("skip_transformer", tmp_path / "m", context_len=1)
    assert memoryless["eval_return"] <= 60, memoryless
    assert transformer["eval_return"] >= 300, transformer


# ----------------------------------------------------------------------------
# The defaults on other tasks of the gymnax suite
# ----------------------------------------------------------------------------
OTHER_TASKS = [  # script, its flags, task, budget, what every seed must reach
    # before --normalize-reward: 4 of 8 suite seeds at -500 (the value targets near -100 saturated
    # the shared tanh torso)
    ("ppo_joint", {}, "Acrobot-v1", 500_000, -100.0),
    # continuous actions with the same defaults (the README's Pendulum command had 6 flags more)
    ("ppo_joint", {}, "Pendulum-v1", 300_000, -200.0),
    # the headline command, K = 4 actions drawn from the recorded Gaussian: at 32 critic steps, 5 of
    # 8 seeds < -500
    ("awr", dict(q_value=True, n_samples=4), "Pendulum-v1", 300_000, -200.0),
    # exploration noise that lasts (--noise-memory): with independent noise, 0 on almost every seed
    ("awr", {}, "MountainCarContinuous-v0", 300_000, 90.0),
    ("awr", dict(q_value=True, n_samples=4), "MountainCarContinuous-v0", 300_000, 90.0),
    # the mean held in the box (--box-coef): without it 5 of 8 a2c seeds ran it out past full
    # throttle
    ("actor_critic", {}, "MountainCarContinuous-v0", 300_000, 90.0),
    # MountainCar-v0's velocity (within +-0.07) read through the observation normalization that
    # discrete actions get by default: with --no-normalize-obs, -200
    ("actor_critic", {}, "MountainCar-v0", 500_000, -118.0),
    ("actor_critic", dict(loss="ppo"), "MountainCar-v0", 500_000, -118.0),
    ("ppo_joint", {}, "MountainCar-v0", 500_000, -118.0),
    # a2c's one policy step per epoch must go far: at --policy-lr 2.5e-3 (128-step rollouts), 0.44
    # to 1
    (
        "actor_critic",
        {},
        "Catch-bsuite",
        100_000,
        0.99,
    ),
    # --context-len 8 sees the cue (4: about 0)
    (
        "skip_transformer",
        {},
        "MemoryChain-bsuite",
        150_000,
        0.99,
    ),
    # image observations through the conv torso (--torso auto); a uniformly random policy scores
    # 0.2-0.7
    ("ppo_joint", {}, "Breakout-MinAtar", 100_000, 3.0),
]


@pytest.mark.parametrize(
    "script, flags, task, budget, goal",
    OTHER_TASKS,
    ids=[f"{s}-{'-'.join(f)}-{t}" if f else f"{s}-{t}" for s, f, t, _, _ in OTHER_TASKS],
)
def test_defaults_learn_another_task_on_every_seed(tmp_path, script, flags, task, budget, goal):
    """The script's defaults with only the task (and its suite budget) given, 2 seeds in one
    program."""
    summary = train(script, tmp_path, **flags, env=task, total_steps=budget, num_seeds=2)
    assert min(summary["eval_return_per_seed"]) >= goal, summary["eval_return_per_seed"]
