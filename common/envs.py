"""gymnax environments: construction, partial observation, episode statistics and greedy evaluation.

gymnax 1.0.1 steps return `(obs, state, reward, terminated, truncated, info)`
and reset automatically; `info["final_observation"]` is the observation
before the reset. A terminated step has no future; a truncated one (time
limit) still has one, so targets bootstrap from `V(final_observation)` (`next_values`).

Partial observation: `make_env` also builds the ids of `PARTIALLY_OBSERVED`
(CartPoleNoVel-v1: CartPole-v1 without its velocities) as `HiddenEntries`, and
`ContextWindow` turns any environment's observations into a window of its last
few (skip_transformer's input).

`--normalize-obs` (the policy-gradient scripts): `ObsStats` holds the running mean and variance of
the observations, `update_obs_stats` merges an epoch's observations into them (every device's: all
devices hold the same numbers), `normalize_obs` applies them. Reward normalization (on unless
`--no-normalize-reward`; reinforce's `--normalize-reward`): `RewardStats`, `update_reward_stats` and
`reward_scale` divide the rewards by a running standard deviation of the discounted return, kept the
same way."""

from __future__ import annotations

import difflib
import functools
import importlib.machinery
import importlib.util
import math
import os
import sys
import types
from typing import Any, Callable, NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np

from common import cli, devices, nets


# gymnax imports these to render only (its Pong, Catch, FourRooms, MetaMaze and PointRobot, at
# import): they load at their first use instead, which a run that never renders skips
RENDERING_ONLY = ("seaborn", "matplotlib", "matplotlib.pyplot", "matplotlib.colors")


class Deferred(types.ModuleType):
    """Stands in `sys.modules` for a module until its first attribute use, which imports the
    module. It carries the module's spec and, for a package, its path, so that the import system
    can find the package's submodules without loading it; a deferred package hands out its deferred
    submodules as they are (`import a.b as c` and `from a import b` read `b` as an attribute of
    `a`)."""

    def __init__(self, spec):
        super().__init__(spec.name)
        self.__spec__ = spec
        if spec.submodule_search_locations is not None:
            self.__path__ = list(spec.submodule_search_locations)

    def __getattr__(self, attr: str):
        submodule = sys.modules.get(f"{self.__name__}.{attr}")
        if isinstance(submodule, Deferred):
            return submodule
        return getattr(self._load(), attr)

    def _load(self) -> types.ModuleType:
        """Imports the module, its package first as a plain import would, and takes its
        attributes."""
        package = sys.modules.get(self.__name__.rpartition(".")[0])
        if isinstance(package, Deferred):
            package._load()
        if sys.modules.get(self.__name__) is self:
            del sys.modules[self.__name__]
        module = importlib.import_module(self.__name__)
        self.__dict__.update(vars(module))
        return module


def defer_rendering_imports() -> None:
    """Puts a `Deferred` in `sys.modules` for each of `RENDERING_ONLY` whose package is installed
    and not imported yet."""
    packages = {name.partition(".")[0] for name in RENDERING_ONLY}
    # a submodule's spec imports its package: the packages' specs first, then their submodules'
    # from their paths
    specs = {p: importlib.util.find_spec(p) for p in packages if p not in sys.modules}
    for name in RENDERING_ONLY:
        package, _, submodule = name.partition(".")
        spec = specs.get(package)
        if spec is not None and submodule:
            spec = importlib.machinery.PathFinder.find_spec(name, spec.submodule_search_locations)
        if spec is not None:
            sys.modules[name] = Deferred(spec)


@functools.cache
def make_env(env_id: str):
    """`(env, env_params)` for a registered gymnax id, one of `PARTIALLY_OBSERVED` or
    `package.module:name` (`load_custom`), or a `cli.ConfigError` listing them all, with the nearest
    as suggestions.

    Built once per id and process: the first call, outside any traced function, runs the constructor
    (some branch in Python on array values, as FourRooms-misc and MetaMaze-misc do); a script's
    `make_trainer` called again inside a program (`sweep.build`) gets the same environment."""
    return encoded(*build_env(env_id), env_id)


