"""DQN value agent: a Q network trained on n-step targets from a replay buffer.

Trax's `ValueAgent` / `DQN` (Mnih et al. 2015, "Human-level control through
deep reinforcement learning", Nature 518; double DQN: van Hasselt et al. 2016,
arXiv:1509.06461). One epoch -- epsilon-greedy collection in vectorized gymnax
environments, storing the rollout in a ring buffer, and gradient steps on
batches sampled from it, with periodic target-network syncs -- is one compiled
function; Python only loops over epochs.

    python algos/dqn_value.py                    # CartPole-v1
    python algos/dqn_value.py --env Acrobot-v1

docs/algorithms/dqn_value.md has the math, the flags that matter and the results.

n-step targets are formed when a batch is sampled, not at collection: the
replay keeps each environment's steps in time order, across epochs, so a
window can run on past the end of the rollout it started in. A window stops at
the first episode end (terminated: no bootstrap; truncated: bootstrap from the
final observation) and at the newest stored step. A row's next observation is
not stored twice: it is the next row's, the newest row's is kept beside the
ring, and only an episode cut by its time limit keeps its final observation,
in a ring of a few slots per environment (one per time limit the ring spans).
"""

from __future__ import annotations

import dataclasses
from typing import Literal, NamedTuple

import chex
import jax
import jax.numpy as jnp
import optax

from common import cli, devices, envs, nets, run


@dataclasses.dataclass(frozen=True)
class Config(cli.TrainConfig):
    # Float flags are inputs of the compiled programs: traced numbers, so runs that differ only in
    # them share their programs. Compute with them (jnp.where); a Python `if` on one is refused.
    # Constants instead: a SWITCHES flag at 0 (its term left out) and the STATIC_FLOATS.
    SWITCHES = ("max_grad_norm",)  # 0: no clipping (a program without it)
    STATIC_FLOATS = ()
    # cli.TrainConfig holds num_envs, num_steps, gamma, anneal_lr and max_grad_norm; three of them
    # and three run flags take other defaults here
    num_envs: int = 10
    num_steps: int = 10
    max_grad_norm: float = 1.0
    total_steps: int = 150_000
    eval_every: int = 250
    """greedy evaluation every this many epochs (0: only at the end): 25k steps at the defaults"""
    checkpoint_every: int = 250
    update_steps: int | None = None
    """gradient steps per epoch, each on --batch-size transitions sampled from the replay (unset:
    50; 10 where the network starts with the convolution, on image observations, whose gradient
    steps cost five times the dense torso's; docs/decisions.md says why)"""
    batch_size: int = 100
    """transitions per gradient step, all devices together (split over devices)"""
    n_replay_epochs: int = 500
    """replay buffer: the transitions of the last this many epochs (a ring buffer)"""
    lr: float = 3e-4
    """Adam learning rate"""
    n_step: int | None = None
    """n of the n-step targets: sum_{k<n} gamma^k r_{t+k} + gamma^n max_a Q_target(s_{t+n}, a), cut
    at episode ends (unset: 3; 1 where the network starts with the convolution, on image
    observations; docs/decisions.md says why)"""
    sync_freq: int = 500
    """copy the online network into the target network every this many gradient steps"""
    double_dqn: bool = False
    """bootstrap with Q_target(s', argmax_a Q_online(s', a)) instead of max_a Q_target(s', a)"""
    loss: Literal["huber", "l2"] = "huber"
    """huber: Huber(Q - y) with delta 1; l2: (Q - y)^2"""
    scale_value_targets: bool = False
    """train the network on targets times (1 - gamma); Q = its outputs / (1 - gamma)"""
    eps_start: float = 1.0
    """exploration: epsilon(epoch) = max(eps_min, eps_start * eps_decay ** epoch)"""
    eps_decay: float = 0.99
    """per-epoch decay factor of epsilon"""
    eps_min: float = 0.1
    """lowest epsilon"""
    torso: nets.Torso = "auto"
    """the network's first layers: conv, one 3x3 convolution of 16 channels before the dense layers
    (image observations [H, W, C]); mlp, dense layers on the flattened observation; auto: conv for
    images, else mlp"""
    hidden: tuple[int, ...] = (128, 128)
    """body layer widths"""
    activation: nets.Activation = "relu"
    """body activation"""

    def __post_init__(self):
        super().__post_init__()
        for name in ("update_steps", "batch_size", "n_replay_epochs"):
            value = getattr(self, name)
            cli.require(
                value is None or value >= 1, f"--{name.replace('_', '-')} must be at least 1"
            )
        cli.require(
            self.n_step is None or self.n_step >= 1,
            f"--n-step {self.n_step}: use 1 (one-step targets) or more",
        )
        cli.require(
            self.sync_freq >= 1,
            f"--sync-freq {self.sync_freq}: use 1 (sync after every gradient step) or more",
        )
        held = self.capacity * self.num_envs  # transitions of a full replay, all devices together
        cli.require(
            held >= self.batch_size,
            f"--n-replay-epochs {self.n_replay_epochs}: the replay holds {held} transitions "
            f"({self.n_replay_epochs} epochs x {self.num_envs} envs x {self.num_steps} steps), "
            f"fewer than --batch-size {self.batch_size}; keep more epochs or use a smaller batch",
        )
        cli.require(
            self.n_step is None or self.n_step <= self.capacity,
            f"--n-step {self.n_step} is longer than the replay's {self.capacity} "
            f"steps per environment; use a smaller --n-step or more --n-replay-epochs",
        )
        cli.require(self.lr > 0, f"--lr {self.lr}: use a positive learning rate")
        cli.require(
            self.gamma < 1 or not self.scale_value_targets,
            "--scale-value-targets divides by 1 - gamma: use --gamma below 1",
        )
        for name in ("eps_start", "eps_min"):
            value = getattr(self, name)
            cli.require(
                0 <= value <= 1, f"--{name.replace('_', '-')} {value}: use a value in [0, 1]"
            )
        cli.require(0 < self.eps_decay <= 1, f"--eps-decay {self.eps_decay}: use a value in (0, 1]")
        cli.require(
            len(self.hidden) >= 1 and min(self.hidden) >= 1, "--hidden needs positive widths"
        )

    def resolved(self) -> Config:
        """--update-steps and --n-step unset: from the network's first layers (the observation
        space)."""
        conv = envs.starts_with_conv(self.env, self.torso)
        config = self
        if config.update_steps is None:
            config = dataclasses.replace(config, update_steps=10 if conv else 50)
        if config.n_step is None:
            config = dataclasses.replace(config, n_step=1 if conv else 3)
        return config

    @property
    def capacity(self) -> int:
        """Rows of the replay's ring buffer: each environment's steps of the last n_replay_epochs
        epochs."""
        return self.n_replay_epochs * self.num_steps


