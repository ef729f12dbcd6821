"""PPO with one network: a shared torso, a policy head and a value head.

Trax's `ActorCriticJointTrainer` with the `PPOJoint` loss (Schulman et al.
2017, "Proximal Policy Optimization Algorithms", arXiv:1707.06347). One epoch
-- a vectorized gymnax rollout, GAE, and clipped-PPO updates over epochs and
minibatches -- is one compiled function; Python only loops over epochs.

    python algos/ppo_joint.py                                   # CartPole-v1
    python algos/ppo_joint.py --env Pendulum-v1 --num-envs 16 --gamma 0.95 --lr 1e-3 ...
"""
from __future__ import annotations

import dataclasses
import os
import sys
from typing import Literal, NamedTuple

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import chex  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

from common import cli, devices, envs, nets, run  # noqa: E402
from common.distributions import make_distribution  # noqa: E402
from common.metrics import residual_metrics  # noqa: E402


@dataclasses.dataclass(frozen=True)
class Config(cli.RunConfig):
    num_envs: int = 8
    """parallel environments (split over devices)"""
    num_steps: int = 128
    """steps per environment per epoch (rollout length T)"""
    update_epochs: int = 4
    """passes over each rollout"""
    num_minibatches: int = 4
    """minibatches per pass (must divide the per-device batch num_envs / n_devices * num_steps)"""
    lr: float = 2.5e-3
    """Adam learning rate"""
    no_anneal_lr: bool = False
    """keep the learning rate constant instead of annealing it linearly to 0"""
    max_grad_norm: float = 0.5
    """clip gradients to this global norm (0: no clipping)"""
    gamma: float = 0.99
    """discount"""
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
    ent_coef: float = 0.0
    """entropy bonus coefficient c_ent"""
    hidden: tuple[int, ...] = (64, 64)
    """torso layer widths"""
    activation: Literal["tanh", "relu"] = "tanh"
    """torso activation"""
    std: Literal["param", "network"] = "param"
    """Box actions: log std as a learned vector (param) or a network output (network)"""
    normalize_obs: bool = False
    """normalize observations by their running mean and variance (kept in the runner state, merged over
    devices, per seed, saved in checkpoints), clipped to +-10"""

    def __post_init__(self):
        super().__post_init__()
        for name in ("num_envs", "num_steps", "update_epochs", "num_minibatches"):
            cli.require(getattr(self, name) >= 1, f"--{name.replace('_', '-')} must be at least 1")
        cli.require(self.lr > 0, f"--lr {self.lr}: use a positive learning rate")
        cli.require(0 <= self.gamma <= 1, f"--gamma {self.gamma}: use a value in [0, 1]")
        cli.require(0 <= self.gae_lambda <= 1, f"--gae-lambda {self.gae_lambda}: use a value in [0, 1]")
        cli.require(self.max_grad_norm >= 0, f"--max-grad-norm {self.max_grad_norm}: use 0 (off) or more")
        cli.require(self.clip_eps > 0, f"--clip-eps {self.clip_eps}: use a positive value, e.g. 0.2")
        cli.require_non_negative(self, "vf_coef", "ent_coef")
        cli.require(len(self.hidden) >= 1 and min(self.hidden) >= 1, "--hidden needs positive widths")


# ----------------------------------------------------------------------------
# Network: plain functions over a parameter pytree
# ----------------------------------------------------------------------------
def dense_init(key, n_in: int, n_out: int, scale: float) -> dict:
    w = nets.orthogonal(key, (n_in, n_out), scale)
    return {"w": w, "b": jnp.zeros((n_out,), jnp.float32)}


def init_network(key, obs_dim: int, hidden: tuple, dist) -> dict:
    keys = jax.random.split(key, len(hidden) + 2)
    sizes = (obs_dim,) + tuple(hidden)
    return {
        "torso": [dense_init(k, a, b, np.sqrt(2)) for k, a, b in zip(keys, sizes[:-1], sizes[1:])],
        "policy": dist.head_init(keys[-2], sizes[-1]),
        "value": dense_init(keys[-1], sizes[-1], 1, 1.0),
    }


def network(params: dict, obs: jax.Array, dist, activation: str):
    """One observation -> (distribution inputs [n_inputs], value [])."""
    act = {"tanh": jnp.tanh, "relu": jax.nn.relu}[activation]
    x = jnp.ravel(obs).astype(jnp.float32)
    for layer in params["torso"]:
        x = act(x @ layer["w"] + layer["b"])
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
    stats: envs.EpisodeStats
    key: jax.Array  # differs per device


class Transition(NamedTuple):
    obs: jax.Array
    action: jax.Array
    reward: jax.Array
    terminated: jax.Array  # no future: discount_t = 0
    done: jax.Array  # terminated or truncated: the GAE trace stops
    value: jax.Array  # V(s_t)
    log_prob: jax.Array  # log pi_old(a_t | s_t)
    final_obs: jax.Array  # s_{t+1} before any reset (bootstraps truncated episodes)
    greedy_action: jax.Array  # mode of pi_old(. | s_t), for the preferred_move metric