def build_env(env_id: str):
    """`make_env`'s environment as gymnax (or the user's module) builds it, before its observations
    are encoded."""
    if ":" in env_id:
        return load_custom(env_id)
    defer_rendering_imports()
    import gymnax

    if env_id in PARTIALLY_OBSERVED:
        base, keep = PARTIALLY_OBSERVED[env_id]
        env, env_params = gymnax.make(base)
        return HiddenEntries(env, keep), env_params
    if env_id not in gymnax.registered_envs:
        own = tuple(PARTIALLY_OBSERVED)
        known = sorted(gymnax.registered_envs) + list(own)
        close = difflib.get_close_matches(env_id, known, n=3) + [
            e for e in known if env_id.lower().split("-")[0] in e.lower()
        ]
        hint = f" Did you mean {', '.join(dict.fromkeys(close))}?" if close else ""
        raise cli.ConfigError(
            f"--env {env_id!r} is not a gymnax environment or {', '.join(own)}."
            f"{hint} Known ids: {', '.join(known)}"
        )
    try:
        return gymnax.make(env_id)
    except OSError as error:  # MNISTBandit-bsuite downloads MNIST into /tmp/mnist when it is built
        raise cli.ConfigError(
            f"--env {env_id}: gymnax could not fetch the data it builds this environment from "
            f"({describe(error)}); run where the network is reachable, or put the files it "
            f"downloads where it looks for them (MNIST: the four .gz files of the MNIST "
            f"dataset in /tmp/mnist)"
        ) from None


def load_custom(env_id: str):
    """`package.module:name`: a gymnax `Environment` class (made with no arguments, its
    `default_params`), or a function returning `(env, env_params)`; the module is looked up on the
    Python path and in the current directory. What does not fit gymnax's interface is a
    `cli.ConfigError` that says what is missing."""
    module_name, _, name = env_id.partition(":")
    cli.require(
        bool(module_name and name),
        f"--env {env_id}: give package.module:name, e.g. --env corridor:Corridor",
    )
    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    try:
        target = getattr(importlib.import_module(module_name), name, None)
    except ImportError as error:
        raise cli.ConfigError(
            f"--env {env_id}: cannot import {module_name} ({error}); give package.module:name "
            f"of a module on the Python path or in the current directory"
        ) from None
    # the module's own code failed: a syntax error, an exception at import
    except Exception as error:
        raise cli.ConfigError(
            f"--env {env_id}: importing {module_name} raised {describe(error)}; fix the module"
        ) from None
    cli.require(
        callable(target), f"--env {env_id}: {module_name} has no class or function {name!r}"
    )
    try:
        made = target()
    except Exception as error:
        raise cli.ConfigError(
            f"--env {env_id}: {name}() raised {describe(error)}; give a class that takes no "
            f"arguments, or a function of none returning (env, env_params)"
        ) from None
    env, env_params = (
        made
        if isinstance(made, tuple) and len(made) == 2
        else (made, getattr(made, "default_params", None))
    )
    missing = [
        m
        for m in ("reset", "step", "observation_space", "action_space")
        if not callable(getattr(env, m, None))
    ]
    if not hasattr(env_params, "max_steps_in_episode"):
        missing.append(
            "params.max_steps_in_episode"
            + (
                " (params must be an object with that attribute, such "
                "as gymnax's EnvParams, not a dict)"
                if isinstance(env_params, dict)
                else ""
            )
        )
    cli.require(
        not missing,
        f"--env {env_id}: {type(env).__name__} lacks {', '.join(missing)}; give a subclass of "
        f"gymnax.environments.environment.Environment (with its EnvParams), or a function "
        f"returning (env, env_params)",
    )

    def reset_and_step(key):
        _, state = env.reset(key, env_params)
        return env.step(key, state, env.action_space(env_params).sample(key), env_params)

    try:
        # traced, not compiled
        out = jax.eval_shape(reset_and_step, jax.ShapeDtypeStruct((2,), jnp.uint32))
        # a Dict or Tuple space has none
        declared = getattr(env.observation_space(env_params), "shape", None)
    except Exception as error:
        raise cli.ConfigError(
            f"--env {env_id}: reset and step of {type(env).__name__} fail when traced "
            f"({describe(error)}); gymnax's interface is reset_env(key, params) and "
            f"step_env(key, state, action, params), in JAX operations"
        ) from None
    fits = (
        isinstance(out, tuple)
        and len(out) == 6
        and isinstance(out[5], dict)
        and "final_observation" in out[5]
    )
    cli.require(
        fits,
        f"--env {env_id}: its step must return (obs, state, reward, terminated, truncated, info "
        "with final_observation), as gymnax >= 1.0's Environment.step does: subclass it and write "
        "step_env and reset_env",
    )
    if declared is not None:  # a Dict or Tuple space is refused by `encoded`
        cli.require(
            tuple(out[0].shape) == tuple(declared),
            f"--env {env_id}: step returns observations of shape {tuple(out[0].shape)}, but "
            f"observation_space declares {tuple(declared)}; make them agree",
        )
    return env, env_params


