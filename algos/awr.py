"""Advantage-Weighted Regression, and Sampling AWR with a Q-value critic.

Trax's `AWR` and `SamplingAWR` trainers (Peng et al. 2019, "Advantage-Weighted
Regression: Simple and Scalable Off-Policy Reinforcement Learning",
arXiv:1910.00177). Separate policy and critic networks, each with its own
optimizer, batch size and number of steps per epoch; the last
`--n-replay-epochs` epochs of transitions live in a ring buffer inside the
compiled state. One epoch -- rollout, store, TD(lambda) targets, critic and
policy updates -- is one compiled function.

Plain AWR: V(s) regresses on TD(lambda) returns G; A = G - V(s), normalized;
the policy maximises  sum w log pi(a|s) / sum 1  with  w = min(exp(A / beta), w_max).
Sampling AWR (--q-value): Q(s, a) regresses on TD(lambda) returns bootstrapped
from an aggregate of Q over K actions drawn from the behaviour policy; the
policy is weighted over those K actions with A_k = Q(s, a_k) - mean_k Q(s, a_k)
(with K at least the number of discrete actions: every action once, weighted by mu).

    python algos/awr.py                          # CartPole-v1
    python algos/awr.py --q-value --n-samples 4  # Sampling AWR
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
    num_steps: int = 128
    """steps per environment per epoch"""
    n_replay_epochs: int = 4
    """epochs of transitions kept in the replay buffer (1: only the newest epoch)"""
    policy_lr: float = 1e-3
    """policy Adam learning rate"""
    policy_lr_schedule: Literal["linear", "constant"] = "linear"
    """policy learning rate: linear (annealed to 0 over the run) or constant"""
    policy_batch_size: int = 256
    """states per policy minibatch (per device), drawn uniformly from the replay"""
    policy_steps: int = 32
    """policy Adam steps per epoch"""
    value_lr: float = 1e-3
    """critic Adam learning rate"""
    value_lr_schedule: Literal["linear", "constant"] = "linear"
    """critic learning rate: linear (annealed to 0 over the run) or constant"""
    value_batch_size: int = 256
    """transitions per critic minibatch (per device), drawn uniformly from the replay"""
    value_steps: int = 32
    """critic Adam steps per epoch"""
    max_grad_norm: float = 0.5
    """clip each network's gradients to this global norm (0: no clipping)"""
    gamma: float = 0.99
    """discount"""
    td_lambda: float = 0.95
    """lambda of the TD(lambda) return"""
    beta: float = 1.0
    """temperature of the weights exp(A / beta)"""
    w_max: float = 20.0
    """upper clip of the weights"""
    no_normalize_advantages: bool = False
    """use raw advantages instead of standardizing them over the replay"""
    ent_coef: float = 0.0
    """entropy bonus coefficient"""
    q_value: bool = False
    """Sampling AWR: a Q(s, a) critic and K sampled actions per state"""
    n_samples: int = 1
    """K actions per state (with --q-value); K at least the number of discrete actions enumerates each once,
    weighted by the behaviour policy"""
    q_aggregate: Literal["mean", "max", "softmax", "logsumexp"] = "mean"
    """how Q over the K actions bootstraps the critic's targets (with --q-value)"""
    q_temperature: float = 1.0
    """temperature T of the softmax and logsumexp aggregates (with --q-value)"""
    q_normalization: Literal["none", "std", "abs"] = "none"
    """divide Q by its std or mean absolute deviation before aggregating (with --q-value)"""
    reweight: bool = False
    """importance-weight sampled actions by pi(a|s) / mu(a|s) (with --q-value)"""
    hidden: tuple[int, ...] = (64, 64)
    """layer widths of both networks"""
    activation: Literal["tanh", "relu"] = "tanh"
    """hidden activation"""
    std: Literal["param", "network"] = "param"
    """Box actions: log std as a learned vector (param) or a network output (network)"""
    normalize_obs: bool = False
    """normalize observations by their running mean and variance (kept in the runner state, merged over
    devices, per seed, saved in checkpoints), clipped to +-10; the replay keeps raw observations"""

    def __post_init__(self):
        super().__post_init__()
        for name in ("num_envs", "num_steps", "policy_batch_size", "policy_steps", "value_batch_size",
                     "value_steps"):
            cli.require(getattr(self, name) >= 1, f"--{name.replace('_', '-')} must be at least 1")
        cli.require(self.n_replay_epochs >= 1, f"--n-replay-epochs {self.n_replay_epochs}: the replay "
                    "must hold at least one epoch; use 1 or more")
        cli.require(self.n_samples >= 1, f"--n-samples {self.n_samples}: use at least 1")
        cli.require(self.q_value or self.n_samples == 1,
                    f"--n-samples {self.n_samples} needs --q-value (plain AWR weights the taken action only)")
        for flag, changed in (("--reweight", self.reweight), ("--q-aggregate", self.q_aggregate != "mean"),
                              ("--q-temperature", self.q_temperature != 1.0),
                              ("--q-normalization", self.q_normalization != "none")):
            cli.require(self.q_value or not changed, f"{flag} applies to Sampling AWR: add --q-value")
        cli.require(self.q_temperature > 0, f"--q-temperature {self.q_temperature}: use a positive value")
        cli.require(self.beta > 0 and self.w_max > 0, "--beta and --w-max must be positive")
        cli.require(min(self.policy_lr, self.value_lr) > 0, "--policy-lr and --value-lr must be positive")
        cli.require(0 <= self.gamma <= 1 and 0 <= self.td_lambda <= 1, "--gamma and --td-lambda: use [0, 1]")
        cli.require(self.max_grad_norm >= 0, f"--max-grad-norm {self.max_grad_norm}: use 0 (off) or more")
        cli.require_non_negative(self, "ent_coef")
        cli.require(len(self.hidden) >= 1 and min(self.hidden) >= 1, "--hidden needs positive widths")


