"""algos/dqn_value.py: n-step targets, double DQN, the loss, the ring buffer, the
epsilon schedule, target syncs, the compiled epoch, devices, resume, bad input,
the command line (learning: tests/test_learning.py).

Sizes are tiny (CartPole-v1, 4 envs x 8 steps, 4 gradient steps per epoch) so
that each test takes a few seconds once its program is compiled; programs are
shared through a module-level cache and the session's persistent compilation
cache (tests/conftest.py).
"""

import functools
from unittest import mock

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from algos import dqn_value
from algos.dqn_value import (
    Batch,
    Config,
    Transition,
    bootstrap_value,
    dqn_loss,
    epsilon_schedule,
    init_replay,
    make_trainer,
    n_step_return,
    replay_push,
    sample_batch,
    td_loss,
)
from common import checkpoints, devices, envs, run
from helpers import RESUME_FLAGS, command, host, run_keys, run_outputs, run_script


# epsilon 1 in the first epoch (random actions), then 1e-30, then 0: greedy from the second epoch on
TINY = dict(
    num_envs=4,
    num_steps=8,
    update_steps=4,
    batch_size=16,
    n_replay_epochs=3,
    n_step=3,
    sync_freq=6,
    eps_decay=1e-30,
    eps_min=0.0,
    total_steps=4 * 8 * 20,
)
TIME_LIMIT = 12  # random CartPole episodes last 8 to ~40 steps: some terminate, some are truncated
NUM_SEEDS = 2


def tiny(**overrides) -> Config:
    return Config(**{**TINY, "n_devices": 1, **overrides})


class Compiled:
    """A trainer on CartPole-v1 cut at TIME_LIMIT steps, with its init and epoch compiled as train()
    does."""

    def __init__(self, config: Config):
        make_env = envs.make_env

        def time_limited(env_id, **kwargs):
            env, params = make_env(env_id, **kwargs)
            return env, params.replace(max_steps_in_episode=TIME_LIMIT)

        with mock.patch.object(envs, "make_env", time_limited):
            self.trainer = make_trainer(config)
        assert self.trainer.env_params.max_steps_in_episode == TIME_LIMIT
        self.init = devices.map_init(self.trainer.init)
        self.epoch = devices.map_epoch(self.trainer.epoch, config.n_devices)


@functools.lru_cache(maxsize=None)
def compiled(**overrides) -> Compiled:
    return Compiled(tiny(**overrides))


# ----------------------------------------------------------------------------
# n-step targets against a NumPy loop
# ----------------------------------------------------------------------------
def np_n_step(rewards, terminated, cut, gamma):
    """Walks each window: add gamma^k r_k until a cut or the window's end; bootstrap unless
    terminated."""
    N, n = rewards.shape
    returns, discount, last = np.zeros(N), np.zeros(N), np.zeros(N, int)
    for i in range(N):
        weight = 1.0
        for k in range(n):
            returns[i] += weight * rewards[i, k]
            weight *= gamma
            if cut[i, k] or k == n - 1:
                last[i], discount[i] = k, 0.0 if terminated[i, k] else weight
                break
    return returns, discount, last