def encoded(env, env_params, env_id: str):
    """`(env, env_params)` whose observations the networks can read, chosen by the observation space
    alone: a Box as it is, a Discrete space (a state's index) one-hot (`OneHotObservations`);
    another type is refused."""
    from gymnax.environments import spaces

    space = env.observation_space(env_params)
    if isinstance(space, spaces.Discrete):
        return OneHotObservations(env, int(space.n)), env_params
    cli.require(
        isinstance(space, spaces.Box),
        f"--env {env_id}: its observation space is a {type(space).__name__}; "
        f"the scripts read Box observations (arrays) and Discrete ones "
        f"(one-hot): give an environment that observes one of those",
    )
    return env, env_params


def describe(error: Exception) -> str:
    """An exception in one line: its type and the first line of its message."""
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0]}" if text else type(error).__name__


def reset_envs(env, env_params, key: jax.Array, n: int):
    """`(obs, state)` of `n` freshly reset environments, every leaf strongly typed.

    Some gymnax resets give weak-typed leaves that `step` returns strong
    (Pendulum's `last_u`); stripping the weak type keeps a compiled epoch's
    input and output state of one type, so it never retraces.
    """
    obs, state = jax.vmap(env.reset, (0, None))(jax.random.split(key, n), env_params)
    return jax.tree.map(lambda x: jax.lax.convert_element_type(x, x.dtype), (obs, state))


# ----------------------------------------------------------------------------
# Partial-observation wrappers
# ----------------------------------------------------------------------------
# keeps x and theta, hides x_dot, theta_dot
PARTIALLY_OBSERVED = {"CartPoleNoVel-v1": ("CartPole-v1", (0, 2))}


class EncodedObservations:
    """A gymnax environment whose observations (the `info["final_observation"]` of a step too) are
    the wrapped `env`'s passed through `encode`; dynamics, keys and resets are the wrapped
    environment's. A subclass defines `encode` and the `observation_space` it gives."""

    def __init__(self, env):
        self.env = env

    def action_space(self, env_params):
        return self.env.action_space(env_params)

    def reset(self, key, env_params=None):
        obs, state = self.env.reset(key, env_params)
        return self.encode(obs), state

    def step(self, key, state, action, env_params=None):
        obs, state, reward, terminated, truncated, info = self.env.step(
            key, state, action, env_params
        )
        info = {**info, "final_observation": self.encode(info["final_observation"])}
        return self.encode(obs), state, reward, terminated, truncated, info


class OneHotObservations(EncodedObservations):
    """Observations that are a Discrete space's index (FrozenLake's cell), shown one-hot: `n`
    numbers, one of them 1, so that a network reads the state as its own input, not as one scalar
    whose size means nothing."""

    def __init__(self, env, n: int):
        super().__init__(env)
        self.n = n

    def observation_space(self, env_params):
        from gymnax.environments import spaces

        return spaces.Box(0.0, 1.0, (self.n,), jnp.float32)

    def encode(self, obs):
        return jax.nn.one_hot(obs, self.n, dtype=jnp.float32)


class HiddenEntries(EncodedObservations):
    """Observations that show only the entries `keep` of the wrapped environment's, flattened."""

    def __init__(self, env, keep: tuple[int, ...]):
        super().__init__(env)
        self.keep = tuple(keep)

    def observation_space(self, env_params):
        from gymnax.environments import spaces

        space, keep = self.env.observation_space(env_params), jnp.array(self.keep)

        def bound(b):
            return jnp.ravel(jnp.broadcast_to(b, space.shape))[keep]

        return spaces.Box(bound(space.low), bound(space.high), (len(keep),), space.dtype)

    def encode(self, obs):
        return jnp.ravel(obs)[jnp.array(self.keep)]


class WindowState(NamedTuple):
    env_state: Any  # the wrapped environment's
    window: jax.Array  # [L, F + 1]


