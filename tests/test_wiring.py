"""The wiring of every script's epoch, checked against NumPy on a task that reaches its time limit.

CartPole-v1 is cut to TIME_LIMIT steps (as tests/test_dqn_value.py does), so a rollout holds
steps that terminate (the pole falls) and steps that are truncated. For each script the
epoch's own `trainer.rollout` (the code `epoch` runs before its update) gives the rollout
and its targets; the test checks the rollout against gymnax's CartPole dynamics (each final
observation is the step from the observation before it, not the reset one) and recomputes
the targets in NumPy with the script's network: at a truncated step the target is
r + gamma V(final observation), at a terminated one r (REINFORCE: r at both, it does not
bootstrap). The epochs run past the first with `--normalize-obs`, so the statistics are not
the identity, and the losses the epoch reports are the script's loss function on
normalized observations.
"""
import functools
from unittest import mock

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gymnax.environments.classic_control.cartpole import EnvState

from algos import actor_critic, ppo_joint, reinforce
from algos import skip_transformer as st
from common import devices, envs, run

pytestmark = pytest.mark.usefixtures("jax_compile_cache")

TIME_LIMIT = 12  # random CartPole episodes last 8 to ~40 steps: some terminate, most are truncated
WARMUP_EPOCHS = 2  # epochs run before the one checked: the observation statistics have moved


def host(tree):
    return jax.tree.map(np.asarray, jax.device_get(tree))


def first(tree):
    """Device 0, seed 0 of a `[n_devices, num_seeds, ...]` tree, on the host."""
    return jax.tree.map(lambda x: np.asarray(x)[0, 0], jax.device_get(tree))


class Compiled:
    """A script's trainer on CartPole-v1 cut at TIME_LIMIT steps: init, epoch and rollout compiled."""

    def __init__(self, module, config):
        make_env = envs.make_env

        def time_limited(env_id):
            env, params = make_env(env_id)
            return env, params.replace(max_steps_in_episode=TIME_LIMIT)

        with mock.patch.object(envs, "make_env", time_limited):
            self.trainer = module.make_trainer(config)
        self.config = config
        keys = devices.seed_keys(jax.random.PRNGKey(3), config.num_seeds, config.n_devices)
        init = devices.compile_init(self.trainer.init).lower(keys)
        self.init = functools.partial(init.compile(run.FAST_COMPILE), keys)
        self.epoch = devices.compile_epoch(self.trainer.epoch, config.n_devices, donate=False).lower(
            init.out_info).compile(run.FAST_COMPILE)
        self.rollout = devices.compile_epoch(self.trainer.rollout, config.n_devices, donate=False).lower(
            init.out_info).compile(run.FAST_COMPILE)

    def state_after_warmup(self):
        state = self.init()
        for _ in range(WARMUP_EPOCHS):
            state, _ = self.epoch(state)
        return state


# ----------------------------------------------------------------------------
# References
# ----------------------------------------------------------------------------
def check_cartpole_rollout(env, env_params, time, obs, action, reward, done, terminated=None, final_obs=None):
    """The rollout `[T, B, ...]` (raw observations) against gymnax's CartPole from each recorded observation.

    `time` `[B]`: the steps each episode had run before the rollout. The recorded `terminated` and
    `final_obs`, where a script keeps them, must be gymnax's. Returns `(terminated, truncated)` `[T, B]`.
    """
    T, B = reward.shape
    flat = lambda x: jnp.asarray(x.reshape((T * B,) + x.shape[2:]))  # noqa: E731
    o = flat(obs)
    states = EnvState(x=o[:, 0], x_dot=o[:, 1], theta=o[:, 2], theta_dot=o[:, 3], time=jnp.zeros(T * B, jnp.int32))
    step = jax.vmap(env.step_env, (None, 0, 0, None))
    next_obs, _, _, next_terminated, _ = step(jax.random.PRNGKey(0), states, flat(action), env_params)
    next_obs, next_terminated = np.asarray(next_obs).reshape(obs.shape), np.asarray(next_terminated).reshape(T, B)
    if final_obs is not None:
        np.testing.assert_allclose(final_obs, next_obs, rtol=1e-5, atol=1e-6)
    if terminated is not None:
        np.testing.assert_array_equal(terminated, next_terminated)
    terminated = next_terminated
    np.testing.assert_array_equal(reward, 1.0)
    # episode lengths from the recorded ends: truncated when the time limit is reached
    length, truncated = np.asarray(time).copy(), np.zeros((T, B), bool)
    for t in range(T):
        length = length + 1
        truncated[t] = length >= TIME_LIMIT
        np.testing.assert_array_equal(done[t], terminated[t] | truncated[t])
        length = np.where(done[t], 0, length)
    # after an end the next observation is a reset one, otherwise the final observation itself
    np.testing.assert_allclose(obs[1:][~done[:-1]], next_obs[:-1][~done[:-1]], rtol=1e-5, atol=1e-6)
    assert np.all(np.abs(obs[1:][done[:-1]]) <= 0.05)
    assert (truncated & ~terminated).any() and terminated.any(), "the rollout needs both kinds of end"
    return terminated, truncated


