"""Actor-critic with separate policy and value networks, several advantage estimators, A2C or PPO
loss.

Trax's `ActorCriticTrainer` (Mnih et al. 2016, "Asynchronous Methods for Deep Reinforcement
Learning", arXiv:1602.01783; with `--loss ppo`, Schulman et al. 2017, arXiv:1707.06347). Each
network has its own Adam optimizer, learning-rate schedule, batch size and number of update steps
per epoch. One epoch -- a vectorized gymnax rollout, the advantages, the value updates, then the
policy updates -- is one compiled function.

    python algos/actor_critic.py             # CartPole-v1, A2C, GAE
    python algos/actor_critic.py --loss ppo  # 16 minibatch steps of 256 per epoch

docs/algorithms/actor_critic.md has the math, the flags that matter and the results.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
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
    num_steps: int = 0
    """steps per environment per epoch (rollout length T; 0: 32 for a2c, whose one policy step per
    rollout wants many rollouts; 128 for ppo)"""
    loss: Literal["a2c", "ppo"] = "a2c"
    """policy loss: a2c = -A log pi - c_ent H; ppo = clipped surrogate - c_ent H"""
    advantage: Literal["monte-carlo", "td-k", "td-lambda", "gae"] = "gae"
    """advantage estimator; the value net regresses on V + A"""
    td_k: int = 8
    """k of --advantage td-k: rewards summed before bootstrapping"""
    gae_lambda: float = 0.95
    """lambda of --advantage td-lambda and gae (the lambda-return's)"""
    policy_lr: float = 0.0
    """policy Adam learning rate (0: 4e-3 for a2c, whose one step per epoch must go far; 2.5e-3 for
    ppo)"""
    value_lr: float = 2.5e-3
    """value Adam learning rate"""
    policy_batch_size: int = 0
    """transitions per policy step, all devices (at most num_envs * num_steps; 0: the whole rollout
    for a2c, a quarter of it for ppo)"""
    value_batch_size: int = 256
    """transitions per value step, all devices (at most num_envs * num_steps)"""
    policy_steps: int = 0
    """policy Adam steps per epoch, in passes over the shuffled rollout (0: 1 for a2c, 16 for ppo:
    PPO needs several, its ratio is 1 at the first)"""
    value_steps: int = 16
    """value Adam steps per epoch (run before the policy's), in passes over the shuffled rollout"""
    clip_eps: float = 0.2
    """ratio clip epsilon of --loss ppo"""
    ent_coef: float = 0.0
    """entropy bonus coefficient c_ent"""
    normalize_advantages: bool = False
    """standardize advantages per policy batch"""
    scale_value_targets: bool = False
    """train the value net on targets * (1 - gamma) and read its output times 1 / (1 - gamma) (after
    the reward normalization: add --no-normalize-reward for Trax's scaling alone)"""
    n_shared_layers: int = 0
    """copy the policy net's first k hidden layers into the value net at each epoch start"""
    torso: nets.Torso = "auto"
    """the network's first layers: conv, one 3x3 convolution of 16 channels before the dense layers
    (image observations [H, W, C]); mlp, dense layers on the flattened observation; auto: conv for
    images, else mlp"""
    hidden: tuple[int, ...] = (64, 64)
    """hidden layer widths of each network"""
    activation: nets.Activation = "tanh"
    """hidden activation"""
    std: Literal["param", "network"] = "param"
    """Box actions: log std as a learned vector (param) or a network output (network)"""
    noise_memory: float = 0.002
    """Box actions: how long each environment's exploration noise lasts, as a fraction of the
    episode's step limit; successive noises are correlated by exp(-1 / (noise_memory * limit)) (0:
    independent noise every step; common/distributions.py)"""
    box_coef: float = 1.0
    """Box actions: weight of the penalty on the policy's mean outside the action box, the squared
    distance outside it in half-widths of the box (common/distributions.py): past a bound the
    clipped action no longer moves with the mean, and nothing else pulls it back (0: no penalty)"""
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
        # 0: the --loss default, set here so that config.json and a divergence's advice hold it
        if self.num_steps == 0:
            object.__setattr__(self, "num_steps", {"a2c": 32, "ppo": 128}.get(self.loss, 128))
        if self.policy_lr == 0:
            object.__setattr__(self, "policy_lr", {"a2c": 4e-3, "ppo": 2.5e-3}.get(self.loss, 0.0))
        super().__post_init__()
        for name in (
            "loss",
            "advantage",
            "activation",
            "std",
        ):
            choices = typing.get_args(typing.get_type_hints(Config)[name])
            value = getattr(self, name)
            cli.require(
                value in choices,
                f"{cli.flag_name(name)} {value!r}: use one of {', '.join(choices)}",
            )
        for name in ("td_k", "value_batch_size", "value_steps"):
            cli.require(getattr(self, name) >= 1, f"{cli.flag_name(name)} must be at least 1")
        for name in ("policy_batch_size", "policy_steps"):
            cli.require(
                getattr(self, name) >= 0,
                f"{cli.flag_name(name)} must be 0 (the --loss default) or more",
            )
        cli.require(
            self.loss == "a2c" or self.n_policy_steps > 1,
            "--loss ppo --policy-steps 1 is A2C (the ratio pi / pi_old is 1 at the only "
            "step): use 2 or more, or 0 for the default 16",
        )
        cli.require(
            self.policy_lr > 0 and self.value_lr > 0,
            f"--policy-lr {self.policy_lr}, --value-lr "
            f"{self.value_lr}: use positive learning rates (--policy-lr 0: the --loss default)",
        )
        cli.require(
            0 <= self.gae_lambda <= 1, f"--gae-lambda {self.gae_lambda}: use a value in [0, 1]"
        )
        cli.require(
            self.clip_eps > 0, f"--clip-eps {self.clip_eps}: use a positive value, e.g. 0.2"
        )
        cli.require_non_negative(self, "ent_coef", "noise_memory", "box_coef")
        cli.require(
            self.advantage != "td-k" or self.td_k <= self.num_steps,
            f"--td-k {self.td_k} is longer than the rollout (--num-steps {self.num_steps}); use at "
            "most that",
        )
        cli.require(
            len(self.hidden) >= 1 and min(self.hidden) >= 1, "--hidden needs positive widths"
        )
        cli.require(
            0 <= self.n_shared_layers <= len(self.hidden),
            f"--n-shared-layers {self.n_shared_layers}: the networks have {len(self.hidden)} "
            f"hidden layers (--hidden {' '.join(map(str, self.hidden))}); use 0 to "
            f"{len(self.hidden)}",
        )
        cli.require(
            not self.scale_value_targets or self.gamma < 1,
            "--scale-value-targets divides by 1 - gamma: use --gamma below 1",
        )

    @property
    def n_policy_steps(self) -> int:
        """--policy-steps, or the --loss default."""
        return self.policy_steps or {"a2c": 1, "ppo": 16}[self.loss]

    @property
    def policy_batch(self) -> int:
        """--policy-batch-size, or the --loss default."""
        return (
            self.policy_batch_size
            or self.num_envs * self.num_steps // {"a2c": 1, "ppo": 4}[self.loss]
        )

    def resolved(self) -> Config:
        """--normalize-obs unset: from the spaces and the torso (`envs.normalizes_obs`)."""
        if self.normalize_obs is not None:
            return self
        return dataclasses.replace(self, normalize_obs=envs.normalizes_obs(self.env, self.torso))


# ----------------------------------------------------------------------------
# Networks: plain functions over parameter pytrees
# ----------------------------------------------------------------------------
def policy_network(params: dict, obs: jax.Array, dist, activation: nets.Activation) -> jax.Array:
    """One observation -> distribution inputs [n_inputs]."""
    return dist.policy_head(params["head"], nets.torso(params["torso"], obs, activation))


def value_network(params: dict, obs: jax.Array, activation: nets.Activation) -> jax.Array:
    """One observation -> the raw value output [] (times `value_scale` it is V(s))."""
    x = nets.torso(params["torso"], obs, activation)
    return (x @ params["head"]["w"] + params["head"]["b"])[0]


def share_layers(policy_params: dict, value_params: dict, n_shared: int) -> dict:
    """The value params with their first `n_shared` hidden layers replaced by the policy's."""
    return {
        **value_params,
        "torso": policy_params["torso"][:n_shared] + value_params["torso"][n_shared:],
    }


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
    done: jax.Array  # terminated or truncated: traces stop
    log_prob: jax.Array  # log pi_old(a_t | s_t)
    final_obs: jax.Array  # s_{t+1} before any reset (bootstraps truncated episodes)
    greedy_action: jax.Array  # mode of pi_old(. | s_t), for the preferred_move metric


# an epoch before its updates: the state after T steps and what they train on
class Rollout(NamedTuple):
    # its value net's first --n-shared-layers the policy's; its obs_stats: those used
    state: RunnerState
    traj: Transition  # [T, B, ...] as collected (raw observations)
    advantages: jax.Array  # [T, B]
    targets: jax.Array  # [T, B] V_old + A


class Batch(NamedTuple):
    obs: jax.Array  # as the networks saw it (normalized with --normalize-obs)
    action: jax.Array
    log_prob: jax.Array
    advantage: jax.Array
    target: jax.Array  # V_old + A


# ----------------------------------------------------------------------------
# Advantage estimators over time-major [T, B] arrays. All take rewards r_t, values V(s_t),
# next_values V(s'_t) (s'_t: final_obs_t, the observation after step t before any reset),
# terminated_t and done_t (terminated or truncated), and return `(advantages, targets = V + A)`.
# discount_t = gamma * (1 - terminated_t): a truncated step bootstraps from V(s'_t), a terminated
# one from nothing; at done_t nothing after t leaks into t. After the rollout's last step every
# estimator bootstraps from V(s'_{T-1}).
# ----------------------------------------------------------------------------
def td_lambda(rewards, values, next_values, terminated, dones, gamma: float, lam: float):
    """R_t = r_t + discount_t * (V(s'_t) if done_t else (1 - lam) V(s'_t) + lam R_{t+1});
    A = R - V."""
    chex.assert_rank(rewards, 2)
    chex.assert_equal_shape([rewards, values, next_values, terminated, dones])
    discount = gamma * (1.0 - terminated.astype(jnp.float32))

    def backward(next_return, x):
        reward, discount_t, next_value, done = x
        ret = reward + discount_t * jnp.where(
            done, next_value, (1 - lam) * next_value + lam * next_return
        )
        return ret, ret

    _, returns = jax.lax.scan(
        backward, next_values[-1], (rewards, discount, next_values, dones), reverse=True
    )
    return returns - values, returns


def monte_carlo(rewards, values, next_values, terminated, dones, gamma: float):
    """G_t = r_t + discount_t * (V(s'_t) if done_t else G_{t+1}), the discounted return; A = G - V:
    TD(1)."""
    return td_lambda(rewards, values, next_values, terminated, dones, gamma, 1.0)


def td_k(rewards, values, next_values, terminated, dones, gamma: float, k: int):
    """G^(k)_t = sum_{i<n} gamma^i r_{t+i} + gamma^n V(s'_{t+n-1}), n = min(k, steps to the end); A
    = G^(k) - V.

    Recursively G^(j)_t = r_t + discount_t * (V(s'_t) if done_t or j = 1 else G^(j-1)_{t+1}); the
    scan carries G^(1..k-1)_{t+1}."""
    chex.assert_rank(rewards, 2)
    chex.assert_equal_shape([rewards, values, next_values, terminated, dones])
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

    Equal to TD(lambda)'s advantage; lam = 1: Monte-Carlo, lam = 0: TD(0)."""
    chex.assert_rank(rewards, 2)
    chex.assert_equal_shape([rewards, values, next_values, terminated, dones])
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
        "td-lambda": functools.partial(td_lambda, gamma=config.gamma, lam=config.gae_lambda),
        "gae": functools.partial(gae, gamma=config.gamma, lam=config.gae_lambda),
    }[config.advantage]


