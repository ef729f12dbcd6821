"""--normalize-obs: the running statistics (common/envs.py) and every policy-gradient script with
the flag.

The statistics against NumPy, merged over two devices, one set per seed; each script's epochs with
the flag (the statistics count the epoch's steps; the first epoch, with the initial statistics
mean 0 and variance 1, is the epoch without the flag); `act` normalizes; the flag off leaves the
runner state as it was; and through `run.train`: the checkpoint holds the statistics, `load_agent`
acts with them, and a resumed run ends as the uninterrupted one.
"""

import functools
import json

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from algos import actor_critic, awr, ppo_joint, reinforce
from algos import skip_transformer as st
from common import checkpoints, cli, devices, envs, run
from helpers import PPO_RUN, RESUME_FLAGS, TINY_BY_SCRIPT, host, quick_compile, slow_for


# ----------------------------------------------------------------------------
# The statistics
# ----------------------------------------------------------------------------
def batches(seed, n, shape, scale=3.0, shift=5.0):
    rng = np.random.default_rng(seed)
    return [
        (
            rng.normal(size=shape) * scale * rng.random(shape[-1:])
            + shift * rng.normal(size=shape[-1:])
        ).astype(np.float32)
        for _ in range(n)
    ]


# one device: a vmap of size 1 carrying the device axis, as map_epoch builds it
update_one = jax.jit(jax.vmap(envs.update_obs_stats, axis_name=devices.DEVICE_AXIS))


def test_init_obs_stats():
    stats = envs.init_obs_stats((3,))
    np.testing.assert_array_equal(stats.mean, np.zeros(3))
    np.testing.assert_array_equal(stats.var, np.ones(3))
    assert stats.count == 0


