"""A causal Transformer policy trained with PPO and LayerDrop (layer skipping).

Trax's `SkippingTransformerLM` + `SkippingSerial` (Fan et al. 2019, "Reducing Transformer Depth on
Demand with Structured Dropout", arXiv:1909.11556) as an actor-critic: pre-norm Transformer blocks
read the last `--context-len` observations of each environment; policy and value heads read the
newest position. Each gradient step runs a random number of blocks (common/skipping.py; one depth
for every device and seed, so skipped blocks really do not run), and a shallower net still acts at
inference: the run ends with the greedy return at every depth. Trained with the PPO joint loss; one
epoch -- vectorized gymnax rollout, GAE, PPO updates -- is one compiled function. CartPoleNoVel-v1
(the default) hides the velocities.

    python algos/skip_transformer.py                            # CartPoleNoVel-v1
    python algos/skip_transformer.py --env MemoryChain-bsuite --skip-fraction 0.5

docs/algorithms/skip_transformer.md has the math, the flags that matter and the results.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
from pathlib import Path
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax

from common import checkpoints, cli, devices, envs, outputs, run, skipping, sweep
from common.distributions import make_distribution, noise_correlation
from common.metrics import residual_metrics


@dataclasses.dataclass(frozen=True)
class Config(cli.TrainConfig):
    # Float flags are inputs of the compiled programs: traced numbers, so runs that differ only in
    # them share their programs. Compute with them (jnp.where); a Python `if` on one is refused.
    # Constants instead: a SWITCHES flag at 0 (its term left out) and the STATIC_FLOATS.
    SWITCHES = ("max_grad_norm",)  # 0: no clipping (a program without it)
    # one depth drawn for every run of the program (skipping.first_copy)
    STATIC_FLOATS = ("skip_fraction",)
    # cli.TrainConfig holds num_envs, num_steps, gamma, anneal_lr and max_grad_norm
    env: str = "CartPoleNoVel-v1"
    """gymnax environment id, or CartPoleNoVel-v1: CartPole-v1 with its velocities hidden"""
    total_steps: int = 200_000
    """environment steps to train for (per seed)"""
    update_passes: int = 4
    """passes over each rollout"""
    num_minibatches: int = 4
    """minibatches per pass (must divide the per-device batch num_envs / n_devices * num_steps)"""
    lr: float = 2e-3
    """Adam learning rate"""
    gae_lambda: float = 0.95
    """lambda of GAE"""
    normalize_advantages: bool = False
    """standardize advantages per minibatch"""
    clip_eps: float = 0.2
    """PPO ratio clip epsilon"""
    vf_coef: float = 0.1
    """value loss coefficient c_v"""
    ent_coef: float = 0.0
    """entropy bonus coefficient c_ent"""
    context_len: int = 8
    """observations the Transformer sees: the newest and up to context_len - 1 before it (same
    episode)"""
    d_model: int = 16
    """width of the Transformer"""
    n_heads: int = 2
    """attention heads (must divide d_model)"""
    d_ff: int = 32
    """hidden width of each block's MLP"""
    n_layers: int = 2
    """Transformer blocks (the layers that can be skipped)"""
    skip_fraction: float = 0.4
    """LayerDrop: after warmup block i runs with probability 1 - i * skip_fraction / n_layers (0:
    never skip)"""
    skip_warmup_steps: int = 1000
    """gradient steps over which skipping ramps up from none to skip_fraction"""
    eval_depth: int = 0
    """blocks run by the greedy evaluation (depth pruning; 0: all)"""
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
    """normalize observations by their running mean and variance, feature by feature (kept in the
    runner state, merged over devices, per seed, saved in checkpoints), clipped to +-10; empty
    window rows stay 0"""
    normalize_reward: bool = True
    """divide the learner's rewards by a running std of the discounted return where above 1 (kept
    like --normalize-obs): value targets of order 1 whatever the reward scale (false: raw
    rewards)"""

    def __post_init__(self):
        super().__post_init__()
        for name in (
            "update_passes",
            "num_minibatches",
            "context_len",
            "d_model",
            "n_heads",
            "d_ff",
            "n_layers",
        ):
            cli.require(getattr(self, name) >= 1, f"--{name.replace('_', '-')} must be at least 1")
        cli.require(self.lr > 0, f"--lr {self.lr}: use a positive learning rate")
        cli.require(
            0 <= self.gae_lambda <= 1, f"--gae-lambda {self.gae_lambda}: use a value in [0, 1]"
        )
        cli.require(
            self.clip_eps > 0, f"--clip-eps {self.clip_eps}: use a positive value, e.g. 0.2"
        )
        cli.require_non_negative(self, "vf_coef", "ent_coef", "noise_memory", "box_coef")
        cli.require(
            self.d_model % self.n_heads == 0,
            f"--d-model {self.d_model} is not divisible by --n-heads {self.n_heads}; use a "
            "multiple",
        )
        cli.require(
            0 <= self.skip_fraction < 1,
            f"--skip-fraction {self.skip_fraction}: use a value in [0, 1)",
        )
        cli.require(
            self.skip_warmup_steps >= 0,
            f"--skip-warmup-steps {self.skip_warmup_steps}: use 0 or more",
        )
        cli.require(
            0 <= self.eval_depth <= self.n_layers,
            f"--eval-depth {self.eval_depth}: use 1 to --n-layers {self.n_layers}, or 0 for all",
        )


