"""PPO with one network: a shared torso, a policy head and a value head.

Trax's `ActorCriticJointTrainer` with the `PPOJoint` loss (Schulman et al.
2017, "Proximal Policy Optimization Algorithms", arXiv:1707.06347). One epoch
-- a vectorized gymnax rollout, GAE, and clipped-PPO updates over epochs and
minibatches -- is one compiled function; Python only loops over epochs.

    python algos/ppo_joint.py                                         # CartPole-v1
    python algos/ppo_joint.py --env Pendulum-v1 --total-steps 300000  # Box actions

docs/algorithms/ppo_joint.md has the math, the flags that matter and the results.
"""

from __future__ import annotations

import dataclasses
from typing import Literal, NamedTuple

import chex
import jax
import jax.numpy as jnp
import optax

from common import cli, devices, envs, nets, run
from common.distributions import make_distribution, noise_correlation
from common.metrics import residual_metrics


@dataclasses.dataclass(frozen=True)
class Config(cli.TrainConfig):
    # Float flags are inputs of the compiled programs: traced numbers, so runs that differ only in
    # them share their programs. Compute with them (jnp.where); a Python `if` on one is refused.
    # Constants instead: a SWITCHES flag at 0 (its term left out) and the STATIC_FLOATS.
    SWITCHES = ("max_grad_norm",)  # 0: no clipping (a program without it)
    STATIC_FLOATS = ()
    # cli.TrainConfig holds num_envs, num_steps, gamma, anneal_lr and max_grad_norm
    update_passes: int = 4
    """passes over each rollout"""
    num_minibatches: int = 4
    """minibatches per pass (must divide the per-device batch num_envs / n_devices * num_steps)"""
    lr: float | None = None
    """Adam learning rate (unset: 1e-3 where the network starts with the convolution, on image
    observations; else 2.5e-3; docs/decisions.md says why)"""
    gae_lambda: float = 0.95
    """lambda of GAE"""
    advantage: Literal["gae", "monte-carlo"] = "gae"
    """gae: A = GAE(lambda); monte-carlo: A = G - V with G the discounted return (Trax)"""
    normalize_advantages: bool = False
    """standardize advantages per minibatch"""
    clip_eps: float = 0.2
    """PPO ratio clip epsilon"""
    vf_coef: float = 0.25
    """value loss coefficient c_v"""
    ent_coef: float | None = None
    """entropy bonus coefficient c_ent, which keeps a policy from settling on one action early
    (unset: 0.02 where the network starts with the convolution, on image observations; else 0.01;
    docs/decisions.md says why)"""
    torso: nets.Torso = "auto"
    """the network's first layers: conv, one 3x3 convolution of 16 channels before the dense layers
    (image observations [H, W, C]); mlp, dense layers on the flattened observation; auto: conv for
    images, else mlp"""
    hidden: tuple[int, ...] = (64, 64)
    """torso layer widths"""
    activation: nets.Activation | None = None
    """torso activation (unset: relu where the network starts with the convolution, on image
    observations; else tanh; docs/decisions.md says why)"""
    std: Literal["param", "network"] = "param"
    """Box actions: log std as a learned vector (param) or a network output (network)"""
    noise_memory: float = 0.002
    """Box actions: how long each environment's exploration noise lasts, as a fraction of the
    episode's step limit; successive noises are correlated by exp(-1 / (noise_memory * limit)) (0:
    independent noise every step; common/distributions.py)"""
    box_coef: float = 0.0
    """Box actions: weight of the penalty on the policy's mean outside the action box, the squared
    distance outside it in half-widths of the box (common/distributions.py; 0: no penalty, the
    default here, where a mean past a bound is how the policy acts bang-bang; actor_critic and
    reinforce, whose large steps let the mean run out, use 1)"""
    normalize_obs: bool | None = None
    """normalize observations by their running mean and variance (kept in the runner state, merged
    over devices, per seed, saved in checkpoints), clipped to +-10; unset: on for discrete actions
    read by dense layers, off for Box actions, images and features the space holds in [0, 1]
    (common/envs.py)"""
    normalize_reward: bool = True
    """divide the learner's rewards by a running std of the discounted return where above 1 (kept
    like --normalize-obs): value targets of order 1 whatever the reward scale (false: raw
    rewards)"""

    def __post_init__(self):
        super().__post_init__()
        for name in ("update_passes", "num_minibatches"):
            cli.require(getattr(self, name) >= 1, f"--{name.replace('_', '-')} must be at least 1")
        cli.require(self.lr is None or self.lr > 0, f"--lr {self.lr}: use a positive learning rate")
        cli.require(
            0 <= self.gae_lambda <= 1, f"--gae-lambda {self.gae_lambda}: use a value in [0, 1]"
        )
        cli.require(
            self.clip_eps > 0, f"--clip-eps {self.clip_eps}: use a positive value, e.g. 0.2"
        )
        cli.require_non_negative(self, "vf_coef", "ent_coef", "noise_memory", "box_coef")
        cli.require(
            len(self.hidden) >= 1 and min(self.hidden) >= 1, "--hidden needs positive widths"
        )

    def resolved(self) -> Config:
        """The flags left unset, from the environment's spaces: --lr, --ent-coef and --activation
        by the network's first layers, --normalize-obs by the spaces and the torso
        (`envs.normalizes_obs`)."""
        config = self
        conv = envs.starts_with_conv(config.env, config.torso)
        by_torso = {
            "lr": 1e-3 if conv else 2.5e-3,
            "ent_coef": 0.02 if conv else 0.01,
            "activation": "relu" if conv else "tanh",
        }
        for name, value in by_torso.items():
            if getattr(config, name) is None:  # else given, or a traced number inside a program
                config = dataclasses.replace(config, **{name: value})
        if config.normalize_obs is None:
            normalize = envs.normalizes_obs(config.env, config.torso)
            config = dataclasses.replace(config, normalize_obs=normalize)
        return config


