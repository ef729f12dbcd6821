"""algos/ppo_joint.py: GAE, the PPO loss, the compiled epoch, seeding, devices and bad input.

Sizes are tiny (CartPole-v1, 4 envs x 32 steps, `helpers.tiny`) so that each test takes a few
seconds once its program is compiled; compiled trainers are shared through `helpers.compiled`.
The checkpoint tests are in test_checkpoints.py, resume and divergence in test_run.py.
"""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from gymnax.environments import spaces

from algos import ppo_joint
from algos.ppo_joint import Batch, Config, gae, make_trainer, ppo_loss
from common import devices
from common.distributions import make_distribution
from helpers import (
    NUM_SEEDS,
    PPO_LOSS_KEYS,
    TINY,
    compiled,
    host,
    np_ppo_loss,
    quick_compile,
    random_batch,
    run_keys,
    tiny,
)


def assert_trees_differ(a, b):
    """Every leaf differs somewhere (catches a key shared by accident)."""
    for path, x, y in zip(
        jax.tree_util.tree_flatten_with_path(a)[0], jax.tree.leaves(a), jax.tree.leaves(b)
    ):
        assert not np.array_equal(x, y), f"leaf {jax.tree_util.keystr(path[0])} is identical"


EPISODE_KEYS = ("episode/return", "episode/length", "episode/count")


# ----------------------------------------------------------------------------
# GAE against plain NumPy loops
# ----------------------------------------------------------------------------
def np_gae(rewards, values, next_values, terminated, truncated, gamma, lam):
    """A_t = sum_l (gamma lam)^l delta_{t+l}, summed forward up to the first end at or after t."""
    T, B = rewards.shape
    done = terminated | truncated
    delta = rewards + gamma * np.where(terminated, 0.0, next_values) - values
    adv = np.zeros((T, B))
    for b in range(B):
        for t in range(T):
            weight = 1.0
            for u in range(t, T):
                adv[t, b] += weight * delta[u, b]
                if done[u, b]:
                    break
                weight *= gamma * lam
    return adv


def np_discounted_return(rewards, next_values, terminated, truncated, gamma):
    """G_t: rewards to the episode's end; bootstrap V(s') at a truncation and at the rollout's
    end."""
    T, B = rewards.shape
    G = np.zeros((T, B))
    for b in range(B):
        for t in range(T):
            discount = 1.0
            for u in range(t, T):
                G[t, b] += discount * rewards[u, b]
                discount *= gamma
                if terminated[u, b]:
                    break
                if truncated[u, b] or u == T - 1:
                    G[t, b] += discount * next_values[u, b]
                    break
    return G


def rollout_data(seed=0, T=24, B=6):
    """Random `[T, B]` data shaped like a rollout: next_values[t] = values[t+1] unless the episode
    ended."""
    rng = np.random.default_rng(seed)
    all_values = rng.normal(size=(T + 1, B))
    values, next_values = all_values[:-1], all_values[1:].copy()
    terminated = rng.random((T, B)) < 0.12
    truncated = rng.random((T, B)) < 0.12
    terminated[5, 0] = truncated[5, 0] = True  # both at once: terminated wins, no bootstrap
    done = terminated | truncated
    # V(final observation), not V(reset observation)
    next_values[done] = rng.normal(size=done.sum()) * 3
    rewards = rng.normal(size=(T, B))
    assert (terminated[:-1] & ~truncated[:-1]).sum() >= 3 and (
        truncated[:-1] & ~terminated[:-1]
    ).sum() >= 3
    assert not done[-1].all()
    return tuple(x.astype(np.float32) for x in (rewards, values, next_values)) + (
        terminated,
        truncated,
    )