class ContextWindow:
    """A gymnax environment observed as a window `[L, F + 1]` of its last L observations (flattened,
    F each).

    Row L - 1 is the newest observation; the last column is 1 for rows of the
    current episode, 0 for empty rows. An episode end clears the window.
    `info["final_observation"]` is the window ending with the episode's last
    observation: a truncated episode bootstraps from its own context. `observe`
    is that update, from one observation of the wrapped environment (shape
    `raw_obs_shape`); `checkpoints.load_agent` keeps windows with it for a caller's observations.
    """

    def __init__(self, env, env_params, context_len: int):
        self.env, self.context_len = env, context_len
        self.raw_obs_shape = tuple(env.observation_space(env_params).shape)
        self.obs_dim = math.prod(self.raw_obs_shape)
        self.window_shape = (context_len, self.obs_dim + 1)

    def action_space(self, env_params):
        return self.env.action_space(env_params)

    def observe(self, window, obs, first):
        """The window after `obs`: the oldest row out, `[obs, 1]` in; if `obs` starts an episode
        (`first`), the rows of the one before are cleared first."""
        row = jnp.append(jnp.ravel(obs).astype(jnp.float32), 1.0)
        return jnp.concatenate([jnp.where(first, 0.0, window)[1:], row[None]])

    def reset(self, key, env_params):
        obs, env_state = self.env.reset(key, env_params)
        window = self.observe(jnp.zeros(self.window_shape, jnp.float32), obs, True)
        return window, WindowState(env_state=env_state, window=window)

    def step(self, key, state: WindowState, action, env_params):
        obs, env_state, reward, terminated, truncated, info = self.env.step(
            key, state.env_state, action, env_params
        )
        # obs: after any reset
        window = self.observe(state.window, obs, jnp.logical_or(terminated, truncated))
        info = {
            **info,
            "final_observation": self.observe(state.window, info["final_observation"], False),
        }
        return (
            window,
            WindowState(env_state=env_state, window=window),
            reward,
            terminated,
            truncated,
            info,
        )


def next_values(values_of: Callable, values, final_obs, truncated, step_limit: int) -> jax.Array:
    """V(s'_t) `[T, B]` for each step of a rollout, s'_t the observation after step t before any
    reset (`info["final_observation"]`), with `values_of` run only on the steps that need it.

    `values` `[T, B]` holds V(s_t). Where step t did not end its episode, s'_t is s_{t+1}, whose
    value is `values[t + 1]`; after a termination the discount is 0, so `values[t + 1]` serves
    there too. That leaves the last step and the truncated ones (`truncated` `[T, B]`): `values_of`
    maps their final observations `[K, B, ...]` to `[K, B]`. gymnax truncates an episode at its
    `step_limit`-th step (`max_steps_in_episode`), so an environment's truncations are at least
    `step_limit` steps apart, and K = (T - 1) // step_limit + 2 slots hold them and the last step.
    The result equals `values_of(final_obs)` wherever the discount is not 0. An environment that
    truncates more often than its time limit allows gets NaN in place of values not computed: the
    run stops (`run.check_losses`).
    """
    chex.assert_equal_shape([values, truncated])
    n_steps, n_envs = truncated.shape
    n_slots = (n_steps - 1) // int(max(1, min(step_limit, n_steps))) + 2
    needed = truncated.at[-1].set(True)
    # [K, B]: each environment's needed steps in order; slots left over repeat its last step
    steps = jax.vmap(
        lambda column: jnp.nonzero(column, size=n_slots, fill_value=n_steps - 1)[0], out_axes=1
    )(needed.T)
    env = jnp.arange(n_envs)
    shifted = jnp.concatenate([values[1:], values[-1:]])  # V(s_{t+1}); the last row is replaced
    next_values = shifted.at[steps, env].set(values_of(final_obs[steps, env]))
    return jnp.where(needed.sum(0) > n_slots, jnp.nan, next_values)


class EpisodeStats(NamedTuple):
    """Running return/length per environment, and what finished this epoch."""

    ret: jax.Array  # [B] return of the episode in progress
    length: jax.Array  # [B]
    done_return: jax.Array  # [] sum of returns of episodes finished this epoch
    done_length: jax.Array  # []
    done_count: jax.Array  # []


def init_episode_stats(num_envs: int) -> EpisodeStats:
    z = jnp.zeros((num_envs,), jnp.float32)
    zero = jnp.float32(0)
    return EpisodeStats(
        ret=z, length=z.astype(jnp.int32), done_return=zero, done_length=zero, done_count=zero
    )