# ----------------------------------------------------------------------------
# Network: plain functions over a parameter pytree
# ----------------------------------------------------------------------------
def init_network(key, obs_shape: tuple, hidden: tuple, n_actions: int, conv: bool = False) -> dict:
    keys = jax.random.split(key, len(hidden) + 1)
    return {
        "torso": nets.torso_init(keys[:-1], obs_shape, hidden, conv),
        "value": nets.dense_init(keys[-1], hidden[-1], n_actions, 1.0),  # one per action
    }


def network(params: dict, obs: jax.Array, activation: nets.Activation) -> jax.Array:
    """One observation -> the network's outputs, one per action `[A]` (Q = outputs * scale)."""
    x = nets.torso(params["torso"], obs, activation)
    return x @ params["value"]["w"] + params["value"]["b"]


# ----------------------------------------------------------------------------
# Records
# ----------------------------------------------------------------------------
class Transition(NamedTuple):
    """One step of the rollout."""

    obs: jax.Array  # s_t
    action: jax.Array
    reward: jax.Array
    terminated: jax.Array  # no future: no bootstrap
    done: jax.Array  # terminated or truncated: an n-step window stops here
    final_obs: jax.Array  # s_{t+1} before any reset (bootstraps truncated episodes)


class Row(NamedTuple):
    """One step as the replay keeps it: s_{t+1} is the next row's obs, or
    `Replay.final[final_slot]`."""

    obs: jax.Array
    action: jax.Array
    reward: jax.Array
    terminated: jax.Array
    done: jax.Array
    # truncated (and not terminated): its final observation's slot in Replay.final; else -1
    final_slot: jax.Array