class Rollout(NamedTuple):
    """An epoch before its update: the runner after T steps and what the update trains on."""

    runner: RunnerState
    obs_stats: envs.ObsStats | None  # --normalize-obs: the statistics the networks normalize with
    traj: Transition  # [T, B, ...] as collected (raw observations)
    advantages: jax.Array  # [T, B]
    targets: jax.Array  # [T, B] R = A + V_old


class Batch(NamedTuple):
    obs: jax.Array
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


def ppo_loss(params, batch: Batch, dist, config: Config):
    """Clipped surrogate + c_v * value L2 - c_ent * entropy, and its diagnostics."""
    inputs, values = jax.vmap(network, (None, 0, None, None))(params, batch.obs, dist, config.activation)
    log_prob = dist.log_prob(inputs, batch.action)
    advantage = batch.advantage
    if config.normalize_advantages:
        advantage = (advantage - advantage.mean()) / (advantage.std() + 1e-8)
    log_ratio = log_prob - batch.log_prob
    ratio = jnp.exp(log_ratio)
    # -min(r A, clip(r, 1 - eps, 1 + eps) A)
    clipped = jnp.clip(ratio, 1 - config.clip_eps, 1 + config.clip_eps)
    policy_loss = -jnp.mean(jnp.minimum(ratio * advantage, clipped * advantage))
    value_loss = jnp.mean((values - batch.target) ** 2)
    entropy = jnp.mean(dist.entropy(inputs))
    loss = policy_loss + config.vf_coef * value_loss - config.ent_coef * entropy
    return loss, {
        "loss/joint": loss,
        "loss/policy": policy_loss,
        "loss/value": value_loss,
        "policy/entropy": entropy,
        "policy/log_prob_mean": jnp.mean(log_prob),
        "ppo/approx_kl": jnp.mean((ratio - 1) - log_ratio),  # k3 estimator of KL(old || new)
        "ppo/clip_fraction": jnp.mean(jnp.abs(ratio - 1) > config.clip_eps),
    }


