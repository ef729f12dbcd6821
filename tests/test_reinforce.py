"""algos/reinforce.py: the loss, the compiled epoch, devices, bad input, CLI (learning:
tests/test_learning.py).

The returns and the baseline are tested in tests/test_estimators.py. Sizes are
tiny (CartPole-v1, 4 envs x 32 steps).
"""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gymnax.environments import spaces

from algos import reinforce
from algos.reinforce import Batch, Config, make_trainer, reinforce_loss
from common import devices, envs, run
from common.distributions import make_distribution
from helpers import NUM_SEEDS, host, quick_compile, run_keys, run_outputs, run_script


TINY = dict(
    num_envs=4, num_steps=32, batch_size=64, update_steps=2, total_steps=4 * 32 * 20, baseline=True
)


def tiny(**overrides) -> Config:
    return Config(**{**TINY, "n_devices": 1, **overrides})


@functools.lru_cache(maxsize=None)
def compiled(**overrides):
    """`(config, init, epoch)` of the tiny config with `overrides` (`helpers.quick_compile`)."""
    config = tiny(**overrides)
    _, init, epoch = quick_compile(make_trainer, config, run_keys(0, n_devices=config.n_devices))
    return config, init, epoch


def test_loss_matches_numpy():
    dist = make_distribution(spaces.Discrete(3))
    params = reinforce.init_network(jax.random.PRNGKey(0), 4, (16, 8), dist)
    params["head"]["w"] = params["head"]["w"] * 100  # probabilities well away from uniform
    rng = np.random.default_rng(0)
    batch = Batch(
        obs=jnp.asarray(rng.normal(size=(50, 4)), jnp.float32),
        action=jnp.asarray(rng.integers(0, 3, size=50), jnp.int32),
        log_prob=jnp.asarray(np.log(1 / 3) + rng.normal(size=50) * 0.3, jnp.float32),
        weight=jnp.asarray(rng.normal(size=50) * 10, jnp.float32),
    )
    config = Config(activation="relu")
    loss, metrics = jax.jit(reinforce_loss, static_argnums=(2, 3))(params, batch, dist, config)

    x = np.asarray(batch.obs, np.float64)
    for layer in params["torso"]:
        x = np.maximum(x @ np.asarray(layer["w"]) + np.asarray(layer["b"]), 0)
    logits = x @ np.asarray(params["head"]["w"]) + np.asarray(params["head"]["b"])
    log_pi = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    log_prob = log_pi[np.arange(50), np.asarray(batch.action)]
    ratio = np.exp(log_prob - np.asarray(batch.log_prob))
    expected = {
        "loss/policy": -np.mean(np.asarray(batch.weight) * log_prob),
        "policy/entropy": np.mean(-(np.exp(log_pi) * log_pi).sum(-1)),
        "policy/log_prob_mean": log_prob.mean(),
        "reinforce/approx_kl": np.mean(ratio - 1 - np.log(ratio)),
        "policy/outside_box": 0.0,  # a categorical has no box
    }
    assert set(metrics) == set(expected)
    np.testing.assert_allclose(loss, expected["loss/policy"], rtol=1e-4)
    for key, value in expected.items():
        np.testing.assert_allclose(metrics[key], value, rtol=1e-4, atol=1e-6, err_msg=key)


KEYS = (
    "loss/policy",
    "policy/entropy",
    "policy/log_prob_mean",
    "policy/outside_box",
    "policy/preferred_move",
    "reinforce/approx_kl",
    "reinforce/return_mean",
    "optim/grad_norm",
    "episode/return",
    "episode/length",
    "episode/count",
)


def test_epoch():
    config, init, epoch = compiled()
    state = init(run_keys(0))
    new_state, metrics = host(epoch(state))
    assert set(metrics) == set(KEYS)
    for key, value in metrics.items():
        chex.assert_shape(value, (1, NUM_SEEDS))
        assert np.all(np.isfinite(value)), key
    assert np.all(metrics["episode/count"] > 0)
    # reward 1 per step
    np.testing.assert_allclose(metrics["episode/return"], metrics["episode/length"])
    # returns of about 20-step random episodes, cut by the rollout's end: well above 1, below 1 / (1
    # - gamma)
    assert np.all((metrics["reinforce/return_mean"] > 3) & (metrics["reinforce/return_mean"] < 20))
    assert np.all(metrics["reinforce/approx_kl"] > 0)  # the second step sees a moved policy
    for x, y in zip(jax.tree.leaves(host(state.params)), jax.tree.leaves(new_state.params)):
        assert not np.array_equal(x, y)
    counts = [x for x in jax.tree.leaves(new_state.opt_state) if x.dtype == np.int32]
    assert counts and all(np.all(x == config.update_steps) for x in counts)
    again, _ = host(epoch(state))
    chex.assert_trees_all_equal(again, new_state)
    seed0, seed1 = (jax.tree.map(lambda x, i=i: x[:, i], new_state) for i in range(2))
    assert not np.array_equal(seed0.obs, seed1.obs)
    assert not np.array_equal(seed0.params["torso"][0]["w"], seed1.params["torso"][0]["w"])


