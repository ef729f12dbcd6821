"""REINFORCE: the policy gradient weighted by discounted returns, with an optional mean baseline.

Trax's `PolicyGradientTrainer` (Williams 1992, "Simple Statistical
Gradient-Following Algorithms for Connectionist Reinforcement Learning").
The loss is -mean((G_t - b) log pi(a_t | s_t)), with G_t the discounted return
to the episode's end within the rollout and b = 0, or with `--baseline` the
mean return of the epoch's rollout. One epoch -- a vectorized gymnax rollout,
the returns and the Adam steps -- is one compiled function.

    python algos/reinforce.py --baseline                          # CartPole-v1
    python algos/reinforce.py --baseline --num-envs 4 --batch-size 2048 --num-seeds 4
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


@dataclasses.dataclass(frozen=True)
class Config(cli.RunConfig):
    num_envs: int = 8
    """parallel environments (split over devices)"""
    num_steps: int = 512
    """steps per environment per epoch (rollout length T); returns stop at its end"""
    batch_size: int = 4096
    """transitions per Adam step, all devices (at most num_envs * num_steps)"""
    train_steps: int = 1
    """Adam steps per epoch, each on a fresh random batch of this epoch's rollout"""
    lr: float = 3e-3
    """Adam learning rate"""
    no_anneal_lr: bool = False
    """keep the learning rate constant instead of annealing it linearly to 0"""
    max_grad_norm: float = 0.5
    """clip gradients to this global norm (0: no clipping)"""
    gamma: float = 0.99
    """discount"""
    baseline: bool = False
    """subtract the mean return of the epoch's rollout (all devices) from every return"""
    hidden: tuple[int, ...] = (64, 64)
    """hidden layer widths"""
    activation: Literal["tanh", "relu"] = "tanh"
    """hidden activation"""
    std: Literal["param", "network"] = "param"
    """Box actions: log std as a learned vector (param) or a network output (network)"""
    normalize_obs: bool = False
    """normalize observations by their running mean and variance (kept in the runner state, merged over
    devices, per seed, saved in checkpoints), clipped to +-10"""

    def __post_init__(self):
        super().__post_init__()
        for name in ("num_envs", "num_steps", "batch_size", "train_steps"):
            cli.require(getattr(self, name) >= 1, f"--{name.replace('_', '-')} must be at least 1")
        cli.require(self.lr > 0, f"--lr {self.lr}: use a positive learning rate")
        cli.require(0 <= self.gamma <= 1, f"--gamma {self.gamma}: use a value in [0, 1]")
        cli.require(self.max_grad_norm >= 0, f"--max-grad-norm {self.max_grad_norm}: use 0 (off) or more")
        cli.require(len(self.hidden) >= 1 and min(self.hidden) >= 1, "--hidden needs positive widths")


# ----------------------------------------------------------------------------
# Network: a plain function over a parameter pytree
# ----------------------------------------------------------------------------
def dense_init(key, n_in: int, n_out: int, scale: float) -> dict:
    w = nets.orthogonal(key, (n_in, n_out), scale)
    return {"w": w, "b": jnp.zeros((n_out,), jnp.float32)}


def init_network(key, obs_dim: int, hidden: tuple, dist) -> dict:
    keys = jax.random.split(key, len(hidden) + 1)
    sizes = (obs_dim,) + tuple(hidden)
    return {
        "torso": [dense_init(k, a, b, np.sqrt(2)) for k, a, b in zip(keys, sizes[:-1], sizes[1:])],
        "head": dist.head_init(keys[-1], sizes[-1]),
    }


def network(params: dict, obs: jax.Array, dist, activation: str) -> jax.Array:
    """One observation -> distribution inputs [n_inputs]."""
    act = {"tanh": jnp.tanh, "relu": jax.nn.relu}[activation]
    x = jnp.ravel(obs).astype(jnp.float32)
    for layer in params["torso"]:
        x = act(x @ layer["w"] + layer["b"])
    return dist.policy_head(params["head"], x)


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
    done: jax.Array  # terminated or truncated: the return stops
    log_prob: jax.Array  # log pi_old(a_t | s_t)
    greedy_action: jax.Array  # mode of pi_old(. | s_t), for the preferred_move metric


class Rollout(NamedTuple):
    """An epoch before its update: the runner after T steps and what the update trains on."""

    runner: RunnerState
    obs_stats: envs.ObsStats | None  # --normalize-obs: the statistics the network normalizes with
    traj: Transition  # [T, B, ...] as collected (raw observations)
    weights: jax.Array  # [T, B] G_t - b
    return_mean: jax.Array  # [] mean G_t of every device's rollout


class Batch(NamedTuple):
    obs: jax.Array
    action: jax.Array
    log_prob: jax.Array
    weight: jax.Array  # G_t - b


# ----------------------------------------------------------------------------
# Pure math
# ----------------------------------------------------------------------------
def discounted_returns(rewards, dones, gamma: float):
    """G_t = r_t + gamma (1 - done_t) G_{t+1} over time-major `[T, B]` arrays, G_T = 0.

    The return to the episode's end within the rollout: nothing is bootstrapped
    (there is no value function), neither at a time limit nor at the rollout's end.
    """
    chex.assert_rank(rewards, 2)
    chex.assert_equal_shape([rewards, dones])
    discount = gamma * (1.0 - dones.astype(jnp.float32))

    def backward(next_return, x):
        reward, discount_t = x
        ret = reward + discount_t * next_return
        return ret, ret

    _, returns = jax.lax.scan(backward, jnp.zeros_like(rewards[0]), (rewards, discount), reverse=True)
    return returns