# ----------------------------------------------------------------------------
# Losses
# ----------------------------------------------------------------------------
def clipped_surrogate(log_prob, old_log_prob, advantage, clip_eps: float):
    """PPO's policy loss -mean(min(r A, clip(r, 1 - eps, 1 + eps) A)), r = exp(log pi - log pi_old),
    over `[N]`.

    Returns `(loss, metrics)`: ppo/approx_kl, the k3 estimator of KL(old || new) mean((r - 1) - log
    r), and ppo/clip_fraction, mean(|r - 1| > eps)."""
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


def policy_loss(params, batch: Batch, dist, config: Config):
    """a2c: -mean(A log pi); ppo: `clipped_surrogate`; minus c_ent * mean(H), plus c_box * the mean
    outside the box."""
    chex.assert_rank(batch.advantage, 1)
    inputs = jax.vmap(policy_network, (None, 0, None, None))(
        params, batch.obs, dist, config.activation
    )
    log_prob = dist.log_prob(inputs, batch.action)
    advantage = batch.advantage
    if config.normalize_advantages:
        advantage = (advantage - advantage.mean()) / (advantage.std() + 1e-8)
    if config.loss == "a2c":
        surrogate = -jnp.mean(advantage * log_prob)
        # how far the policy moved from the one that collected the data
        log_ratio = log_prob - batch.log_prob
        # k3 estimator of KL(old || new)
        metrics = {"a2c/approx_kl": jnp.mean((jnp.exp(log_ratio) - 1) - log_ratio)}
    else:
        surrogate, metrics = clipped_surrogate(log_prob, batch.log_prob, advantage, config.clip_eps)
    entropy = jnp.mean(dist.entropy(inputs))
    outside_box = jnp.mean(dist.outside_box(inputs))
    metrics.update(
        {
            "loss/policy": surrogate,
            "policy/entropy": entropy,
            "policy/log_prob_mean": jnp.mean(log_prob),
            "policy/outside_box": outside_box,
        }
    )
    return surrogate - config.ent_coef * entropy + config.box_coef * outside_box, metrics


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
    config = config.resolved()
    env, env_params = envs.make_env(config.env)
    dist = make_distribution(env.action_space(env_params), config.std)
    correlation = noise_correlation(config.noise_memory, env_params.max_steps_in_episode)
    layout = devices.layout(config)
    for name, size in (
        ("policy_batch_size", config.policy_batch),
        ("value_batch_size", config.value_batch_size),
    ):
        cli.require(
            1 <= size <= layout.steps_per_epoch and size % layout.n_devices == 0,
            f"{cli.flag_name(name)} {size}: use a multiple of --n-devices {layout.n_devices} of at "
            f"most {config.num_envs} envs x {config.num_steps} steps = {layout.steps_per_epoch}",
        )
    obs_shape = tuple(env.observation_space(env_params).shape)
    # the networks' first layer: a convolution for images
    conv = nets.uses_conv(config.torso, obs_shape)
    value_scale = 1.0 / (1.0 - config.gamma) if config.scale_value_targets else 1.0

    def optimizer(lr: float, n_steps: int):
        if config.anneal_lr:
            lr = optax.linear_schedule(lr, 0.0, layout.num_epochs * n_steps)
        clip = (
            optax.identity()
            if cli.off(config.max_grad_norm)
            else optax.clip_by_global_norm(config.max_grad_norm)
        )
        return optax.chain(clip, optax.adam(lr, eps=1e-5))

    policy_tx = optimizer(config.policy_lr, config.n_policy_steps)
    value_tx = optimizer(config.value_lr, config.value_steps)
    estimate = estimator(config)
    # [T, B, ...] -> [T, B]
    values_of = jax.vmap(jax.vmap(value_network, (None, 0, None)), (None, 0, None))
    step_envs = jax.vmap(env.step, (0, 0, 0, None))

    def init(key) -> RunnerState:
        # parameters from the seed's key alone (the same on every device), exploration from a device
        # key
        policy_key, policy_head_key, value_key, value_head_key, env_key = jax.random.split(key, 5)

        def torso(k):
            return nets.torso_init(
                jax.random.split(k, len(config.hidden)), obs_shape, config.hidden, conv
            )

        policy_params = {
            "torso": torso(policy_key),
            "head": dist.head_init(policy_head_key, config.hidden[-1]),
        }
        value_params = {
            "torso": torso(value_key),
            "head": nets.dense_init(value_head_key, config.hidden[-1], 1, 1.0),
        }
        value_params = share_layers(policy_params, value_params, config.n_shared_layers)
        reset_key, run_key = jax.random.split(devices.device_key(env_key))
        obs, env_state = envs.reset_envs(env, env_params, reset_key, layout.envs_per_device)
        return RunnerState(
            policy_params=policy_params,
            value_params=value_params,
            policy_opt_state=policy_tx.init(policy_params),
            value_opt_state=value_tx.init(value_params),
            env_state=env_state,
            obs=obs,
            episode_stats=envs.init_episode_stats(layout.envs_per_device),
            obs_stats=envs.init_obs_stats(obs.shape[1:]) if config.normalize_obs else None,
            noise=dist.init_noise(run_key, layout.envs_per_device),
            epoch=jnp.int32(0),
            key=run_key,
            reward_stats=envs.init_reward_stats(obs.shape[0]) if config.normalize_reward else None,
        )

    def env_step(state: RunnerState, _):
        """One step of the B environments; the policy sees observations normalized by
        state.obs_stats."""
        key, act_key, step_key = jax.random.split(state.key, 3)
        inputs = jax.vmap(policy_network, (None, 0, None, None))(
            state.policy_params,
            envs.normalize_obs(state.obs_stats, state.obs),
            dist,
            config.activation,
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
        # COLLECT: T steps of B environments under the current policy (the value net first takes its
        # shared layers).
        value_params = share_layers(state.policy_params, state.value_params, config.n_shared_layers)
        state = state._replace(
            value_params=value_params, episode_stats=envs.reset_epoch_stats(state.episode_stats)
        )
        state, traj = jax.lax.scan(env_step, state, None, config.num_steps)  # [T, B, ...]

        # ADVANTAGES: the estimator on V(s_t), V(final_obs_t) (truncations bootstrap), rewards /
        # their return std.
        # values_of's V, as the networks see observations (--normalize-obs off: as they are)
        def value(obs):  # [N, B, *obs_shape] -> [N, B]
            obs = envs.normalize_obs(state.obs_stats, obs)
            return value_scale * values_of(state.value_params, obs, config.activation)

        values = value(traj.obs)
        truncated = traj.done & ~traj.terminated
        next_values = envs.next_values(
            value, values, traj.final_obs, truncated, env_params.max_steps_in_episode
        )
        reward_stats = envs.update_reward_stats(
            state.reward_stats, traj.reward, traj.done, config.gamma
        )
        advantages, targets = estimate(
            traj.reward / envs.reward_scale(reward_stats),
            values,
            next_values,
            traj.terminated,
            traj.done,
        )
        return Rollout(
            state=state._replace(reward_stats=reward_stats),
            traj=traj,
            advantages=advantages,
            targets=targets,
        )

    def fit(
        loss_fn, tx, params, opt_state, batch: Batch, key, n_steps: int, batch_size: int, name: str
    ):
        """n_steps Adam steps of batch_size transitions, in passes over the shuffled rollout;
        pmean'd grads."""
        per_pass = layout.rollout_size // batch_size
        n_passes = -(-n_steps // per_pass)

        def shuffle(k):
            return jax.random.permutation(k, layout.rollout_size)[: per_pass * batch_size]

        order = jax.vmap(shuffle)(jax.random.split(key, n_passes)).reshape(-1, batch_size)[:n_steps]

        def update_step(carry, idx):
            params, opt_state = carry
            minibatch = jax.tree.map(lambda x: x[idx], batch)
            grads, metrics = jax.grad(loss_fn, has_aux=True)(params, minibatch)
            grads = jax.lax.pmean(grads, devices.DEVICE_AXIS)
            updates, opt_state = tx.update(grads, opt_state, params)
            metrics[f"optim/{name}_grad_norm"] = optax.tree.norm(grads)
            return (optax.apply_updates(params, updates), opt_state), metrics

        return jax.lax.scan(update_step, (params, opt_state), order)

    def epoch(state: RunnerState):
        collected = rollout(state)  # COLLECT and ADVANTAGES
        state, traj = collected.state, collected.traj
        advantages, targets = collected.advantages, collected.targets

        # UPDATE: the value net on V + A, then the policy on A (both from V before this update);
        # each network with its own steps, batch size and optimizer.
        def flat(x):  # [T, B, ...] -> [T*B, ...]
            return x.reshape((layout.rollout_size,) + x.shape[2:])

        obs = envs.normalize_obs(state.obs_stats, traj.obs)  # what the networks saw
        batch = jax.tree.map(
            flat,
            Batch(
                obs=obs,
                action=traj.action,
                log_prob=traj.log_prob,
                advantage=advantages,
                target=targets,
            ),
        )
        key, value_key, policy_key = jax.random.split(state.key, 3)
        (value_params, value_opt_state), value_metrics = fit(
            functools.partial(value_loss, config=config, value_scale=value_scale),
            value_tx,
            state.value_params,
            state.value_opt_state,
            batch,
            value_key,
            config.value_steps,
            config.value_batch_size // layout.n_devices,
            "value",
        )
        (policy_params, policy_opt_state), policy_metrics = fit(
            functools.partial(policy_loss, dist=dist, config=config),
            policy_tx,
            state.policy_params,
            state.policy_opt_state,
            batch,
            policy_key,
            config.n_policy_steps,
            config.policy_batch // layout.n_devices,
            "policy",
        )

        # METRICS: scalar means, identical on every device.
        metrics = {k: jnp.mean(v) for k, v in {**value_metrics, **policy_metrics}.items()}
        # the mean mode of pi_old (greedy action)
        metrics["policy/preferred_move"] = jnp.mean(traj.greedy_action)
        metrics = jax.lax.pmean(metrics, devices.DEVICE_AXIS)
        metrics.update(residual_metrics(advantages, targets))  # A = R - V over every device's batch
        metrics.update(envs.episode_metrics(state.episode_stats, devices.DEVICE_AXIS))
        # --normalize-obs: every device's obs join
        obs_stats = envs.update_obs_stats(state.obs_stats, traj.obs)
        state = state._replace(
            policy_params=policy_params,
            value_params=value_params,
            obs_stats=obs_stats,
            policy_opt_state=policy_opt_state,
            value_opt_state=value_opt_state,
            epoch=state.epoch + 1,
            key=key,
        )
        return state, metrics

    def act(policy: envs.Policy, obs, key):
        del key  # greedy
        inputs = policy_network(
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
        policy=lambda state: envs.Policy(params=state.policy_params, obs_stats=state.obs_stats),
        steps_per_epoch=layout.steps_per_epoch,
        num_epochs=layout.num_epochs,
    )


if __name__ == "__main__":
    run.main(Config, make_trainer, "actor_critic", __doc__.split("\n\n")[0])