# ----------------------------------------------------------------------------
# Network: plain functions over a parameter pytree (observations: envs.ContextWindow's windows)
# ----------------------------------------------------------------------------
def scaled_normal_init(key, n_in: int, n_out: int, scale: float) -> dict:
    """A dense layer: normal weights of std scale / sqrt(n_in) (not `nets.dense_init`'s orthogonal
    ones), zero bias."""
    w = jax.random.normal(key, (n_in, n_out), jnp.float32) * scale / np.sqrt(n_in)
    return {"w": w, "b": jnp.zeros((n_out,), jnp.float32)}


def init_network(key, obs_dim: int, config: Config, dist) -> dict:
    d, keys = config.d_model, jax.random.split(key, 4 + 4 * config.n_layers)
    out_scale = 1.0 / np.sqrt(2 * config.n_layers)  # residual branches start small
    dense = scaled_normal_init

    def norm_init(d):
        return {"scale": jnp.ones((d,), jnp.float32), "bias": jnp.zeros((d,), jnp.float32)}

    def block(k):
        return {
            "norm1": norm_init(d),
            "qkv": dense(k[0], d, 3 * d, 1.0),
            "out": dense(k[1], d, d, out_scale),
            "norm2": norm_init(d),
            "mlp1": dense(k[2], d, config.d_ff, np.sqrt(2)),
            "mlp2": dense(k[3], config.d_ff, d, out_scale),
        }

    return {
        "embed": dense(keys[0], obs_dim, d, 1.0),
        "position": 0.1 * jax.random.normal(keys[1], (config.context_len, d), jnp.float32),
        "blocks": [block(keys[4 + 4 * i : 8 + 4 * i]) for i in range(config.n_layers)],
        "norm": norm_init(d),
        "policy": dist.head_init(keys[2], d),
        "value": dense(keys[3], d, 1, 1.0),
    }


def layer_norm(p: dict, x: jax.Array) -> jax.Array:
    mean, var = jnp.mean(x, -1, keepdims=True), jnp.var(x, -1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + 1e-5) * p["scale"] + p["bias"]