class Replay(NamedTuple):
    """A ring of Config.capacity rows; each environment's column holds its steps in time order,
    across epochs.

    An episode lasts at most max_steps_in_episode steps (gymnax truncates at the time limit), so the
    rows hold at most capacity // max_steps + 1 truncations per environment: `final` has that many
    slots."""

    data: Row  # [capacity, B, ...]
    next_obs: jax.Array  # [B, *obs_shape] s_{t+1} of the newest row (after any reset)
    # [n_final, B, *obs_shape] final observations of truncated episodes, a ring per environment
    final: jax.Array
    # [B] truncations stored so far: the next one goes to slot n_truncated % n_final
    n_truncated: jax.Array
    position: jax.Array  # [] the next row to write
    filled: jax.Array  # [] rows holding data (at most capacity)


class Batch(NamedTuple):
    obs: jax.Array  # s_t
    action: jax.Array  # a_t
    returns: jax.Array  # G = sum_{k<m} gamma^k r_{t+k}, m <= n the window's length
    discount: jax.Array  # gamma^m, or 0 if the window ends in a termination
    boot_obs: jax.Array  # s'_{t+m-1}: the observation the target bootstraps from


class NStep(NamedTuple):
    """The parts of the n-step targets of `[N]` windows: y = returns + discount *
    Q_target(s'_{t+last})."""

    returns: jax.Array  # [N] G = sum_{k<m} gamma^k r_{t+k}
    discount: jax.Array  # [N] gamma^m (1 - terminated_{t+m-1})
    last: jax.Array  # [N] m - 1: the window's last step


class RunnerState(NamedTuple):
    params: dict
    target_params: dict  # copied from params every sync_freq gradient steps
    opt_state: optax.OptState
    env_state: chex.ArrayTree  # [B] environments of this device
    obs: jax.Array  # [B, *obs_shape]
    replay: Replay
    episode_stats: envs.EpisodeStats
    epoch: jax.Array  # [] epochs done: drives epsilon; the run's progress is epoch / num_epochs
    step: jax.Array  # [] gradient steps done (drives the target sync)
    key: jax.Array  # differs per device


# ----------------------------------------------------------------------------
# Pure math
# ----------------------------------------------------------------------------
def epsilon_schedule(epoch, eps_start: float, eps_decay: float, eps_min: float):
    """epsilon(epoch) = max(eps_min, eps_start * eps_decay ** epoch) (Trax's multifactor
    schedule)."""
    return jnp.maximum(eps_min, eps_start * eps_decay ** jnp.asarray(epoch, jnp.float32))


def n_step_return(rewards, terminated, cut, gamma: float) -> NStep:
    """n-step discounted rewards of `[N, n]` windows of steps t, t+1, ..., t+n-1.

    A window stops at its first `cut` (an episode end, or the newest stored step)
    or after n steps; m = its length. s'_{t+m-1} is the observation before any
    reset: a truncated episode bootstraps from its final observation, a terminated one not at all.
    """
    chex.assert_rank([rewards, terminated, cut], 2)
    chex.assert_equal_shape([rewards, terminated, cut])
    k = jnp.arange(rewards.shape[1])
    last = jnp.argmax(jnp.logical_or(cut, k == k[-1]), axis=1)  # the first cut, or the window's end
    inside = (k[None, :] <= last[:, None]).astype(jnp.float32)
    returns = jnp.sum(gamma**k * rewards * inside, axis=1)
    ended = jnp.take_along_axis(terminated, last[:, None], axis=1)[:, 0]
    discount = gamma ** (last + 1.0) * (1.0 - ended.astype(jnp.float32))
    return NStep(returns=returns, discount=discount, last=last)


def bootstrap_value(q_target, q_online, double: bool):
    """max_a Q_target(s', a); double DQN: Q_target(s', argmax_a Q_online(s', a)). `[N, A] ->
    [N]`."""
    chex.assert_rank([q_target, q_online], 2)
    chex.assert_equal_shape([q_target, q_online])
    best = jnp.argmax(q_online if double else q_target, axis=-1)
    return jnp.take_along_axis(q_target, best[:, None], axis=-1)[:, 0]


