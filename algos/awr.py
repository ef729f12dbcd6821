"""Advantage-Weighted Regression, and Sampling AWR with a Q-value critic.

Trax's `AWR` and `SamplingAWR` trainers (Peng et al. 2019, "Advantage-Weighted Regression: Simple
and Scalable Off-Policy Reinforcement Learning", arXiv:1910.00177). Separate policy and critic
networks, each with its own optimizer, batch size and number of steps per epoch; the last
`--n-replay-epochs` epochs of transitions live in a ring buffer inside the compiled state. One epoch
is one compiled function.

Plain AWR: V(s) regresses on TD(lambda) returns G; the policy maximises mean w log pi(a|s) with w =
min(exp(A / beta), w_max), A = G - V(s) standardized. Sampling AWR (--q-value): Q(s, a) regresses on
returns bootstrapped from K actions of the behaviour policy mu; the policy weighs them by A_k = Q(s,
a_k) - mean_k Q(s, a_k).

    python algos/awr.py                          # CartPole-v1
    python algos/awr.py --q-value --n-samples 4  # Sampling AWR

docs/algorithms/awr.md has the math, the flags that matter and the results.
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


@dataclasses.dataclass(frozen=True)
class Config(cli.TrainConfig):
    # Float flags are inputs of the compiled programs: traced numbers, so runs that differ only in
    # them share their programs. Compute with them (jnp.where); a Python `if` on one is refused.
    # Constants instead: a SWITCHES flag at 0 (its term left out) and the STATIC_FLOATS.
    SWITCHES = ("max_grad_norm",)  # 0: no clipping (a program without it)
    STATIC_FLOATS = ()
    # cli.TrainConfig holds num_envs, num_steps, gamma, anneal_lr and max_grad_norm
    n_replay_epochs: int = 4
    """epochs of transitions kept in the replay buffer (1: only the newest epoch)"""
    policy_lr: float = 1e-3
    """policy Adam learning rate"""
    policy_batch_size: int = 256
    """states per policy minibatch (per device), drawn uniformly from the replay"""
    policy_steps: int = 32
    """policy Adam steps per epoch"""
    value_lr: float = 1e-3
    """critic Adam learning rate"""
    value_batch_size: int = 256
    """transitions per critic minibatch (per device), drawn uniformly from the replay"""
    value_steps: int = 0
    """critic Adam steps per epoch (0: 32 for V; 128 for Q, which learns the action's effect from
    taken actions only)"""
    gae_lambda: float = 0.95
    """lambda of the TD(lambda) return (GAE's lambda: the same lambda-return)"""
    beta: float = 2.0
    """temperature of the weights exp(A / beta)"""
    w_max: float = 20.0
    """upper clip of the weights"""
    normalize_advantages: bool = True
    """standardize the advantages over the replay (false: raw advantages)"""
    ent_coef: float = 0.0
    """entropy bonus coefficient"""
    q_value: bool = False
    """Sampling AWR: a Q(s, a) critic and K sampled actions per state"""
    n_samples: int = 1
    """K actions per state (with --q-value); at least the number of discrete actions: each once,
    weighted by mu"""
    q_aggregate: Literal["mean", "max", "softmax", "logsumexp"] = "mean"
    """how Q over the K actions bootstraps the critic's targets (with --q-value)"""
    q_temperature: float = 1.0
    """temperature T of the softmax and logsumexp aggregates (with --q-value)"""
    q_normalization: Literal["none", "std", "abs"] = "none"
    """divide Q by its std or mean absolute deviation before aggregating (with --q-value)"""
    reweight: bool = False
    """importance-weight sampled actions by pi(a|s) / mu(a|s) (with --q-value)"""
    torso: nets.Torso = "auto"
    """the network's first layers: conv, one 3x3 convolution of 16 channels before the dense layers
    (image observations [H, W, C]); mlp, dense layers on the flattened observation; auto: conv for
    images, else mlp"""
    hidden: tuple[int, ...] = (64, 64)
    """layer widths of both networks"""
    activation: nets.Activation = "tanh"
    """hidden activation"""
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
    normalize_obs: bool = False
    """normalize observations by their running mean and variance (per seed, merged over devices,
    checkpointed)"""
    normalize_reward: bool = True
    """divide the learner's rewards by a running std of the discounted return where above 1 (kept
    like --normalize-obs): value targets of order 1 whatever the reward scale (false: raw
    rewards)"""

    def __post_init__(self):
        super().__post_init__()
        for name in (
            "policy_batch_size",
            "policy_steps",
            "value_batch_size",
        ):
            cli.require(getattr(self, name) >= 1, f"{cli.flag_name(name)} must be at least 1")
        cli.require(
            min(self.n_replay_epochs, self.n_samples) >= 1,
            f"--n-replay-epochs {self.n_replay_epochs} "
            f"and --n-samples {self.n_samples}: use at least one epoch and one sample",
        )
        cli.require(
            self.q_value or self.n_samples == 1,
            f"--n-samples {self.n_samples} needs --q-value (plain AWR weights the taken action "
            "only)",
        )
        # Sampling AWR's own flags
        for name in (
            "reweight",
            "q_aggregate",
            "q_temperature",
            "q_normalization",
        ):
            cli.require(
                self.q_value or getattr(self, name) == getattr(Config, name),
                f"{cli.flag_name(name)} applies to Sampling AWR: add --q-value",
            )
        cli.require(
            self.q_temperature > 0, f"--q-temperature {self.q_temperature}: use a positive value"
        )
        cli.require(
            min(self.beta, self.w_max, self.policy_lr, self.value_lr) > 0,
            "--beta, --w-max, --policy-lr and --value-lr must be positive",
        )
        cli.require(
            0 <= self.gae_lambda <= 1, f"--gae-lambda {self.gae_lambda}: use a value in [0, 1]"
        )
        cli.require_non_negative(self, "ent_coef", "noise_memory", "box_coef")
        cli.require(
            self.value_steps >= 0,
            f"--value-steps {self.value_steps}: use 1 or more (0: by the critic)",
        )
        cli.require(
            len(self.hidden) >= 1 and min(self.hidden) >= 1, "--hidden needs positive widths"
        )


def policy_net(params: dict, obs: jax.Array, dist, activation: nets.Activation) -> jax.Array:
    """One observation -> distribution inputs [n_inputs]."""
    return dist.policy_head(params["head"], nets.torso(params["torso"], obs, activation))


def critic_net(
    params: dict, obs: jax.Array, codes: jax.Array | None, activation: nets.Activation
) -> jax.Array:
    """V(s) `[]`, or Q(s, a_k) `[K]` for action codes `[K, n_code]` (one-hot or flat continuous
    actions). Q's first layer is W [s; a] = W_s s + W_a a: W_s s is computed once per state, so K
    actions cost little more than one."""
    # the convolution, if any, sees the state alone
    n_conv = sum(layer["w"].ndim == 4 for layer in params["torso"])
    x = nets.torso(params["torso"][:n_conv], obs, activation)
    first, *rest = params["torso"][n_conv:]
    # [K, H]
    h = (
        x @ first["w"][: x.size]
        + first["b"]
        + (0.0 if codes is None else codes @ first["w"][x.size :])
    )
    h = jax.vmap(nets.torso, (None, 0, None))(
        rest, jnp.atleast_2d(nets.ACTIVATIONS[activation](h)), activation
    )
    q = (h @ params["out"]["w"] + params["out"]["b"])[:, 0]
    return q[0] if codes is None else q


class Transition(NamedTuple):
    obs: jax.Array
    action: jax.Array
    reward: jax.Array
    terminated: jax.Array  # no future: discount_t = 0
    done: jax.Array  # terminated or truncated: the lambda-trace stops
    final_obs: jax.Array  # s_{t+1} before any reset (bootstraps truncated episodes)
    inputs: jax.Array  # behaviour policy mu(.|s_t): distribution inputs at collection
    # mu(.|s_{t+1}) at final_obs, for the Q bootstrap's samples (set after COLLECT's scan)
    next_inputs: jax.Array


class Replay(NamedTuple):
    data: Transition  # [m, T, B, ...]: a ring of m = capacity slots, each holding one epoch
    position: jax.Array  # [] the slot the next epoch overwrites (the oldest once full)
    filled: jax.Array  # [] slots holding data (at most the capacity)


class RunnerState(NamedTuple):
    policy: dict
    critic: dict
    policy_opt_state: optax.OptState
    critic_opt_state: optax.OptState
    replay: Replay
    env_state: chex.ArrayTree  # [B] environments of this device
    obs: jax.Array  # [B, *obs_shape]
    episode_stats: envs.EpisodeStats
    noise: jax.Array  # [B, action dims] each environment's exploration noise (Box actions)
    epoch: jax.Array  # [] epochs done: the run's progress is epoch / num_epochs
    key: jax.Array  # differs per device
    # --normalize-obs: what the networks normalize with; None (no arrays) if off
    obs_stats: envs.ObsStats | None
    # the discounted returns' statistics; --no-normalize-reward: None
    reward_stats: envs.RewardStats | None


class Targets(NamedTuple):
    """What one critic makes of the N = m T B replay rows: TD(lambda) returns and K weighted actions
    per state."""

    returns: jax.Array  # [N] TD(lambda) returns
    actions: jax.Array  # [N, K, ...] the taken action (plain AWR), or the K actions per state
    log_mu: jax.Array  # [N, K] log mu(a_k|s) (plain AWR: 0)
    q: jax.Array  # [N, K] Q(s, a_k) (plain AWR: V(s))
    # [N, K] G - V(s) or Q(s, a_k) - V(s), standardized (unless --no-normalize-advantages)
    advantages: jax.Array
    weights: jax.Array  # [N, K] min(exp(A / beta), w_max)
    mask: jax.Array  # [N, K] m_k: mu(a_k|s) when every action is enumerated, else 1
    # awr/* and q/mean over the valid rows of every device (awr/weight_max: their maximum)
    metrics: dict


class Rollout(NamedTuple):
    """An epoch before its policy update: the state (this epoch stored, the critic updated) and
    what follows."""

    state: RunnerState
    traj: Transition  # [T, B, ...] this epoch's steps as collected (raw observations)
    # [N, ...] the replay, observations and rewards normalized with the current statistics
    rows: Transition
    # [N] what the critic regressed on: the returns of the critic before its update
    returns: jax.Array
    # the policy's: from the critic just updated (plain AWR) or the target copy (Sampling AWR)
    targets: Targets
    critic_metrics: dict  # per critic step: loss/value, optim/value_grad_norm
    policy_key: jax.Array


def td_lambda(rewards, next_values, terminated, dones, gamma: float, lam: float):
    """TD(lambda) returns over time-major `[T, B]` arrays: G_t = r_t + gamma_t ((1 - lam_t) V(s'_t)
    + lam_t G_{t+1}), gamma_t = gamma (1 - terminated_t), lam_t = lam (1 - done_t), s'_t the
    observation after step t before any reset (a truncated episode bootstraps from it), G_T =
    V(s'_{T-1}). lam = 1: Monte-Carlo in the rollout; 0: TD(0)."""
    chex.assert_rank(rewards, 2), chex.assert_equal_shape([rewards, next_values, terminated, dones])
    discount = gamma * (1.0 - terminated.astype(jnp.float32))
    trace = lam * (1.0 - dones.astype(jnp.float32))

    def backward(next_return, x):
        r, v_next, g, trace_t = x
        ret = r + g * ((1.0 - trace_t) * v_next + trace_t * next_return)
        return ret, ret

    _, returns = jax.lax.scan(
        backward, next_values[-1], (rewards, next_values, discount, trace), reverse=True
    )
    return returns


def awr_weights(advantages, beta: float, w_max: float):
    """w = min(exp(A / beta), w_max), computed without overflow."""
    return jnp.exp(jnp.minimum(advantages / beta, jnp.log(w_max)))


def q_scale(q, valid, normalization: str):
    """std(Q) or mean|Q - mean Q| (+ 1e-5) over the `valid` rows of `q` `[N, K]` (empty replay slots
    left out), the same on every device (merged sums); 1 for none."""
    chex.assert_rank([q, valid], [2, 1])
    if normalization == "none":
        return 1.0

    def psum(x):
        return jax.lax.psum(jnp.sum(x), devices.DEVICE_AXIS)

    count = psum(valid.astype(jnp.float32)) * q.shape[1]
    deviation = jnp.where(valid[:, None], q - psum(jnp.where(valid[:, None], q, 0.0)) / count, 0.0)
    if normalization == "std":
        return jnp.sqrt(psum(deviation**2) / count) + 1e-5
    return psum(jnp.abs(deviation)) / count + 1e-5


def aggregate_q(q, log_mu, how: str, temperature: float, enumerated: bool, scale=1.0):
    """V_agg(s) from Q(s, a_k) over `[N, K]` actions per state.

    mean: mean_k Q_k, or sum_k mu(a_k|s) Q_k when every discrete action is enumerated; max: max_k
    Q_k; softmax: sum_k softmax(Q / T)_k Q_k; logsumexp: T * (logsumexp(Q / T) - log K). Q is
    divided by `scale` (see `q_scale`) before aggregating and the result multiplied back."""
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
    """K actions per state from mu = dist(inputs `[N, n_inputs]`) and their log mu: `[N, K, ...]`,
    `[N, K]`. `enumerate_all`: every discrete action once, a_k = k."""
    chex.assert_rank(inputs, 2)
    inputs = jnp.broadcast_to(inputs[:, None], (inputs.shape[0], n_samples, inputs.shape[1]))
    actions = (
        jnp.broadcast_to(jnp.arange(n_samples), inputs.shape[:2])
        if enumerate_all
        else dist.sample(inputs, key)
    )
    return actions, dist.log_prob(inputs, actions)


def replay_push(replay: Replay, epoch_data: Transition) -> Replay:
    """Writes one epoch into the oldest slot of the ring buffer."""
    capacity = replay.data.reward.shape[0]
    data = jax.tree.map(lambda slots, x: slots.at[replay.position].set(x), replay.data, epoch_data)
    return Replay(
        data=data,
        position=(replay.position + 1) % capacity,
        filled=jnp.minimum(replay.filled + 1, capacity),
    )


def policy_loss(params, obs, actions, weights, mask, log_mu, dist, config: Config):
    """-mean_s [sum_k w_k log pi(a_k|s) m_k / sum_k m_k] over `[N, K]` weights and mask.

    m_k = mask_k (1, or mu(a_k|s) when every action is enumerated), times
    rho_k = exp(stopgrad(log pi(a_k|s)) - log mu(a_k|s)) with --reweight. Minus c_ent * entropy,
    plus c_box * the mean outside the box.
    """
    chex.assert_equal_shape([weights, mask, log_mu])
    inputs = jax.vmap(policy_net, (None, 0, None, None))(params, obs, dist, config.activation)
    log_pi = jax.vmap(dist.log_prob, (None, 1), 1)(inputs, actions)  # [N, K]
    if config.reweight:  # towards the current policy: pi(a_k|s) / mu(a_k|s)
        mask = mask * jnp.exp(jax.lax.stop_gradient(log_pi) - log_mu)
    entropy = jnp.mean(dist.entropy(inputs))
    weighted = jnp.sum(weights * mask * log_pi, axis=1) / jnp.sum(mask, axis=1)
    outside_box = jnp.mean(dist.outside_box(inputs))
    loss = -jnp.mean(weighted) - config.ent_coef * entropy + config.box_coef * outside_box
    return loss, {
        "loss/policy": loss,
        "policy/entropy": entropy,
        "policy/log_prob_mean": jnp.mean(log_pi),
        "policy/outside_box": outside_box,
    }


def make_trainer(config: Config) -> run.Trainer:
    env, env_params = envs.make_env(config.env)
    dist = make_distribution(env.action_space(env_params), config.std)
    correlation = noise_correlation(config.noise_memory, env_params.max_steps_in_episode)
    layout = devices.layout(config)
    B, T, capacity, K = (
        layout.envs_per_device,
        config.num_steps,
        config.n_replay_epochs,
        config.n_samples,
    )
    cli.require(
        not config.q_value or K > 1 or (dist.discrete and dist.n == 1),
        "--q-value with --n-samples 1 learns nothing: every advantage Q(s, a_1) - mean_k Q(s, "
        "a_k) is 0; use --n-samples 2 or more"
        + (f" ({dist.n} enumerates every action of {config.env})" if dist.discrete else ""),
    )
    # N = m T B rows of one device's replay: its batches are drawn there
    n_rows = capacity * layout.rollout_size
    for name in ("policy_batch_size", "value_batch_size"):
        cli.require(
            getattr(config, name) <= n_rows,
            f"{cli.flag_name(name)} {getattr(config, name)} is larger than the replay: {capacity} "
            f"epochs x {B} envs x {T} steps = {n_rows} transitions per device; use at most "
            f"{n_rows}",
        )
    # K >= A discrete actions: each once, weighted by mu(a|s). Sampled, a near-deterministic mu
    # gives K copies of one action, every A_k = 0, and the policy never leaves it.
    enumerate_all = config.q_value and dist.discrete and K >= dist.n
    K = dist.n if enumerate_all else K

    def optimizer(lr: float, n_steps: int):
        if config.anneal_lr:
            lr = optax.linear_schedule(lr, 0.0, layout.num_epochs * n_steps)
        clip = (
            optax.identity()
            if cli.off(config.max_grad_norm)
            else optax.clip_by_global_norm(config.max_grad_norm)
        )
        return optax.chain(clip, optax.adam(lr))

    policy_tx = optimizer(config.policy_lr, config.policy_steps)
    value_steps = config.value_steps or (128 if config.q_value else 32)
    critic_tx = optimizer(config.value_lr, value_steps)

    def pi(params, obs):
        return jax.vmap(policy_net, (None, 0, None, None))(params, obs, dist, config.activation)

    # [N, ...] -> V [N]; with actions [N, K, ...] (one-hot if discrete) Q [N, K]
    def critic(params, obs, actions=None):
        codes = (
            None
            if actions is None
            else jax.nn.one_hot(actions, dist.n)
            if dist.discrete
            else (actions.reshape(actions.shape[:2] + (-1,)).astype(jnp.float32))
        )
        return jax.vmap(critic_net, (None, 0, None if codes is None else 0, None))(
            params, obs, codes, config.activation
        )

    def env_step(state: RunnerState, _):
        key, act_key, step_key = jax.random.split(state.key, 3)
        inputs = pi(state.policy, envs.normalize_obs(state.obs_stats, state.obs))
        action, noise = dist.sample_correlated(inputs, state.noise, act_key, correlation)
        obs, env_state, reward, terminated, truncated, info = jax.vmap(env.step, (0, 0, 0, None))(
            jax.random.split(step_key, B), state.env_state, dist.clip_action(action), env_params
        )
        done = jnp.logical_or(terminated, truncated)
        transition = Transition(
            obs=state.obs,
            action=action,
            reward=reward,
            terminated=terminated,
            done=done,
            final_obs=info["final_observation"],
            inputs=inputs,
            next_inputs=inputs,
        )
        stats = envs.update_episode_stats(state.episode_stats, reward, done)
        state = state._replace(
            env_state=env_state, obs=obs, episode_stats=stats, noise=noise, key=key
        )
        return state, transition

    def init(key):
        # same on every device
        policy_key, head_key, critic_key, out_key, env_key = jax.random.split(key, 5)
        reset_key, run_key = jax.random.split(devices.device_key(env_key))
        obs, env_state = envs.reset_envs(env, env_params, reset_key, B)

        def torso(k, extra):
            return nets.torso_init(
                jax.random.split(k, len(config.hidden)),
                obs.shape[1:],
                config.hidden,
                nets.uses_conv(config.torso, obs.shape[1:]),
                extra,
            )

        policy = {
            "torso": torso(policy_key, 0),
            "head": dist.head_init(head_key, config.hidden[-1]),
        }
        # Q(s, a): the action's input
        code_dim = (dist.n if dist.discrete else dist.d) if config.q_value else 0
        critic_params = {
            "torso": torso(critic_key, code_dim),
            "out": nets.dense_init(out_key, config.hidden[-1], 1, 1),
        }
        state = RunnerState(
            policy=policy,
            critic=critic_params,
            policy_opt_state=policy_tx.init(policy),
            critic_opt_state=critic_tx.init(critic_params),
            replay=None,
            env_state=env_state,
            obs=obs,
            episode_stats=envs.init_episode_stats(B),
            noise=dist.init_noise(run_key, B),
            epoch=jnp.int32(0),
            key=run_key,
            obs_stats=envs.init_obs_stats(obs.shape[1:]) if config.normalize_obs else None,
            reward_stats=envs.init_reward_stats(B) if config.normalize_reward else None,
        )
        step = jax.eval_shape(env_step, state, None)[1]  # the Transition one step records: [B, ...]
        slots = jax.tree.map(lambda x: jnp.zeros((capacity, T) + x.shape, x.dtype), step)
        return state._replace(replay=Replay(data=slots, position=jnp.int32(0), filled=jnp.int32(0)))

    def masked_mean(x, valid):  # over the valid rows of an [N, K] array
        return jnp.sum(x * valid[:, None]) / jnp.sum(valid) / K

    def by_epoch(x):  # [N, ...] -> [capacity, T, B, ...]: each stored epoch is its own rollout
        return x.reshape((capacity, T, B) + x.shape[1:])

    def targets_of(critic_params, rows: Transition, valid, key) -> Targets:
        """What the critic `critic_params` makes of the replay `rows` `[N, ...]` (`valid` `[N]`:
        those holding data)."""
        if config.q_value:
            key, next_key = jax.random.split(key)
            # [N, K, ...], [N, K]
            actions, log_mu = sample_actions(dist, rows.inputs, key, K, enumerate_all)
            next_actions, next_log_mu = sample_actions(
                dist, rows.next_inputs, next_key, K, enumerate_all
            )
            q = critic(critic_params, rows.obs, actions)
            next_q = critic(critic_params, rows.final_obs, next_actions)
            next_values = aggregate_q(
                next_q,
                next_log_mu,
                config.q_aggregate,
                config.q_temperature,
                enumerate_all,
                q_scale(next_q, valid, config.q_normalization),
            )
            # V(s) = mean_k Q, or sum_k mu_k Q_k when enumerated (a scale would cancel)
            values = aggregate_q(q, log_mu, "mean", config.q_temperature, enumerate_all)
        else:  # the taken action, and V(s) in Q's place
            actions, log_mu = rows.action[:, None], jnp.zeros((n_rows, 1))
            values = critic(critic_params, rows.obs)

            def values_of(obs):  # [M, B, *obs_shape] -> [M, B]
                flat = obs.reshape((-1,) + obs.shape[2:])
                return critic(critic_params, flat).reshape(obs.shape[:2])

            # V(s'_t): V(s_{t+1}) from `values`, the critic only on the final observations of the
            # truncated and last steps (envs.next_values)
            def epoch_next_values(values, final_obs, truncated):  # one stored epoch's [T, B]
                limit = env_params.max_steps_in_episode
                return envs.next_values(values_of, values, final_obs, truncated, limit)

            truncated = rows.done & ~rows.terminated
            next_values = jax.vmap(epoch_next_values)(
                by_epoch(values), by_epoch(rows.final_obs), by_epoch(truncated)
            ).reshape(-1)
            q = values[:, None]
        returns = jax.vmap(td_lambda, (0, 0, 0, 0, None, None))(
            *(by_epoch(x) for x in (rows.reward, next_values, rows.terminated, rows.done)),
            config.gamma,
            config.gae_lambda,
        ).reshape(-1)
        advantages = q - values[:, None] if config.q_value else (returns - values)[:, None]
        mean = jax.lax.pmean(masked_mean(advantages, valid), devices.DEVICE_AXIS)
        var = jax.lax.pmean(masked_mean((advantages - mean) ** 2, valid), devices.DEVICE_AXIS)
        if config.normalize_advantages:
            advantages = (advantages - mean) / (jnp.sqrt(var) + 1e-8)
        weights = awr_weights(advantages, config.beta, config.w_max)
        metrics = {
            "awr/advantage_mean": mean,
            "awr/advantage_std": jnp.sqrt(var),  # before standardizing
            "awr/weight_mean": masked_mean(weights, valid),
            "awr/weight_max": jax.lax.pmax(
                jnp.max(jnp.where(valid[:, None], weights, 0.0)), devices.DEVICE_AXIS
            ),
            "awr/weight_clipped_fraction": masked_mean(
                advantages / config.beta >= jnp.log(config.w_max), valid
            ),
            **({"q/mean": masked_mean(q, valid)} if config.q_value else {}),
        }
        return Targets(
            returns=returns,
            actions=actions,
            log_mu=log_mu,
            q=q,
            advantages=advantages,
            weights=weights,
            mask=jnp.exp(log_mu) if enumerate_all else jnp.ones_like(log_mu),
            metrics=metrics,
        )

    def fit(net: str, loss_fn, tx, params, opt_state, key, n_steps: int, batch_size: int, n_valid):
        """n_steps Adam steps on batch_size rows drawn from the first n_valid, gradients averaged
        over devices."""

        def step(carry, key):
            params, opt_state = carry
            idx = jax.random.randint(key, (batch_size,), 0, n_valid)
            (_, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, idx)
            grads = jax.lax.pmean(grads, devices.DEVICE_AXIS)
            updates, opt_state = tx.update(grads, opt_state, params)
            metrics = {**aux, f"optim/{net}_grad_norm": optax.tree.norm(grads)}
            return (optax.apply_updates(params, updates), opt_state), metrics

        return jax.lax.scan(step, (params, opt_state), jax.random.split(key, n_steps))

    def before_policy_update(state: RunnerState) -> Rollout:
        def norm(obs):  # --normalize-obs off: the identity
            return envs.normalize_obs(state.obs_stats, obs)

        # COLLECT: T steps of B environments under the current policy (the behaviour policy mu).
        state = state._replace(episode_stats=envs.reset_epoch_stats(state.episode_stats))
        state, traj = jax.lax.scan(env_step, state, None, T)
        # mu(.|s'_t): the policy is fixed during the rollout, so one batched call
        if config.q_value:
            traj = traj._replace(
                next_inputs=jax.vmap(pi, (None, 0))(state.policy, norm(traj.final_obs))
            )

        # STORE: the epoch overwrites the oldest slot; minibatches draw from the first n_valid rows
        # (the rest is empty).
        reward_stats = envs.update_reward_stats(
            state.reward_stats, traj.reward, traj.done, config.gamma
        )
        state = state._replace(replay=replay_push(state.replay, traj), reward_stats=reward_stats)
        # [N, ...]
        rows = jax.tree.map(lambda x: x.reshape((n_rows,) + x.shape[3:]), state.replay.data)
        rows = rows._replace(
            obs=norm(rows.obs),
            final_obs=norm(rows.final_obs),  # rewards / the return std now
            reward=rows.reward / envs.reward_scale(reward_stats),
        )
        n_valid = state.replay.filled * layout.rollout_size
        valid = jnp.arange(n_rows) < n_valid
        key, target_key, critic_key, policy_key = jax.random.split(state.key, 4)

        # TARGETS: TD(lambda) over every stored epoch with the critic as it is now (Sampling AWR:
        # the target copy).
        targets = targets_of(state.critic, rows, valid, target_key)

        # UPDATE the critic: L2 regression of V(s_t), or Q(s_t, a_t) on the taken action, on the
        # returns.
        def critic_loss(params, idx):
            pred = critic(
                params, rows.obs[idx], rows.action[idx][:, None] if config.q_value else None
            ).reshape(-1)
            loss = jnp.mean((pred - targets.returns[idx]) ** 2)
            return loss, {"loss/value": loss}

        (critic_params, critic_opt_state), critic_metrics = fit(
            "value",
            critic_loss,
            critic_tx,
            state.critic,
            state.critic_opt_state,
            critic_key,
            value_steps,
            config.value_batch_size,
            n_valid,
        )
        # Plain AWR's policy weighs A = G - V of the critic just updated; Sampling AWR's the target
        # copy's A_k.
        return Rollout(
            state=state._replace(critic=critic_params, critic_opt_state=critic_opt_state, key=key),
            traj=traj,
            rows=rows,
            returns=targets.returns,
            critic_metrics=critic_metrics,
            policy_key=policy_key,
            targets=targets
            if config.q_value
            else targets_of(critic_params, rows, valid, target_key),
        )

    def epoch(state: RunnerState):
        r = before_policy_update(state)  # COLLECT, STORE, TARGETS, the critic's UPDATE
        state, t, n_valid = r.state, r.targets, r.state.replay.filled * layout.rollout_size

        # UPDATE the policy: weighted log-likelihood of the K actions per state.
        def batch(idx):
            return r.rows.obs[idx], t.actions[idx], t.weights[idx], t.mask[idx], t.log_mu[idx]

        (policy, policy_opt_state), policy_metrics = fit(
            "policy",
            lambda p, idx: policy_loss(p, *batch(idx), dist, config),
            policy_tx,
            state.policy,
            state.policy_opt_state,
            r.policy_key,
            config.policy_steps,
            config.policy_batch_size,
            n_valid,
        )

        # METRICS: scalar means over the update steps, the targets' statistics, the transitions
        # stored (all devices).
        metrics = {k: jnp.mean(v) for k, v in {**policy_metrics, **r.critic_metrics}.items()}
        size = (n_valid * layout.n_devices).astype(jnp.float32)
        metrics = jax.lax.pmean({**metrics, **t.metrics, "replay/size": size}, devices.DEVICE_AXIS)
        metrics.update(envs.episode_metrics(state.episode_stats, devices.DEVICE_AXIS))
        obs_stats = (
            envs.update_obs_stats(state.obs_stats, r.traj.obs) if config.normalize_obs else None
        )
        state = state._replace(
            policy=policy,
            policy_opt_state=policy_opt_state,
            obs_stats=obs_stats,
            epoch=state.epoch + 1,
        )
        return state, metrics

    def act(policy: envs.Policy, obs, key):  # greedy: no key needed
        inputs = policy_net(
            policy.params, envs.normalize_obs(policy.obs_stats, obs), dist, config.activation
        )
        return dist.clip_action(dist.mode(inputs))

    return run.Trainer(
        init=init,
        epoch=epoch,
        act=act,
        env=env,
        env_params=env_params,
        policy=lambda s: envs.Policy(params=s.policy, obs_stats=s.obs_stats),
        steps_per_epoch=layout.steps_per_epoch,
        num_epochs=layout.num_epochs,
        rollout=before_policy_update,
    )


if __name__ == "__main__":
    run.main(Config, make_trainer, "awr", __doc__.split("\n\n")[0])