class GaeTest(chex.TestCase):
    def _gae(self, data, gamma, lam):
        rewards, values, next_values, terminated, truncated = data
        fn = self.variant(functools.partial(gae, gamma=gamma, lam=lam))
        adv, targets = fn(
            jnp.asarray(rewards),
            jnp.asarray(values),
            jnp.asarray(next_values),
            jnp.asarray(terminated),
            jnp.asarray(terminated | truncated),
        )
        chex.assert_shape([adv, targets], rewards.shape)
        np.testing.assert_allclose(targets, np.asarray(adv) + values, rtol=1e-5, atol=1e-5)
        return np.asarray(adv, np.float64)

    @chex.variants(with_jit=True, without_jit=True)
    def test_gae_matches_numpy_loop(self):
        for seed, gamma, lam in [(0, 0.99, 0.95), (1, 0.9, 0.5), (2, 0.97, 0.8)]:
            data = rollout_data(seed)
            np.testing.assert_allclose(
                self._gae(data, gamma, lam), np_gae(*data, gamma, lam), rtol=1e-4, atol=1e-4
            )

    @chex.variants(with_jit=True, without_jit=True)
    def test_lambda_one_is_monte_carlo(self):
        rewards, values, next_values, terminated, truncated = data = rollout_data(3)
        mc = np_discounted_return(rewards, next_values, terminated, truncated, 0.95) - values
        np.testing.assert_allclose(self._gae(data, 0.95, 1.0), mc, rtol=1e-4, atol=1e-4)

    @chex.variants(with_jit=True, without_jit=True)
    def test_lambda_zero_is_td0(self):
        rewards, values, next_values, terminated, truncated = data = rollout_data(4)
        td0 = rewards + 0.9 * (1.0 - terminated) * next_values - values
        np.testing.assert_allclose(self._gae(data, 0.9, 0.0), td0, rtol=1e-5, atol=1e-5)

    @chex.variants(with_jit=True, without_jit=True)
    def test_truncation_bootstraps_termination_does_not(self):
        # T = 2; env 0 terminates at t = 0, env 1 is truncated at t = 0, env 2 runs on.
        # gamma = 0.5, lambda = 0.5; V(s_0) = 1, V(final obs of step 0) = 4, V(s_1) = 2,
        # V(s_2) = 3 (rollout end); r_0 = 1, r_1 = 10.
        rewards = np.array([[1.0, 1.0, 1.0], [10.0, 10.0, 10.0]], np.float32)
        values = np.array([[1.0, 1.0, 1.0], [2.0, 2.0, 2.0]], np.float32)
        next_values = np.array([[4.0, 4.0, 2.0], [3.0, 3.0, 3.0]], np.float32)
        terminated = np.array([[True, False, False], [False, False, False]])
        truncated = np.array([[False, True, False], [False, False, False]])
        adv = self._gae((rewards, values, next_values, terminated, truncated), 0.5, 0.5)
        # t = 1: 10 + 0.5 * 3 - 2 = 9.5 everywhere t = 0: terminated 1 - 1 = 0; truncated 1 + 0.5 *
        # 4 - 1 = 2 (and nothing of t = 1 leaks in);
        #        running 1 + 0.5 * 2 - 1 + 0.25 * 9.5 = 3.375
        np.testing.assert_allclose(adv, [[0.0, 2.0, 3.375], [9.5, 9.5, 9.5]], rtol=1e-6)


def test_gae_checks_ranks():
    x = jnp.zeros((5,))
    with pytest.raises(AssertionError):
        gae(x, x, x, x, x, 0.99, 0.95)


# ----------------------------------------------------------------------------
# The PPO loss against a NumPy reference
# ----------------------------------------------------------------------------
@pytest.mark.parametrize("normalize", [False, True])
def test_ppo_loss_matches_numpy(normalize):
    dist = make_distribution(spaces.Discrete(2))
    config = tiny(
        normalize_advantages=normalize, clip_eps=0.1, vf_coef=0.7, ent_coef=0.05
    ).resolved()
    params = ppo_joint.init_network(jax.random.PRNGKey(0), 4, config.hidden, dist)
    # a larger policy head, so the probabilities move away from uniform
    params["policy"]["w"] = params["policy"]["w"] * 100
    batch = random_batch(Batch, 0, 64)
    loss, metrics = ppo_loss(params, batch, dist, config)

    logits, values = jax.vmap(ppo_joint.network, (None, 0, None, None))(
        params, batch.obs, dist, "tanh"
    )
    expected = np_ppo_loss(logits, values, batch, config)
    assert expected["ppo/clip_fraction"] > 0.2  # the clip is exercised
    np.testing.assert_allclose(loss, expected["loss/joint"], rtol=1e-4)
    for key, value in expected.items():
        np.testing.assert_allclose(metrics[key], value, rtol=1e-4, atol=1e-6, err_msg=key)