# ----------------------------------------------------------------------------
# Training
# ----------------------------------------------------------------------------
def make_trainer(config: Config) -> run.Trainer:
    env, env_params = envs.make_env(config.env)
    dist = make_distribution(env.action_space(env_params), config.std)
    if dist.discrete and config.std != "param":
        raise cli.ConfigError(f"--std {config.std} applies to continuous actions; {config.env} has discrete ones")
    n_devices = config.n_devices or jax.local_device_count()
    if config.num_envs % n_devices:
        raise cli.ConfigError(f"--num-envs {config.num_envs} is not divisible by --n-devices {n_devices}; "
                              f"use a multiple of {n_devices}")
    envs_per_device = config.num_envs // n_devices
    batch_size = envs_per_device * config.num_steps
    if batch_size % config.num_minibatches:
        raise cli.ConfigError(f"--num-minibatches {config.num_minibatches} does not divide the per-device batch "
                              f"{envs_per_device} envs x {config.num_steps} steps = {batch_size}")
    steps_per_epoch = config.num_envs * config.num_steps
    num_epochs = config.total_steps // steps_per_epoch
    if num_epochs < 1:
        raise cli.ConfigError(f"--total-steps {config.total_steps} is less than one epoch "
                              f"({config.num_envs} envs x {config.num_steps} steps = {steps_per_epoch})")
    obs_dim = int(np.prod(env.observation_space(env_params).shape))
    n_updates = num_epochs * config.update_epochs * config.num_minibatches
    lr = config.lr if config.no_anneal_lr else optax.linear_schedule(config.lr, 0.0, n_updates)
    clip = optax.clip_by_global_norm(config.max_grad_norm) if config.max_grad_norm else optax.identity()
    tx = optax.chain(clip, optax.adam(lr, eps=1e-5))
    net = jax.vmap(network, (None, 0, None, None))
    step_envs = jax.vmap(env.step, (0, 0, 0, None))

    def init(key):
        param_key, env_key = jax.random.split(key)  # same on every device
        params = init_network(param_key, obs_dim, config.hidden, dist)
        reset_key, run_key = jax.random.split(devices.device_key(env_key))
        obs, env_state = envs.reset_envs(env, env_params, reset_key, envs_per_device)
        runner = RunnerState(params, tx.init(params), env_state, obs, envs.init_episode_stats(envs_per_device),
                             run_key)
        return envs.Normalized(runner, envs.init_obs_stats(obs.shape[1:])) if config.normalize_obs else runner

    def rollout(state) -> Rollout:
        # --normalize-obs: the networks see observations normalized with the statistics of earlier epochs.
        runner, obs_stats = state if config.normalize_obs else (state, None)
        norm = lambda obs: envs.normalize_obs(obs_stats, obs)  # noqa: E731  (off: the identity)

        # COLLECT: T steps of B environments under the current policy.
        def env_step(runner: RunnerState, _):
            key, act_key, step_key = jax.random.split(runner.key, 3)
            inputs, value = net(runner.params, norm(runner.obs), dist, config.activation)
            action = dist.sample(inputs, act_key)
            obs, env_state, reward, terminated, truncated, info = step_envs(
                jax.random.split(step_key, envs_per_device), runner.env_state, dist.clip_action(action),
                env_params)
            done = jnp.logical_or(terminated, truncated)
            transition = Transition(runner.obs, action, reward, terminated, done, value,
                                    dist.log_prob(inputs, action), info["final_observation"],
                                    dist.mode(inputs))
            stats = envs.update_episode_stats(runner.stats, reward, done)
            return runner._replace(env_state=env_state, obs=obs, stats=stats, key=key), transition

        runner = runner._replace(stats=envs.reset_epoch_stats(runner.stats))
        runner, traj = jax.lax.scan(env_step, runner, None, config.num_steps)  # [T, B, ...]

        # ADVANTAGES: GAE, or Monte-Carlo (lambda = 1), bootstrapping truncations.
        _, next_values = jax.vmap(net, (None, 0, None, None))(runner.params, norm(traj.final_obs), dist,
                                                               config.activation)
        lam = 1.0 if config.advantage == "monte-carlo" else config.gae_lambda
        advantages, targets = gae(traj.reward, traj.value, next_values, traj.terminated, traj.done,
                                  config.gamma, lam)
        return Rollout(runner, obs_stats, traj, advantages, targets)

    def epoch(state):
        runner, obs_stats, traj, advantages, targets = rollout(state)
        flat = lambda x: x.reshape((batch_size,) + x.shape[2:])  # noqa: E731  [T, B, ...] -> [T*B, ...]
        obs = envs.normalize_obs(obs_stats, traj.obs)  # what the networks saw
        batch = jax.tree.map(flat, Batch(obs, traj.action, traj.log_prob, advantages, targets))

        # UPDATE: update_epochs passes of num_minibatches Adam steps; gradients
        # averaged over devices.
        def minibatch_step(carry, minibatch: Batch):
            params, opt_state = carry
            grads, metrics = jax.grad(ppo_loss, has_aux=True)(params, minibatch, dist, config)
            grads = jax.lax.pmean(grads, devices.DEVICE_AXIS)
            updates, opt_state = tx.update(grads, opt_state, params)
            metrics["optim/grad_norm"] = optax.tree.norm(grads)
            return (optax.apply_updates(params, updates), opt_state), metrics

        def update_epoch(carry, key):
            order = jax.random.permutation(key, batch_size)
            minibatches = jax.tree.map(
                lambda x: x[order].reshape((config.num_minibatches, -1) + x.shape[1:]), batch)
            return jax.lax.scan(minibatch_step, carry, minibatches)

        key, perm_key = jax.random.split(runner.key)
        (params, opt_state), losses = jax.lax.scan(
            update_epoch, (runner.params, runner.opt_state), jax.random.split(perm_key, config.update_epochs))

        # METRICS: scalar means, identical on every device.
        metrics = {k: jnp.mean(v) for k, v in losses.items()}
        metrics["policy/preferred_move"] = jnp.mean(traj.greedy_action)
        metrics = jax.lax.pmean(metrics, devices.DEVICE_AXIS)
        metrics.update(residual_metrics(targets - traj.value, targets))  # R - V over every device's batch
        metrics.update(envs.episode_metrics(runner.stats, devices.DEVICE_AXIS))
        runner = runner._replace(params=params, opt_state=opt_state, key=key)
        if config.normalize_obs:  # this epoch's observations, every device's, join the statistics
            return envs.Normalized(runner, envs.update_obs_stats(obs_stats, traj.obs)), metrics
        return runner, metrics

    def act(params, obs, key):
        del key  # greedy
        if config.normalize_obs:  # params: (network parameters, observation statistics)
            params, obs = params[0], envs.normalize_obs(params[1], obs)
        return dist.clip_action(dist.mode(network(params, obs, dist, config.activation)[0]))

    def params(state):  # what act needs
        return (state.runner.params, state.obs_stats) if config.normalize_obs else state.params

    return run.Trainer(init=init, epoch=epoch, act=act, policy=params, env=env,
                       env_params=env_params, steps_per_epoch=steps_per_epoch, num_epochs=num_epochs,
                       rollout=rollout)


if __name__ == "__main__":
    run.main(Config, make_trainer, "ppo_joint", __doc__.split("\n\n")[0])