def td_loss(q, targets, kind: str):
    """mean Huber(q - y) (delta 1: 0.5 x^2 for |x| <= 1, |x| - 0.5 beyond) or mean (q - y)^2."""
    chex.assert_rank([q, targets], 1)
    chex.assert_equal_shape([q, targets])
    error = q - targets
    return jnp.mean({"huber": optax.huber_loss(error, delta=1.0), "l2": error**2}[kind])


def dqn_loss(params, target_params, batch: Batch, config: Config):
    """TD loss of Q(s_t, a_t) against y = G + discount * Q_target(s', a*), and its diagnostics.

    No gradient flows through y. With --scale-value-targets the network emits
    Q * (1 - gamma), and the loss compares those outputs with y * (1 - gamma).
    """
    scale = 1.0 / (1.0 - config.gamma) if config.scale_value_targets else 1.0
    q_values = jax.vmap(lambda p, obs: scale * network(p, obs, config.activation), (None, 0))
    q_next = q_values(target_params, batch.boot_obs)
    q_online = q_values(params, batch.boot_obs) if config.double_dqn else q_next
    targets = jax.lax.stop_gradient(
        batch.returns + batch.discount * bootstrap_value(q_next, q_online, config.double_dqn)
    )
    q = jnp.take_along_axis(q_values(params, batch.obs), batch.action[:, None], axis=-1)[:, 0]
    loss = td_loss(q / scale, targets / scale, config.loss)
    return loss, {"loss/value": loss, "q/mean": jnp.mean(q), "q/target_mean": jnp.mean(targets)}


def init_replay(capacity: int, n_final: int, obs: jax.Array) -> Replay:
    """An empty replay for the environments' first observations `obs` `[B, *obs_shape]`."""

    def zeros(shape, dtype):
        return jnp.zeros((capacity,) + shape, dtype)

    n_envs = obs.shape[0]
    data = Row(
        obs=zeros(obs.shape, obs.dtype),
        action=zeros((n_envs,), jnp.int32),
        reward=zeros((n_envs,), jnp.float32),
        terminated=zeros((n_envs,), jnp.bool_),
        done=zeros((n_envs,), jnp.bool_),
        final_slot=zeros((n_envs,), jnp.int32),
    )
    zero = jnp.int32(0)
    return Replay(
        data=data,
        next_obs=obs,
        final=jnp.zeros((n_final,) + obs.shape, obs.dtype),
        n_truncated=jnp.zeros((n_envs,), jnp.int32),
        position=zero,
        filled=zero,
    )


def replay_push(replay: Replay, rollout: Transition, next_obs: jax.Array) -> Replay:
    """`replay` with a `[T, B, ...]` rollout written at its position (capacity a multiple of T,
    position of T); `next_obs` `[B, ...]` follows its last step. Truncated steps' final observations
    go to their slots."""
    chex.assert_rank([replay.data.reward, rollout.reward], 2)
    capacity = replay.data.reward.shape[0]
    n_rows = rollout.reward.shape[0]
    n_final = replay.final.shape[0]
    truncated = rollout.done & ~rollout.terminated  # [T, B]
    # truncations before each step
    count = replay.n_truncated + jnp.cumsum(truncated, axis=0) - truncated
    slot = jnp.where(truncated, count % n_final, -1)
    rows = Row(
        obs=rollout.obs,
        action=rollout.action,
        reward=rollout.reward,
        terminated=rollout.terminated,
        done=rollout.done,
        final_slot=slot,
    )
    data = jax.tree.map(
        lambda buf, x: jax.lax.dynamic_update_slice_in_dim(buf, x, replay.position, axis=0),
        replay.data,
        rows,
    )
    env = jnp.broadcast_to(jnp.arange(slot.shape[1]), slot.shape)
    final = replay.final.at[jnp.where(truncated, slot, n_final), env].set(
        rollout.final_obs, mode="drop"
    )
    return Replay(
        data=data,
        next_obs=next_obs,
        final=final,
        n_truncated=replay.n_truncated + truncated.sum(0),
        position=(replay.position + n_rows) % capacity,
        filled=jnp.minimum(replay.filled + n_rows, capacity),
    )