def np_gae(rewards, values, next_values, terminated, dones, gamma, lam):
    """A_t = r_t + gamma (1 - terminated_t) V(s'_t) - V(s_t) + gamma lam (1 - done_t) A_{t+1}: a plain loop."""
    advantages, next_advantage = np.zeros_like(rewards, np.float64), np.zeros(rewards.shape[1])
    for t in reversed(range(len(rewards))):
        delta = rewards[t] + gamma * (1 - terminated[t]) * next_values[t] - values[t]
        next_advantage = delta + gamma * lam * (1 - dones[t]) * next_advantage
        advantages[t] = next_advantage
    return advantages, advantages + values


def check_ends(targets, rewards, next_values, terminated, truncated, gamma):
    """targets = r + gamma V(final observation) at truncated steps, r at terminated ones."""
    cut = truncated & ~terminated
    np.testing.assert_allclose(targets[cut], rewards[cut] + gamma * next_values[cut], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(targets[terminated], rewards[terminated], rtol=1e-5, atol=1e-5)


def flat(x):
    return jnp.asarray(x.reshape((-1,) + x.shape[2:]))


# ----------------------------------------------------------------------------
# ppo_joint
# ----------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def ppo():
    config = ppo_joint.Config(num_envs=8, num_steps=32, update_epochs=1, num_minibatches=1, hidden=(16,),
                              gamma=0.9, gae_lambda=0.8, normalize_obs=True, total_steps=8 * 32 * 10,
                              n_devices=1)
    return Compiled(ppo_joint, config)


def test_ppo_joint_epoch():
    c = ppo()
    config, trainer = c.config, c.trainer
    dist = ppo_joint.make_distribution(trainer.env.action_space(trainer.env_params))
    state = c.state_after_warmup()
    before = first(state)
    rollout, (_, metrics) = first(c.rollout(state)), c.epoch(state)
    traj, stats, params = rollout.traj, before.obs_stats, before.runner.params
    assert np.abs(stats.var - 1).max() > 0.1  # past the first epoch: the normalization is not the identity
    _, truncated = check_cartpole_rollout(trainer.env, trainer.env_params, before.runner.env_state.time, traj.obs,
                                          traj.action, traj.reward, traj.done, traj.terminated, traj.final_obs)

    # targets: GAE in NumPy on the network's values of the normalized observations
    net = jax.vmap(ppo_joint.network, (None, 0, None, None))
    norm_obs = envs.normalize_obs(stats, flat(traj.obs))
    inputs, values = host(net(params, norm_obs, dist, config.activation))
    next_values = host(net(params, envs.normalize_obs(stats, flat(traj.final_obs)), dist, config.activation)[1])
    values, next_values = values.reshape(traj.reward.shape), next_values.reshape(traj.reward.shape)
    advantages, targets = np_gae(traj.reward, values, next_values, traj.terminated, traj.done, config.gamma,
                                 config.gae_lambda)
    check_ends(rollout.targets, traj.reward, next_values, traj.terminated, truncated, config.gamma)
    np.testing.assert_allclose(rollout.advantages, advantages, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(rollout.targets, targets, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(traj.value, values, rtol=1e-5, atol=1e-5)

    # the update's loss: ppo_loss on the normalized observations (one full-batch step, from the params before it)
    log_prob = dist.log_prob(inputs, flat(traj.action))
    np.testing.assert_allclose(flat(traj.log_prob), log_prob, rtol=1e-5, atol=1e-5)
    batch = ppo_joint.Batch(norm_obs, flat(traj.action), log_prob, flat(advantages).astype(jnp.float32),
                            flat(targets).astype(jnp.float32))
    _, want = ppo_joint.ppo_loss(params, batch, dist, config)
    metrics = first(metrics)
    for key in ("loss/joint", "loss/policy", "loss/value", "policy/entropy"):
        np.testing.assert_allclose(metrics[key], want[key], rtol=1e-4, atol=1e-5, err_msg=key)


# ----------------------------------------------------------------------------
# actor_critic
# ----------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def a2c():
    # one full-batch step of each network: the losses reported are those of the parameters before the update
    config = actor_critic.Config(num_envs=8, num_steps=32, loss="a2c", value_train_steps=1, value_batch_size=256,
                                 hidden=(16,), gamma=0.9, lam=0.8, normalize_obs=True, total_steps=8 * 32 * 10,
                                 n_devices=1)
    return Compiled(actor_critic, config)


def test_actor_critic_epoch():
    c = a2c()
    config, trainer = c.config, c.trainer
    dist = actor_critic.make_distribution(trainer.env.action_space(trainer.env_params))
    state = c.state_after_warmup()
    before = first(state)
    rollout, (_, metrics) = first(c.rollout(state)), c.epoch(state)
    traj, stats, runner = rollout.traj, before.obs_stats, before.runner
    assert np.abs(stats.var - 1).max() > 0.1
    _, truncated = check_cartpole_rollout(trainer.env, trainer.env_params, runner.env_state.time, traj.obs,
                                          traj.action, traj.reward, traj.done, traj.terminated, traj.final_obs)

    value = jax.vmap(actor_critic.value_network, (None, 0, None))
    norm_obs = envs.normalize_obs(stats, flat(traj.obs))
    values = host(value(runner.value_params, norm_obs, config.activation)).reshape(traj.reward.shape)
    next_values = host(value(runner.value_params, envs.normalize_obs(stats, flat(traj.final_obs)),
                             config.activation)).reshape(traj.reward.shape)
    advantages, targets = np_gae(traj.reward, values, next_values, traj.terminated, traj.done, config.gamma,
                                 config.lam)
    check_ends(rollout.targets, traj.reward, next_values, traj.terminated, truncated, config.gamma)
    np.testing.assert_allclose(rollout.advantages, advantages, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(rollout.targets, targets, rtol=1e-4, atol=1e-4)

    inputs = jax.vmap(actor_critic.policy_network, (None, 0, None, None))(runner.policy_params, norm_obs, dist,
                                                                         config.activation)
    log_prob = dist.log_prob(inputs, flat(traj.action))
    np.testing.assert_allclose(flat(traj.log_prob), log_prob, rtol=1e-5, atol=1e-5)
    batch = actor_critic.Batch(norm_obs, flat(traj.action), log_prob, flat(advantages).astype(jnp.float32),
                               flat(targets).astype(jnp.float32))
    _, want = actor_critic.policy_loss(runner.policy_params, batch, dist, config)
    _, want_value = actor_critic.value_loss(runner.value_params, batch, config, 1.0)
    metrics = first(metrics)
    for key, value in {**want, **want_value}.items():
        np.testing.assert_allclose(metrics[key], value, rtol=1e-4, atol=1e-5, err_msg=key)


# ----------------------------------------------------------------------------
# reinforce
# ----------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def pg():
    # one Adam step on the whole rollout: the loss reported is that of the parameters before it
    config = reinforce.Config(num_envs=8, num_steps=32, batch_size=256, hidden=(16,), gamma=0.9, baseline=True,
                              normalize_obs=True, total_steps=8 * 32 * 10, n_devices=1)
    return Compiled(reinforce, config)


def np_returns(rewards, dones, gamma):
    """G_t = r_t + gamma (1 - done_t) G_{t+1}, G_T = 0: a plain loop, no bootstrap anywhere."""
    returns, next_return = np.zeros_like(rewards, np.float64), np.zeros(rewards.shape[1])
    for t in reversed(range(len(rewards))):
        next_return = rewards[t] + gamma * (1 - dones[t]) * next_return
        returns[t] = next_return
    return returns


def test_reinforce_epoch():
    c = pg()
    config, trainer = c.config, c.trainer
    dist = reinforce.make_distribution(trainer.env.action_space(trainer.env_params))
    state = c.state_after_warmup()
    before = first(state)
    rollout, (_, metrics) = first(c.rollout(state)), c.epoch(state)
    traj, stats, params = rollout.traj, before.obs_stats, before.runner.params
    assert np.abs(stats.var - 1).max() > 0.1
    terminated, truncated = check_cartpole_rollout(trainer.env, trainer.env_params, before.runner.env_state.time,
                                                   traj.obs, traj.action, traj.reward, traj.done)

    # G_t: at every episode end, truncated or terminated, G = r (REINFORCE does not bootstrap: SPEC 3.2)
    returns = np_returns(traj.reward, traj.done, config.gamma)
    weights = rollout.weights + rollout.return_mean
    ends = truncated | terminated
    np.testing.assert_allclose(weights[ends], traj.reward[ends], rtol=1e-5)
    np.testing.assert_allclose(weights, returns, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(rollout.return_mean, returns.mean(), rtol=1e-5)

    norm_obs = envs.normalize_obs(stats, flat(traj.obs))
    inputs = jax.vmap(reinforce.network, (None, 0, None, None))(params, norm_obs, dist, config.activation)
    log_prob = dist.log_prob(inputs, flat(traj.action))
    np.testing.assert_allclose(flat(traj.log_prob), log_prob, rtol=1e-5, atol=1e-5)
    batch = reinforce.Batch(norm_obs, flat(traj.action), log_prob, flat(returns - returns.mean()).astype(jnp.float32))
    _, want = reinforce.reinforce_loss(params, batch, dist, config.activation)
    metrics = first(metrics)
    for key in ("loss/policy", "policy/entropy", "policy/log_prob_mean"):
        np.testing.assert_allclose(metrics[key], want[key], rtol=1e-4, atol=1e-5, err_msg=key)


# ----------------------------------------------------------------------------
# skip_transformer
# ----------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def transformer():
    # one full-batch step; inside the skip warmup every block runs, so the loss is the full-depth network's
    config = st.Config(env="CartPole-v1", num_envs=8, num_steps=32, update_epochs=1, num_minibatches=1,
                       context_len=3, d_model=8, n_heads=2, d_ff=16, n_layers=2, skip_warmup_steps=1000,
                       gamma=0.9, gae_lambda=0.8, normalize_obs=True, total_steps=8 * 32 * 10, n_devices=1)
    return Compiled(st, config)


def test_skip_transformer_epoch():
    c = transformer()
    config, trainer = c.config, c.trainer
    dist = st.make_distribution(trainer.env.action_space(trainer.env_params))
    state = c.state_after_warmup()
    before = first(state)
    rollout, (_, metrics) = first(c.rollout(state)), c.epoch(state)
    traj, stats, runner = rollout.traj, before.obs_stats, before.runner
    assert np.abs(stats.var - 1).max() > 0.1
    # windows [T, B, L, F + 1]: the newest row is the observation; a final window is the window before
    # it shifted by one row, with the final observation (before any reset) as its newest
    newest, final_newest = traj.obs[..., -1, :-1], traj.final_obs[..., -1, :-1]
    _, truncated = check_cartpole_rollout(trainer.env.env, trainer.env_params, runner.env_state.env_state.time,
                                          newest, traj.action, traj.reward, traj.done, traj.terminated, final_newest)
    np.testing.assert_array_equal(traj.final_obs[..., :-1, :], traj.obs[..., 1:, :])
    np.testing.assert_array_equal(traj.final_obs[..., -1, -1], 1.0)
    np.testing.assert_array_equal(traj.obs[1:][traj.done[:-1]][:, :-1], 0.0)  # a new episode: an empty context

    net = lambda windows: host(st.network(runner.params, st.normalize_window(stats, flat(windows)), dist,  # noqa
                                          config))
    inputs, values, _ = net(traj.obs)
    values, next_values = values.reshape(traj.reward.shape), net(traj.final_obs)[1].reshape(traj.reward.shape)
    advantages, targets = np_gae(traj.reward, values, next_values, traj.terminated, traj.done, config.gamma,
                                 config.gae_lambda)
    check_ends(rollout.targets, traj.reward, next_values, traj.terminated, truncated, config.gamma)
    np.testing.assert_allclose(rollout.advantages, advantages, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(rollout.targets, targets, rtol=1e-4, atol=1e-4)

    log_prob = dist.log_prob(jnp.asarray(inputs), flat(traj.action))
    np.testing.assert_allclose(flat(traj.log_prob), log_prob, rtol=1e-5, atol=1e-5)
    batch = st.Batch(st.normalize_window(stats, flat(traj.obs)), flat(traj.action), log_prob,
                     flat(advantages).astype(jnp.float32), flat(targets).astype(jnp.float32))
    _, (want, _) = st.ppo_loss(runner.params, batch, runner.skip_step, jax.random.PRNGKey(0), dist, config)
    metrics = first(metrics)
    assert metrics["skip/layers_run"] == config.n_layers
    for key in ("loss/joint", "loss/policy", "loss/value", "policy/entropy"):
        np.testing.assert_allclose(metrics[key], want[key], rtol=1e-4, atol=1e-5, err_msg=key)
