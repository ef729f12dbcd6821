"""Actor-critic with separate policy and value networks, several advantage estimators, A2C or PPO loss.

Trax's `ActorCriticTrainer` (Mnih et al. 2016, "Asynchronous Methods for Deep
Reinforcement Learning", arXiv:1602.01783; with `--loss ppo`, Schulman et al.
2017, arXiv:1707.06347). Each network has its own Adam optimizer,
learning-rate schedule, batch size and number of update steps per epoch. One
epoch -- a vectorized gymnax rollout, the advantages, the value updates, then
the policy updates -- is one compiled function.

    python algos/actor_critic.py                                  # CartPole-v1, A2C, GAE
    python algos/actor_critic.py --loss ppo                       # 16 minibatch steps of 256 per epoch
"""
from __future__ import annotations

import dataclasses
import functools
import os
import sys
import typing
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
    loss: Literal["a2c", "ppo"] = "a2c"
    """policy loss: a2c = -A log pi - c_ent H; ppo = clipped surrogate - c_ent H"""
    advantage: Literal["monte-carlo", "td-k", "td-lambda", "gae"] = "gae"
    """advantage estimator; the value net regresses on V + A"""
    td_k: int = 8
    """k of --advantage td-k: rewards summed before bootstrapping"""
    lam: float = 0.95
    """lambda of --advantage td-lambda and gae"""
    gamma: float = 0.99
    """discount"""
    policy_lr: float = 2.5e-3
    """policy Adam learning rate"""
    value_lr: float = 2.5e-3
    """value Adam learning rate"""
    policy_lr_schedule: Literal["linear", "constant"] = "linear"
    """policy learning rate: linear (annealed to 0 over the run) or constant"""
    value_lr_schedule: Literal["linear", "constant"] = "linear"
    """value learning rate: linear (annealed to 0 over the run) or constant"""
    policy_batch_size: int = 0
    """transitions per policy step, all devices (at most num_envs * num_steps; 0: the whole rollout for a2c,
    a quarter of it for ppo)"""
    value_batch_size: int = 256
    """transitions per value step, all devices (at most num_envs * num_steps)"""
    policy_train_steps: int = 0
    """policy Adam steps per epoch, in passes over the shuffled rollout (0: 1 for a2c, 16 for ppo: PPO needs
    several, its ratio is 1 at the first)"""
    value_train_steps: int = 16
    """value Adam steps per epoch (run before the policy's), in passes over the shuffled rollout"""
    max_grad_norm: float = 0.5
    """clip each network's gradients to this global norm (0: no clipping)"""
    clip_eps: float = 0.2
    """ratio clip epsilon of --loss ppo"""
    ent_coef: float = 0.0
    """entropy bonus coefficient c_ent"""
    normalize_advantages: bool = False
    """standardize advantages per policy batch"""
    scale_value_targets: bool = False
    """train the value net on targets * (1 - gamma) and read its output times 1 / (1 - gamma)"""
    n_shared_layers: int = 0
    """copy the policy net's first k hidden layers into the value net at each epoch start"""
    n_replay_epochs: int = 1
    """epochs of transitions to train on; must be 1, as a2c and ppo learn only from the current policy's data"""
    hidden: tuple[int, ...] = (64, 64)
    """hidden layer widths of each network"""
    activation: Literal["tanh", "relu"] = "tanh"
    """hidden activation"""
    std: Literal["param", "network"] = "param"
    """Box actions: log std as a learned vector (param) or a network output (network)"""
    normalize_obs: bool = False
    """normalize observations by their running mean and variance (kept in the runner state, merged over
    devices, per seed, saved in checkpoints), clipped to +-10"""

    def __post_init__(self):
        super().__post_init__()
        for name in ("loss", "advantage", "policy_lr_schedule", "value_lr_schedule", "activation", "std"):
            choices = typing.get_args(typing.get_type_hints(Config)[name])
            cli.require(getattr(self, name) in choices, f"--{name.replace('_', '-')} {getattr(self, name)!r}: "
                                                        f"use one of {', '.join(choices)}")
        for name in ("num_envs", "num_steps", "td_k", "value_batch_size", "value_train_steps"):
            cli.require(getattr(self, name) >= 1, f"--{name.replace('_', '-')} must be at least 1")
        for name in ("policy_batch_size", "policy_train_steps"):
            cli.require(getattr(self, name) >= 0, f"--{name.replace('_', '-')} must be 0 (the --loss default) "
                                                  f"or more")
        cli.require(self.loss == "a2c" or self.policy_steps > 1,
                    "--loss ppo --policy-train-steps 1 is A2C (the ratio pi / pi_old is 1 at the only step): "
                    "use 2 or more, or 0 for the default 16")
        for name in ("policy_lr", "value_lr"):
            cli.require(getattr(self, name) > 0, f"--{name.replace('_', '-')} {getattr(self, name)}: "
                                                 f"use a positive learning rate")
        cli.require(0 <= self.gamma <= 1, f"--gamma {self.gamma}: use a value in [0, 1]")
        cli.require(0 <= self.lam <= 1, f"--lam {self.lam}: use a value in [0, 1]")
        cli.require(self.max_grad_norm >= 0, f"--max-grad-norm {self.max_grad_norm}: use 0 (off) or more")
        cli.require(self.clip_eps > 0, f"--clip-eps {self.clip_eps}: use a positive value, e.g. 0.2")
        cli.require_non_negative(self, "ent_coef")
        cli.require(self.advantage != "td-k" or self.td_k <= self.num_steps,
                    f"--td-k {self.td_k} is longer than the rollout (--num-steps {self.num_steps}); use at most that")
        cli.require(len(self.hidden) >= 1 and min(self.hidden) >= 1, "--hidden needs positive widths")
        cli.require(0 <= self.n_shared_layers <= len(self.hidden),
                    f"--n-shared-layers {self.n_shared_layers}: the networks have {len(self.hidden)} hidden "
                    f"layers (--hidden {' '.join(map(str, self.hidden))}); use 0 to {len(self.hidden)}")
        cli.require(not self.scale_value_targets or self.gamma < 1,
                    "--scale-value-targets divides by 1 - gamma: use --gamma below 1")
        cli.require(self.n_replay_epochs == 1,
                    f"--n-replay-epochs {self.n_replay_epochs}: --loss {self.loss} is on-policy and trains only "
                    f"on the current epoch's transitions; use 1")

    @property
    def policy_steps(self) -> int:
        """--policy-train-steps, or the --loss default."""
        return self.policy_train_steps or {"a2c": 1, "ppo": 16}[self.loss]

    @property
    def policy_batch(self) -> int:
        """--policy-batch-size, or the --loss default."""
        rollout = self.num_envs * self.num_steps
        return self.policy_batch_size or {"a2c": rollout, "ppo": rollout // 4}[self.loss]


# ----------------------------------------------------------------------------
# Networks: plain functions over parameter pytrees
# ----------------------------------------------------------------------------
def dense_init(key, n_in: int, n_out: int, scale: float) -> dict:
    w = nets.orthogonal(key, (n_in, n_out), scale)
    return {"w": w, "b": jnp.zeros((n_out,), jnp.float32)}


def init_torso(key, obs_dim: int, hidden: tuple) -> list:
    sizes = (obs_dim,) + tuple(hidden)
    keys = jax.random.split(key, len(hidden))
    return [dense_init(k, a, b, np.sqrt(2)) for k, a, b in zip(keys, sizes[:-1], sizes[1:])]


def torso(layers: list, obs: jax.Array, activation: str) -> jax.Array:
    act = {"tanh": jnp.tanh, "relu": jax.nn.relu}[activation]
    x = jnp.ravel(obs).astype(jnp.float32)
    for layer in layers:
        x = act(x @ layer["w"] + layer["b"])
    return x


def policy_network(params: dict, obs: jax.Array, dist, activation: str) -> jax.Array:
    """One observation -> distribution inputs [n_inputs]."""
    return dist.policy_head(params["head"], torso(params["torso"], obs, activation))


def value_network(params: dict, obs: jax.Array, activation: str) -> jax.Array:
    """One observation -> the raw value output [] (times `value_scale` it is V(s))."""
    x = torso(params["torso"], obs, activation)
    return (x @ params["head"]["w"] + params["head"]["b"])[0]


def share_layers(policy_params: dict, value_params: dict, n_shared: int) -> dict:
    """The value params with their first `n_shared` hidden layers replaced by the policy's."""
    return {**value_params, "torso": policy_params["torso"][:n_shared] + value_params["torso"][n_shared:]}


# ----------------------------------------------------------------------------
# Records
# ----------------------------------------------------------------------------
class RunnerState(NamedTuple):
    policy_params: dict
    value_params: dict
    policy_opt_state: optax.OptState
    value_opt_state: optax.OptState
    env_state: chex.ArrayTree  # [B] environments of this device
    obs: jax.Array  # [B, *obs_shape]
    stats: envs.EpisodeStats
    key: jax.Array  # differs per device


class Transition(NamedTuple):
    obs: jax.Array
    action: jax.Array
    reward: jax.Array
    terminated: jax.Array  # no future: discount_t = 0
    done: jax.Array  # terminated or truncated: traces stop
    log_prob: jax.Array  # log pi_old(a_t | s_t)
    final_obs: jax.Array  # s_{t+1} before any reset (bootstraps truncated episodes)
    greedy_action: jax.Array  # mode of pi_old(. | s_t), for the preferred_move metric


class Rollout(NamedTuple):
    """An epoch before its updates: the runner after T steps and what the updates train on."""

    runner: RunnerState
    obs_stats: envs.ObsStats | None  # --normalize-obs: the statistics the networks normalize with
    value_params: dict  # the value net's, its first --n-shared-layers the policy's
    traj: Transition  # [T, B, ...] as collected (raw observations)
    advantages: jax.Array  # [T, B]
    targets: jax.Array  # [T, B] V_old + A


class Batch(NamedTuple):
    obs: jax.Array
    action: jax.Array
    log_prob: jax.Array
    advantage: jax.Array
    target: jax.Array  # V_old + A


# ----------------------------------------------------------------------------
# Advantage estimators over time-major [T, B] arrays
#
# All take rewards r_t, values V(s_t), next_values V(s'_t) (s'_t: the
# observation after step t, before any reset), terminated_t and done_t
# (terminated or truncated), and return `(advantages, targets = V + A)`.
# discount_t = gamma * (1 - terminated_t): a truncated step bootstraps from
# V(s'_t), a terminated one from nothing; at done_t nothing after t leaks
# into t. After the rollout's last step every estimator bootstraps from
# V(s'_{T-1}).
# ----------------------------------------------------------------------------
def _check_shapes(rewards, values, next_values, terminated, dones):
    chex.assert_rank(rewards, 2)
    chex.assert_equal_shape([rewards, values, next_values, terminated, dones])


def td_lambda(rewards, values, next_values, terminated, dones, gamma: float, lam: float):
    """R_t = r_t + discount_t * (V(s'_t) if done_t else (1 - lam) V(s'_t) + lam R_{t+1}); A = R - V."""
    _check_shapes(rewards, values, next_values, terminated, dones)
    discount = gamma * (1.0 - terminated.astype(jnp.float32))

    def backward(next_return, x):
        reward, discount_t, next_value, done = x
        ret = reward + discount_t * jnp.where(done, next_value, (1 - lam) * next_value + lam * next_return)
        return ret, ret

    _, returns = jax.lax.scan(backward, next_values[-1], (rewards, discount, next_values, dones), reverse=True)
    return returns - values, returns


def monte_carlo(rewards, values, next_values, terminated, dones, gamma: float):
    """G_t = r_t + discount_t * (V(s'_t) if done_t else G_{t+1}), the discounted return; A = G - V.

    TD(lambda) with lambda = 1.
    """
    return td_lambda(rewards, values, next_values, terminated, dones, gamma, 1.0)


def td_k(rewards, values, next_values, terminated, dones, gamma: float, k: int):
    """G^(k)_t = sum_{i<n} gamma^i r_{t+i} + gamma^n V(s'_{t+n-1}), n = min(k, steps to the end); A = G^(k) - V.

    Recursively G^(j)_t = r_t + discount_t * (V(s'_t) if done_t or j = 1 else G^(j-1)_{t+1}); the
    scan carries G^(1..k-1)_{t+1}.
    """
    _check_shapes(rewards, values, next_values, terminated, dones)
    discount = gamma * (1.0 - terminated.astype(jnp.float32))

    def backward(next_returns, x):  # next_returns [k-1, B]: G^(1..k-1)_{t+1}
        reward, discount_t, next_value, done = x
        bootstrap = jnp.concatenate([next_value[None], next_returns])  # [k, B]: G^(0..k-1)_{t+1}
        returns = reward + discount_t * jnp.where(done, next_value, bootstrap)  # [k, B]: G^(1..k)_t
        return returns[:-1], returns[-1]

    init = jnp.broadcast_to(next_values[-1], (k - 1,) + next_values.shape[1:])
    _, returns = jax.lax.scan(backward, init, (rewards, discount, next_values, dones), reverse=True)
    return returns - values, returns


def gae(rewards, values, next_values, terminated, dones, gamma: float, lam: float):
    """A_t = delta_t + gamma lam (1 - done_t) A_{t+1}, delta_t = r_t + discount_t V(s'_t) - V(s_t).

    Equal to TD(lambda)'s advantage; lam = 1: Monte-Carlo, lam = 0: TD(0).
    """
    _check_shapes(rewards, values, next_values, terminated, dones)
    deltas = rewards + gamma * (1.0 - terminated.astype(jnp.float32)) * next_values - values
    trace = gamma * lam * (1.0 - dones.astype(jnp.float32))

    def backward(next_advantage, x):
        delta, trace_t = x
        advantage = delta + trace_t * next_advantage
        return advantage, advantage

    _, advantages = jax.lax.scan(backward, jnp.zeros_like(values[0]), (deltas, trace), reverse=True)
    return advantages, advantages + values


def estimator(config: Config):
    """The chosen estimator as `fn(rewards, values, next_values, terminated, dones)`."""
    return {
        "monte-carlo": functools.partial(monte_carlo, gamma=config.gamma),
        "td-k": functools.partial(td_k, gamma=config.gamma, k=config.td_k),
        "td-lambda": functools.partial(td_lambda, gamma=config.gamma, lam=config.lam),
        "gae": functools.partial(gae, gamma=config.gamma, lam=config.lam),
    }[config.advantage]


# ----------------------------------------------------------------------------
# Losses
# ----------------------------------------------------------------------------
def policy_loss(params, batch: Batch, dist, config: Config):
    """a2c: -mean(A log pi); ppo: -mean(min(r A, clip(r, 1 - eps, 1 + eps) A)); minus c_ent * mean(H)."""
    chex.assert_rank(batch.advantage, 1)
    inputs = jax.vmap(policy_network, (None, 0, None, None))(params, batch.obs, dist, config.activation)
    log_prob = dist.log_prob(inputs, batch.action)
    advantage = batch.advantage
    if config.normalize_advantages:
        advantage = (advantage - advantage.mean()) / (advantage.std() + 1e-8)
    log_ratio = log_prob - batch.log_prob
    ratio = jnp.exp(log_ratio)
    # k3 estimator of KL(old || new): how far the policy moved from the one that collected the data
    metrics = {f"{config.loss}/approx_kl": jnp.mean((ratio - 1) - log_ratio)}
    if config.loss == "a2c":
        surrogate = -jnp.mean(advantage * log_prob)
    else:
        clipped = jnp.clip(ratio, 1 - config.clip_eps, 1 + config.clip_eps)
        surrogate = -jnp.mean(jnp.minimum(ratio * advantage, clipped * advantage))
        metrics["ppo/clip_fraction"] = jnp.mean(jnp.abs(ratio - 1) > config.clip_eps)
    entropy = jnp.mean(dist.entropy(inputs))
    metrics.update({"loss/policy": surrogate, "policy/entropy": entropy,
                    "policy/log_prob_mean": jnp.mean(log_prob)})
    return surrogate - config.ent_coef * entropy, metrics


def value_loss(params, batch: Batch, config: Config, value_scale: float):
    """L2 regression of the raw output on target / value_scale."""
    chex.assert_rank(batch.target, 1)
    raw = jax.vmap(value_network, (None, 0, None))(params, batch.obs, config.activation)
    loss = jnp.mean((raw - batch.target / value_scale) ** 2)
    return loss, {"loss/value": loss}


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
    for name, size in (("policy_batch_size", config.policy_batch), ("value_batch_size", config.value_batch_size)):
        if size < 1 or size % n_devices or size > config.num_envs * config.num_steps:
            raise cli.ConfigError(f"--{name.replace('_', '-')} {size}: use a multiple of --n-devices {n_devices} of "
                                  f"at most {config.num_envs} envs x {config.num_steps} steps = "
                                  f"{config.num_envs * config.num_steps}")
    steps_per_epoch = config.num_envs * config.num_steps
    num_epochs = config.total_steps // steps_per_epoch
    if num_epochs < 1:
        raise cli.ConfigError(f"--total-steps {config.total_steps} is less than one epoch "
                              f"({config.num_envs} envs x {config.num_steps} steps = {steps_per_epoch})")
    obs_dim = int(np.prod(env.observation_space(env_params).shape))
    value_scale = 1.0 / (1.0 - config.gamma) if config.scale_value_targets else 1.0

    def optimizer(lr: float, schedule: str, n_steps: int):
        lr = optax.linear_schedule(lr, 0.0, num_epochs * n_steps) if schedule == "linear" else lr
        clip = optax.clip_by_global_norm(config.max_grad_norm) if config.max_grad_norm else optax.identity()
        return optax.chain(clip, optax.adam(lr, eps=1e-5))

    policy_tx = optimizer(config.policy_lr, config.policy_lr_schedule, config.policy_steps)
    value_tx = optimizer(config.value_lr, config.value_lr_schedule, config.value_train_steps)
    estimate = estimator(config)
    policy_net = jax.vmap(policy_network, (None, 0, None, None))
    values_of = jax.vmap(jax.vmap(value_network, (None, 0, None)), (None, 0, None))  # [T, B, ...] -> [T, B]
    step_envs = jax.vmap(env.step, (0, 0, 0, None))

    def init(key):
        # parameters from the seed's key alone (the same on every device), exploration from a device key
        policy_key, policy_head_key, value_key, value_head_key, env_key = jax.random.split(key, 5)
        policy_params = {"torso": init_torso(policy_key, obs_dim, config.hidden),
                         "head": dist.head_init(policy_head_key, config.hidden[-1])}
        value_params = share_layers(policy_params, {
            "torso": init_torso(value_key, obs_dim, config.hidden),
            "head": dense_init(value_head_key, config.hidden[-1], 1, 1.0)}, config.n_shared_layers)
        reset_key, run_key = jax.random.split(devices.device_key(env_key))
        obs, env_state = envs.reset_envs(env, env_params, reset_key, envs_per_device)
        runner = RunnerState(policy_params, value_params, policy_tx.init(policy_params),
                             value_tx.init(value_params), env_state, obs, envs.init_episode_stats(envs_per_device),
                             run_key)
        return envs.Normalized(runner, envs.init_obs_stats(obs.shape[1:])) if config.normalize_obs else runner

    def fit(loss_fn, tx, params, opt_state, batch: Batch, key, n_steps: int, batch_size: int, name: str):
        """n_steps Adam steps on batch_size transitions each, in passes over the shuffled rollout (every
        transition once per pass); gradients averaged over devices."""
        per_pass = rollout_size // batch_size
        n_passes = -(-n_steps // per_pass)
        shuffle = lambda k: jax.random.permutation(k, rollout_size)[:per_pass * batch_size]  # noqa: E731
        order = jax.vmap(shuffle)(jax.random.split(key, n_passes)).reshape(-1, batch_size)[:n_steps]

        def train_step(carry, idx):
            params, opt_state = carry
            minibatch = jax.tree.map(lambda x: x[idx], batch)
            grads, metrics = jax.grad(loss_fn, has_aux=True)(params, minibatch)
            grads = jax.lax.pmean(grads, devices.DEVICE_AXIS)
            updates, opt_state = tx.update(grads, opt_state, params)
            metrics[f"optim/{name}_grad_norm"] = optax.tree.norm(grads)
            return (optax.apply_updates(params, updates), opt_state), metrics

        return jax.lax.scan(train_step, (params, opt_state), order)

    def rollout(state) -> Rollout:
        # --normalize-obs: the networks see observations normalized with the statistics of earlier epochs.
        runner, obs_stats = state if config.normalize_obs else (state, None)
        norm = lambda obs: envs.normalize_obs(obs_stats, obs)  # noqa: E731  (off: the identity)
        value_params = share_layers(runner.policy_params, runner.value_params, config.n_shared_layers)

        # COLLECT: T steps of B environments under the current policy.
        def env_step(runner: RunnerState, _):
            key, act_key, step_key = jax.random.split(runner.key, 3)
            inputs = policy_net(runner.policy_params, norm(runner.obs), dist, config.activation)
            action = dist.sample(inputs, act_key)
            obs, env_state, reward, terminated, truncated, info = step_envs(
                jax.random.split(step_key, envs_per_device), runner.env_state, dist.clip_action(action),
                env_params)
            done = jnp.logical_or(terminated, truncated)
            transition = Transition(runner.obs, action, reward, terminated, done, dist.log_prob(inputs, action),
                                    info["final_observation"], dist.mode(inputs))
            stats = envs.update_episode_stats(runner.stats, reward, done)
            return runner._replace(env_state=env_state, obs=obs, stats=stats, key=key), transition

        runner = runner._replace(stats=envs.reset_epoch_stats(runner.stats))
        runner, traj = jax.lax.scan(env_step, runner, None, config.num_steps)  # [T, B, ...]

        # ADVANTAGES: the chosen estimator on V(s_t) and V(s'_t), bootstrapping truncations.
        values = value_scale * values_of(value_params, norm(traj.obs), config.activation)
        next_values = value_scale * values_of(value_params, norm(traj.final_obs), config.activation)
        advantages, targets = estimate(traj.reward, values, next_values, traj.terminated, traj.done)
        return Rollout(runner, obs_stats, value_params, traj, advantages, targets)

    def epoch(state):
        runner, obs_stats, value_params, traj, advantages, targets = rollout(state)
        flat = lambda x: x.reshape((rollout_size,) + x.shape[2:])  # noqa: E731  [T, B, ...] -> [T*B, ...]
        obs = envs.normalize_obs(obs_stats, traj.obs)  # what the networks saw
        batch = jax.tree.map(flat, Batch(obs, traj.action, traj.log_prob, advantages, targets))

        # UPDATE: the value net on V + A, then the policy on A (both from V before this update);
        # each network with its own steps, batch size and optimizer.
        key, value_key, policy_key = jax.random.split(runner.key, 3)
        (value_params, value_opt_state), value_metrics = fit(
            functools.partial(value_loss, config=config, value_scale=value_scale), value_tx, value_params,
            runner.value_opt_state, batch, value_key, config.value_train_steps,
            config.value_batch_size // n_devices, "value")
        (policy_params, policy_opt_state), policy_metrics = fit(
            functools.partial(policy_loss, dist=dist, config=config), policy_tx, runner.policy_params,
            runner.policy_opt_state, batch, policy_key, config.policy_steps,
            config.policy_batch // n_devices, "policy")

        # METRICS: scalar means, identical on every device.
        metrics = {k: jnp.mean(v) for k, v in {**value_metrics, **policy_metrics}.items()}
        metrics["policy/preferred_move"] = jnp.mean(traj.greedy_action)
        metrics = jax.lax.pmean(metrics, devices.DEVICE_AXIS)
        metrics.update(residual_metrics(advantages, targets))  # A = R - V over every device's batch
        metrics.update(envs.episode_metrics(runner.stats, devices.DEVICE_AXIS))
        runner = runner._replace(policy_params=policy_params, value_params=value_params,
                                 policy_opt_state=policy_opt_state, value_opt_state=value_opt_state, key=key)
        if config.normalize_obs:  # this epoch's observations, every device's, join the statistics
            return envs.Normalized(runner, envs.update_obs_stats(obs_stats, traj.obs)), metrics
        return runner, metrics

    def act(params, obs, key):
        del key  # greedy
        if config.normalize_obs:  # params: (network parameters, observation statistics)
            params, obs = params[0], envs.normalize_obs(params[1], obs)
        return dist.clip_action(dist.mode(policy_network(params, obs, dist, config.activation)))

    def params(state):  # what act needs
        return (state.runner.policy_params, state.obs_stats) if config.normalize_obs else state.policy_params

    return run.Trainer(init=init, epoch=epoch, act=act, policy=params, env=env,
                       env_params=env_params, steps_per_epoch=steps_per_epoch, num_epochs=num_epochs,
                       rollout=rollout)


if __name__ == "__main__":
    run.main(Config, make_trainer, "actor_critic", __doc__.split("\n\n")[0])
