"""REINFORCE: the policy gradient weighted by discounted returns, with an optional mean baseline.

Trax's `PolicyGradientTrainer` (Williams 1992, "Simple Statistical
Gradient-Following Algorithms for Connectionist Reinforcement Learning").
The loss is -mean((G_t - b) log pi(a_t | s_t)), with G_t the discounted return
to the episode's end within the rollout and b = 0, or with `--baseline` the
mean return of the epoch's rollout. One epoch -- a vectorized gymnax rollout,
the returns and the Adam steps -- is one compiled function.

    python algos/reinforce.py --baseline                          # CartPole-v1
    python algos/reinforce.py --baseline --num-envs 4 --batch-size 1024 --num-seeds 4

docs/algorithms/reinforce.md has the math, the flags that matter and the results.
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
    num_steps: int = 512
    """steps per environment per epoch (rollout length T); returns stop at its end"""
    batch_size: int = 2048
    """transitions per Adam step, all devices (at most num_envs * num_steps)"""
    update_steps: int = 2
    """Adam steps per epoch, each on a fresh random batch of this epoch's rollout"""
    lr: float = 3e-3
    """Adam learning rate"""
    baseline: bool = False
    """subtract the mean return of the epoch's rollout (all devices) from every return"""
    torso: nets.Torso = "auto"
    """the network's first layers: conv, one 3x3 convolution of 16 channels before the dense layers
    (image observations [H, W, C]); mlp, dense layers on the flattened observation; auto: conv for
    images, else mlp"""
    hidden: tuple[int, ...] = (64, 64)
    """hidden layer widths"""
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
    normalize_obs: bool = False
    """normalize observations by their running mean and variance (kept in the runner state, merged
    over devices, per seed, saved in checkpoints), clipped to +-10"""
    normalize_reward: bool = False
    """divide the rewards the returns are summed from by a running std of the discounted return
    where above 1 (kept like --normalize-obs)"""

    def __post_init__(self):
        super().__post_init__()
        for name in ("batch_size", "update_steps"):
            cli.require(getattr(self, name) >= 1, f"--{name.replace('_', '-')} must be at least 1")
        cli.require(self.lr > 0, f"--lr {self.lr}: use a positive learning rate")
        cli.require(
            len(self.hidden) >= 1 and min(self.hidden) >= 1, "--hidden needs positive widths"
        )
        cli.require_non_negative(self, "noise_memory", "box_coef")


# ----------------------------------------------------------------------------
# Network: a plain function over a parameter pytree
# ----------------------------------------------------------------------------
def init_network(key, obs_shape: tuple, hidden: tuple, dist, conv: bool = False) -> dict:
    keys = jax.random.split(key, len(hidden) + 1)
    return {
        "torso": nets.torso_init(keys[:-1], obs_shape, hidden, conv),
        "head": dist.head_init(keys[-1], hidden[-1]),
    }


def network(params: dict, obs: jax.Array, dist, activation: nets.Activation) -> jax.Array:
    """One observation -> distribution inputs [n_inputs]."""
    return dist.policy_head(params["head"], nets.torso(params["torso"], obs, activation))


# ----------------------------------------------------------------------------
# Records
# ----------------------------------------------------------------------------
class RunnerState(NamedTuple):
    params: dict
    opt_state: optax.OptState
    env_state: chex.ArrayTree  # [B] environments of this device
    obs: jax.Array  # [B, *obs_shape]
    episode_stats: envs.EpisodeStats
    # --normalize-obs: what the network normalizes with; None (no arrays) off
    obs_stats: envs.ObsStats | None
    # --normalize-reward: the discounted returns' statistics; off: None
    reward_stats: envs.RewardStats | None
    noise: jax.Array  # [B, action dims] each environment's exploration noise (Box actions)
    epoch: jax.Array  # [] epochs done: the run's progress is epoch / num_epochs
    key: jax.Array  # differs per device


class Transition(NamedTuple):
    obs: jax.Array  # s_t, raw
    action: jax.Array
    reward: jax.Array
    done: jax.Array  # terminated or truncated: the return stops
    log_prob: jax.Array  # log pi_old(a_t | s_t)
    greedy_action: jax.Array  # mode of pi_old(. | s_t), for policy/preferred_move