# ----------------------------------------------------------------------------
# The epoch
# ----------------------------------------------------------------------------
def check_metrics(metrics, lead_shape):
    for key in PPO_LOSS_KEYS + EPISODE_KEYS:
        assert key in metrics, key
    for key, value in metrics.items():
        chex.assert_shape(value, lead_shape)
    for key in PPO_LOSS_KEYS:
        assert np.all(np.isfinite(metrics[key])), key
    count = np.asarray(metrics["episode/count"])
    assert np.all(count > 0), "choose sizes so that episodes finish in one epoch"
    for key in EPISODE_KEYS:
        assert np.all(np.isfinite(metrics[key])), key
    assert np.all(np.asarray(metrics["episode/length"]) >= 8)  # CartPole cannot fall sooner
    # reward 1 per step
    np.testing.assert_allclose(metrics["episode/return"], metrics["episode/length"])


class EpochVariantsTest(chex.TestCase):
    """The per-(device, seed) epoch with and without jit, on one device and two seeds."""

    @chex.variants(with_jit=True, without_jit=True)
    def test_epoch_metrics_and_shapes(self):
        c = compiled()
        state = c.init(run_keys(0))
        epoch = self.variant(jax.vmap(jax.vmap(c.trainer.epoch), axis_name=devices.DEVICE_AXIS))
        new_state, metrics = epoch(state)
        chex.assert_trees_all_equal_shapes_and_dtypes(new_state, state)
        check_metrics(metrics, (1, NUM_SEEDS))
        # a fresh policy is near uniform: episodes last as a random policy's (about 22 steps), not
        # as one repeated action's (about 9), which is what exploration keys reused across steps
        # give
        assert np.all(np.asarray(metrics["episode/length"]) > 14), metrics["episode/length"]
        # the update happened: every parameter moved, Adam counted every minibatch step
        assert_trees_differ(new_state.params, state.params)
        counts = [x for x in jax.tree.leaves(new_state.opt_state) if x.dtype == jnp.int32]
        assert counts and all(
            np.all(np.asarray(x) == TINY["update_passes"] * TINY["num_minibatches"]) for x in counts
        )
        assert not np.array_equal(new_state.key, state.key)


@pytest.mark.parametrize("n_devices, num_seeds", [(1, NUM_SEEDS), (2, NUM_SEEDS)])
def test_compiled_epoch_is_traced_once(n_devices, num_seeds):
    c = compiled(n_devices=n_devices)
    chex.clear_trace_counter()
    epoch = devices.map_epoch(chex.assert_max_traces(c.trainer.epoch, n=1), n_devices)
    state = c.init(run_keys(0, num_seeds, n_devices))
    shapes = jax.eval_shape(lambda s: s, state)
    for _ in range(4):
        state, metrics = epoch(state)
        check_metrics(host(metrics), (n_devices, num_seeds))
    chex.assert_trees_all_equal_shapes_and_dtypes(state, shapes)
    # the runner state comes back exactly as it went in (dtype and weak type), so no retrace
    assert jax.tree.map(lambda s: s.weak_type, jax.eval_shape(lambda s: s, state)) == jax.tree.map(
        lambda s: s.weak_type, shapes
    )


@pytest.mark.parametrize(
    "env, by_torso",
    [
        ("CartPole-v1", dict(lr=2.5e-3, ent_coef=0.01, activation="tanh")),
        pytest.param(  # the conv torso
            "Breakout-MinAtar",
            dict(lr=1e-3, ent_coef=0.02, activation="relu"),
            marks=pytest.mark.slow,
        ),
    ],
)
def test_flags_unset_are_the_values_of_the_torso(env, by_torso):
    """`--lr`, `--ent-coef` and `--activation` unset (the defaults) train as the values the docs
    give for the network's torso do."""
    resolved = tiny(env=env).resolved()
    assert {name: getattr(resolved, name) for name in by_torso} == by_torso
    keys = run_keys(0, 1)
    states = []
    for given in ({}, by_torso):
        config = tiny(env=env, num_seeds=1, **given)
        _, init, epoch = quick_compile(make_trainer, config, keys)
        states.append(epoch(init(keys))[0].params)
    chex.assert_trees_all_equal(*states)


@pytest.mark.parametrize("env", ["CartPole-v1", "Pendulum-v1"])  # Pendulum's reset is weak-typed
def test_runner_state_types_are_stable(env):
    """epoch(state) returns leaves of the same shape, dtype AND weak type, so a jitted epoch never
    retraces."""
    trainer = make_trainer(tiny(env=env))
    state = jax.eval_shape(devices.map_init(trainer.init), run_keys(0))
    after, _ = jax.eval_shape(devices.map_epoch(trainer.epoch, 1), state)
    changed = [
        f"{jax.tree_util.keystr(path)}: {a} -> {b}"
        for (path, a), b in zip(
            jax.tree_util.tree_flatten_with_path(state)[0], jax.tree.leaves(after)
        )
        if (a.shape, a.dtype, a.weak_type) != (b.shape, b.dtype, b.weak_type)
    ]
    assert jax.tree.structure(state) == jax.tree.structure(after)
    assert not changed, "\n".join(changed)