@pytest.mark.parametrize("seed, n, gamma", [(0, 1, 0.99), (1, 3, 0.9), (2, 5, 0.5), (3, 8, 0.97)])
def test_n_step_return_matches_numpy_loop(seed, n, gamma):
    rng = np.random.default_rng(seed)
    N = 64
    rewards = rng.normal(size=(N, n)).astype(np.float32)
    terminated = rng.random((N, n)) < 0.15
    truncated = rng.random((N, n)) < 0.15
    head = rng.random((N, n)) < 0.05  # the newest stored step
    cut = terminated | truncated | head
    if n > 1:  # ends inside windows, of both kinds
        assert (terminated[:, :-1] & ~truncated[:, :-1]).any() and (
            truncated[:, :-1] & ~terminated[:, :-1]
        ).any()
    got = jax.jit(functools.partial(n_step_return, gamma=gamma))(rewards, terminated, cut)
    want = np_n_step(rewards, terminated, cut, gamma)
    np.testing.assert_allclose(got.returns, want[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got.discount, want[1], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(got.last, want[2])


def test_n_step_return_by_hand():
    # gamma 0.5, n 3, rewards 1, 2, 4 in every window
    rewards = np.tile(np.float32([1, 2, 4]), (4, 1))
    terminated = np.array([[0, 0, 0], [0, 1, 0], [0, 0, 0], [1, 0, 0]], bool)
    truncated = np.array([[0, 0, 0], [0, 0, 0], [1, 0, 0], [1, 0, 0]], bool)
    returns, discount, last = n_step_return(rewards, terminated, terminated | truncated, 0.5)
    # no end: 1 + 0.5 * 2 + 0.25 * 4 = 3, bootstrap gamma^3 from the third step's next observation
    # terminated at the 2nd step: 1 + 1 = 2, no bootstrap (nothing of the 3rd step leaks in)
    # truncated (time limit) at the 1st: 1, bootstrap gamma^1 from the final observation
    # terminated and truncated at once: termination wins
    np.testing.assert_allclose(returns, [3.0, 2.0, 1.0, 1.0])
    np.testing.assert_allclose(discount, [0.125, 0.0, 0.5, 0.0])
    np.testing.assert_array_equal(last, [2, 1, 0, 0])
    with pytest.raises(AssertionError):
        n_step_return(rewards[0], terminated[0], terminated[0], 0.5)


def test_double_dqn_takes_the_online_argmax():
    q_target = jnp.array([[1.0, 5.0, 3.0], [2.0, 0.0, 7.0]])
    q_online = jnp.array([[9.0, 0.0, 1.0], [0.0, 4.0, 3.0]])
    np.testing.assert_allclose(bootstrap_value(q_target, q_online, double=True), [1.0, 0.0])
    np.testing.assert_allclose(bootstrap_value(q_target, q_online, double=False), [5.0, 7.0])


def test_td_loss_by_hand():
    q, y = jnp.array([0.0, 0.0, 0.0]), jnp.array([0.5, -2.0, 3.0])
    np.testing.assert_allclose(td_loss(q, y, "l2"), (0.25 + 4 + 9) / 3)
    np.testing.assert_allclose(td_loss(q, y, "huber"), (0.125 + 1.5 + 2.5) / 3)


def test_epsilon_schedule():
    epochs = np.array([0, 1, 10, 100, 229, 230, 1000])
    want = np.maximum(0.1, 1.0 * 0.99**epochs)
    np.testing.assert_allclose(epsilon_schedule(epochs, 1.0, 0.99, 0.1), want, rtol=1e-5)  # float32
    assert epsilon_schedule(229, 1.0, 0.99, 0.1) > 0.1 and epsilon_schedule(
        230, 1.0, 0.99, 0.1
    ) == np.float32(0.1)
    np.testing.assert_allclose(epsilon_schedule(3, 0.5, 0.5, 0.0), 0.0625)


# ----------------------------------------------------------------------------
# The loss against a NumPy reference
# ----------------------------------------------------------------------------
def np_q(params, obs):
    x = np.asarray(obs, np.float64)
    for layer in params["torso"]:
        x = np.maximum(x @ np.asarray(layer["w"], np.float64) + np.asarray(layer["b"]), 0.0)
    return x @ np.asarray(params["value"]["w"], np.float64) + np.asarray(params["value"]["b"])


def random_batch(seed, n=48, obs_dim=4, n_actions=3):
    rng = np.random.default_rng(seed)
    return Batch(
        obs=jnp.asarray(rng.normal(size=(n, obs_dim)), jnp.float32),
        action=jnp.asarray(rng.integers(0, n_actions, n), jnp.int32),
        returns=jnp.asarray(rng.normal(size=n) * 3, jnp.float32),
        discount=jnp.asarray(rng.choice([0.0, 0.99, 0.99**3], n), jnp.float32),
        boot_obs=jnp.asarray(rng.normal(size=(n, obs_dim)), jnp.float32),
    )


@pytest.mark.parametrize(
    "double, loss, scale_targets",
    [
        (False, "huber", False),
        (True, "huber", False),
        (False, "l2", True),
        (True, "l2", False),
    ],
)
def test_dqn_loss_matches_numpy(double, loss, scale_targets):
    config = tiny(double_dqn=double, loss=loss, scale_value_targets=scale_targets, gamma=0.9)
    params = dqn_value.init_network(jax.random.PRNGKey(0), 4, config.hidden, 3)
    target_params = dqn_value.init_network(jax.random.PRNGKey(1), 4, config.hidden, 3)
    batch = random_batch(0)
    value, metrics = dqn_loss(params, target_params, batch, config)

    scale = 10.0 if scale_targets else 1.0  # 1 / (1 - gamma)
    q_next, q_online = (
        scale * np_q(target_params, batch.boot_obs),
        scale * np_q(params, batch.boot_obs),
    )
    assert (q_next.argmax(1) != q_online.argmax(1)).mean() > 0.2  # the two bootstraps differ
    best = (q_online if double else q_next).argmax(1)
    y = np.asarray(batch.returns) + np.asarray(batch.discount) * q_next[np.arange(48), best]
    q = scale * np_q(params, batch.obs)[np.arange(48), np.asarray(batch.action)]
    err = (q - y) / scale
    want = (
        np.mean(err**2)
        if loss == "l2"
        else np.mean(np.where(np.abs(err) <= 1, 0.5 * err**2, np.abs(err) - 0.5))
    )
    np.testing.assert_allclose(value, want, rtol=1e-4)
    np.testing.assert_allclose(metrics["loss/value"], want, rtol=1e-4)
    np.testing.assert_allclose(metrics["q/mean"], q.mean(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(metrics["q/target_mean"], y.mean(), rtol=1e-4, atol=1e-5)

    # no gradient through the target: the same as regressing on y held fixed
    grads = jax.grad(lambda p: dqn_loss(p, target_params, batch, config)[0])(params)
    fixed_y = jnp.asarray(y / scale, jnp.float32)

    def fixed(p):
        q = jax.vmap(dqn_value.network, (None, 0, None))(p, batch.obs, "relu")
        return td_loss(jnp.take_along_axis(q, batch.action[:, None], 1)[:, 0], fixed_y, loss)

    chex.assert_trees_all_close(grads, jax.grad(fixed)(params), rtol=1e-4, atol=1e-6)


def test_pmean_of_half_batch_gradients_equals_full_batch():
    config = tiny(double_dqn=True)
    params = dqn_value.init_network(jax.random.PRNGKey(2), 4, config.hidden, 3)
    target_params = dqn_value.init_network(jax.random.PRNGKey(3), 4, config.hidden, 3)
    batch = random_batch(1, n=64)

    def step(args):  # one (device, seed) slice, as in the epoch
        params, batch = args
        grads, _ = jax.grad(dqn_loss, has_aux=True)(params, target_params, batch, config)
        return jax.lax.pmean(grads, devices.DEVICE_AXIS)

    add_axes = lambda n: lambda x: jnp.broadcast_to(x, (n, 1) + x.shape)  # noqa: E731  [D, seeds, ...]
    halves = jax.tree.map(lambda x: x.reshape((2, 1, 32) + x.shape[1:]), batch)
    two = host(
        devices.map_epoch(step, 2, donate=False)((jax.tree.map(add_axes(2), params), halves))
    )
    one = host(
        devices.map_epoch(step, 1, donate=False)(
            (jax.tree.map(add_axes(1), params), jax.tree.map(lambda x: x[None, None], batch))
        )
    )
    at = lambda tree, i: jax.tree.map(lambda x: x[i, 0], tree)  # noqa: E731
    chex.assert_trees_all_equal(at(two, 0), at(two, 1))
    chex.assert_trees_all_close(at(two, 0), at(one, 0), rtol=1e-5, atol=1e-6)
    half, _ = jax.grad(dqn_loss, has_aux=True)(
        params, target_params, jax.tree.map(lambda x: x[:32], batch), config
    )
    assert not np.allclose(half["value"]["w"], at(one, 0)["value"]["w"], rtol=1e-3)


# ----------------------------------------------------------------------------
# The ring buffer
# ----------------------------------------------------------------------------
T, B, EPOCHS_KEPT, N_STEP, GAMMA = 3, 2, 4, 3, 0.5


def logical_series(n_epochs, seed=0):
    """`[n_epochs * T, B]` steps; obs encode (time, env); final_obs of an episode's last step is its
    final obs."""
    rng = np.random.default_rng(seed)
    steps = n_epochs * T
    t = np.arange(steps)[:, None] * np.ones((1, B))
    b = np.ones((steps, 1)) * np.arange(B)[None, :]
    done = rng.random((steps, B)) < 0.25
    terminated = done & (rng.random((steps, B)) < 0.5)
    obs = np.stack([t, b], -1).astype(np.float32)
    # after a reset: t + 0.5
    final_obs = np.stack([t + np.where(done, 0.5, 1.0), b], -1).astype(np.float32)
    return Transition(
        obs=obs,
        action=t.astype(np.int32),
        reward=rng.normal(size=(steps, B)).astype(np.float32),
        terminated=terminated,
        done=done,
        final_obs=final_obs,
    )


def test_ring_buffer_keeps_the_last_epochs_and_samples_them():
    """The compact replay (each observation once, final observations of truncations in a small ring)
    samples the batches a plain one would, every row holding its s_{t+1}: those of the logical
    series."""
    capacity, n_epochs = EPOCHS_KEPT * T, 7
    # the last epoch's first observations follow the last rollout
    series = logical_series(n_epochs + 1)
    truncated = series.done & ~series.terminated
    # the most truncations any `capacity` rows of an environment hold: a ring of that many slots, no
    # more
    n_final = max(
        truncated[t : t + capacity].sum(0).max() for t in range(n_epochs * T - capacity + 1)
    )
    replay = init_replay(capacity, n_final, jnp.asarray(series.obs[0]))
    push, sample = jax.jit(replay_push), jax.jit(sample_batch, static_argnums=(2, 3, 4))
    head_windows = truncations = 0
    for epoch in range(n_epochs):
        rollout = jax.tree.map(lambda x: x[epoch * T : (epoch + 1) * T], series)
        replay = push(replay, rollout, series.obs[(epoch + 1) * T])
        newest = (epoch + 1) * T - 1
        # times held: the last EPOCHS_KEPT epochs
        kept = range(max(0, newest + 1 - capacity), newest + 1)
        # every time t sits at row t % capacity, with its own index
        stored = np.asarray(replay.data.action)
        for t in kept:
            np.testing.assert_array_equal(stored[t % capacity], [t, t])
        assert replay.position == (newest + 1) % capacity and replay.filled == len(kept)

        batch = host(sample(replay, jax.random.PRNGKey(epoch), 2000, N_STEP, GAMMA))
        t0, b0 = batch.obs[:, 0].astype(int), batch.obs[:, 1].astype(int)
        # uniform over the filled part: every held step is drawn, nothing else
        assert set(t0) == set(kept)
        counts = np.bincount(t0 * B + b0, minlength=(newest + 1) * B)[kept[0] * B :]
        assert counts.min() > 0.6 * counts.mean() and counts.max() < 1.4 * counts.mean()
        np.testing.assert_array_equal(batch.action, t0)
        # n-step parts from the logical series: windows stop at an end or at the newest step,
        # never running on from the newest step into the oldest rows
        want = np.zeros((3, len(t0)))  # returns, discount, time of the bootstrap observation
        for i in range(len(t0)):
            g, weight = 0.0, 1.0
            for t in range(t0[i], t0[i] + N_STEP):
                g += weight * series.reward[t, b0[i]]
                weight *= GAMMA
                if series.done[t, b0[i]] or t == newest or t == t0[i] + N_STEP - 1:
                    break
            want[:, i] = (
                g,
                0.0 if series.terminated[t, b0[i]] else weight,
                series.final_obs[t, b0[i], 0],
            )
        np.testing.assert_allclose(batch.returns, want[0], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(batch.discount, want[1])
        # a terminated window's s' is left out of its target (the discount is 0)
        boots = want[1] > 0
        # t + 1, or t + 0.5 for a final obs
        np.testing.assert_array_equal(batch.boot_obs[boots, 0], want[2][boots])
        np.testing.assert_array_equal(batch.boot_obs[:, 1], b0)
        truncations += np.sum(boots & (want[2] % 1 == 0.5))
        head_windows += np.sum((t0 == newest - 1) & ~series.done[newest - 1, b0])
    # windows cut by the newest step and by time limits were drawn
    assert head_windows > 0 and truncations > 0


# ----------------------------------------------------------------------------
# The compiled epoch
# ----------------------------------------------------------------------------
KEYS = (
    "loss/value",
    "q/mean",
    "q/target_mean",
    "policy/epsilon",
    "replay/size",
    "optim/grad_norm",
    "episode/return",
    "episode/length",
    "episode/count",
)


def test_epoch_metrics_replay_collection_and_target_sync():
    """TINY: 4 gradient steps per epoch, sync every 6: syncs at steps 6 and 12 (epochs 2 and 3)."""
    c = compiled()
    state = c.init(run_keys(0))
    init_params = host(state.params)
    chex.assert_trees_all_equal(host(state.target_params), init_params)
    history, ends = [], np.zeros(2, int)  # terminated, truncated
    for epoch in range(1, 5):
        before = host(state)
        state, metrics = c.epoch(state)
        metrics, now = host(metrics), host(state)
        history.append(now)
        assert set(KEYS) <= set(metrics)
        for key, value in metrics.items():
            chex.assert_shape(value, (1, NUM_SEEDS))
            assert key.startswith("episode/") or np.all(np.isfinite(value)), key
        np.testing.assert_allclose(
            metrics["policy/epsilon"], max(0.0, 1e-30 ** (epoch - 1)), rtol=1e-5, atol=1e-35
        )
        np.testing.assert_array_equal(metrics["replay/size"], min(epoch, 3) * 8 * 4)
        ended = metrics["episode/count"] > 0  # NaN episode statistics where no episode ended
        assert np.all(np.isfinite(metrics["episode/return"]) == ended)
        np.testing.assert_allclose(
            metrics["episode/return"][ended], metrics["episode/length"][ended]
        )
        assert np.all(now.step == 4 * epoch) and np.all(now.epoch == epoch)
        assert np.all(now.replay.position == (8 * epoch) % 24) and np.all(
            now.replay.filled == min(8 * epoch, 24)
        )
        # the update happened
        assert not np.allclose(now.params["value"]["w"], before.params["value"]["w"])

        # STORE: the rollout went where the position said; the other rows are kept
        pos = int(before.replay.position[0, 0])
        new = jax.tree.map(lambda x: x[0, :, pos : pos + 8], now.replay.data)  # [seeds, T, B, ...]
        assert not np.array_equal(new.obs, before.replay.data.obs[0, :, pos : pos + 8])
        keep = [r for r in range(24) if not pos <= r < pos + 8]
        np.testing.assert_array_equal(
            now.replay.data.obs[:, :, keep], before.replay.data.obs[:, :, keep]
        )
        # a truncated step's final observation (within the pole and cart limits) is in its slot, and
        # differs from the next row's (the reset's); other steps have none
        truncated = new.done & ~new.terminated
        np.testing.assert_array_equal(new.final_slot >= 0, truncated)
        slots = new.final_slot[truncated]
        final = now.replay.final[0][np.nonzero(truncated)[0], slots, np.nonzero(truncated)[2]]
        assert np.all((np.abs(final[:, 2]) <= 0.2094) & (np.abs(final[:, 0]) <= 2.4))
        following = np.concatenate([new.obs[:, 1:], now.replay.next_obs[0][:, None]], 1)
        assert np.all(np.any(final != following[truncated], axis=-1))
        ends += new.terminated.sum(), truncated.sum()

        # COLLECT: epsilon 1 gives uniformly random actions; epsilon 0 the current network's argmax
        if epoch == 1:
            assert 0.3 < new.action.mean() < 0.7
        elif epoch >= 3:
            for seed in range(NUM_SEEDS):
                params = jax.tree.map(lambda x: x[0, seed], before.params)
                np.testing.assert_array_equal(
                    new.action[seed], np_q(params, new.obs[seed]).argmax(-1)
                )
    assert np.all(ends >= 2), ends  # both kinds of episode end were stored

    first, second, third, fourth = history
    # target: unchanged until step 6; synced inside epoch 2 (so neither the start nor the end of
    # it); synced again at step 12 = the end of epoch 3; unchanged through epoch 4 (steps 13-16)
    chex.assert_trees_all_equal(first.target_params, init_params)
    for a, b in ((second.target_params, init_params), (second.target_params, second.params)):
        assert not np.allclose(a["value"]["w"], b["value"]["w"])
    chex.assert_trees_all_equal(third.target_params, third.params)
    chex.assert_trees_all_equal(fourth.target_params, third.params)


def test_targets_bootstrap_from_the_target_network():
    """A target network whose every output is 100 above the online network's raises each target by
    100 times its discount gamma^m (0 after a termination): the epoch bootstraps from the target
    network (the first epoch's 4 steps come before the sync at step 6). Bootstrapping from the
    online network, nothing changes."""
    c = compiled()
    same, shifted = c.init(run_keys(0)), c.init(run_keys(0))
    head = shifted.target_params["value"]
    shifted = shifted._replace(
        target_params={**shifted.target_params, "value": {**head, "b": head["b"] + 100.0}}
    )
    _, same = c.epoch(same)
    _, shifted = c.epoch(shifted)
    rise = host(shifted)["q/target_mean"] - host(same)["q/target_mean"]
    # 70%+ of the windows bootstrap
    assert np.all((rise > 0.99**3 * 100 * 0.7) & (rise < 100.001)), rise


def test_seeds_differ_and_repeat():
    c = compiled()
    a, b, a2 = c.init(run_keys(0)), c.init(run_keys(1)), c.init(run_keys(0))
    for _ in range(2):
        a, _ = c.epoch(a)
        b, _ = c.epoch(b)
        a2, _ = c.epoch(a2)
    a, b, a2 = host(a), host(b), host(a2)
    chex.assert_trees_all_equal(a, a2)
    assert not np.array_equal(a.replay.data.obs, b.replay.data.obs)
    assert not np.allclose(a.params["value"]["w"], b.params["value"]["w"])
    # the seeds of one run differ too
    assert not np.array_equal(a.replay.data.obs[0, 0], a.replay.data.obs[0, 1])


# ----------------------------------------------------------------------------
# train(): resume with the replay, bad input
# ----------------------------------------------------------------------------
RUN = dict(TINY, total_steps=4 * 8 * 6, n_devices=2, **RESUME_FLAGS)


def test_two_devices_two_seeds_resume_with_the_replay(tmp_path):
    """--num-seeds 2 --n-devices 2: devices keep one network; a resumed run (replay, counters,
    target network in the checkpoint) ends exactly as the uninterrupted one."""
    whole = run.train(Config(**RUN, out_dir=str(tmp_path / "whole")), make_trainer).summary
    run.train(Config(**RUN, out_dir=str(tmp_path / "part")), make_trainer, max_epochs=2)
    resumed = run.train(
        Config(**RUN, out_dir=str(tmp_path / "part"), resume=str(tmp_path / "part")), make_trainer
    ).summary
    assert whole["epoch"] == resumed["epoch"] == 6 and len(whole["eval_return_per_seed"]) == 2
    assert resumed["eval_return_per_seed"] == whole["eval_return_per_seed"]
    template = jax.eval_shape(devices.map_init(make_trainer(Config(**RUN)).init), run_keys(3, 2, 2))
    state, epoch = checkpoints.load(
        checkpoints.latest(tmp_path / "whole" / "checkpoints"), template
    )
    part, _ = checkpoints.load(checkpoints.latest(tmp_path / "part" / "checkpoints"), template)
    assert epoch == 6
    chex.assert_trees_all_equal(state, part)
    # [devices, seeds, capacity, envs per device, obs]
    chex.assert_shape(state.replay.data.obs, (2, 2, 24, 2, 4))
    assert (
        np.all(state.step == 6 * 4)
        and np.all(state.replay.filled == 24)
        and np.all(state.replay.position == 0)
    )
    first, second = (jax.tree.map(lambda x, i=i: x[i], state) for i in range(2))
    chex.assert_trees_all_equal(first.params, second.params)
    chex.assert_trees_all_equal(first.target_params, second.target_params)
    chex.assert_trees_all_equal(first.opt_state, second.opt_state)
    # each device explores its own envs
    assert not np.array_equal(first.replay.data.obs, second.replay.data.obs)
    # seeds differ
    assert not np.array_equal(first.params["value"]["w"][0], first.params["value"]["w"][1])


@pytest.mark.parametrize(
    "env, torso, steps, n",
    [
        ("CartPole-v1", "auto", 50, 3),
        ("Breakout-MinAtar", "auto", 10, 1),  # image observations: the conv torso
        ("Breakout-MinAtar", "mlp", 50, 3),
    ],
)
def test_unset_flags_follow_the_torso(env, torso, steps, n):
    """`--update-steps` and `--n-step` unset (the defaults) are 10 gradient steps an epoch and
    one-step targets where the network starts with the convolution, 50 steps and 3-step targets
    where it is dense; given values are kept."""
    config = Config(env=env, torso=torso)
    assert config.update_steps is None and config.n_step is None
    assert (config.resolved().update_steps, config.resolved().n_step) == (steps, n)
    given = Config(env=env, torso=torso, update_steps=3, n_step=2).resolved()
    assert (given.update_steps, given.n_step) == (3, 2)


@pytest.mark.parametrize(
    "overrides, match",
    [
        (dict(n_step=0), r"--n-step 0"),
        (dict(sync_freq=0), r"--sync-freq 0"),
        (
            dict(n_replay_epochs=1, batch_size=64),
            r"replay holds 32 transitions .* fewer than --batch-size 64",
        ),
        (dict(n_step=30), r"--n-step 30 is longer than the replay's 24 steps"),
        (dict(update_steps=0), r"--update-steps"),
        (dict(eps_decay=0.0), r"--eps-decay 0.0"),
        (dict(eps_min=1.5), r"--eps-min 1.5"),
        (dict(gamma=1.0, scale_value_targets=True), r"--scale-value-targets .* below 1"),
        (dict(lr=0.0), r"--lr 0.0"),
        (dict(hidden=()), r"--hidden"),
    ],
)
def test_bad_input_rejected_by_config(overrides, match):
    with pytest.raises(ValueError, match=match):
        Config(**{**TINY, **overrides})


@pytest.mark.parametrize(
    "overrides, match",
    [
        (dict(env="Pendulum-v1"), r"--env Pendulum-v1: DQN needs discrete actions .* Box"),
        (dict(env="MountainCarContinuous-v0"), r"discrete actions"),
        (dict(batch_size=15, n_devices=2), r"--batch-size 15 is not divisible by --n-devices 2"),
    ],
)
def test_bad_input_rejected_by_make_trainer(overrides, match):
    with pytest.raises(ValueError, match=match):
        make_trainer(tiny(**overrides))


# ----------------------------------------------------------------------------
# The command line
# ----------------------------------------------------------------------------
CLI_TINY = [
    "--num-envs",
    "4",
    "--num-steps",
    "8",
    "--update-steps",
    "4",
    "--batch-size",
    "16",
    "--n-replay-epochs",
    "3",
    "--total-steps",
    "320",
    "--eval-every",
    "0",
    "--eval-episodes",
    "4",
]


def test_cli_refuses_bad_input_before_compiling(tmp_path):
    out = command(
        "dqn_value", *CLI_TINY, "--env", "Pendulum-v1", "--out-dir", tmp_path / "run", cwd=tmp_path
    )
    assert out.returncode != 0 and "needs discrete actions" in out.stderr
    assert "compiled in" not in out.stdout and not (tmp_path / "run").exists()


@pytest.mark.slow  # a whole run in a new process: CI runs it, the fast suite does not
def test_cli_run_writes_outputs(tmp_path):
    out_dir = tmp_path / "run"
    out = run_script("dqn_value", *CLI_TINY, "--double-dqn", "--out-dir", out_dir, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "eval return" in out.stdout
    config, lines, summary = run_outputs(out_dir)
    assert config["n_step"] == 3 and config["update_steps"] == 4 and config["double_dqn"] is True
    assert len(lines) == 10 and summary["env_steps"] == 320
    for key in KEYS[:6]:
        assert np.isfinite(lines[-1][key]), key
    assert lines[-1]["replay/size"] == 3 * 8 * 4