# ----------------------------------------------------------------------------
# Networks: plain functions over parameter pytrees
# ----------------------------------------------------------------------------
def dense_init(key, n_in: int, n_out: int, scale: float) -> dict:
    w = nets.orthogonal(key, (n_in, n_out), scale)
    return {"w": w, "b": jnp.zeros((n_out,), jnp.float32)}


def torso_init(key, n_in: int, hidden: tuple) -> list:
    sizes = (n_in,) + tuple(hidden)
    keys = jax.random.split(key, len(hidden))
    return [dense_init(k, a, b, np.sqrt(2)) for k, a, b in zip(keys, sizes[:-1], sizes[1:])]


def torso(layers: list, x: jax.Array, activation: str) -> jax.Array:
    act = {"tanh": jnp.tanh, "relu": jax.nn.relu}[activation]
    for layer in layers:
        x = act(x @ layer["w"] + layer["b"])
    return x


def policy_net(params: dict, obs: jax.Array, dist, activation: str) -> jax.Array:
    """One observation -> distribution inputs [n_inputs]."""
    return dist.policy_head(params["head"], torso(params["torso"], jnp.ravel(obs).astype(jnp.float32), activation))


def critic_net(params: dict, obs: jax.Array, action_code: jax.Array | None, activation: str) -> jax.Array:
    """V(s), or Q(s, a) when an action code (one-hot or flat continuous action) is given: a scalar."""
    x = jnp.ravel(obs).astype(jnp.float32)
    if action_code is not None:
        x = jnp.concatenate([x, action_code])
    out = params["out"]
    return (torso(params["torso"], x, activation) @ out["w"] + out["b"])[0]


def action_code(dist, action: jax.Array) -> jax.Array:
    """The critic's action input: one-hot for discrete actions, the flat action otherwise."""
    if dist.discrete:
        return jax.nn.one_hot(action, dist.n)
    return jnp.ravel(action).astype(jnp.float32)