def sample_batch(replay: Replay, key, n_samples: int, n_step: int, gamma: float) -> Batch:
    """`n_samples` transitions drawn uniformly from the filled rows, with their n-step targets'
    parts.

    Each environment's column of the ring holds its steps in time order, so a
    window runs on from the sampled row (wrapping around the ring) until an
    episode end or the newest row `position - 1`, after which come older or empty rows.
    """
    data = replay.data
    chex.assert_rank([data.reward, data.done, data.terminated], 2)
    capacity, n_envs = data.reward.shape
    row_key, env_key = jax.random.split(key)
    start = jax.random.randint(row_key, (n_samples,), 0, replay.filled)
    env = jax.random.randint(env_key, (n_samples,), 0, n_envs)
    rows = (start[:, None] + jnp.arange(n_step)) % capacity  # [N, n]

    def window(x):  # [capacity, B] -> [N, n]
        return x[rows, env[:, None]]

    newest = (replay.position - 1) % capacity
    cut = window(data.done) | (rows == newest)
    parts = n_step_return(window(data.reward), window(data.terminated), cut, gamma)
    boot_row = jnp.take_along_axis(rows, parts.last[:, None], axis=1)[:, 0]
    # s'_{t+m-1}: a truncated row's final observation, the newest row's successor, or the next row's
    # obs (after a termination it is the reset's, and the discount 0 leaves it out)
    slot, after = data.final_slot[boot_row, env], (boot_row + 1) % capacity

    def expand(c):  # [N] -> [N, 1, ...]
        return c.reshape(c.shape + (1,) * (data.obs.ndim - 2))

    boot_obs = jnp.where(
        expand(slot >= 0),
        replay.final[jnp.maximum(slot, 0), env],
        jnp.where(expand(boot_row == newest), replay.next_obs[env], data.obs[after, env]),
    )
    return Batch(
        obs=data.obs[start, env],
        action=data.action[start, env],
        returns=parts.returns,
        discount=parts.discount,
        boot_obs=boot_obs,
    )


