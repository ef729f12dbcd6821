"""The wiring of every script's epoch, checked against NumPy on a task that reaches its time limit.

CartPole-v1 is cut to TIME_LIMIT steps (as tests/test_dqn_value.py does), so a rollout holds
steps that terminate (the pole falls) and steps that are truncated. For each script the
epoch's own `trainer.rollout` (the code `epoch` runs before its update) gives the rollout
and its targets; the test checks the rollout against gymnax's CartPole dynamics (each final
observation is the step from the observation before it, not the reset one) and recomputes
the targets in NumPy with the script's network: at a truncated step the target is
r + gamma V(final observation), at a terminated one r (REINFORCE: r at both, it does not
bootstrap). The epochs run past the first with `--normalize-obs`, so the statistics are not
the identity (`--normalize-reward`, on by default where a script has it, divides the rewards
by more than 1), and the losses the epoch reports are the script's loss function on
normalized observations.
"""

import dataclasses
import functools
from typing import Callable, NamedTuple
from unittest import mock

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gymnax.environments.classic_control.cartpole import EnvState

from algos import actor_critic, awr, ppo_joint, reinforce
from algos import skip_transformer as st
from common import devices, envs, run
from helpers import first, host, np_gae, np_log_softmax


TIME_LIMIT = 12  # random CartPole episodes last 8 to ~40 steps: some terminate, most are truncated
WARMUP_EPOCHS = 2  # epochs run before the one checked: the observation statistics have moved


class Compiled:
    """A script's trainer on CartPole-v1 cut at TIME_LIMIT steps: init and rollout compiled, epoch
    when first used."""

    def __init__(self, module, config):
        make_env = envs.make_env

        def time_limited(env_id, **kwargs):
            env, params = make_env(env_id, **kwargs)
            return env, params.replace(max_steps_in_episode=TIME_LIMIT)

        with mock.patch.object(envs, "make_env", time_limited):
            self.trainer = module.make_trainer(config)
        self.config = config
        keys = devices.seed_keys(jax.random.PRNGKey(3), config.num_seeds, config.n_devices)
        init = devices.map_init(self.trainer.init).lower(keys)
        self.init = functools.partial(init.compile(run.FAST_COMPILE), keys)
        self.state_info = init.out_info
        self.rollout = (
            devices.map_epoch(self.trainer.rollout, config.n_devices, donate=False)
            .lower(init.out_info)
            .compile(run.FAST_COMPILE)
        )

    @functools.cached_property
    def epoch(self):
        return (
            devices.map_epoch(self.trainer.epoch, self.config.n_devices, donate=False)
            .lower(self.state_info)
            .compile(run.FAST_COMPILE)
        )

    def state_after_warmup(self):
        state = self.init()
        for _ in range(WARMUP_EPOCHS):
            state, _ = self.epoch(state)
        return state


# ----------------------------------------------------------------------------
# References
# ----------------------------------------------------------------------------
def check_cartpole_rollout(
    env, env_params, time, obs, action, reward, done, terminated=None, final_obs=None
):
    """The rollout `[T, B, ...]` (raw observations) against gymnax's CartPole from each recorded
    observation.

    `time` `[B]`: the steps each episode had run before the rollout. The recorded `terminated` and
    `final_obs`, where a script keeps them, must be gymnax's. Returns `(terminated, truncated)` `[T,
    B]`."""
    T, B = reward.shape
    flat = lambda x: jnp.asarray(x.reshape((T * B,) + x.shape[2:]))  # noqa: E731
    o = flat(obs)
    states = EnvState(
        x=o[:, 0], x_dot=o[:, 1], theta=o[:, 2], theta_dot=o[:, 3], time=jnp.zeros(T * B, jnp.int32)
    )
    step = jax.vmap(env.step_env, (None, 0, 0, None))
    next_obs, _, _, next_terminated, _ = step(
        jax.random.PRNGKey(0), states, flat(action), env_params
    )
    next_obs, next_terminated = (
        np.asarray(next_obs).reshape(obs.shape),
        np.asarray(next_terminated).reshape(T, B),
    )
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
    assert (truncated & ~terminated).any() and terminated.any(), (
        "the rollout needs both kinds of end"
    )
    return terminated, truncated