# ----------------------------------------------------------------------------
# Records
# ----------------------------------------------------------------------------
class Transition(NamedTuple):
    obs: jax.Array
    action: jax.Array
    reward: jax.Array
    terminated: jax.Array  # no future: discount_t = 0
    done: jax.Array  # terminated or truncated: the lambda-trace stops
    final_obs: jax.Array  # s_{t+1} before any reset (bootstraps truncated episodes)
    inputs: jax.Array  # behaviour policy mu(.|s_t): distribution inputs at collection
    next_inputs: jax.Array  # mu(.|s_{t+1}) at final_obs, for the Q bootstrap's samples


class Replay(NamedTuple):
    data: Transition  # [m, T, B, ...]: slot i holds one epoch
    next_slot: jax.Array  # [] the slot the next epoch overwrites (the oldest once full)
    n_filled: jax.Array  # [] slots holding data


class RunnerState(NamedTuple):
    policy: dict
    critic: dict
    policy_opt: optax.OptState
    critic_opt: optax.OptState
    replay: Replay
    env_state: chex.ArrayTree  # [B] environments of this device
    obs: jax.Array  # [B, *obs_shape]
    stats: envs.EpisodeStats
    key: jax.Array  # differs per device


class Rollout(NamedTuple):
    """An epoch before its policy update: the runner (this epoch in the replay, the critic updated) and what
    the policy update trains on. `[N, K]` arrays span the N = m T B replay rows, K actions each."""

    runner: RunnerState
    obs_stats: envs.ObsStats | None  # --normalize-obs: the statistics the networks normalize with
    traj: Transition  # [T, B, ...] this epoch's steps as collected (raw observations)
    returns: jax.Array  # [N] TD(lambda) targets of the critic's update, from the critic before it
    actions: jax.Array  # [N, K, ...] the taken action (plain AWR), or the K actions per state
    log_mu: jax.Array  # [N, K] log mu(a_k|s) (plain AWR: 0)
    q: jax.Array  # [N, K] Q(s, a_k) of the target copy (plain AWR: V(s))
    advantages: jax.Array  # [N, K] standardized (unless --no-normalize-advantages)
    advantage_mean: jax.Array  # [] before standardizing, over the valid rows of every device
    advantage_std: jax.Array  # []
    weights: jax.Array  # [N, K] min(exp(A / beta), w_max)
    mask: jax.Array  # [N, K] m_k: mu(a_k|s) when every action is enumerated, else 1
    critic_metrics: dict  # per critic step
    policy_key: jax.Array


# ----------------------------------------------------------------------------
# Pure math
# ----------------------------------------------------------------------------
def td_lambda(rewards, next_values, terminated, dones, gamma: float, lam: float):
    """TD(lambda) returns over time-major `[T, B]` arrays.

    G_t = r_t + gamma_t * ((1 - lam_t) * V(s'_t) + lam_t * G_{t+1}), with
    gamma_t = gamma * (1 - terminated_t), lam_t = lam * (1 - done_t), and s'_t the
    observation after step t before any reset (a truncated episode bootstraps
    from it). The last step bootstraps fully: G_T = V(s'_{T-1}).
    lam = 1 is the Monte-Carlo return within the rollout, lam = 0 is TD(0).
    """
    chex.assert_rank(rewards, 2)
    chex.assert_equal_shape([rewards, next_values, terminated, dones])
    discount = gamma * (1.0 - terminated.astype(jnp.float32))
    trace = lam * (1.0 - dones.astype(jnp.float32))

    def backward(next_return, x):
        r, v_next, g, l = x
        ret = r + g * ((1.0 - l) * v_next + l * next_return)
        return ret, ret

    _, returns = jax.lax.scan(backward, next_values[-1], (rewards, next_values, discount, trace), reverse=True)
    return returns