# ----------------------------------------------------------------------------
# Network: plain functions over a parameter pytree
# ----------------------------------------------------------------------------
def init_network(key, obs_shape: tuple, hidden: tuple, dist, conv: bool = False) -> dict:
    # one per hidden layer, the policy head, the value head
    keys = jax.random.split(key, len(hidden) + 2)
    return {
        "torso": nets.torso_init(keys[:-2], obs_shape, hidden, conv),
        "policy": dist.head_init(keys[-2], hidden[-1]),
        "value": nets.dense_init(keys[-1], hidden[-1], 1, 1.0),
    }


def network(params: dict, obs: jax.Array, dist, activation: nets.Activation):
    """One observation -> (distribution inputs [n_inputs], value [])."""
    x = nets.torso(params["torso"], obs, activation)
    value = x @ params["value"]["w"] + params["value"]["b"]
    return dist.policy_head(params["policy"], x), value[0]


# ----------------------------------------------------------------------------
# Records
# ----------------------------------------------------------------------------
class RunnerState(NamedTuple):
    params: dict
    opt_state: optax.OptState
    env_state: chex.ArrayTree  # [B] environments of this device
    obs: jax.Array  # [B, *obs_shape]
    episode_stats: envs.EpisodeStats
    # --normalize-obs: statistics of the earlier epochs' observations; off: None
    obs_stats: envs.ObsStats | None
    # the discounted returns' statistics; --no-normalize-reward: None
    reward_stats: envs.RewardStats | None
    noise: jax.Array  # [B, action dims] each environment's exploration noise (Box actions)
    epoch: jax.Array  # [] epochs done: the run's progress is epoch / num_epochs
    key: jax.Array  # differs per device


class Transition(NamedTuple):
    obs: jax.Array  # s_t as observed (raw)
    action: jax.Array
    reward: jax.Array
    terminated: jax.Array  # no future: discount_t = 0
    done: jax.Array  # terminated or truncated: the GAE trace stops
    value: jax.Array  # V(s_t)
    log_prob: jax.Array  # log pi_old(a_t | s_t)
    final_obs: jax.Array  # s_{t+1} before any reset (bootstraps truncated episodes)
    greedy_action: jax.Array  # mode of pi_old(. | s_t), for the preferred_move metric