class Rollout(NamedTuple):
    """An epoch before its update: the state after T steps (its obs_stats: what the network saw)
    and what the update trains on."""

    state: RunnerState
    traj: Transition  # [T, B, ...] as collected (raw observations)
    weights: jax.Array  # [T, B] G_t - b
    return_mean: jax.Array  # [] mean G_t of every device's rollout


class Batch(NamedTuple):
    obs: jax.Array  # s_t as the network saw it
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

    _, returns = jax.lax.scan(
        backward, jnp.zeros_like(rewards[0]), (rewards, discount), reverse=True
    )
    return returns


def returns_weights(returns, baseline: bool):
    """`(G - b, mean G)`: b = mean G over this epoch's rollout on every device with `baseline`, else
    0."""
    chex.assert_rank(returns, 2)
    return_mean = jax.lax.pmean(jnp.mean(returns), devices.DEVICE_AXIS)
    return (returns - return_mean if baseline else returns), return_mean


def reinforce_loss(params, batch: Batch, dist, config: Config):
    """-mean((G - b) log pi(a | s)) + c_box * the mean outside the box, and its diagnostics."""
    chex.assert_rank(batch.weight, 1)
    inputs = jax.vmap(network, (None, 0, None, None))(params, batch.obs, dist, config.activation)
    log_prob = dist.log_prob(inputs, batch.action)
    loss = -jnp.mean(batch.weight * log_prob)
    outside_box = jnp.mean(dist.outside_box(inputs))
    log_ratio = log_prob - batch.log_prob
    return loss + config.box_coef * outside_box, {
        "loss/policy": loss,
        "policy/outside_box": outside_box,
        "policy/entropy": jnp.mean(dist.entropy(inputs)),
        "policy/log_prob_mean": jnp.mean(log_prob),
        # k3 estimator of KL(old || new): nonzero only from the second Adam step of an epoch on
        "reinforce/approx_kl": jnp.mean((jnp.exp(log_ratio) - 1) - log_ratio),
    }