def returns_weights(returns, baseline: bool):
    """`(G - b, mean G)`: b = mean G over this epoch's rollout on every device with `baseline`, else 0."""
    chex.assert_rank(returns, 2)
    return_mean = jax.lax.pmean(jnp.mean(returns), devices.DEVICE_AXIS)
    return (returns - return_mean if baseline else returns), return_mean


def reinforce_loss(params, batch: Batch, dist, activation: str):
    """-mean((G - b) log pi(a | s)), and its diagnostics."""
    chex.assert_rank(batch.weight, 1)
    inputs = jax.vmap(network, (None, 0, None, None))(params, batch.obs, dist, activation)
    log_prob = dist.log_prob(inputs, batch.action)
    loss = -jnp.mean(batch.weight * log_prob)
    log_ratio = log_prob - batch.log_prob
    return loss, {
        "loss/policy": loss,
        "policy/entropy": jnp.mean(dist.entropy(inputs)),
        "policy/log_prob_mean": jnp.mean(log_prob),
        # k3 estimator of KL(old || new): nonzero only from the second Adam step of an epoch on
        "reinforce/approx_kl": jnp.mean((jnp.exp(log_ratio) - 1) - log_ratio),
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
    rollout_size = envs_per_device * config.num_steps  # transitions per device and epoch
    steps_per_epoch = config.num_envs * config.num_steps
    if config.batch_size % n_devices or config.batch_size > steps_per_epoch:
        raise cli.ConfigError(f"--batch-size {config.batch_size}: use a multiple of --n-devices {n_devices} of at most "
                              f"{config.num_envs} envs x {config.num_steps} steps = {steps_per_epoch}")
    batch_size = config.batch_size // n_devices  # per device
    num_epochs = config.total_steps // steps_per_epoch
    if num_epochs < 1:
        raise cli.ConfigError(f"--total-steps {config.total_steps} is less than one epoch "
                              f"({config.num_envs} envs x {config.num_steps} steps = {steps_per_epoch})")
    obs_dim = int(np.prod(env.observation_space(env_params).shape))
    n_updates = num_epochs * config.train_steps
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
            inputs = net(runner.params, norm(runner.obs), dist, config.activation)
            action = dist.sample(inputs, act_key)
            obs, env_state, reward, terminated, truncated, _ = step_envs(
                jax.random.split(step_key, envs_per_device), runner.env_state, dist.clip_action(action),
                env_params)
            done = jnp.logical_or(terminated, truncated)
            transition = Transition(runner.obs, action, reward, done, dist.log_prob(inputs, action),
                                    dist.mode(inputs))
            stats = envs.update_episode_stats(runner.stats, reward, done)
            return runner._replace(env_state=env_state, obs=obs, stats=stats, key=key), transition

        runner = runner._replace(stats=envs.reset_epoch_stats(runner.stats))
        runner, traj = jax.lax.scan(env_step, runner, None, config.num_steps)  # [T, B, ...]

        # TARGETS: returns to the episode's end within the rollout, minus the baseline.
        returns = discounted_returns(traj.reward, traj.done, config.gamma)
        weights, return_mean = returns_weights(returns, config.baseline)
        return Rollout(runner, obs_stats, traj, weights, return_mean)

    def epoch(state):
        runner, obs_stats, traj, weights, return_mean = rollout(state)
        flat = lambda x: x.reshape((rollout_size,) + x.shape[2:])  # noqa: E731  [T, B, ...] -> [T*B, ...]
        obs = envs.normalize_obs(obs_stats, traj.obs)  # what the network saw
        batch = jax.tree.map(flat, Batch(obs, traj.action, traj.log_prob, weights))

        # UPDATE: train_steps Adam steps on random batches; gradients averaged over devices.
        def train_step(carry, key):
            params, opt_state = carry
            minibatch = jax.tree.map(lambda x: x[jax.random.permutation(key, rollout_size)[:batch_size]], batch)
            grads, metrics = jax.grad(reinforce_loss, has_aux=True)(params, minibatch, dist, config.activation)
            grads = jax.lax.pmean(grads, devices.DEVICE_AXIS)
            updates, opt_state = tx.update(grads, opt_state, params)
            metrics["optim/grad_norm"] = optax.tree.norm(grads)
            return (optax.apply_updates(params, updates), opt_state), metrics

        key, step_key = jax.random.split(runner.key)
        (params, opt_state), losses = jax.lax.scan(
            train_step, (runner.params, runner.opt_state), jax.random.split(step_key, config.train_steps))

        # METRICS: scalar means, identical on every device.
        metrics = {k: jnp.mean(v) for k, v in losses.items()}
        metrics.update({
            "reinforce/return_mean": return_mean,
            "policy/preferred_move": jnp.mean(traj.greedy_action),
        })
        metrics = jax.lax.pmean(metrics, devices.DEVICE_AXIS)
        metrics.update(envs.episode_metrics(runner.stats, devices.DEVICE_AXIS))
        runner = runner._replace(params=params, opt_state=opt_state, key=key)
        if config.normalize_obs:  # this epoch's observations, every device's, join the statistics
            return envs.Normalized(runner, envs.update_obs_stats(obs_stats, traj.obs)), metrics
        return runner, metrics

    def act(params, obs, key):
        del key  # greedy
        if config.normalize_obs:  # params: (network parameters, observation statistics)
            params, obs = params[0], envs.normalize_obs(params[1], obs)
        return dist.clip_action(dist.mode(network(params, obs, dist, config.activation)))

    def params(state):  # what act needs
        return (state.runner.params, state.obs_stats) if config.normalize_obs else state.params

    return run.Trainer(init=init, epoch=epoch, act=act, policy=params, env=env,
                       env_params=env_params, steps_per_epoch=steps_per_epoch, num_epochs=num_epochs,
                       rollout=rollout)


if __name__ == "__main__":
    run.main(Config, make_trainer, "reinforce", __doc__.split("\n\n")[0])