def awr_weights(advantages, beta: float, w_max: float):
    """w = min(exp(A / beta), w_max), computed without overflow."""
    return jnp.exp(jnp.minimum(advantages / beta, jnp.log(w_max)))


def q_scale(q, valid, normalization: str):
    """std(Q) or mean|Q - mean Q| (+ 1e-5) over the `valid` rows of `q` `[N, K]` on every device; 1 for none.

    Rows of replay slots not yet filled are left out; the moments are merged over
    `devices.DEVICE_AXIS` from sums, so every device scales by the same number.
    """
    chex.assert_rank([q, valid], [2, 1])
    if normalization == "none":
        return 1.0
    psum = lambda x: jax.lax.psum(jnp.sum(x), devices.DEVICE_AXIS)  # noqa: E731
    rows = valid[:, None]
    count = psum(valid.astype(jnp.float32)) * q.shape[1]
    deviation = jnp.where(rows, q - psum(jnp.where(rows, q, 0.0)) / count, 0.0)
    if normalization == "std":
        return jnp.sqrt(psum(deviation ** 2) / count) + 1e-5
    return psum(jnp.abs(deviation)) / count + 1e-5


def aggregate_q(q, log_mu, how: str, temperature: float, enumerated: bool, scale=1.0):
    """V_agg(s) from Q(s, a_k) over `[N, K]` actions per state.

    mean: mean_k Q_k, or sum_k mu(a_k|s) Q_k when every discrete action is
    enumerated; max: max_k Q_k; softmax: sum_k softmax(Q / T)_k Q_k;
    logsumexp: T * (logsumexp(Q / T) - log K). Q is divided by `scale` (see
    `q_scale`) before aggregating and the result multiplied back.
    """
    chex.assert_rank(q, 2)
    chex.assert_equal_shape([q, log_mu])
    q = q / scale
    if how == "mean":
        agg = jnp.sum(jnp.exp(log_mu) * q, axis=1) if enumerated else jnp.mean(q, axis=1)
    elif how == "max":
        agg = jnp.max(q, axis=1)
    elif how == "softmax":
        agg = jnp.sum(jax.nn.softmax(q / temperature, axis=1) * q, axis=1)
    else:  # logsumexp
        agg = temperature * (jax.nn.logsumexp(q / temperature, axis=1) - jnp.log(q.shape[1]))
    return agg * scale


def sample_actions(dist, inputs, key, n_samples: int, enumerate_all: bool):
    """K actions per state from mu = dist(inputs `[N, n_inputs]`) and their log mu: `[N, K, ...]`, `[N, K]`."""
    chex.assert_rank(inputs, 2)
    inputs = jnp.broadcast_to(inputs[:, None], (inputs.shape[0], n_samples, inputs.shape[1]))
    if enumerate_all:  # every discrete action once: a_k = k
        actions = jnp.broadcast_to(jnp.arange(n_samples), inputs.shape[:2])
    else:
        actions = dist.sample(inputs, key)
    return actions, dist.log_prob(inputs, actions)


def replay_push(replay: Replay, epoch_data: Transition) -> Replay:
    """Writes one epoch into the oldest slot of the ring buffer."""
    data = jax.tree.map(lambda buf, x: buf.at[replay.next_slot].set(x), replay.data, epoch_data)
    m = jax.tree.leaves(replay.data)[0].shape[0]
    return Replay(data, (replay.next_slot + 1) % m, jnp.minimum(replay.n_filled + 1, m))