def update_episode_stats(stats: EpisodeStats, reward: jax.Array, done: jax.Array) -> EpisodeStats:
    ret, length = stats.ret + reward, stats.length + 1
    d = done.astype(jnp.float32)
    return EpisodeStats(
        ret=ret * (1 - d),
        length=length * (1 - done.astype(jnp.int32)),
        done_return=stats.done_return + jnp.sum(ret * d),
        done_length=stats.done_length + jnp.sum(length * d),
        done_count=stats.done_count + jnp.sum(d),
    )


def reset_epoch_stats(stats: EpisodeStats) -> EpisodeStats:
    zero = jnp.float32(0)
    return stats._replace(done_return=zero, done_length=zero, done_count=zero)


def episode_metrics(stats: EpisodeStats, axis_name: str) -> dict:
    """Mean return/length of the episodes finished this epoch, over all devices.

    NaN when no episode finished.
    """
    total = jax.lax.psum(
        jnp.stack([stats.done_return, stats.done_length, stats.done_count]), axis_name
    )
    return {
        "episode/return": total[0] / total[2],
        "episode/length": total[1] / total[2],
        "episode/count": total[2],
    }


class ObsStats(NamedTuple):
    """Running mean and variance of the observations, element by element (`--normalize-obs`)."""

    mean: jax.Array  # [*obs_shape]
    var: jax.Array  # [*obs_shape]
    count: jax.Array  # [] observations seen, on every device together


class Policy(NamedTuple):
    """What a script's `act` reads: the policy's parameters and, with --normalize-obs, the
    statistics its network normalizes observations with (None: raw observations)."""

    params: Any
    obs_stats: ObsStats | None = None


def init_obs_stats(obs_shape) -> ObsStats:
    """Nothing seen yet: mean 0, variance 1, so the first epoch sees its observations as they are
    (clipped)."""
    return ObsStats(
        mean=jnp.zeros(obs_shape, jnp.float32),
        var=jnp.ones(obs_shape, jnp.float32),
        count=jnp.float32(0),
    )


def update_obs_stats(
    stats: ObsStats | None, obs: jax.Array, axis_name: str = devices.DEVICE_AXIS
) -> ObsStats | None:
    """`stats` merged with a batch `obs` `[..., *obs_shape]` of every device (Chan et al.'s parallel
    update); None when `stats` is None (`--normalize-obs` off).

    Call inside `devices.map_epoch`: the batch's mean and variance are those of
    every device's batch together (`lax.pmean`; every device holds a batch of the
    same size), so each device ends with the same statistics; each seed keeps its own.
    """
    if stats is None:
        return None
    x = obs.reshape((-1,) + stats.mean.shape).astype(jnp.float32)
    mean = jax.lax.pmean(jnp.mean(x, 0), axis_name)
    var = jax.lax.pmean(jnp.mean((x - mean) ** 2, 0), axis_name)
    n = jax.lax.psum(jnp.float32(x.shape[0]), axis_name)
    total = stats.count + n
    delta = mean - stats.mean
    m2 = stats.var * stats.count + var * n + delta**2 * stats.count * n / total
    return ObsStats(mean=stats.mean + delta * n / total, var=m2 / total, count=total)


def starts_with_conv(env_id: str, torso: nets.Torso) -> bool:
    """Whether the network for `env_id` starts with the convolution (`nets.uses_conv` on its
    observation space): what the defaults that differ for image observations read."""
    env, env_params = make_env(env_id)
    return nets.uses_conv(torso, tuple(env.observation_space(env_params).shape))


def normalizes_obs(env_id: str, torso: nets.Torso) -> bool:
    """What `--normalize-obs` left unset means: on where the actions are discrete and dense layers
    read the observations, unless the observation space already holds every feature in [0, 1] (the
    bsuite grids, one-hot states); off for Box actions and for images read by the convolution
    (`nets.uses_conv`). docs/environments.md says why each case is what it is."""
    from gymnax.environments import spaces

    env, env_params = make_env(env_id)
    space = env.observation_space(env_params)
    unit = bool(np.all(np.asarray(space.low) >= 0) and np.all(np.asarray(space.high) <= 1))
    discrete = isinstance(env.action_space(env_params), spaces.Discrete)
    return discrete and not starts_with_conv(env_id, torso) and not unit