def test_same_seed_same_run():
    c = compiled()
    a, b = c.init(run_keys(5)), c.init(run_keys(5))
    chex.assert_trees_all_equal(host(a), host(b))
    for _ in range(2):
        a, metrics_a = c.epoch(a)
        b, metrics_b = c.epoch(b)
        chex.assert_trees_all_equal(host(a), host(b))
        chex.assert_trees_all_equal(host(metrics_a), host(metrics_b))


def test_different_seeds_differ_in_params_and_trajectories():
    c = compiled()
    a, b = c.init(run_keys(0)), c.init(run_keys(1))

    def weights(s):
        return [layer["w"] for layer in s.params["torso"]] + [
            s.params["policy"]["w"],
            s.params["value"]["w"],
        ]

    assert_trees_differ(host(weights(a)), host(weights(b)))  # biases start at zero for every seed
    assert not np.array_equal(a.obs, b.obs)
    # the seeds of one program differ from each other too
    assert not np.array_equal(a.params["torso"][0]["w"][0, 0], a.params["torso"][0]["w"][0, 1])
    assert not np.array_equal(a.obs[0, 0], a.obs[0, 1])
    for _ in range(2):
        a, metrics_a = c.epoch(a)
        b, metrics_b = c.epoch(b)
        seed0, seed1 = (jax.tree.map(lambda v, i=i: v[:, i], a) for i in range(2))
        for x, y in ((a, b), (seed0, seed1)):  # across runs, and across the seeds of one run
            assert not np.array_equal(x.obs, y.obs)
            assert not np.array_equal(x.env_state.x, y.env_state.x)
            assert not np.array_equal(x.key, y.key)
            assert_trees_differ(host(x.params), host(y.params))
        assert not np.array_equal(metrics_a["loss/joint"], metrics_b["loss/joint"])


@pytest.mark.parametrize("std", ["param", "network"])
def test_pendulum_epoch(std):
    c = compiled(env="Pendulum-v1", num_steps=16, update_passes=1, std=std)
    state = c.init(run_keys(0))
    before = host(state.params)
    assert ("log_std" in before["policy"]) == (std == "param")
    for _ in range(2):
        state, metrics = c.epoch(state)
    metrics = host(metrics)
    for key in PPO_LOSS_KEYS:
        assert np.all(np.isfinite(metrics[key])), key
    assert_trees_differ(host(state.params), before)
    chex.assert_shape(state.obs, (1, NUM_SEEDS, 4, 3))
    # Gaussian entropy of a 1-d action, std near 1 at initialisation: 0.5 log(2 pi e) = 1.419
    np.testing.assert_allclose(metrics["policy/entropy"], 1.419, atol=0.2)


# ----------------------------------------------------------------------------
# Several devices
# ----------------------------------------------------------------------------
def test_pmean_of_half_batch_gradients_equals_full_batch_step():
    dist = make_distribution(spaces.Discrete(2))
    config = tiny().resolved()
    params = ppo_joint.init_network(jax.random.PRNGKey(1), 4, config.hidden, dist)
    batch = random_batch(Batch, 1, 64)
    tx = optax.chain(optax.clip_by_global_norm(0.5), optax.adam(1e-3, eps=1e-5))

    def step(params_and_batch):  # one (device, seed) slice: gradient averaged over the device axis
        params, batch = params_and_batch
        grads, _ = jax.grad(ppo_loss, has_aux=True)(params, batch, dist, config)
        grads = jax.lax.pmean(grads, devices.DEVICE_AXIS)
        updates, _ = tx.update(grads, tx.init(params), params)
        return grads, optax.apply_updates(params, updates)

    add_axes = lambda n: lambda x: jnp.broadcast_to(x, (n, 1) + x.shape)  # noqa: E731  [D, seeds, ...]
    halves = jax.tree.map(lambda x: x.reshape((2, 1, 32) + x.shape[1:]), batch)
    grads2, params2 = devices.map_epoch(step, 2, donate=False)(
        (jax.tree.map(add_axes(2), params), halves)
    )
    grads1, params1 = devices.map_epoch(step, 1, donate=False)(
        (jax.tree.map(add_axes(1), params), jax.tree.map(lambda x: x[None, None], batch))
    )
    assert len(grads2["torso"][0]["w"].sharding.device_set) == 2  # really on two devices
    device = lambda tree, i: jax.tree.map(lambda x: x[i, 0], host(tree))  # noqa: E731
    chex.assert_trees_all_equal(device(grads2, 0), device(grads2, 1))
    chex.assert_trees_all_close(device(grads2, 0), device(grads1, 0), rtol=1e-5, atol=1e-6)
    chex.assert_trees_all_close(device(params2, 0), device(params1, 0), rtol=1e-5, atol=1e-6)
    # the halves alone give other gradients: the average is what makes them agree
    half, _ = jax.grad(ppo_loss, has_aux=True)(
        params, jax.tree.map(lambda x: x[:32], batch), dist, config
    )
    assert not np.allclose(half["torso"][0]["w"], grads1["torso"][0]["w"][0, 0], rtol=1e-3)