class Rollout(NamedTuple):
    """An epoch before its update: the state after T steps and what the update trains on."""

    state: RunnerState  # its obs_stats: those the networks normalized with
    traj: Transition  # [T, B, ...] as collected (raw observations)
    advantages: jax.Array  # [T, B]
    targets: jax.Array  # [T, B] R = A + V_old


class Batch(NamedTuple):
    obs: jax.Array  # as the networks saw it (normalized with --normalize-obs)
    action: jax.Array
    log_prob: jax.Array
    advantage: jax.Array
    target: jax.Array  # R = A + V_old


# ----------------------------------------------------------------------------
# Pure math
# ----------------------------------------------------------------------------
def gae(rewards, values, next_values, terminated, dones, gamma: float, lam: float):
    """Generalized advantage estimation over time-major `[T, B]` arrays.

    delta_t = r_t + gamma * (1 - terminated_t) * V(s'_t) - V(s_t), with s'_t the
    observation after step t before any reset (so a truncated episode
    bootstraps from its final observation);
    A_t = delta_t + gamma * lam * (1 - done_t) * A_{t+1}.  lam = 1 gives the
    Monte-Carlo advantage G_t - V(s_t); lam = 0 gives TD(0).
    Returns `(advantages, targets = advantages + values)`.
    """
    chex.assert_rank(rewards, 2)
    chex.assert_equal_shape([rewards, values, next_values, terminated, dones])
    discount = gamma * (1.0 - terminated.astype(jnp.float32))
    deltas = rewards + discount * next_values - values
    trace = gamma * lam * (1.0 - dones.astype(jnp.float32))

    def backward(next_advantage, x):
        delta_t, trace_t = x
        advantage = delta_t + trace_t * next_advantage
        return advantage, advantage

    _, advantages = jax.lax.scan(backward, jnp.zeros_like(values[0]), (deltas, trace), reverse=True)
    return advantages, advantages + values


def clipped_surrogate(log_prob, old_log_prob, advantage, clip_eps: float):
    """PPO's policy loss -mean(min(r A, clip(r, 1 - eps, 1 + eps) A)), r = exp(log pi - log pi_old),
    over `[N]`.

    Returns `(loss, {"ppo/approx_kl", "ppo/clip_fraction"})`: the k3 estimator of KL(old || new),
    mean((r - 1) - log r), and mean(|r - 1| > eps).
    """
    chex.assert_rank(log_prob, 1)
    chex.assert_equal_shape([log_prob, old_log_prob, advantage])
    log_ratio = log_prob - old_log_prob
    ratio = jnp.exp(log_ratio)
    clipped = jnp.clip(ratio, 1 - clip_eps, 1 + clip_eps)
    loss = -jnp.mean(jnp.minimum(ratio * advantage, clipped * advantage))
    return loss, {
        "ppo/approx_kl": jnp.mean((ratio - 1) - log_ratio),
        "ppo/clip_fraction": jnp.mean(jnp.abs(ratio - 1) > clip_eps),
    }


def ppo_loss(params, batch: Batch, dist, config: Config):
    """Clipped surrogate + c_v * value L2 - c_ent * entropy + c_box * mean outside the box, and its
    diagnostics."""
    inputs, values = jax.vmap(network, (None, 0, None, None))(
        params, batch.obs, dist, config.activation
    )
    log_prob = dist.log_prob(inputs, batch.action)
    advantage = batch.advantage
    if config.normalize_advantages:
        advantage = (advantage - advantage.mean()) / (advantage.std() + 1e-8)
    policy_loss, metrics = clipped_surrogate(log_prob, batch.log_prob, advantage, config.clip_eps)
    value_loss = jnp.mean((values - batch.target) ** 2)
    entropy = jnp.mean(dist.entropy(inputs))
    outside_box = jnp.mean(dist.outside_box(inputs))
    loss = (
        policy_loss
        + config.vf_coef * value_loss
        - config.ent_coef * entropy
        + config.box_coef * outside_box
    )
    return loss, {
        "loss/joint": loss,
        "loss/policy": policy_loss,
        "loss/value": value_loss,
        "policy/entropy": entropy,
        "policy/log_prob_mean": jnp.mean(log_prob),
        "policy/outside_box": outside_box,
        **metrics,
    }