def attention(p: dict, x: jax.Array, mask: jax.Array, n_heads: int) -> jax.Array:
    """Multi-head self-attention: `[N, L, D]`, `mask [N, L(query), L(key)]` -> `[N, L, D]`."""
    n, length, d = x.shape
    qkv = (x @ p["qkv"]["w"] + p["qkv"]["b"]).reshape(n, length, 3, n_heads, d // n_heads)
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]  # [N, L, H, D/H]
    scores = jnp.einsum("nqhd,nkhd->nhqk", q, k) / np.sqrt(d // n_heads)
    weights = jax.nn.softmax(jnp.where(mask[:, None], scores, -1e9), axis=-1)
    out = jnp.einsum("nhqk,nkhd->nqhd", weights, v).reshape(n, length, d)
    return out @ p["out"]["w"] + p["out"]["b"]


def block(p: dict, x: jax.Array, mask: jax.Array, n_heads: int) -> jax.Array:
    """Pre-norm Transformer block: x + attention(norm(x)), then x + MLP(norm(x))."""
    x = x + attention(p, layer_norm(p["norm1"], x), mask, n_heads)
    h = jax.nn.gelu(layer_norm(p["norm2"], x) @ p["mlp1"]["w"] + p["mlp1"]["b"])
    return x + h @ p["mlp2"]["w"] + p["mlp2"]["b"]


def torso(
    params: dict,
    windows: jax.Array,
    config: Config,
    mode: skipping.Mode = "eval",
    step=0,
    rng=None,
    eval_depth=None,
):
    """Windows `[N, L, F + 1]` -> (features `[N, L, D]`; position q attends to k <= q of its
    episode, step + 1)."""
    chex.assert_rank(windows, 3)
    obs, valid = windows[..., :-1], windows[..., -1] > 0
    length = windows.shape[1]
    causal = jnp.tril(jnp.ones((length, length), bool))
    mask = causal & (valid[:, None, :] | jnp.eye(length, dtype=bool))  # [N, L(query), L(key)]
    x = obs @ params["embed"]["w"] + params["embed"]["b"] + params["position"]

    def layer(p, x):
        return block(p, x, mask, config.n_heads)

    return skipping.skipping_serial(
        [layer] * len(params["blocks"]),
        params["blocks"],
        x,
        step,
        rng,
        mode,
        config.skip_fraction,
        config.skip_warmup_steps,
        eval_depth,
    )


def network(
    params: dict,
    windows: jax.Array,
    dist,
    config: Config,
    mode: skipping.Mode = "eval",
    step=0,
    rng=None,
    eval_depth=None,
):
    """Windows `[N, L, F + 1]` -> (distribution inputs `[N, n_inputs]`, values `[N]`, step + 1)."""
    x, step = torso(params, windows, config, mode, step, rng, eval_depth)
    newest = layer_norm(params["norm"], x[:, -1])
    value = newest @ params["value"]["w"] + params["value"]["b"]
    return dist.policy_head(params["policy"], newest), value[:, 0], step


def greedy_action(policy: envs.Policy, window: jax.Array, dist, config: Config, eval_depth=None):
    """The policy's mode on ONE window `[L, F + 1]`, normalized by `policy.obs_stats`, running
    `eval_depth` blocks."""
    window = envs.normalize_window(policy.obs_stats, window)
    inputs = network(policy.params, window[None], dist, config, "eval", eval_depth=eval_depth)[0][0]
    return dist.clip_action(dist.mode(inputs))


# ----------------------------------------------------------------------------
# Records
# ----------------------------------------------------------------------------
class RunnerState(NamedTuple):
    params: dict
    opt_state: optax.OptState
    env_state: envs.WindowState  # [B] environments of this device, each with its context window
    obs: jax.Array  # [B, L, F + 1] context windows
    episode_stats: envs.EpisodeStats
    obs_stats: envs.ObsStats | None  # --normalize-obs: statistics of the observations (None: off)
    # the discounted returns' statistics; --no-normalize-reward: None
    reward_stats: envs.RewardStats | None
    noise: jax.Array  # [B, action dims] each environment's exploration noise (Box actions)
    skip_step: jax.Array  # [] gradient steps so far: drives the skip warmup
    epoch: jax.Array  # [] epochs done: the run's progress is epoch / num_epochs
    depth_key: jax.Array  # the same on every device; seed 0's draws serve every seed
    key: jax.Array  # differs per device


class Transition(NamedTuple):  # the windows, what the policy did, what the environment answered
    obs: jax.Array  # window at s_t
    final_obs: jax.Array  # window at s_{t+1} before any reset (bootstraps truncated episodes)
    action: jax.Array  # a_t ~ pi_old(. | s_t)
    log_prob: jax.Array  # log pi_old(a_t | s_t)
    # mode of pi_old(. | s_t): policy/preferred_move is its mean (discrete actions)
    greedy_action: jax.Array
    value: jax.Array  # V(s_t)
    reward: jax.Array
    terminated: jax.Array  # no future: discount_t = 0
    done: jax.Array  # terminated or truncated: the GAE trace stops


# an epoch before its update: the state after T steps and what the update trains on
class Rollout(NamedTuple):
    state: RunnerState
    traj: Transition  # [T, B, ...] as collected (raw windows)
    advantages: jax.Array  # [T, B]
    targets: jax.Array  # [T, B] R = A + V_old


class Batch(NamedTuple):
    obs: jax.Array  # windows as the network saw them (normalized with --normalize-obs)
    action: jax.Array
    log_prob: jax.Array
    advantage: jax.Array
    target: jax.Array  # R = A + V_old


# ----------------------------------------------------------------------------
# Pure math
# ----------------------------------------------------------------------------
def gae(rewards, values, next_values, terminated, dones, gamma: float, lam: float):
    """GAE over time-major `[T, B]` arrays, as algos/ppo_joint.py; returns `(advantages, targets)`.

    delta_t = r_t + gamma * (1 - terminated_t) * V(s'_t) - V(s_t) with s'_t before any reset;
    A_t = delta_t + gamma * lam * (1 - done_t) * A_{t+1}."""
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


def ppo_loss(params, batch: Batch, step, rng, dist, config: Config):
    """Clipped surrogate + c_v * value L2 - c_ent * entropy + c_box * mean outside the box, on a
    random depth; aux (metrics, step + 1)."""
    chex.assert_rank(batch.obs, 3)
    inputs, values, step = network(params, batch.obs, dist, config, "train", step, rng)
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
    outside_box = jnp.mean(dist.outside_box(inputs))
    loss = (
        policy_loss
        + config.vf_coef * value_loss
        - config.ent_coef * entropy
        + config.box_coef * outside_box
    )
    return loss, (
        {
            "loss/joint": loss,
            "loss/policy": policy_loss,
            "loss/value": value_loss,
            "policy/entropy": entropy,
            "policy/log_prob_mean": jnp.mean(log_prob),
            "policy/outside_box": outside_box,
            "ppo/approx_kl": jnp.mean((ratio - 1) - log_ratio),  # k3 estimator of KL(old || new)
            "ppo/clip_fraction": jnp.mean(jnp.abs(ratio - 1) > config.clip_eps),
        },
        step,
    )


# ----------------------------------------------------------------------------
# Training
# ----------------------------------------------------------------------------
def make_trainer(config: Config) -> run.Trainer:
    layout = devices.layout(config)
    cli.require(
        layout.rollout_size % config.num_minibatches == 0,
        f"--num-minibatches {config.num_minibatches} does not divide the per-device batch "
        f"{layout.envs_per_device} envs x {config.num_steps} steps = {layout.rollout_size}",
    )
    env, env_params = envs.make_env(config.env)
    limit = env_params.max_steps_in_episode
    cli.require(
        config.context_len <= limit,
        f"--context-len {config.context_len} is longer than an episode of "
        f"{config.env} ({limit} steps); use at most {limit}",
    )
    env = envs.ContextWindow(env, env_params, config.context_len)
    dist = make_distribution(env.action_space(env_params))
    correlation = noise_correlation(config.noise_memory, limit)
    n_updates = layout.num_epochs * config.update_passes * config.num_minibatches
    lr = optax.linear_schedule(config.lr, 0.0, n_updates) if config.anneal_lr else config.lr
    clip = (
        optax.identity()
        if cli.off(config.max_grad_norm)
        else optax.clip_by_global_norm(config.max_grad_norm)
    )
    tx = optax.chain(clip, optax.adam(lr, eps=1e-5))

    def flat(x):  # [T, B, ...] -> [T*B, ...]
        return x.reshape((layout.rollout_size,) + x.shape[2:])

    def init(key) -> RunnerState:
        param_key, depth_key, env_key = jax.random.split(key, 3)  # same on every device
        params = init_network(param_key, env.obs_dim, config, dist)
        reset_key, run_key = jax.random.split(devices.device_key(env_key))
        n_envs = layout.envs_per_device
        obs, env_state = envs.reset_envs(env, env_params, reset_key, n_envs)
        return RunnerState(
            params=params,
            opt_state=tx.init(params),
            env_state=env_state,
            obs=obs,
            episode_stats=envs.init_episode_stats(n_envs),
            obs_stats=envs.init_obs_stats((env.obs_dim,)) if config.normalize_obs else None,
            reward_stats=envs.init_reward_stats(n_envs) if config.normalize_reward else None,
            noise=dist.init_noise(run_key, n_envs),
            skip_step=jnp.int32(0),
            depth_key=depth_key,
            epoch=jnp.int32(0),
            key=run_key,
        )

    def rollout(state: RunnerState) -> Rollout:
        # statistics of earlier epochs (None: as is)
        norm = functools.partial(envs.normalize_window, state.obs_stats)

        # COLLECT: T steps of B environments; every block runs (as Trax's collect mode).
        def env_step(state: RunnerState, _):
            key, act_key, step_key = jax.random.split(state.key, 3)
            inputs, value, _ = network(state.params, norm(state.obs), dist, config)
            action, noise = dist.sample_correlated(inputs, state.noise, act_key, correlation)
            obs, env_state, reward, terminated, truncated, info = jax.vmap(
                env.step, (0, 0, 0, None)
            )(
                jax.random.split(step_key, layout.envs_per_device),
                state.env_state,
                dist.clip_action(action),
                env_params,
            )
            done = jnp.logical_or(terminated, truncated)
            transition = Transition(
                obs=state.obs,
                final_obs=info["final_observation"],
                action=action,
                log_prob=dist.log_prob(inputs, action),
                greedy_action=dist.mode(inputs),
                value=value,
                reward=reward,
                terminated=terminated,
                done=done,
            )
            stats = envs.update_episode_stats(state.episode_stats, reward, done)
            state = state._replace(
                env_state=env_state, obs=obs, episode_stats=stats, noise=noise, key=key
            )
            return state, transition

        state = state._replace(episode_stats=envs.reset_epoch_stats(state.episode_stats))
        state, traj = jax.lax.scan(env_step, state, None, config.num_steps)  # [T, B, ...]

        # ADVANTAGES: GAE on rewards / their return std, truncations bootstrapping from the final
        # window.
        def values_of(windows):  # [N, B, ...] -> [N, B]
            rows = windows.reshape((-1,) + windows.shape[2:])
            return network(state.params, norm(rows), dist, config)[1].reshape(windows.shape[:2])

        truncated = traj.done & ~traj.terminated
        next_values = envs.next_values(values_of, traj.value, traj.final_obs, truncated, limit)
        state = state._replace(
            reward_stats=envs.update_reward_stats(
                state.reward_stats, traj.reward, traj.done, config.gamma
            )
        )
        advantages, targets = gae(
            traj.reward / envs.reward_scale(state.reward_stats),
            traj.value,
            next_values,
            traj.terminated,
            traj.done,
            config.gamma,
            config.gae_lambda,
        )
        return Rollout(state=state, traj=traj, advantages=advantages, targets=targets)

    def epoch(state: RunnerState):
        collected = rollout(state)
        state, traj, targets = collected.state, collected.traj, collected.targets
        batch = jax.tree.map(
            flat,
            Batch(
                obs=envs.normalize_window(state.obs_stats, traj.obs),
                action=traj.action,
                log_prob=traj.log_prob,
                advantage=collected.advantages,
                target=targets,
            ),
        )

        # UPDATE: update_passes passes of num_minibatches Adam steps, each running ONE random depth
        # drawn from depth_key: the same key on every device, and the first seed's draw serves every
        # seed (skipping.first_copy), so the lax.cond predicate is unbatched and skipped blocks do
        # not run. Gradients averaged over devices.
        def update_step(carry, minibatch: Batch):
            params, opt_state, step = carry
            rng = jax.random.fold_in(state.depth_key, step)
            grads, (metrics, next_step) = jax.grad(ppo_loss, has_aux=True)(
                params, minibatch, step, rng, dist, config
            )
            grads = jax.lax.pmean(grads, devices.DEVICE_AXIS)
            updates, opt_state = tx.update(grads, opt_state, params)
            metrics["optim/grad_norm"] = optax.tree.norm(grads)
            n_forward = skipping.n_forward_layers(
                step, rng, config.n_layers, "train", config.skip_fraction, config.skip_warmup_steps
            )
            metrics["skip/layers_run"] = skipping.layers_run(n_forward, config.n_layers).astype(
                jnp.float32
            )
            return (optax.apply_updates(params, updates), opt_state, next_step), metrics

        def update_pass(carry, key):
            order = jax.random.permutation(key, layout.rollout_size)
            minibatches = jax.tree.map(
                lambda x: x[order].reshape((config.num_minibatches, -1) + x.shape[1:]), batch
            )
            return jax.lax.scan(update_step, carry, minibatches)

        key, perm_key = jax.random.split(state.key)
        learner = (state.params, state.opt_state, state.skip_step)
        (params, opt_state, skip_step), losses = jax.lax.scan(
            update_pass, learner, jax.random.split(perm_key, config.update_passes)
        )

        # METRICS: scalar means, identical on every device.
        metrics = {k: jnp.mean(v) for k, v in losses.items()}
        # the mean greedy action (discrete actions)
        metrics["policy/preferred_move"] = jnp.mean(traj.greedy_action)
        metrics["skip/warmup"] = skipping.warmup_factor(skip_step, config.skip_warmup_steps)
        metrics = jax.lax.pmean(metrics, devices.DEVICE_AXIS)
        # R - V over every device's batch
        metrics.update(residual_metrics(targets - traj.value, targets))
        metrics.update(envs.episode_metrics(state.episode_stats, devices.DEVICE_AXIS))
        # --normalize-obs: this epoch's observations (each window's newest), every device's, join
        # the statistics
        obs_stats = envs.update_obs_stats(state.obs_stats, traj.obs[:, :, -1, :-1])
        state = state._replace(
            params=params,
            opt_state=opt_state,
            obs_stats=obs_stats,
            skip_step=skip_step,
            epoch=state.epoch + 1,
            key=key,
        )
        return state, metrics

    def act(policy: envs.Policy, obs, key):
        del key  # greedy
        return greedy_action(policy, obs, dist, config, config.eval_depth or None)

    return run.Trainer(
        init=init,
        epoch=epoch,
        act=act,
        policy=lambda state: envs.Policy(params=state.params, obs_stats=state.obs_stats),
        env=env,
        env_params=env_params,
        steps_per_epoch=layout.steps_per_epoch,
        num_epochs=layout.num_epochs,
        rollout=rollout,
    )


# ----------------------------------------------------------------------------
# Greedy return against depth, after training
# ----------------------------------------------------------------------------
def evaluate_depths(config: Config, run_dir: Path) -> dict:
    """Greedy return of the run's last checkpoint running the first 1, 2, ..., n_layers blocks.

    The program and episodes of run.train's final evaluation, one per depth (full depth: the same
    numbers)."""
    _, n_devices, seed = devices.init_host_and_devices(config.n_devices or None, config.seed)
    _, eval_key = sweep.run_keys(sweep.seed_input(seed), config, n_devices)  # as run.train's
    # the checkpoint holds every host's devices, as run.train splits the run
    n_devices *= jax.process_count()
    trainer, policy, epoch = checkpoints.load_policy(run_dir, config, make_trainer, n_devices)
    key = jax.random.fold_in(eval_key, epoch)
    dist = make_distribution(trainer.env.action_space(trainer.env_params))
    returns = {}
    for depth in range(1, config.n_layers + 1):

        def act(p, obs, key, depth=depth):
            return greedy_action(p, obs, dist, config, depth)

        seeds = jax.vmap(
            lambda p, k: envs.evaluate(
                trainer.env, trainer.env_params, act, p, k, config.eval_episodes
            )
        )
        fn = jax.jit(lambda policy, key: seeds(policy, sweep.eval_keys(key, config)))
        returns[str(depth)] = np.asarray(fn(policy, key))  # compiled as run.train's evaluation is
    return {
        "eval_return_by_depth": {d: float(r.mean()) for d, r in returns.items()},
        "eval_return_by_depth_per_seed": {d: r.tolist() for d, r in returns.items()},
    }


def main(argv=None) -> dict:
    """run.main, plus the greedy return at every depth (printed, and added to summary.json)."""
    config = cli.parse_config(Config, argv, __doc__.split("\n\n")[0])
    per_epoch = config.update_passes * config.num_minibatches
    grad_steps = config.total_steps // (config.num_envs * config.num_steps) * per_epoch
    unskipped = skipping.steps_without_skipping(config.n_layers, config.skip_warmup_steps)
    if config.skip_fraction and grad_steps <= unskipped:  # the same run for every --skip-fraction
        print(
            f"warning: --skip-fraction {config.skip_fraction} changes nothing in this run: its "
            f"{grad_steps} gradient steps all come before step {unskipped} (--skip-warmup-steps / "
            "--n-layers), and until then the warmup runs every block; train for at least "
            f"{(unskipped // per_epoch + 1) * config.num_envs * config.num_steps:,} environment "
            "steps, or lower --skip-warmup-steps",
            file=sys.stderr,
        )
    run_dir, summary = run.launch(config, make_trainer, "skip_transformer")
    # several hosts: the chief evaluates the depths (programs of one device)
    if jax.process_index() != 0:
        return summary
    summary.update(evaluate_depths(config, run_dir))
    print(
        "greedy return by depth (blocks run): "
        + ", ".join(f"{d}: {r:.2f}" for d, r in summary["eval_return_by_depth"].items()),
        flush=True,
    )
    if not config.eval_only and (run_dir / "summary.json").exists():
        outputs.write_json(run_dir / "summary.json", summary, run_dir)
    return summary


if __name__ == "__main__":
    main()