def test_two_device_epoch_keeps_devices_in_sync():
    c = compiled(n_devices=2)
    state = c.init(run_keys(0, n_devices=2))
    chex.assert_shape(state.obs, (2, NUM_SEEDS, 2, 4))  # the 4 envs split over 2 devices
    # parameters are initialised from the seed key alone: the same as on one device
    one = compiled().init(run_keys(0, n_devices=1))
    chex.assert_trees_all_equal(
        jax.tree.map(lambda x: x[0], host(state.params)),
        jax.tree.map(lambda x: x[0], host(one.params)),
    )
    for _ in range(3):
        state, metrics = c.epoch(state)
    assert c.traces == 1
    state, metrics = host(state), host(metrics)
    first, second = (jax.tree.map(lambda x, i=i: x[i], state) for i in range(2))
    chex.assert_trees_all_equal(first.params, second.params)
    chex.assert_trees_all_equal(first.opt_state, second.opt_state)
    assert not np.array_equal(first.obs, second.obs)  # devices explore differently
    assert not np.array_equal(first.key, second.key)
    chex.assert_trees_all_equal(*(jax.tree.map(lambda x, i=i: x[i], metrics) for i in range(2)))
    for key in PPO_LOSS_KEYS:
        assert np.all(np.isfinite(metrics[key])), key
    assert np.all(metrics["episode/count"] > 0)


@pytest.mark.parametrize(
    "overrides, match",
    [
        (dict(num_steps=8, num_minibatches=3), r"--num-minibatches 3 .* 4 envs x 8 steps = 32"),
        (
            dict(num_envs=4, num_steps=3, num_minibatches=4, n_devices=2),
            r"--num-minibatches 4 .*per-device .* = 6",
        ),
        (dict(env="CartPole-v7"), r"--env 'CartPole-v7'.*CartPole-v1"),
        (dict(env="NoSuchEnv-v0"), r"--env 'NoSuchEnv-v0'"),
        (dict(std="network"), r"--std network.*2 discrete"),
    ],
)
def test_bad_input_rejected_by_make_trainer(overrides, match):
    config = tiny(**overrides)  # valid on its own; only the environment or the devices reject it
    with pytest.raises(ValueError, match=match):
        make_trainer(config)


@pytest.mark.parametrize(
    "overrides, match",
    [
        (dict(num_envs=0), "--num-envs"),
        (dict(num_minibatches=0), "--num-minibatches"),
        (dict(update_passes=0), "--update-passes"),
        (dict(lr=0.0), "--lr 0.0"),
        (dict(gae_lambda=-0.1), "--gae-lambda -0.1"),
        (dict(hidden=()), "--hidden"),
        (dict(num_seeds=0), "--num-seeds 0"),
        (dict(n_devices=-1), "--n-devices -1"),
        (dict(total_steps=0), "--total-steps 0"),
        (dict(eval_only=True), "--eval-only needs --resume"),
    ],
)
def test_bad_input_rejected_by_config(overrides, match):
    with pytest.raises(ValueError, match=match):
        Config(**{**TINY, **overrides})


def test_make_trainer_defaults_to_every_local_device():
    trainer = make_trainer(Config())  # --n-devices 0: all local devices (2 forced here)
    assert trainer.steps_per_epoch == Config().num_envs * Config().num_steps
    with pytest.raises(ValueError, match="not divisible by --n-devices 2"):
        make_trainer(Config(num_envs=3))