def test_update_obs_stats_matches_numpy():
    data = batches(0, 4, (7, 5, 3))  # four [T, B, F] rollouts
    stats = jax.tree.map(lambda x: x[None], envs.init_obs_stats((3,)))
    for i, batch in enumerate(data):
        stats = update_one(stats, batch[None])
        seen = np.concatenate(data[: i + 1]).reshape(-1, 3).astype(np.float64)
        np.testing.assert_allclose(stats.mean[0], seen.mean(0), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(stats.var[0], seen.var(0), rtol=1e-4)
        assert stats.count[0] == len(seen)


def test_update_obs_stats_merges_devices_and_keeps_seeds_apart():
    # three epochs of [2 devices, 2 seeds, T, B, F]: every device and seed sees its own data
    rng = np.random.default_rng(2)
    shift = np.array([[5.0, -1.0], [-3.0, 2.0]])[:, None, None, :]  # per seed
    data = [
        (rng.normal(size=(2, 2, 6, 4, 2)) * rng.random((2, 2, 1, 1, 2)) * 3 + shift).astype(
            np.float32
        )
        for _ in range(3)
    ]
    update = devices.map_epoch(lambda s: (envs.update_obs_stats(*s), s[1]), 2, donate=False)
    stats = jax.tree.map(lambda x: jnp.broadcast_to(x, (2, 2) + x.shape), envs.init_obs_stats((2,)))
    for i, batch in enumerate(data):
        stats, _ = update((stats, jnp.asarray(batch)))
        stats = host(stats)
        for seed in range(2):
            seen = np.concatenate([b[d, seed] for b in data[: i + 1] for d in range(2)]).reshape(
                -1, 2
            )
            for d in range(2):  # both devices hold the statistics of both devices' batches
                np.testing.assert_allclose(stats.mean[d, seed], seen.mean(0), rtol=1e-5, atol=1e-5)
                np.testing.assert_allclose(stats.var[d, seed], seen.var(0), rtol=1e-4)
                assert stats.count[d, seed] == len(seen) == (i + 1) * 2 * 6 * 4
        assert not np.allclose(stats.mean[:, 0], stats.mean[:, 1])  # each seed its own


def test_normalize_obs_gives_zero_mean_unit_variance_and_clips():
    data = batches(1, 1, (50, 8, 4))[0]
    stats = jax.tree.map(
        lambda x: x[0],
        update_one(jax.tree.map(lambda x: x[None], envs.init_obs_stats((4,))), data[None]),
    )
    normal = np.asarray(envs.normalize_obs(stats, data)).reshape(-1, 4)
    np.testing.assert_allclose(normal.mean(0), 0.0, atol=1e-4)
    np.testing.assert_allclose(normal.std(0), 1.0, atol=1e-3)
    far = np.asarray(stats.mean) + 100.0 * np.sqrt(np.asarray(stats.var)) * np.array([1, -1, 1, -1])
    np.testing.assert_allclose(envs.normalize_obs(stats, far), [10.0, -10.0, 10.0, -10.0])
    np.testing.assert_allclose(envs.normalize_obs(stats, stats.mean), 0.0, atol=1e-6)
    assert envs.normalize_obs(None, data) is data  # the flag off: nothing at all


def test_normalize_window_keeps_empty_rows_and_the_episode_column():
    stats = envs.ObsStats(jnp.array([1.0, -2.0]), jnp.array([4.0, 0.25]), jnp.float32(10))
    window = jnp.array([[0.0, 0.0, 0.0], [3.0, -1.0, 1.0], [1.0, -2.0, 1.0]])  # oldest row empty
    np.testing.assert_allclose(
        envs.normalize_window(stats, window), [[0, 0, 0], [1, 2, 1], [0, 0, 1]], atol=1e-6
    )
    assert envs.normalize_window(None, window) is window


# ----------------------------------------------------------------------------
# The reward statistics (--normalize-reward / --no-normalize-reward)
# ----------------------------------------------------------------------------
update_rewards_one = jax.jit(
    jax.vmap(envs.update_reward_stats, (0, 0, 0, None), axis_name=devices.DEVICE_AXIS)
)


def test_reward_stats_follow_each_environments_discounted_return_across_rollouts_and_resets():
    """G_t = r_t + gamma G_{t-1}, 0 after an end, carried from one rollout to the next; the variance
    is that of every G_t seen so far; rewards are divided by its root only where it is above 1."""
    rng, gamma, B = np.random.default_rng(0), 0.9, 3
    stats = jax.tree.map(lambda x: x[None], envs.init_reward_stats(B))
    ret, seen = np.zeros(B), []
    for scale in (0.1, 0.1, 5.0):  # returns of std below 1 first: the rewards stay as they are
        rewards = (rng.normal(size=(6, B)) * scale).astype(np.float32)
        dones = rng.random((6, B)) < 0.3
        stats = update_rewards_one(stats, rewards[None], dones[None], gamma)
        for t in range(6):
            ret = gamma * ret + rewards[t]
            seen.append(ret.copy())
            ret = np.where(dones[t], 0.0, ret)
        np.testing.assert_allclose(stats.returns[0], ret, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(stats.stats.var[0], np.var(seen), rtol=1e-4)
        assert stats.stats.count[0] == len(seen) * B
        scale_now = float(envs.reward_scale(jax.tree.map(lambda x: x[0], stats)))
        np.testing.assert_allclose(scale_now, max(np.std(seen), 1.0), rtol=1e-4)
    assert np.std(seen) > 1  # the last rollout's returns took the scale above 1
    assert (
        envs.update_reward_stats(None, rewards, dones, gamma) is None
        and envs.reward_scale(None) == 1.0
    )


# ----------------------------------------------------------------------------
# Every script with the flag
# ----------------------------------------------------------------------------
STEPS = 4 * 16 * 6
# each script's tiny config (helpers.TINY_BY_SCRIPT) with what these tests change
AWR = dict(TINY_BY_SCRIPT["awr"], n_replay_epochs=3, policy_steps=2, value_steps=2, hidden=(16,))
SCRIPTS = {
    "ppo_joint": (ppo_joint, TINY_BY_SCRIPT["ppo_joint"]),
    "actor_critic": (
        actor_critic,
        dict(TINY_BY_SCRIPT["actor_critic"], policy_steps=2, value_steps=2, loss="ppo"),
    ),
    "reinforce": (reinforce, dict(TINY_BY_SCRIPT["reinforce"], update_steps=2, baseline=True)),
    "awr": (awr, AWR),
    "sampling_awr": (awr, dict(AWR, q_value=True, n_samples=2)),
    "skip_transformer": (
        st,
        dict(
            TINY_BY_SCRIPT["skip_transformer"],
            update_passes=2,
            context_len=3,
            d_model=8,
            n_heads=2,
            d_ff=16,
            n_layers=2,
            skip_warmup_steps=2,
        ),
    ),
}
RUNNER_PARAMS = {
    "ppo_joint": "params",
    "actor_critic": "policy_params",
    "reinforce": "params",
    "awr": "policy",
    "sampling_awr": "policy",
    "skip_transformer": "params",
}


def config_of(name, **overrides):
    module, flags = SCRIPTS[name]
    return module.Config(
        **{**flags, "total_steps": STEPS, "n_devices": 1, "num_seeds": 2, **overrides}
    )


@functools.lru_cache(maxsize=None)
def compiled(name, **overrides):
    """`(config, trainer, init, epoch)`, compiled quickly as the scripts' tests do."""
    config = config_of(name, **overrides)
    keys = devices.seed_keys(jax.random.PRNGKey(0), config.num_seeds, config.n_devices)
    trainer, init, epoch = quick_compile(SCRIPTS[name][0].make_trainer, config, keys)
    return config, trainer, lambda: init(keys), epoch


def normalize(name, stats, obs):
    return (
        envs.normalize_window(stats, obs)
        if name == "skip_transformer"
        else envs.normalize_obs(stats, obs)
    )


def without_stats(state):
    """The state of a run without the flag: its `obs_stats` field None."""
    return state._replace(obs_stats=None)


def some_observations(name, stats, n=6):
    rng = np.random.default_rng(7)
    shape = stats.mean.shape[-1:]
    obs = np.asarray(stats.mean) + rng.normal(size=(n,) + shape) * 2 * np.sqrt(
        np.asarray(stats.var)
    )
    obs = obs.astype(np.float32)
    if name == "skip_transformer":  # windows of 3 rows: one empty, two of this episode
        obs = np.stack(
            [
                np.concatenate([np.zeros((1, 3)), np.c_[obs[i : i + 2], np.ones(2)]])
                for i in range(n - 1)
            ]
        )
    return jnp.asarray(obs, jnp.float32)


@pytest.mark.parametrize("name", slow_for(SCRIPTS, "skip_transformer"))
def test_epochs_with_normalize_obs(name):
    config, trainer, init, epoch = compiled(name, normalize_obs=True)
    _, plain, plain_init, plain_epoch = compiled(name, normalize_obs=False)
    module = SCRIPTS[name][0]
    state = init()
    # one type, flag on or off
    assert type(state) is module.RunnerState and state.obs_stats is not None
    stats = host(state.obs_stats)
    np.testing.assert_array_equal(stats.count, 0)
    np.testing.assert_array_equal(stats.mean, 0)
    np.testing.assert_array_equal(stats.var, 1)

    # the first epoch normalizes with mean 0 and variance 1 (and CartPole's |obs| < 10): the epoch
    # without the flag
    first, metrics = epoch(state)
    plain_first, plain_metrics = plain_epoch(plain_init())
    chex.assert_trees_all_close(host(without_stats(first)), host(plain_first), rtol=1e-6, atol=1e-6)
    chex.assert_trees_all_close(host(metrics), host(plain_metrics), rtol=1e-6, atol=1e-6)

    state = first
    for i in range(2, 4):
        state, metrics = epoch(state)
        metrics = host(metrics)
        for key, value in metrics.items():
            if not key.startswith("episode/"):  # episode/*: NaN when none finished
                assert np.all(np.isfinite(value)), key
        stats = host(state.obs_stats)
        # every step of every epoch
        np.testing.assert_array_equal(stats.count, i * trainer.steps_per_epoch)
        assert np.all(np.isfinite(stats.mean)) and np.all(stats.var > 0)
        assert np.all(np.abs(stats.mean).max(-1) > 1e-3) and np.all(
            np.abs(stats.var - 1).max(-1) > 1e-2
        )
        assert not np.allclose(stats.mean[0, 0], stats.mean[0, 1])  # each seed its own
    # the network has learned on normalized observations: it differs from the run without the flag
    plain_state = plain_first
    for _ in range(2):
        plain_state, _ = plain_epoch(plain_state)
    field = RUNNER_PARAMS[name]
    assert not np.allclose(
        jax.tree.leaves(host(getattr(without_stats(state), field)))[0],
        jax.tree.leaves(host(getattr(plain_state, field)))[0],
    )

    # act normalizes with the statistics that policy(state) hands it
    policy = jax.tree.map(lambda x: x[0, 1], trainer.policy(state))  # device 0, seed 1
    net_params, obs_stats = policy
    chex.assert_trees_all_equal(
        net_params, jax.tree.map(lambda x: x[0, 1], getattr(without_stats(state), field))
    )
    chex.assert_trees_all_equal(obs_stats, jax.tree.map(lambda x: x[0, 1], state.obs_stats))
    plain_policy = envs.Policy(params=net_params)
    key = jax.random.PRNGKey(0)
    for obs in some_observations(name, obs_stats):
        np.testing.assert_array_equal(
            trainer.act(policy, obs, key),
            plain.act(plain_policy, normalize(name, obs_stats, obs), key),
        )


@pytest.mark.parametrize("name", list(SCRIPTS))
def test_flag_off_holds_no_statistics(name):
    """One state type: without the flag its `obs_stats` is None (no arrays, the same program); with
    it, the statistics' arrays are the only ones added."""
    module = SCRIPTS[name][0]

    def initial_shapes(**overrides):  # traced, not compiled
        config = config_of(name, **overrides)
        trainer = module.make_trainer(config)
        keys = devices.seed_keys(jax.random.PRNGKey(0), config.num_seeds, config.n_devices)
        return trainer, jax.eval_shape(devices.map_init(trainer.init), keys)

    (trainer, state), (_, normalized) = (
        initial_shapes(normalize_obs=False),
        initial_shapes(normalize_obs=True),
    )
    assert type(state) is type(normalized) is module.RunnerState and state.obs_stats is None
    assert len(jax.tree.leaves(normalized)) == len(jax.tree.leaves(state)) + len(
        envs.ObsStats._fields
    )
    policy = trainer.policy(state)
    assert type(policy) is envs.Policy and policy.obs_stats is None
    assert policy.params is getattr(state, RUNNER_PARAMS[name])


def test_two_devices_two_seeds():
    config, trainer, init, epoch = compiled("ppo_joint", normalize_obs=True, n_devices=2)
    state = init()
    for i in range(1, 3):
        state, metrics = epoch(state)
        stats = host(state.obs_stats)  # [2 devices, 2 seeds, 4]
        chex.assert_shape(stats.mean, (2, 2, 4))
        # both devices' steps
        np.testing.assert_array_equal(stats.count, i * trainer.steps_per_epoch)
        chex.assert_trees_all_equal(
            jax.tree.map(lambda x: x[0], stats), jax.tree.map(lambda x: x[1], stats)
        )
        assert not np.allclose(stats.mean[0, 0], stats.mean[0, 1])
        assert all(
            np.all(np.isfinite(v)) for k, v in host(metrics).items() if not k.startswith("episode/")
        )


# ----------------------------------------------------------------------------
# Through run.train: checkpoint, load_agent, resume
# ----------------------------------------------------------------------------
RUN = dict(PPO_RUN, total_steps=4 * 16 * 6, normalize_obs=True, **RESUME_FLAGS)


def test_train_checkpoints_the_statistics_and_resumes(tmp_path):
    make = ppo_joint.make_trainer
    whole = run.train(ppo_joint.Config(**RUN, out_dir=str(tmp_path / "whole")), make).summary
    part = run.train(
        ppo_joint.Config(**RUN, out_dir=str(tmp_path / "part")), make, max_epochs=2
    ).summary
    assert part["epoch"] == 2
    resumed = run.train(
        ppo_joint.Config(**RUN, out_dir=str(tmp_path / "part"), resume=str(tmp_path / "part")), make
    ).summary
    assert (
        resumed["epoch"] == whole["epoch"] == 6 and resumed["eval_return"] == whole["eval_return"]
    )

    # the checkpoint holds the statistics: 6 epochs of 64 steps, the same as the uninterrupted run's
    config = ppo_joint.Config(**RUN)
    trainer = make(config)
    template = jax.eval_shape(
        devices.map_init(trainer.init), devices.seed_keys(jax.random.PRNGKey(0), 2, 1)
    )
    states = [
        checkpoints.load(checkpoints.latest(tmp_path / d / "checkpoints"), template)[0]
        for d in ("whole", "part")
    ]
    chex.assert_trees_all_equal(*states)
    stats = jax.tree.map(lambda x: x[0, 1], states[0].obs_stats)  # device 0, seed 1
    assert float(stats.count) == 6 * 64 and np.abs(np.asarray(stats.var) - 1).max() > 1e-2
    # --normalize-reward's, resumed as well
    returns = jax.tree.map(lambda x: x[0, 1], states[0].reward_stats.stats)
    assert float(returns.count) == 6 * 64 and float(returns.var) > 0
    assert json.loads((tmp_path / "whole" / "config.json").read_text())["normalize_obs"] is True

    # load_agent acts with them: the network of seed 1 on the observations normalized by hand
    act = checkpoints.load_agent(tmp_path / "whole", ppo_joint.Config, make, seed=1)
    net_params = jax.tree.map(lambda x: x[0, 1], states[0].params)
    dist = ppo_joint.make_distribution(trainer.env.action_space(trainer.env_params))
    obs = some_observations("ppo_joint", stats)
    by_hand = [
        int(dist.mode(ppo_joint.network(net_params, envs.normalize_obs(stats, o), dist, "tanh")[0]))
        for o in obs
    ]
    np.testing.assert_array_equal(act(obs), by_hand)


# the scripts that leave the flag unset by default
UNSET_BY = (ppo_joint, actor_critic)
# what it resolves to: discrete actions read by dense layers; Box actions; an image the default
# torso convolves; a grid of 0 and 1
UNSET = {
    "CartPole-v1": True,
    "Pendulum-v1": False,
    "Breakout-MinAtar": False,
    "DeepSea-bsuite": False,
}


@pytest.mark.parametrize(
    "module", [ppo_joint, actor_critic, reinforce, awr, st], ids=lambda m: m.__name__
)
def test_flag_on_the_command_line(module):
    assert cli.parse_config(module.Config, ["--normalize-obs"]).normalize_obs is True
    assert cli.parse_config(module.Config, ["--normalize_obs=False"]).normalize_obs is False
    # unset, resolved() decides (ppo_joint, actor_critic); off in the others
    assert cli.parse_config(module.Config, []).normalize_obs is (
        None if module in UNSET_BY else False
    )
    # its --help text
    assert "running mean and variance" in cli.field_docs(module.Config)["normalize_obs"]


@pytest.mark.parametrize("name", ["ppo_joint", "actor_critic"])
@pytest.mark.parametrize("env, on", UNSET.items())
def test_unset_is_on_for_discrete_actions_read_by_dense_layers(name, env, on):
    """Left unset, the flag is on where the actions are discrete, no convolution reads the
    observations and the space does not already hold them in [0, 1]; the config a run writes says
    which, and the program is the one the flag given builds."""
    module = SCRIPTS[name][0]
    config = config_of(name, env=env)
    assert config.normalize_obs is None and config.resolved().normalize_obs is on
    keys = devices.seed_keys(jax.random.PRNGKey(0), config.num_seeds, config.n_devices)
    state = jax.eval_shape(devices.map_init(module.make_trainer(config).init), keys)
    assert (state.obs_stats is not None) is on