# ----------------------------------------------------------------------------
# Training
# ----------------------------------------------------------------------------
def make_trainer(config: Config) -> run.Trainer:
    layout = devices.layout(config)
    cli.require(
        config.batch_size % layout.n_devices == 0 and config.batch_size <= layout.steps_per_epoch,
        f"--batch-size {config.batch_size}: use a multiple of --n-devices {layout.n_devices} of at "
        f"most {config.num_envs} envs x {config.num_steps} steps = {layout.steps_per_epoch}",
    )
    envs_per_device = layout.envs_per_device
    batch_per_device = config.batch_size // layout.n_devices
    env, env_params = envs.make_env(config.env)
    dist = make_distribution(env.action_space(env_params), config.std)
    correlation = noise_correlation(config.noise_memory, env_params.max_steps_in_episode)
    obs_shape = tuple(env.observation_space(env_params).shape)
    conv = nets.uses_conv(config.torso, obs_shape)
    n_updates = layout.num_epochs * config.update_steps
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
        obs, env_state = envs.reset_envs(env, env_params, reset_key, envs_per_device)
        return RunnerState(
            params=params,
            opt_state=tx.init(params),
            env_state=env_state,
            obs=obs,
            episode_stats=envs.init_episode_stats(envs_per_device),
            obs_stats=envs.init_obs_stats(obs.shape[1:]) if config.normalize_obs else None,
            reward_stats=envs.init_reward_stats(envs_per_device)
            if config.normalize_reward
            else None,
            noise=dist.init_noise(run_key, envs_per_device),
            epoch=jnp.int32(0),
            key=run_key,
        )

    def rollout(state: RunnerState) -> Rollout:
        # COLLECT: T steps of B environments under the current policy (--normalize-obs: the network
        # sees observations normalized with the statistics of earlier epochs; off, normalize_obs is
        # the identity).
        def env_step(state: RunnerState, _):
            key, act_key, step_key = jax.random.split(state.key, 3)
            inputs = net(
                state.params,
                envs.normalize_obs(state.obs_stats, state.obs),
                dist,
                config.activation,
            )
            action, noise = dist.sample_correlated(inputs, state.noise, act_key, correlation)
            obs, env_state, reward, terminated, truncated, _ = step_envs(
                jax.random.split(step_key, envs_per_device),
                state.env_state,
                dist.clip_action(action),
                env_params,
            )
            done = jnp.logical_or(terminated, truncated)
            transition = Transition(
                obs=state.obs,
                action=action,
                reward=reward,
                done=done,
                log_prob=dist.log_prob(inputs, action),
                greedy_action=dist.mode(inputs),
            )
            episode_stats = envs.update_episode_stats(state.episode_stats, reward, done)
            state = state._replace(
                env_state=env_state, obs=obs, episode_stats=episode_stats, noise=noise, key=key
            )
            return state, transition

        state = state._replace(episode_stats=envs.reset_epoch_stats(state.episode_stats))
        state, traj = jax.lax.scan(env_step, state, None, config.num_steps)  # [T, B, ...]

        # TARGETS: returns to the episode's end in the rollout (of rewards / --normalize-reward),
        # minus the baseline.
        state = state._replace(
            reward_stats=envs.update_reward_stats(
                state.reward_stats, traj.reward, traj.done, config.gamma
            )
        )
        returns = discounted_returns(
            traj.reward / envs.reward_scale(state.reward_stats), traj.done, config.gamma
        )
        weights, return_mean = returns_weights(returns, config.baseline)
        return Rollout(state=state, traj=traj, weights=weights, return_mean=return_mean)

    def epoch(state: RunnerState):
        # COLLECT, TARGETS: `rollout` above.
        collected = rollout(state)
        state, traj = collected.state, collected.traj

        # UPDATE: update_steps Adam steps on random batches of the rollout; gradients averaged over
        # devices.
        def flat(x):  # [T, B, ...] -> [T*B, ...]
            return x.reshape((layout.rollout_size,) + x.shape[2:])

        batch = jax.tree.map(
            flat,
            Batch(
                obs=envs.normalize_obs(state.obs_stats, traj.obs),
                action=traj.action,
                log_prob=traj.log_prob,
                weight=collected.weights,
            ),
        )

        def update_step(state: RunnerState, key):
            rows = jax.random.permutation(key, layout.rollout_size)[:batch_per_device]
            minibatch = jax.tree.map(lambda x: x[rows], batch)
            grads, metrics = jax.grad(reinforce_loss, has_aux=True)(
                state.params, minibatch, dist, config
            )
            grads = jax.lax.pmean(grads, devices.DEVICE_AXIS)
            updates, opt_state = tx.update(grads, state.opt_state, state.params)
            metrics["optim/grad_norm"] = optax.tree.norm(grads)
            state = state._replace(
                params=optax.apply_updates(state.params, updates), opt_state=opt_state
            )
            return state, metrics

        key, step_key = jax.random.split(state.key)
        state, losses = jax.lax.scan(
            update_step, state, jax.random.split(step_key, config.update_steps)
        )

        # METRICS: scalar means, identical on every device. policy/preferred_move is the mean greedy
        # action of a discrete policy: the mean index of its most probable action over the rollout
        # (Box: of its mean action).
        metrics = {k: jnp.mean(v) for k, v in losses.items()}
        metrics.update(
            {
                "reinforce/return_mean": collected.return_mean,
                "policy/preferred_move": jnp.mean(traj.greedy_action),
            }
        )
        metrics = jax.lax.pmean(metrics, devices.DEVICE_AXIS)
        metrics.update(envs.episode_metrics(state.episode_stats, devices.DEVICE_AXIS))
        # this epoch's observations, every device's, join the statistics (--normalize-obs off: None
        # stays None)
        state = state._replace(
            obs_stats=envs.update_obs_stats(state.obs_stats, traj.obs),
            epoch=state.epoch + 1,
            key=key,
        )
        return state, metrics

    def act(policy: envs.Policy, obs, key):
        del key  # greedy
        inputs = network(
            policy.params, envs.normalize_obs(policy.obs_stats, obs), dist, config.activation
        )
        return dist.clip_action(dist.mode(inputs))

    return run.Trainer(
        init=init,
        epoch=epoch,
        rollout=rollout,
        act=act,
        policy=lambda s: envs.Policy(params=s.params, obs_stats=s.obs_stats),
        env=env,
        env_params=env_params,
        steps_per_epoch=layout.steps_per_epoch,
        num_epochs=layout.num_epochs,
    )


if __name__ == "__main__":
    run.main(Config, make_trainer, "reinforce", __doc__.split("\n\n")[0])