# ----------------------------------------------------------------------------
# Training
# ----------------------------------------------------------------------------
def make_trainer(config: Config) -> run.Trainer:
    from gymnax.environments import spaces

    config = config.resolved()
    layout = devices.layout(config)
    cli.require(
        config.batch_size % layout.n_devices == 0,
        f"--batch-size {config.batch_size} is not divisible by "
        f"--n-devices {layout.n_devices}; use a multiple of {layout.n_devices}",
    )
    envs_per_device = layout.envs_per_device
    batch_per_device = config.batch_size // layout.n_devices
    env, env_params = envs.make_env(config.env)
    space = env.action_space(env_params)
    if not isinstance(space, spaces.Discrete):
        raise cli.ConfigError(
            f"--env {config.env}: DQN needs discrete actions (one Q output per action), and its "
            f"action space is {type(space).__name__}; use an environment with Discrete actions"
        )
    n_actions = int(space.n)
    obs_shape = tuple(env.observation_space(env_params).shape)
    conv = nets.uses_conv(config.torso, obs_shape)
    # truncations the ring can hold (Replay)
    n_final = config.capacity // int(env_params.max_steps_in_episode) + 1
    n_updates = layout.num_epochs * config.update_steps
    lr = optax.linear_schedule(config.lr, 0.0, n_updates) if config.anneal_lr else config.lr
    clip = (
        optax.identity()
        if cli.off(config.max_grad_norm)
        else optax.clip_by_global_norm(config.max_grad_norm)
    )
    # one flat vector for the optimiser: a few large kernels per step instead of a few per layer
    tx = optax.flatten(optax.chain(clip, optax.adam(lr)))
    q_values = jax.vmap(network, (None, 0, None))
    step_envs = jax.vmap(env.step, (0, 0, 0, None))

    def init(key) -> RunnerState:
        param_key, env_key = jax.random.split(key)  # same on every device
        params = init_network(param_key, obs_shape, config.hidden, n_actions, conv)
        reset_key, run_key = jax.random.split(devices.device_key(env_key))
        obs, env_state = envs.reset_envs(env, env_params, reset_key, envs_per_device)
        zero = jnp.int32(0)
        return RunnerState(
            params=params,
            target_params=params,
            opt_state=tx.init(params),
            env_state=env_state,
            obs=obs,
            replay=init_replay(config.capacity, n_final, obs),
            episode_stats=envs.init_episode_stats(envs_per_device),
            epoch=zero,
            step=zero,
            key=run_key,
        )

    def epoch(state: RunnerState):
        # COLLECT: T epsilon-greedy steps of B environments.
        epsilon = epsilon_schedule(state.epoch, config.eps_start, config.eps_decay, config.eps_min)

        def env_step(state: RunnerState, _):
            key, explore_key, random_key, step_key = jax.random.split(state.key, 4)
            greedy = jnp.argmax(q_values(state.params, state.obs, config.activation), axis=-1)
            explore = jax.random.uniform(explore_key, (envs_per_device,)) < epsilon
            action = jnp.where(
                explore, jax.random.randint(random_key, (envs_per_device,), 0, n_actions), greedy
            )
            obs, env_state, reward, terminated, truncated, info = step_envs(
                jax.random.split(step_key, envs_per_device), state.env_state, action, env_params
            )
            done = jnp.logical_or(terminated, truncated)
            transition = Transition(
                obs=state.obs,
                action=action.astype(jnp.int32),
                reward=reward.astype(jnp.float32),
                terminated=terminated,
                done=done,
                final_obs=info["final_observation"],
            )
            episode_stats = envs.update_episode_stats(state.episode_stats, reward, done)
            state = state._replace(
                env_state=env_state, obs=obs, episode_stats=episode_stats, key=key
            )
            return state, transition

        state = state._replace(episode_stats=envs.reset_epoch_stats(state.episode_stats))
        state, traj = jax.lax.scan(env_step, state, None, config.num_steps)  # [T, B, ...]

        # STORE: the rollout overwrites the oldest epoch's rows of the ring buffer.
        state = state._replace(replay=replay_push(state.replay, traj, state.obs))

        # TARGETS: every update step's batch is drawn at once (the draws do not depend
        # on the parameters); y = G + gamma^m * Q_target(s'_{t+m-1}, a*) is completed
        # in the step, with the target network of that step.
        key, sample_key = jax.random.split(state.key)
        batches = sample_batch(
            state.replay,
            sample_key,
            config.update_steps * batch_per_device,
            config.n_step,
            config.gamma,
        )
        # [U * N, ...] -> [U, N, ...]
        batches = jax.tree.map(
            lambda x: x.reshape((config.update_steps, batch_per_device) + x.shape[1:]), batches
        )

        # UPDATE: gradient steps on the sampled batches; gradients averaged over devices.
        def update_step(state: RunnerState, batch: Batch):
            params, target_params = state.params, state.target_params
            grads, metrics = jax.grad(dqn_loss, has_aux=True)(params, target_params, batch, config)
            grads = jax.lax.pmean(grads, devices.DEVICE_AXIS)
            updates, opt_state = tx.update(grads, state.opt_state, params)
            params, step = optax.apply_updates(params, updates), state.step + 1
            # SYNC: the target network takes the online weights every sync_freq gradient steps.
            target_params = jax.tree.map(
                lambda t, p: jnp.where(step % config.sync_freq == 0, p, t), target_params, params
            )
            metrics["optim/grad_norm"] = optax.tree.norm(grads)
            state = state._replace(
                params=params, target_params=target_params, opt_state=opt_state, step=step
            )
            return state, metrics

        state, losses = jax.lax.scan(update_step, state, batches)

        # METRICS: scalar means, identical on every device.
        metrics = {k: jnp.mean(v) for k, v in losses.items()}
        metrics["policy/epsilon"] = epsilon
        metrics = jax.lax.pmean(metrics, devices.DEVICE_AXIS)
        metrics["replay/size"] = jax.lax.psum(
            state.replay.filled * envs_per_device, devices.DEVICE_AXIS
        ).astype(jnp.float32)
        metrics.update(envs.episode_metrics(state.episode_stats, devices.DEVICE_AXIS))
        return state._replace(epoch=state.epoch + 1, key=key), metrics

    def act(policy: envs.Policy, obs, key):
        del key  # greedy (temperature 0)
        return jnp.argmax(network(policy.params, obs, config.activation))

    return run.Trainer(
        init=init,
        epoch=epoch,
        act=act,
        policy=lambda s: envs.Policy(params=s.params),
        env=env,
        env_params=env_params,
        steps_per_epoch=layout.steps_per_epoch,
        num_epochs=layout.num_epochs,
    )


if __name__ == "__main__":
    run.main(Config, make_trainer, "dqn_value", __doc__.split("\n\n")[0])