def test_one_state_type_with_or_without_normalize_obs():
    """--normalize-obs fills the state's `obs_stats` field; without it the field is None (no arrays,
    so the program is the one without the field), and `policy(state)` hands `act` the parameters and
    that field."""
    states = {}
    for flag in (False, True):
        trainer = make_trainer(tiny(normalize_obs=flag))
        state = states[flag] = jax.eval_shape(devices.map_init(trainer.init), run_keys(0))
        assert type(state) is reinforce.RunnerState and (state.obs_stats is None) == (not flag)
        policy = trainer.policy(state)
        assert (
            type(policy) is envs.Policy
            and policy.params is state.params
            and policy.obs_stats is state.obs_stats
        )
    assert len(jax.tree.leaves(states[True])) == len(jax.tree.leaves(states[False])) + len(
        envs.ObsStats._fields
    )


def test_two_device_pendulum_epoch_keeps_devices_in_sync():
    _, init, epoch = compiled(env="Pendulum-v1", num_steps=16, n_devices=2)
    state = init(run_keys(0, n_devices=2))
    chex.assert_shape(state.obs, (2, NUM_SEEDS, 2, 3))  # the 4 envs split over 2 devices
    state, metrics = host(epoch(state))
    # 0.5 log(2 pi e), std 1
    np.testing.assert_allclose(metrics["policy/entropy"], 1.419, atol=0.05)
    state, metrics = host(epoch(state))
    first, second = (jax.tree.map(lambda x, i=i: x[i], state) for i in range(2))
    chex.assert_trees_all_equal(first.params, second.params)
    chex.assert_trees_all_equal(first.opt_state, second.opt_state)
    assert not np.array_equal(first.obs, second.obs)  # devices explore differently
    chex.assert_trees_all_equal(*(jax.tree.map(lambda x, i=i: x[i], metrics) for i in range(2)))
    # Pendulum pays -16.3 at worst per step: returns of 16 steps or fewer are negative and above
    # -16.3 * 16
    assert np.all(
        (metrics["reinforce/return_mean"] < 0) & (metrics["reinforce/return_mean"] > -16.3 * 16)
    )


@pytest.mark.parametrize(
    "overrides, match",
    [
        (dict(update_steps=0), "--update-steps must be at least 1"),
        (dict(lr=-1.0), "--lr -1.0: use a positive"),
        (dict(gamma=2.0), "--gamma 2.0"),
        (dict(hidden=(0,)), "--hidden"),
    ],
)
def test_bad_config_is_rejected(overrides, match):
    with pytest.raises(ValueError, match=match):
        Config(**{**TINY, **overrides})


@pytest.mark.parametrize(
    "overrides, match",
    [
        (dict(batch_size=129), r"--batch-size 129: .* at most 4 envs x 32 steps = 128"),
        (dict(batch_size=63, n_devices=2), r"--batch-size 63: use a multiple of --n-devices 2"),
        (dict(std="network"), r"--std network.*discrete"),
        (dict(env="Catch"), r"--env 'Catch'.*Catch-bsuite"),
    ],
)
def test_bad_input_rejected_before_compiling(overrides, match, tmp_path):
    with pytest.raises(ValueError, match=match):
        run.train(tiny(**overrides, out_dir=str(tmp_path / "run")), make_trainer)
    assert not (tmp_path / "run").exists()


@pytest.mark.slow  # about 15-35 s: import, then a full compile in a fresh process
def test_cli_writes_outputs(tmp_path):
    out_dir = tmp_path / "run"
    out = run_script(
        "reinforce",
        "--num-envs",
        4,
        "--num-steps",
        32,
        "--batch-size",
        128,
        "--total-steps",
        256,
        "--num-seeds",
        2,
        "--baseline",
        "--eval-episodes",
        2,
        "--out-dir",
        out_dir,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "eval return" in out.stdout
    config, lines, summary = run_outputs(out_dir)
    assert config["baseline"] is True and config["num_seeds"] == 2
    assert len(lines) == 2 and summary["env_steps"] == 256
    assert "reinforce/return_mean" in lines[-1]