def np_reward_scale(reward_stats, after, rewards, dones, gamma):
    """`--normalize-reward` in NumPy: each environment's discounted return G_t = r_t + gamma G_{t-1}
    (0 after an end) from the state's, the rollout's returns `[T, B]` merged into the running
    variance (Chan et al.), and what the rewards are divided by: its square root where above 1.
    `after`, the rollout state's statistics, must match."""
    # the warmup's epochs joined the statistics
    assert reward_stats.stats.count == WARMUP_EPOCHS * rewards.size
    assert np.any(reward_stats.returns != 0)  # and left episodes under way
    returns, ret = np.zeros_like(rewards, np.float64), reward_stats.returns.astype(np.float64)
    for t in range(len(rewards)):
        ret = gamma * ret + rewards[t]
        returns[t] = ret
        ret = np.where(dones[t], 0.0, ret)
    old, n = reward_stats.stats, returns.size
    total = old.count + n
    delta = returns.mean() - old.mean
    var = (old.var * old.count + returns.var() * n + delta**2 * old.count * n / total) / total
    np.testing.assert_allclose(after.returns, ret, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(
        [after.stats.mean, after.stats.var, after.stats.count],
        [old.mean + delta * n / total, var, total],
        rtol=1e-4,
    )
    assert np.sqrt(var) > 1.5  # the scale is not the identity here
    return max(np.sqrt(var), 1.0)


def check_ends(targets, rewards, next_values, terminated, truncated, gamma):
    """targets = r + gamma V(final observation) at truncated steps, r at terminated ones."""
    cut = truncated & ~terminated
    np.testing.assert_allclose(
        targets[cut], rewards[cut] + gamma * next_values[cut], rtol=1e-5, atol=1e-5
    )
    np.testing.assert_allclose(targets[terminated], rewards[terminated], rtol=1e-5, atol=1e-5)


def flat(x):
    return jnp.asarray(x.reshape((-1,) + x.shape[2:]))


# ----------------------------------------------------------------------------
# The GAE scripts: ppo_joint, actor_critic, skip_transformer
# ----------------------------------------------------------------------------
class GaeScript(NamedTuple):
    """What the check of a GAE script's epoch needs from it; the check itself is the same for all
    three."""

    module: object
    flags: dict  # its tiny config, besides GAE_FLAGS
    normalize: Callable  # (obs_stats, raw observations [N, ...]) -> what its networks read
    nets: Callable  # (config, runner, dist, normalized [N, ...]) -> (policy inputs [N, ...], V [N])
    losses: Callable  # (config, runner, batch, dist) -> {metric: value}, as the epoch reports them
    runner_after: Callable  # rollout -> the runner state after its T steps


# One full-batch update step per network: the losses an epoch reports are those of the parameters
# before it (skip_transformer inside its skip warmup, where every block runs).
GAE_FLAGS = dict(
    num_envs=8, num_steps=32, gamma=0.9, normalize_obs=True, total_steps=8 * 32 * 10, n_devices=1
)
PPO_KEYS = ("loss/joint", "loss/policy", "loss/value", "policy/entropy")
GAE = {
    "ppo_joint": GaeScript(
        ppo_joint,
        dict(update_passes=1, num_minibatches=1, hidden=(16,), gae_lambda=0.8),
        envs.normalize_obs,
        lambda config, runner, dist, x: jax.vmap(ppo_joint.network, (None, 0, None, None))(
            runner.params, x, dist, config.activation
        ),
        lambda config, runner, batch, dist: {
            k: v
            for k, v in ppo_joint.ppo_loss(runner.params, batch, dist, config)[1].items()
            if k in PPO_KEYS
        },
        lambda rollout: rollout.state,
    ),
    "actor_critic": GaeScript(
        actor_critic,
        dict(loss="a2c", value_steps=1, value_batch_size=256, hidden=(16,), gae_lambda=0.8),
        envs.normalize_obs,
        lambda config, runner, dist, x: (
            jax.vmap(actor_critic.policy_network, (None, 0, None, None))(
                runner.policy_params, x, dist, config.activation
            ),
            jax.vmap(actor_critic.value_network, (None, 0, None))(
                runner.value_params, x, config.activation
            ),
        ),
        lambda config, runner, batch, dist: {
            **actor_critic.policy_loss(runner.policy_params, batch, dist, config)[1],
            **actor_critic.value_loss(runner.value_params, batch, config, 1.0)[1],
        },
        lambda rollout: rollout.state,
    ),
    "skip_transformer": GaeScript(
        st,
        dict(
            env="CartPole-v1",
            update_passes=1,
            num_minibatches=1,
            context_len=3,
            d_model=8,
            n_heads=2,
            d_ff=16,
            n_layers=2,
            skip_warmup_steps=1000,
            gae_lambda=0.8,
        ),
        envs.normalize_window,
        lambda config, runner, dist, x: st.network(runner.params, x, dist, config)[:2],
        lambda config, runner, batch, dist: {
            k: v
            for k, v in st.ppo_loss(
                runner.params, batch, runner.skip_step, jax.random.PRNGKey(0), dist, config
            )[1][0].items()
            if k in PPO_KEYS
        },
        lambda rollout: rollout.state,
    ),
}


@functools.lru_cache(maxsize=None)
def gae_compiled(name):
    script = GAE[name]
    return Compiled(script.module, script.module.Config(**GAE_FLAGS, **script.flags).resolved())


def check_windows(env, env_params, before, traj):
    """skip_transformer's rollout of windows `[T, B, L, F + 1]`: the newest row is the observation
    (checked against CartPole); a final window is the window before it shifted by one row, with the
    final observation (before any reset) as its newest; a new episode starts from an empty context.
    Returns `truncated`."""
    newest, final_newest = traj.obs[..., -1, :-1], traj.final_obs[..., -1, :-1]
    _, truncated = check_cartpole_rollout(
        env.env,
        env_params,
        before.env_state.env_state.time,
        newest,
        traj.action,
        traj.reward,
        traj.done,
        traj.terminated,
        final_newest,
    )
    np.testing.assert_array_equal(traj.final_obs[..., :-1, :], traj.obs[..., 1:, :])
    np.testing.assert_array_equal(traj.final_obs[..., -1, -1], 1.0)
    np.testing.assert_array_equal(traj.obs[1:][traj.done[:-1]][:, :-1], 0.0)
    return truncated


@pytest.mark.parametrize("name", sorted(GAE))
def test_gae_epoch(name):
    """The rollout against CartPole; GAE advantages and targets in NumPy from the script's networks
    on the normalized observations (rewards divided by the --normalize-reward scale); the losses the
    epoch reports against the script's loss functions on the same batch."""
    script, c = GAE[name], gae_compiled(name)
    config, trainer = c.config, c.trainer
    dist = script.module.make_distribution(trainer.env.action_space(trainer.env_params))
    state = c.state_after_warmup()
    before = first(state)
    rollout, (_, metrics) = first(c.rollout(state)), c.epoch(state)
    traj, stats = rollout.traj, before.obs_stats
    # past the first epoch: the normalization is not the identity
    assert np.abs(stats.var - 1).max() > 0.1
    if name == "skip_transformer":
        truncated = check_windows(trainer.env, trainer.env_params, before, traj)
    else:
        _, truncated = check_cartpole_rollout(
            trainer.env,
            trainer.env_params,
            before.env_state.time,
            traj.obs,
            traj.action,
            traj.reward,
            traj.done,
            traj.terminated,
            traj.final_obs,
        )

    # targets: GAE in NumPy on the network's values of the normalized observations
    normalized = script.normalize(stats, flat(traj.obs))
    inputs, values = host(script.nets(config, before, dist, normalized))
    next_values = host(
        script.nets(config, before, dist, script.normalize(stats, flat(traj.final_obs)))[1]
    )
    values, next_values = values.reshape(traj.reward.shape), next_values.reshape(traj.reward.shape)
    rewards = traj.reward / np_reward_scale(
        before.reward_stats,
        script.runner_after(rollout).reward_stats,
        traj.reward,
        traj.done,
        config.gamma,
    )
    advantages, targets = np_gae(
        rewards,
        values,
        next_values,
        traj.terminated,
        traj.done,
        config.gamma,
        config.gae_lambda,
    )
    check_ends(rollout.targets, rewards, next_values, traj.terminated, truncated, config.gamma)
    np.testing.assert_allclose(rollout.advantages, advantages, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(rollout.targets, targets, rtol=1e-4, atol=1e-4)
    if hasattr(traj, "value"):  # the value recorded at collection
        np.testing.assert_allclose(traj.value, values, rtol=1e-5, atol=1e-5)

    # the update's losses on the normalized batch (one full-batch step, from the parameters before
    # it)
    log_prob = dist.log_prob(jnp.asarray(inputs), flat(traj.action))
    np.testing.assert_allclose(flat(traj.log_prob), log_prob, rtol=1e-5, atol=1e-5)
    batch = script.module.Batch(
        obs=normalized,
        action=flat(traj.action),
        log_prob=log_prob,
        advantage=flat(advantages).astype(jnp.float32),
        target=flat(targets).astype(jnp.float32),
    )
    metrics = first(metrics)
    if name == "skip_transformer":
        assert metrics["skip/layers_run"] == config.n_layers
    for key, value in script.losses(config, before, batch, dist).items():
        np.testing.assert_allclose(metrics[key], value, rtol=1e-4, atol=1e-5, err_msg=key)


# ----------------------------------------------------------------------------
# reinforce
# ----------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def pg():
    # one Adam step on the whole rollout: the loss reported is that of the parameters before it
    config = reinforce.Config(
        num_envs=8,
        num_steps=32,
        batch_size=256,
        update_steps=1,
        hidden=(16,),
        gamma=0.9,
        baseline=True,
        normalize_obs=True,
        normalize_reward=True,
        total_steps=8 * 32 * 10,
        n_devices=1,
    )
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
    traj, stats, params = rollout.traj, before.obs_stats, before.params
    assert np.abs(stats.var - 1).max() > 0.1
    terminated, truncated = check_cartpole_rollout(
        trainer.env,
        trainer.env_params,
        before.env_state.time,
        traj.obs,
        traj.action,
        traj.reward,
        traj.done,
    )

    # G_t: at every episode end, truncated or terminated, G = r (REINFORCE does not bootstrap: SPEC
    # 3.2)
    rewards = traj.reward / np_reward_scale(
        before.reward_stats, rollout.state.reward_stats, traj.reward, traj.done, config.gamma
    )
    returns = np_returns(rewards, traj.done, config.gamma)
    weights = rollout.weights + rollout.return_mean
    ends = truncated | terminated
    np.testing.assert_allclose(weights[ends], rewards[ends], rtol=1e-5)
    np.testing.assert_allclose(weights, returns, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(rollout.return_mean, returns.mean(), rtol=1e-5)

    norm_obs = envs.normalize_obs(stats, flat(traj.obs))
    inputs = jax.vmap(reinforce.network, (None, 0, None, None))(
        params, norm_obs, dist, config.activation
    )
    log_prob = dist.log_prob(inputs, flat(traj.action))
    np.testing.assert_allclose(flat(traj.log_prob), log_prob, rtol=1e-5, atol=1e-5)
    batch = reinforce.Batch(
        obs=norm_obs,
        action=flat(traj.action),
        log_prob=log_prob,
        weight=flat(returns - returns.mean()).astype(jnp.float32),
    )
    _, want = reinforce.reinforce_loss(params, batch, dist, config)
    metrics = first(metrics)
    for key in ("loss/policy", "policy/entropy", "policy/log_prob_mean"):
        np.testing.assert_allclose(metrics[key], want[key], rtol=1e-4, atol=1e-5, err_msg=key)


# ----------------------------------------------------------------------------
# awr: one epoch's returns, advantages and loss weights from the stored replay and the critic
# ----------------------------------------------------------------------------
# Two devices; the replay holds 4 epochs and is checked after its third (one slot still empty,
# so the empty rows must stay out of every statistic). beta and w_max clip some weights.
AWR = dict(
    num_envs=8,
    num_steps=16,
    n_replay_epochs=4,
    policy_steps=1,
    value_steps=2,
    policy_batch_size=32,
    value_batch_size=32,
    hidden=(16,),
    gamma=0.9,
    gae_lambda=0.8,
    beta=0.5,
    w_max=3.0,
    total_steps=8 * 16 * 10,
    n_devices=2,
)
# Sampling AWR on CartPole with K = 2: every action once, weighted by mu
SAMPLING = dict(
    AWR,
    q_value=True,
    n_samples=2,
    q_aggregate="softmax",
    q_temperature=0.5,
    q_normalization="std",
    reweight=True,
    normalize_obs=True,
)


@functools.lru_cache(maxsize=None)
def awr_compiled(**flags):
    return Compiled(awr, awr.Config(**flags))


@functools.lru_cache(maxsize=None)
def awr_state(**flags):
    """The state after two epochs, and the rollout and metrics of the third."""
    c = awr_compiled(**flags)
    state = c.state_after_warmup()
    return state, host(c.rollout(state)), host(c.epoch(state)[1])


def devices_of(tree):
    """Seed 0 of every device: `[n_devices, ...]` leaves on the host."""
    return jax.tree.map(lambda x: np.asarray(x)[:, 0], jax.device_get(tree))


def np_td_lambda(rewards, next_values, terminated, dones, gamma, lam):
    """G_t = r_t + gamma_t ((1 - lam_t) V(s'_t) + lam_t G_{t+1}), G_T = V(s'_{T-1}): a plain
    loop."""
    returns, next_return = np.zeros_like(rewards, np.float64), next_values[-1]
    for t in reversed(range(len(rewards))):
        discount, lam_t = gamma * (1 - terminated[t]), lam * (1 - dones[t])
        next_return = rewards[t] + discount * ((1 - lam_t) * next_values[t] + lam_t * next_return)
        returns[t] = next_return
    return returns


def np_aggregate(q, mu, how, temperature, scale):
    """SPEC 3.5 over every action of `[N, A]`: mean (weighted by mu), max, softmax, logsumexp."""
    q = q / scale
    if how == "mean":
        agg = np.sum(mu * q, 1)
    elif how == "max":
        agg = q.max(1)
    elif how == "softmax":
        p = np.exp(q / temperature - (q / temperature).max(1, keepdims=True))
        agg = np.sum(p / p.sum(1, keepdims=True) * q, 1)
    else:
        z = q / temperature
        agg = temperature * (
            z.max(1) + np.log(np.exp(z - z.max(1, keepdims=True)).sum(1)) - np.log(q.shape[1])
        )
    return agg * scale


def np_scale(q, normalization):
    """std(Q) or mean |Q - mean Q| (+ 1e-5) over every entry of `q`, or 1."""
    if normalization == "none":
        return 1.0
    deviation = q - q.mean()
    return (
        np.sqrt(np.mean(deviation**2)) if normalization == "std" else np.mean(np.abs(deviation))
    ) + 1e-5


def awr_setup(c, state, rollout):
    """Per device: the replay rows the epoch stored, observations and rewards normalized, how many
    are filled."""
    config, trainer = c.config, c.trainer
    before, replay = devices_of(state), devices_of(rollout).state.replay
    # --normalize-reward: one scale for every device, from all their returns (their statistics are
    # merged)
    traj, after = devices_of(rollout).traj, devices_of(rollout).state.reward_stats
    cat = lambda x: np.concatenate(list(x), -1)  # noqa: E731  [D, ..., B] -> [..., D * B]

    def seen(s):
        return envs.RewardStats(returns=cat(s.returns), stats=jax.tree.map(lambda x: x[0], s.stats))

    chex.assert_trees_all_equal(
        *(jax.tree.map(lambda x: x[d], after.stats) for d in range(config.n_devices))
    )
    scale = np_reward_scale(
        seen(before.reward_stats), seen(after), cat(traj.reward), cat(traj.done), config.gamma
    )
    n_valid = int(replay.filled[0]) * config.num_steps * config.num_envs // config.n_devices
    N = config.n_replay_epochs * config.num_steps * config.num_envs // config.n_devices

    def norm(d, x):
        return np.asarray(
            envs.normalize_obs(
                jax.tree.map(lambda s: s[d], before.obs_stats),
                jnp.asarray(x.reshape((N,) + x.shape[3:])),
            )
        )

    rows = [
        dict(
            obs=norm(d, replay.data.obs[d]),
            final_obs=norm(d, replay.data.final_obs[d]),
            **{
                k: getattr(replay.data, k)[d].reshape((N,) + getattr(replay.data, k).shape[4:])
                for k in ("action", "terminated", "done", "inputs", "next_inputs")
            },
            reward=replay.data.reward[d].reshape(N) / scale,
        )
        for d in range(config.n_devices)
    ]
    assert 0 < n_valid < N  # a slot still empty
    dist = awr.make_distribution(trainer.env.action_space(trainer.env_params))
    return before, rows, n_valid, N, dist


def np_returns_per_device(c, rows, next_values, N):
    config = c.config
    shape = (config.n_replay_epochs, config.num_steps, config.num_envs // config.n_devices)
    out = []
    for row, v in zip(rows, next_values):
        r, term, done = (row[k].reshape(shape) for k in ("reward", "terminated", "done"))
        out.append(
            np.stack(
                [
                    np_td_lambda(
                        r[i], v.reshape(shape)[i], term[i], done[i], config.gamma, config.gae_lambda
                    )
                    for i in range(shape[0])
                ]
            ).reshape(N)
        )
    return out


def check_awr_ends(rollout, rows, next_values, n_valid, gamma):
    """At every stored episode end the epoch's G = r + gamma V(final observation) if truncated, r if
    terminated."""
    returns = devices_of(rollout).returns
    term = np.concatenate([row["terminated"][:n_valid] for row in rows])
    cut = np.concatenate([row["done"][:n_valid] for row in rows]) & ~term
    assert cut.any() and term.any()
    check_ends(
        np.concatenate([g[:n_valid] for g in returns]),
        np.concatenate([row["reward"][:n_valid] for row in rows]),
        np.concatenate([v[:n_valid] for v in next_values]),
        term,
        cut,
        gamma,
    )


def np_weights(config, advantages, n_valid):
    """Standardized over the valid rows of every device (the default), then min(exp(A / beta),
    w_max)."""
    valid = np.concatenate([a[:n_valid] for a in advantages])
    mean, std = valid.mean(), valid.std()
    advantages = [(a - mean) / (std + 1e-8) for a in advantages]
    return (
        advantages,
        [np.minimum(np.exp(a / config.beta), config.w_max) for a in advantages],
        mean,
        std,
    )


def check_awr_figures(rollout, n_valid, returns, advantages, weights, mask, mean, std, w_max):
    r = devices_of(rollout)
    t = r.targets  # what the policy trains on
    for d in range(len(returns)):
        np.testing.assert_allclose(
            r.returns[d][:n_valid], returns[d][:n_valid], rtol=1e-4, atol=1e-4
        )
        np.testing.assert_allclose(
            t.advantages[d][:n_valid], advantages[d][:n_valid], rtol=1e-3, atol=1e-3
        )
        np.testing.assert_allclose(
            t.weights[d][:n_valid], weights[d][:n_valid], rtol=1e-3, atol=1e-3
        )
        np.testing.assert_allclose(t.mask[d][:n_valid], mask[d][:n_valid], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(t.metrics["awr/advantage_mean"][0], mean, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(t.metrics["awr/advantage_std"][0], std, rtol=1e-4, atol=1e-5)
    # some weights clip
    assert np.isclose(np.concatenate([w[:n_valid] for w in weights]), w_max).any()


def policy_minibatch(r, d, config, n_valid):
    """The rows device `d` draws for the epoch's one policy step, from its policy key."""
    return np.asarray(
        jax.random.randint(
            jax.random.split(r.policy_key[d], 1)[0], (config.policy_batch_size,), 0, n_valid
        )
    )


def check_awr_policy_loss(c, before, rollout, metrics, rows, weights, mask, n_valid):
    """The loss the epoch reports: policy_loss on the normalized replay rows of its minibatch (one
    step, each device drawing its rows from its policy key), with the weights and mask recomputed
    here."""
    config, r = c.config, devices_of(rollout)
    dist = awr.make_distribution(c.trainer.env.action_space(c.trainer.env_params))
    losses = []
    for d, row in enumerate(rows):
        idx = policy_minibatch(r, d, config, n_valid)
        losses.append(
            awr.policy_loss(
                jax.tree.map(lambda x: x[d], before.policy),
                jnp.asarray(row["obs"][idx]),
                jnp.asarray(r.targets.actions[d][idx]),
                jnp.asarray(weights[d][idx], jnp.float32),
                jnp.asarray(mask[d][idx], jnp.float32),
                jnp.asarray(r.targets.log_mu[d][idx]),
                dist,
                config,
            )[0]
        )
    np.testing.assert_allclose(metrics["loss/policy"][0, 0], np.mean(losses), rtol=1e-4, atol=1e-5)


def test_awr_epoch():
    flags = dict(AWR, normalize_obs=True)
    c = awr_compiled(**flags)
    state, rollout, metrics = awr_state(**flags)
    before, rows, n_valid, N, dist = awr_setup(c, state, rollout)
    config, after = c.config, devices_of(rollout).state
    assert np.abs(before.obs_stats.var - 1).max() > 0.1
    traj = devices_of(rollout).traj  # this epoch's steps, every device's environments side by side
    cat = lambda x: np.concatenate(list(x), 1)  # noqa: E731  [D, T, B, ...] -> [T, D * B, ...]
    check_cartpole_rollout(
        c.trainer.env,
        c.trainer.env_params,
        np.concatenate(before.env_state.time),
        cat(traj.obs),
        cat(traj.action),
        cat(traj.reward),
        cat(traj.done),
        cat(traj.terminated),
        cat(traj.final_obs),
    )

    def value(params, d, obs):
        return np.asarray(
            jax.vmap(awr.critic_net, (None, 0, None, None))(
                jax.tree.map(lambda x: x[d], params), jnp.asarray(obs), None, config.activation
            )
        )

    # the critic's targets: TD(lambda) on V(final observation) of the critic before its update
    next_values = [value(before.critic, d, row["final_obs"]) for d, row in enumerate(rows)]
    returns = np_returns_per_device(c, rows, next_values, N)
    check_awr_ends(rollout, rows, next_values, n_valid, config.gamma)
    # the policy's advantages: G - V of the updated critic
    new_next = [value(after.critic, d, row["final_obs"]) for d, row in enumerate(rows)]
    new_returns = np_returns_per_device(c, rows, new_next, N)
    advantages = [
        (g - value(after.critic, d, row["obs"]))[:, None]
        for d, (g, row) in enumerate(zip(new_returns, rows))
    ]
    advantages, weights, mean, std = np_weights(config, advantages, n_valid)
    mask = [np.ones((N, 1))] * config.n_devices
    check_awr_figures(rollout, n_valid, returns, advantages, weights, mask, mean, std, config.w_max)
    np.testing.assert_array_equal(
        devices_of(rollout).targets.actions, np.stack([row["action"][:, None] for row in rows])
    )
    check_awr_policy_loss(c, before, rollout, metrics, rows, weights, mask, n_valid)


def np_mlp(layers, out, x):
    """The tanh torso `layers`, then the linear layer `out`, in float64."""
    f = lambda a: np.asarray(a, np.float64)  # noqa: E731
    for layer in layers:
        x = np.tanh(x @ f(layer["w"]) + f(layer["b"]))
    return x @ f(out["w"]) + f(out["b"])


def np_q(params, obs, codes):
    """Q(s, a_k) `[N, K]`: the critic on the concatenation [s; a_k] of each state `[N, n_obs]` and
    action code `[N, K, n_code]` (the script splits its first layer instead)."""
    x = np.concatenate([np.broadcast_to(obs[:, None], codes.shape[:2] + obs.shape[1:]), codes], -1)
    return np_mlp(params["torso"], params["out"], x.astype(np.float64))[..., 0]


@pytest.mark.parametrize(
    "how, temperature, normalization",
    [
        ("softmax", 0.5, "std"),
        ("mean", 1.0, "none"),
        ("max", 1.0, "abs"),
        ("logsumexp", 2.0, "std"),
    ],
)
def test_sampling_awr_epoch(how, temperature, normalization):
    """Every aggregate, with a temperature other than 1 and each q-normalization; the epoch of the
    first."""
    base = awr_compiled(**SAMPLING)
    state, _, metrics = awr_state(**SAMPLING)
    flags = dict(
        SAMPLING, q_aggregate=how, q_temperature=temperature, q_normalization=normalization
    )
    c = awr_compiled(**flags) if flags != SAMPLING else base
    rollout = host(c.rollout(state))  # from the state of the first's two epochs
    before, rows, n_valid, N, dist = awr_setup(c, state, rollout)
    config = c.config
    A = dist.n
    np.testing.assert_array_equal(
        devices_of(rollout).targets.actions, np.broadcast_to(np.arange(A), (config.n_devices, N, A))
    )

    # Q(s, a) of the target copy (the critic before its update) for every action: [N, A]
    def q_of(d, obs):
        return np_q(
            jax.tree.map(lambda x: x[d], before.critic),
            obs,
            np.broadcast_to(np.eye(A), (len(obs), A, A)),
        )

    q = [q_of(d, row["obs"]) for d, row in enumerate(rows)]
    next_q = [q_of(d, row["final_obs"]) for d, row in enumerate(rows)]
    log_mu = [np_log_softmax(row["inputs"].astype(np.float64)) for row in rows]
    next_mu = [np.exp(np_log_softmax(row["next_inputs"].astype(np.float64))) for row in rows]
    # the scale: over the filled rows of both devices
    scale = np_scale(np.concatenate([nq[:n_valid] for nq in next_q]), normalization)
    next_values = [np_aggregate(nq, mu, how, temperature, scale) for nq, mu in zip(next_q, next_mu)]
    returns = np_returns_per_device(c, rows, next_values, N)
    check_awr_ends(rollout, rows, next_values, n_valid, config.gamma)
    # A_k = Q_k - sum_k mu_k Q_k; the mask m_k = mu(a_k|s)
    advantages = [qd - np.sum(np.exp(lm) * qd, 1, keepdims=True) for qd, lm in zip(q, log_mu)]
    advantages, weights, mean, std = np_weights(config, advantages, n_valid)
    mask = [np.exp(lm) for lm in log_mu]
    r = devices_of(rollout).targets
    for d in range(config.n_devices):
        np.testing.assert_allclose(r.q[d][:n_valid], q[d][:n_valid], rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(r.log_mu[d][:n_valid], log_mu[d][:n_valid], rtol=1e-4, atol=1e-5)
    check_awr_figures(rollout, n_valid, returns, advantages, weights, mask, mean, std, config.w_max)
    if flags == SAMPLING:
        check_awr_policy_loss(c, before, rollout, metrics, rows, weights, mask, n_valid)


# Pendulum, K = 4 actions drawn from the Gaussian mu recorded at collection
CONTINUOUS = dict(AWR, env="Pendulum-v1", q_value=True, n_samples=4)


def test_sampling_awr_continuous_epoch():
    """Continuous Sampling AWR: the K actions per state follow mu (their z-scores are standard
    normal), log mu, Q(s, a_k), A_k = Q_k - mean_k Q_k, the weights and the policy's loss, all in
    NumPy."""
    c = awr_compiled(**CONTINUOUS)
    state, rollout, metrics = awr_state(**CONTINUOUS)
    before, rows, n_valid, N, dist = awr_setup(c, state, rollout)
    config, r, K = c.config, devices_of(rollout), CONTINUOUS["n_samples"]
    t = r.targets
    chex.assert_shape(t.actions, (config.n_devices, N, K, 1))

    # mu's z-scores [N, K] and log-densities [N, K] of 1-D actions [N, K]
    def gaussian(inputs, actions):
        mean, log_std = np.split(inputs.astype(np.float64), 2, -1)
        z = (actions - mean) / np.exp(log_std)
        return z, -0.5 * z**2 - log_std - 0.5 * np.log(2 * np.pi)

    z, log_mu = zip(*(gaussian(row["inputs"], t.actions[d][..., 0]) for d, row in enumerate(rows)))
    zs = np.concatenate([x[:n_valid] for x in z])
    assert abs(zs.mean()) < 0.15 and abs(zs.std() - 1) < 0.15 and np.all(np.std(zs, 1) > 0)
    q = [
        np_q(jax.tree.map(lambda x: x[d], before.critic), row["obs"], t.actions[d])
        for d, row in enumerate(rows)
    ]
    advantages, weights, mean, std = np_weights(
        config, [qd - qd.mean(1, keepdims=True) for qd in q], n_valid
    )
    for d in range(config.n_devices):
        for name, got, want in (
            ("log_mu", t.log_mu, log_mu),
            ("q", t.q, q),
            ("advantages", t.advantages, advantages),
            ("weights", t.weights, weights),
        ):
            np.testing.assert_allclose(
                got[d][:n_valid], want[d][:n_valid], rtol=1e-3, atol=1e-4, err_msg=name
            )
        np.testing.assert_array_equal(t.mask[d], 1.0)
    losses = []  # -mean_s mean_k w_k log pi(a_k|s) on each device's minibatch (one policy step)
    for d, row in enumerate(rows):
        idx = policy_minibatch(r, d, config, n_valid)
        policy = jax.tree.map(lambda x: np.asarray(x[d]), before.policy)
        head = {"w": policy["head"]["w"], "b": policy["head"]["b"]}
        inputs = np.concatenate(
            [
                np_mlp(policy["torso"], head, row["obs"][idx].astype(np.float64)),
                np.broadcast_to(policy["head"]["log_std"], (len(idx), 1)),
            ],
            -1,
        )
        losses.append(-np.mean(weights[d][idx] * gaussian(inputs, t.actions[d][idx][..., 0])[1]))
    np.testing.assert_allclose(metrics["loss/policy"][0, 0], np.mean(losses), rtol=1e-4, atol=1e-5)


def test_awr_reweight_carries_no_gradient():
    """--reweight's rho = pi(a_k|s) / mu(a_k|s) weighs the epoch's replay rows as a number: the
    gradient is that of the loss with the mask times rho held fixed."""
    c = awr_compiled(**SAMPLING)
    state, rollout, _ = awr_state(**SAMPLING)
    before, rows, n_valid, _, dist = awr_setup(c, state, rollout)
    config, r = c.config, devices_of(rollout).targets
    params = jax.tree.map(lambda x: x[0], before.policy)
    obs, actions, weights, mask, log_mu = (
        jnp.asarray(x[:n_valid])
        for x in (rows[0]["obs"], r.actions[0], r.weights[0], r.mask[0], r.log_mu[0])
    )
    inputs = np.asarray(
        jax.vmap(awr.policy_net, (None, 0, None, None))(params, obs, dist, config.activation)
    )
    # actions: every one, in order
    rho = np.exp(np_log_softmax(inputs.astype(np.float64)) - np.asarray(log_mu))
    loss = lambda p: awr.policy_loss(p, obs, actions, weights, mask, log_mu, dist, config)[0]  # noqa: E731

    def fixed(p):
        return awr.policy_loss(
            p,
            obs,
            actions,
            weights,
            mask * jnp.asarray(rho, jnp.float32),
            log_mu,
            dist,
            dataclasses.replace(config, reweight=False),
        )[0]

    np.testing.assert_allclose(loss(params), fixed(params), rtol=1e-5)
    chex.assert_trees_all_close(
        jax.grad(loss)(params), jax.grad(fixed)(params), rtol=1e-4, atol=1e-6
    )