def policy_loss(params, obs, actions, weights, mask, log_mu, dist, config: Config):
    """-mean_s [sum_k w_k log pi(a_k|s) m_k / sum_k m_k] over `[N, K]` weights and mask.

    m_k = mask_k (1, or mu(a_k|s) when every action is enumerated), times
    rho_k = exp(stopgrad(log pi(a_k|s)) - log mu(a_k|s)) with --reweight.
    """
    chex.assert_equal_shape([weights, mask, log_mu])
    inputs = jax.vmap(policy_net, (None, 0, None, None))(params, obs, dist, config.activation)
    log_pi = jax.vmap(dist.log_prob, (None, 1), 1)(inputs, actions)  # [N, K]
    if config.reweight:  # towards the current policy: pi(a_k|s) / mu(a_k|s)
        mask = mask * jnp.exp(jax.lax.stop_gradient(log_pi) - log_mu)
    entropy = jnp.mean(dist.entropy(inputs))
    weighted = jnp.sum(weights * mask * log_pi, axis=1) / jnp.sum(mask, axis=1)
    loss = -jnp.mean(weighted) - config.ent_coef * entropy
    return loss, {"loss/policy": loss, "policy/entropy": entropy, "policy/log_prob_mean": jnp.mean(log_pi)}


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
    envs_per_device, T, m, K = config.num_envs // n_devices, config.num_steps, config.n_replay_epochs, config.n_samples
    steps_per_epoch = config.num_envs * T
    num_epochs = config.total_steps // steps_per_epoch
    if num_epochs < 1:
        raise cli.ConfigError(f"--total-steps {config.total_steps} is less than one epoch "
                              f"({config.num_envs} envs x {T} steps = {steps_per_epoch})")
    if config.q_value and K == 1 and not (dist.discrete and dist.n == 1):
        raise cli.ConfigError("--q-value with --n-samples 1 learns nothing: every advantage Q(s, a_1) - mean_k Q(s, a_k) "
                              "is 0; use --n-samples 2 or more" + (f" ({dist.n} enumerates every action of {config.env})"
                                                                  if dist.discrete else ""))
    # K >= A discrete actions: every action once, weighted by mu(a|s) -- the expectation that K samples only
    # estimate. Sampled, a near-deterministic mu gives K copies of one action, every A_k = 0, and the policy
    # can never leave it (CartPole, K = 4: 2 of 32 seeds stuck at return 9; enumerated: 0 of 40).
    enumerate_all = config.q_value and dist.discrete and K >= dist.n
    K = dist.n if enumerate_all else K
    obs_shape = env.observation_space(env_params).shape
    obs_dim = int(np.prod(obs_shape))
    code_dim = (dist.n if dist.discrete else dist.d) if config.q_value else 0

    def optimizer(lr: float, schedule: str, n_steps: int):
        lr = optax.linear_schedule(lr, 0.0, num_epochs * n_steps) if schedule == "linear" else lr
        clip = optax.clip_by_global_norm(config.max_grad_norm) if config.max_grad_norm else optax.identity()
        return optax.chain(clip, optax.adam(lr))

    policy_tx = optimizer(config.policy_lr, config.policy_lr_schedule, config.policy_steps)
    critic_tx = optimizer(config.value_lr, config.value_lr_schedule, config.value_steps)
    pi = jax.vmap(policy_net, (None, 0, None, None))
    step_envs = jax.vmap(env.step, (0, 0, 0, None))
    n_buffer = m * T * envs_per_device
    for name in ("policy_batch_size", "value_batch_size"):  # batches are drawn from one device's replay
        if getattr(config, name) > n_buffer:
            raise cli.ConfigError(f"--{name.replace('_', '-')} {getattr(config, name)} is larger than the replay: "
                                  f"{m} epochs x {envs_per_device} envs x {T} steps = {n_buffer} transitions per device; "
                                  f"use at most {n_buffer}")

    def critic(params, obs, actions=None):  # [N, ...] (and [N, K, ...]) -> [N] (or [N, K])
        if actions is None:
            return jax.vmap(critic_net, (None, 0, None, None))(params, obs, None, config.activation)
        q_one = lambda o, a: critic_net(params, o, action_code(dist, a), config.activation)  # noqa: E731
        return jax.vmap(jax.vmap(q_one, (None, 0)))(obs, actions)

    def init(key):
        policy_key, head_key, critic_key, out_key, env_key = jax.random.split(key, 5)  # same on every device
        policy = {"torso": torso_init(policy_key, obs_dim, config.hidden),
                  "head": dist.head_init(head_key, config.hidden[-1])}
        critic_params = {"torso": torso_init(critic_key, obs_dim + code_dim, config.hidden),
                         "out": dense_init(out_key, config.hidden[-1], 1, 1.0)}
        reset_key, run_key = jax.random.split(devices.device_key(env_key))
        obs, env_state = envs.reset_envs(env, env_params, reset_key, envs_per_device)
        zeros = lambda shape=(), dtype=jnp.float32: jnp.zeros((m, T, envs_per_device) + shape, dtype)  # noqa: E731
        empty = Transition(zeros(obs.shape[1:], obs.dtype),
                           zeros(dist.action_shape, jnp.int32 if dist.discrete else jnp.float32), zeros(),
                           zeros(dtype=bool), zeros(dtype=bool), zeros(obs.shape[1:], obs.dtype),
                           zeros((dist.n_inputs,)), zeros((dist.n_inputs,)))
        replay = Replay(empty, jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32))
        runner = RunnerState(policy, critic_params, policy_tx.init(policy), critic_tx.init(critic_params), replay,
                             env_state, obs, envs.init_episode_stats(envs_per_device), run_key)
        return envs.Normalized(runner, envs.init_obs_stats(obs.shape[1:])) if config.normalize_obs else runner

    def targets_and_samples(critic_params, data: Transition, valid, key):
        """TD(lambda) targets [N], and K actions per state with their advantages and log mu."""
        flat = lambda x: x.reshape((-1,) + x.shape[3:])  # noqa: E731  [m, T, B, ...] -> [m*T*B, ...]
        if config.q_value:
            s_key, next_key = jax.random.split(key)
            actions, log_mu = sample_actions(dist, flat(data.inputs), s_key, K, enumerate_all)  # [N, K, ...]
            next_actions, next_log_mu = sample_actions(dist, flat(data.next_inputs), next_key, K, enumerate_all)
            q = critic(critic_params, flat(data.obs), actions)
            next_q = critic(critic_params, flat(data.final_obs), next_actions)
            next_values = aggregate_q(next_q, next_log_mu, config.q_aggregate, config.q_temperature, enumerate_all,
                                      q_scale(next_q, valid, config.q_normalization))
            # mean_k Q, or sum_k mu_k Q_k when enumerated (a scale would cancel)
            baseline = aggregate_q(q, log_mu, "mean", config.q_temperature, enumerate_all)[:, None]
            advantages = q - baseline
        else:
            actions, log_mu = flat(data.action)[:, None], jnp.zeros((n_buffer, 1))
            values = critic(critic_params, flat(data.obs))
            next_values = critic(critic_params, flat(data.final_obs))
            q = values[:, None]
        returns = jax.vmap(td_lambda, (0, 0, 0, 0, None, None))(  # each stored epoch is its own [T, B] rollout
            *(x.reshape((m, T, envs_per_device)) for x in (data.reward, next_values, data.terminated, data.done)),
            config.gamma, config.td_lambda).reshape(-1)
        if not config.q_value:
            advantages = (returns - values)[:, None]
        return returns, actions, advantages, log_mu, q

    def valid_rows(replay: Replay):
        """Slots past n_filled are empty: minibatches draw from the first n_filled * T * B transitions."""
        n_valid = replay.n_filled * T * envs_per_device
        return jnp.arange(n_buffer) < n_valid, n_valid

    def masked_mean(x, valid):  # over the valid rows of an [N, K] array
        mask = valid[:, None].astype(jnp.float32)
        return jnp.sum(x * mask) / jnp.sum(mask) / K

    def sgd_step(loss_fn, tx, batch_size: int, n_valid):
        def step(carry, key):
            params, opt_state = carry
            idx = jax.random.randint(key, (batch_size,), 0, n_valid)
            (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, idx)
            grads = jax.lax.pmean(grads, devices.DEVICE_AXIS)
            updates, opt_state = tx.update(grads, opt_state, params)
            return (optax.apply_updates(params, updates), opt_state), {**aux, "grad_norm": optax.tree.norm(grads)}
        return step

    def rollout(state) -> Rollout:
        # --normalize-obs: the networks see observations normalized with the statistics of earlier epochs
        # (the replay holds raw ones: every stored epoch is normalized with the same, current, statistics).
        runner, obs_stats = state if config.normalize_obs else (state, None)
        norm = lambda obs: envs.normalize_obs(obs_stats, obs)  # noqa: E731  (off: the identity)

        # COLLECT: T steps of B environments under the current policy (the behaviour policy mu).
        def env_step(runner: RunnerState, _):
            key, act_key, step_key = jax.random.split(runner.key, 3)
            inputs = pi(runner.policy, norm(runner.obs), dist, config.activation)
            action = dist.sample(inputs, act_key)
            obs, env_state, reward, terminated, truncated, info = step_envs(
                jax.random.split(step_key, envs_per_device), runner.env_state, dist.clip_action(action),
                env_params)
            done = jnp.logical_or(terminated, truncated)
            transition = Transition(runner.obs, action, reward, terminated, done, info["final_observation"], inputs,
                                    inputs)  # next_inputs: filled in below, batched
            stats = envs.update_episode_stats(runner.stats, reward, done)
            return runner._replace(env_state=env_state, obs=obs, stats=stats, key=key), transition

        runner = runner._replace(stats=envs.reset_epoch_stats(runner.stats))
        runner, traj = jax.lax.scan(env_step, runner, None, T)  # [T, B, ...]
        if config.q_value:  # mu(.|s'_t): the policy is fixed during the rollout, so one batched call
            traj = traj._replace(next_inputs=jax.vmap(pi, (None, 0, None, None))(
                runner.policy, norm(traj.final_obs), dist, config.activation))
        replay = replay_push(runner.replay, traj)
        data = replay.data._replace(obs=norm(replay.data.obs), final_obs=norm(replay.data.final_obs))
        key, target_key, critic_key, policy_key = jax.random.split(runner.key, 4)
        valid, n_valid = valid_rows(replay)
        flat_data = jax.tree.map(lambda x: x.reshape((n_buffer,) + x.shape[3:]), data)

        # TARGETS: TD(lambda) over every stored epoch with the critic as it is now
        # (for Sampling AWR this is the target copy, refreshed here once per epoch).
        returns, actions, advantages, log_mu, q = targets_and_samples(runner.critic, data, valid, target_key)

        # UPDATE (critic): L2 regression of V(s_t), or Q(s_t, a_t) on the taken action, on the returns.
        def critic_loss(params, idx):
            obs = flat_data.obs[idx]
            pred = critic(params, obs, flat_data.action[idx][:, None])[:, 0] if config.q_value else critic(params, obs)
            loss = jnp.mean((pred - returns[idx]) ** 2)
            return loss, {"loss/value": loss}

        (critic_params, critic_opt), critic_metrics = jax.lax.scan(
            sgd_step(critic_loss, critic_tx, config.value_batch_size, n_valid), (runner.critic, runner.critic_opt),
            jax.random.split(critic_key, config.value_steps))

        # ADVANTAGES: plain AWR recomputes them with the updated critic (A = G - V);
        # Sampling AWR keeps the target copy's A_k = Q(s, a_k) - V(s).
        if not config.q_value:
            _, actions, advantages, log_mu, _ = targets_and_samples(critic_params, data, valid, target_key)
        # Standardized over the valid replay of every device.
        mean = jax.lax.pmean(masked_mean(advantages, valid), devices.DEVICE_AXIS)
        var = jax.lax.pmean(masked_mean((advantages - mean) ** 2, valid), devices.DEVICE_AXIS)
        if not config.no_normalize_advantages:
            advantages = (advantages - mean) / (jnp.sqrt(var) + 1e-8)
        # The mask m_k: mu(a_k|s) when every action is enumerated, else 1.
        sample_mask = jnp.exp(log_mu) if enumerate_all else jnp.ones_like(log_mu)
        runner = runner._replace(critic=critic_params, critic_opt=critic_opt, replay=replay, key=key)
        return Rollout(runner, obs_stats, traj, returns, actions, log_mu, q, advantages, mean, jnp.sqrt(var),
                       awr_weights(advantages, config.beta, config.w_max), sample_mask, critic_metrics, policy_key)

    def epoch(state):
        r = rollout(state)
        runner = r.runner
        valid, n_valid = valid_rows(runner.replay)
        obs = envs.normalize_obs(r.obs_stats, runner.replay.data.obs).reshape((n_buffer,) + obs_shape)

        # UPDATE (policy): weighted log-likelihood of the K actions per state.
        policy_step = sgd_step(
            lambda p, idx: policy_loss(p, obs[idx], r.actions[idx], r.weights[idx], r.mask[idx], r.log_mu[idx],
                                       dist, config),
            policy_tx, config.policy_batch_size, n_valid)
        (policy, policy_opt), policy_metrics = jax.lax.scan(
            policy_step, (runner.policy, runner.policy_opt), jax.random.split(r.policy_key, config.policy_steps))

        # METRICS: scalar means over the valid replay, identical on every device.
        metrics = {k: jnp.mean(v) for k, v in policy_metrics.items() if k != "grad_norm"}
        metrics.update({
            "loss/value": jnp.mean(r.critic_metrics["loss/value"]),
            "optim/policy_grad_norm": jnp.mean(policy_metrics["grad_norm"]),
            "optim/value_grad_norm": jnp.mean(r.critic_metrics["grad_norm"]),
            "awr/advantage_mean": r.advantage_mean,
            "awr/advantage_std": r.advantage_std,
            "awr/weight_mean": masked_mean(r.weights, valid),
            "awr/weight_max": jax.lax.pmax(jnp.max(jnp.where(valid[:, None], r.weights, 0.0)),  # every device's
                                           devices.DEVICE_AXIS),
            "awr/weight_clipped_fraction": masked_mean(r.advantages / config.beta >= jnp.log(config.w_max), valid),
            "replay/size": (n_valid * n_devices).astype(jnp.float32),  # transitions stored, all devices
        })
        if config.q_value:
            metrics["q/mean"] = masked_mean(r.q, valid)
        metrics = jax.lax.pmean(metrics, devices.DEVICE_AXIS)
        metrics.update(envs.episode_metrics(runner.stats, devices.DEVICE_AXIS))
        runner = runner._replace(policy=policy, policy_opt=policy_opt)
        if config.normalize_obs:  # this epoch's observations, every device's, join the statistics
            return envs.Normalized(runner, envs.update_obs_stats(r.obs_stats, r.traj.obs)), metrics
        return runner, metrics

    def act(params, obs, key):
        del key  # greedy
        if config.normalize_obs:  # params: (policy parameters, observation statistics)
            params, obs = params[0], envs.normalize_obs(params[1], obs)
        return dist.clip_action(dist.mode(policy_net(params, obs, dist, config.activation)))

    def params(state):  # what act needs
        return (state.runner.policy, state.obs_stats) if config.normalize_obs else state.policy

    return run.Trainer(init=init, epoch=epoch, act=act, policy=params, env=env, env_params=env_params,
                       steps_per_epoch=steps_per_epoch, num_epochs=num_epochs, rollout=rollout)


if __name__ == "__main__":
    run.main(Config, make_trainer, "awr", __doc__.split("\n\n")[0])