# ----------------------------------------------------------------------------
# Training
# ----------------------------------------------------------------------------
def make_trainer(config: Config) -> run.Trainer:
    config = config.resolved()
    env, env_params = envs.make_env(config.env)
    dist = make_distribution(env.action_space(env_params), config.std)
    correlation = noise_correlation(config.noise_memory, env_params.max_steps_in_episode)
    layout = devices.layout(config)
    cli.require(
        layout.rollout_size % config.num_minibatches == 0,
        f"--num-minibatches {config.num_minibatches} does not divide the per-device batch "
        f"{layout.envs_per_device} envs x {config.num_steps} steps = {layout.rollout_size}",
    )
    obs_shape = tuple(env.observation_space(env_params).shape)
    conv = nets.uses_conv(config.torso, obs_shape)
    n_updates = layout.num_epochs * config.update_passes * config.num_minibatches
    lr = optax.linear_schedule(config.lr, 0.0, n_updates) if config.anneal_lr else config.lr
    clip = (
        optax.identity()
        if cli.off(config.max_grad_norm)
        else optax.clip_by_global_norm(config.max_grad_norm)
    )
    tx = optax.chain(clip, optax.adam(lr, eps=1e-5))
    net = jax.vmap(network, (None, 0, None, None))
    step_envs = jax.vmap(env.step, (0, 0, 0, None))

    def init(key) -> RunnerState:
        param_key, env_key = jax.random.split(key)  # same on every device
        params = init_network(param_key, obs_shape, config.hidden, dist, conv)
        reset_key, run_key = jax.random.split(devices.device_key(env_key))
        obs, env_state = envs.reset_envs(env, env_params, reset_key, layout.envs_per_device)
        return RunnerState(
            params=params,
            opt_state=tx.init(params),
            env_state=env_state,
            obs=obs,
            episode_stats=envs.init_episode_stats(layout.envs_per_device),
            obs_stats=envs.init_obs_stats(obs.shape[1:]) if config.normalize_obs else None,
            reward_stats=(
                envs.init_reward_stats(layout.envs_per_device) if config.normalize_reward else None
            ),
            noise=dist.init_noise(run_key, layout.envs_per_device),
            epoch=jnp.int32(0),
            key=run_key,
        )

    def env_step(state: RunnerState, _):
        """One step of the B environments; the network sees observations normalized by
        state.obs_stats."""
        key, act_key, step_key = jax.random.split(state.key, 3)
        inputs, value = net(
            state.params, envs.normalize_obs(state.obs_stats, state.obs), dist, config.activation
        )
        action, noise = dist.sample_correlated(inputs, state.noise, act_key, correlation)
        obs, env_state, reward, terminated, truncated, info = step_envs(
            jax.random.split(step_key, layout.envs_per_device),
            state.env_state,
            dist.clip_action(action),
            env_params,
        )
        done = jnp.logical_or(terminated, truncated)
        transition = Transition(
            obs=state.obs,
            action=action,
            reward=reward,
            terminated=terminated,
            done=done,
            value=value,
            log_prob=dist.log_prob(inputs, action),
            final_obs=info["final_observation"],
            greedy_action=dist.mode(inputs),
        )
        episode_stats = envs.update_episode_stats(state.episode_stats, reward, done)
        state = state._replace(
            env_state=env_state, obs=obs, episode_stats=episode_stats, noise=noise, key=key
        )
        return state, transition

    def rollout(state: RunnerState) -> Rollout:
        # COLLECT: T steps of B environments under the current policy.
        state = state._replace(episode_stats=envs.reset_epoch_stats(state.episode_stats))
        state, traj = jax.lax.scan(env_step, state, None, config.num_steps)  # [T, B, ...]

        # ADVANTAGES: GAE, or Monte-Carlo (lambda = 1), bootstrapping truncations from V(final_obs),
        # on the rewards divided by the running std of the discounted return (unless
        # --no-normalize-reward).
        def values_of(obs):  # [N, B, *obs_shape] -> [N, B]
            obs = envs.normalize_obs(state.obs_stats, obs)
            _, values = jax.vmap(net, (None, 0, None, None))(
                state.params, obs, dist, config.activation
            )
            return values

        truncated = traj.done & ~traj.terminated
        next_values = envs.next_values(
            values_of, traj.value, traj.final_obs, truncated, env_params.max_steps_in_episode
        )
        lam = 1.0 if config.advantage == "monte-carlo" else config.gae_lambda
        state = state._replace(
            reward_stats=envs.update_reward_stats(
                state.reward_stats, traj.reward, traj.done, config.gamma
            )
        )
        rewards = traj.reward / envs.reward_scale(state.reward_stats)
        advantages, targets = gae(
            rewards, traj.value, next_values, traj.terminated, traj.done, config.gamma, lam
        )
        return Rollout(state=state, traj=traj, advantages=advantages, targets=targets)

    def update_step(carry, minibatch: Batch):
        params, opt_state = carry
        grads, metrics = jax.grad(ppo_loss, has_aux=True)(params, minibatch, dist, config)
        grads = jax.lax.pmean(grads, devices.DEVICE_AXIS)
        updates, opt_state = tx.update(grads, opt_state, params)
        metrics["optim/grad_norm"] = optax.tree.norm(grads)
        return (optax.apply_updates(params, updates), opt_state), metrics

    def epoch(state: RunnerState):
        collected = rollout(state)  # COLLECT and ADVANTAGES
        state, traj = collected.state, collected.traj

        # UPDATE: update_passes passes of num_minibatches Adam steps; gradients averaged over
        # devices.
        def flat(x):  # [T, B, ...] -> [T*B, ...]
            return x.reshape((layout.rollout_size,) + x.shape[2:])

        obs = envs.normalize_obs(state.obs_stats, traj.obs)  # what the networks saw
        batch = jax.tree.map(
            flat,
            Batch(
                obs=obs,
                action=traj.action,
                log_prob=traj.log_prob,
                advantage=collected.advantages,
                target=collected.targets,
            ),
        )

        def update_pass(carry, key):
            order = jax.random.permutation(key, layout.rollout_size)
            minibatches = jax.tree.map(
                lambda x: x[order].reshape((config.num_minibatches, -1) + x.shape[1:]), batch
            )
            return jax.lax.scan(update_step, carry, minibatches)

        key, perm_key = jax.random.split(state.key)
        (params, opt_state), losses = jax.lax.scan(
            update_pass,
            (state.params, state.opt_state),
            jax.random.split(perm_key, config.update_passes),
        )

        # METRICS: scalar means, identical on every device.
        metrics = {k: jnp.mean(v) for k, v in losses.items()}
        # the mean greedy action: a discrete policy's mean most probable action (Box: the mean of
        # its mode)
        metrics["policy/preferred_move"] = jnp.mean(traj.greedy_action)
        metrics = jax.lax.pmean(metrics, devices.DEVICE_AXIS)
        targets = collected.targets
        # R - V over every device's batch
        metrics.update(residual_metrics(targets - traj.value, targets))
        metrics.update(envs.episode_metrics(state.episode_stats, devices.DEVICE_AXIS))
        # --normalize-obs: this epoch's observations, every device's, join the statistics
        obs_stats = (
            envs.update_obs_stats(state.obs_stats, traj.obs) if config.normalize_obs else None
        )
        state = state._replace(
            params=params, opt_state=opt_state, obs_stats=obs_stats, epoch=state.epoch + 1, key=key
        )
        return state, metrics

    def act(policy: envs.Policy, obs, key):
        del key  # greedy
        inputs, _ = network(
            policy.params, envs.normalize_obs(policy.obs_stats, obs), dist, config.activation
        )
        return dist.clip_action(dist.mode(inputs))

    return run.Trainer(
        init=init,
        epoch=epoch,
        rollout=rollout,
        act=act,
        env=env,
        env_params=env_params,
        policy=lambda state: envs.Policy(params=state.params, obs_stats=state.obs_stats),
        steps_per_epoch=layout.steps_per_epoch,
        num_epochs=layout.num_epochs,
    )


if __name__ == "__main__":
    run.main(Config, make_trainer, "ppo_joint", __doc__.split("\n\n")[0])