def normalize_obs(stats: ObsStats | None, obs: jax.Array) -> jax.Array:
    """`(obs - mean) / sqrt(var + 1e-8)` clipped to [-10, 10], as is customary; `obs` itself when
    `stats` is None (`--normalize-obs` off: nothing is added to the program). `obs` is `[...,
    *obs_shape]`."""
    if stats is None:
        return obs
    return jnp.clip(
        (obs.astype(jnp.float32) - stats.mean) / jnp.sqrt(stats.var + 1e-8), -10.0, 10.0
    )


def normalize_window(stats: ObsStats | None, window: jax.Array) -> jax.Array:
    """Windows `[..., L, F + 1]` (`ContextWindow`) with their observation columns normalized
    (`normalize_obs`, statistics `[F]`), empty rows kept at 0 and the last column as it is; `window`
    itself when `stats` is None."""
    if stats is None:
        return window
    obs, in_episode = window[..., :-1], window[..., -1:]
    return jnp.concatenate([normalize_obs(stats, obs) * in_episode, in_episode], -1)


class RewardStats(NamedTuple):
    """`--normalize-reward`: each environment's discounted return so far, and the running variance
    of those returns (`ObsStats` of shape []), whose standard deviation divides the rewards the
    learner sees."""

    returns: jax.Array  # [B] the discounted return of each environment's episode so far
    stats: ObsStats  # of every step's returns, every device's


def init_reward_stats(n_envs: int) -> RewardStats:
    return RewardStats(returns=jnp.zeros(n_envs, jnp.float32), stats=init_obs_stats(()))


def update_reward_stats(
    stats: RewardStats | None, rewards: jax.Array, dones: jax.Array, gamma
) -> RewardStats | None:
    """`stats` with a rollout's discounted returns G_t = r_t + gamma G_{t-1} (0 before an episode)
    merged in, from its time-major rewards and ends `[T, B]` (every device's: call inside
    `devices.map_epoch`); None when `stats` is None (normalization off)."""
    if stats is None:
        return None

    def step(ret, x):
        reward, done = x
        ret = gamma * ret + reward
        return jnp.where(done, 0.0, ret), ret

    last, returns = jax.lax.scan(step, stats.returns, (rewards, dones))
    return RewardStats(returns=last, stats=update_obs_stats(stats.stats, returns))


def reward_scale(stats: RewardStats | None):
    """What the learner's rewards are divided by: the discounted return's standard deviation where
    it is above 1, else 1 (1 when `stats` is None). The episode metrics keep the raw rewards.

    Rewards are only ever shrunk: a task whose returns are already of order 1 (bsuite's) learns as
    it would without, and a rare reward after a long run of small ones (DeepSea's cost of moving,
    then its treasure) is not blown up."""
    return 1.0 if stats is None else jnp.maximum(jnp.sqrt(stats.stats.var), 1.0)


def evaluate(env, env_params, act: Callable, params, key: jax.Array, n_episodes: int) -> jax.Array:
    """Mean return of `n_episodes` episodes, each run to its first end.

    `act(params, obs, key)` maps ONE observation to one action; the episodes
    run side by side, until every one has ended or the environment's time limit.
    """
    reset_key, run_key = jax.random.split(key)
    obs, state = jax.vmap(env.reset, (0, None))(jax.random.split(reset_key, n_episodes), env_params)
    limit = int(env_params.max_steps_in_episode)
    keys = jax.random.split(run_key, limit)  # step t's key, the same whenever the loop stops

    def running(carry):
        t, _, _, _, alive = carry
        return (t < limit) & jnp.any(alive > 0)

    def step(carry):
        t, obs, state, ret, alive = carry
        act_key, step_key = jax.random.split(keys[t])
        action = jax.vmap(act, (None, 0, 0))(params, obs, jax.random.split(act_key, n_episodes))
        obs, state, reward, terminated, truncated, _ = jax.vmap(env.step, (0, 0, 0, None))(
            jax.random.split(step_key, n_episodes), state, action, env_params
        )
        ret = ret + reward * alive
        alive = alive * (1 - jnp.logical_or(terminated, truncated).astype(jnp.float32))
        return t + 1, obs, state, ret, alive

    carry = (jnp.int32(0), obs, state, jnp.zeros(n_episodes), jnp.ones(n_episodes))
    _, _, _, ret, _ = jax.lax.while_loop(running, step, carry)
    return jnp.mean(ret)
