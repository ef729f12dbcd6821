"""Policy distributions built from a gymnax action space (Trax `create_distribution`).

A distribution here is a small object of pure functions over *inputs*: the
array a network emits for it (`n_inputs` numbers per state).

- `Discrete(n)` -> categorical over `n` logits.
- `Box(shape)` -> diagonal Gaussian over `prod(shape)` dimensions. Its inputs
  are the means followed by the log standard deviations (`n_inputs = 2 * d`).
  With `std="param"` (default, as in Trax) the log std is one learned vector,
  not a function of the state: `policy_head` appends it to the means. With
  `std="network"` the network emits it.

Actions are sampled unclipped (log-probs use the sample itself); `clip_action`
maps them into the box only when they are sent to the environment.

Exploration noise that lasts (`sample_correlated`): a rollout keeps each
environment's Gaussian noise `eps` from one step to the next as an AR(1)
process, `eps_t = c eps_{t-1} + sqrt(1 - c^2) z_t` with `z_t ~ N(0, I)`. Every
`eps_t` is still N(0, I), so each action has the policy's own distribution (its
log-prob, and every loss, are unchanged), but one environment's successive
actions lean the same way for about `-1 / log c` steps: a push long enough to
move a system that white noise only jitters. `noise_correlation` sets `c` from
the scripts' `--noise-memory`, a fraction of the episode's step limit.

The mean held in the box (`outside_box`): once a Gaussian's mean is past a
bound of the action box, the clipped action no longer moves with it, and the
policy gradient, taken on the unclipped sample, lets it drift on. A script's
policy loss adds `--box-coef` times `outside_box`, the squared distance of the
mean outside the box in half-widths of the box: zero inside the box, a pull
back from outside it (on by default in actor_critic and reinforce).

distrax (and TensorFlow Probability under it, about half a second of imports)
loads at the first trace of a log-prob or an entropy, not with this module: a
run whose programs were stored by an earlier one (`common/executables.py`)
traces none, and never loads it.
"""

from __future__ import annotations

import math
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np

from common import cli, nets

Std = Literal["param", "network"]


class Categorical:
    """Categorical over `n` actions; inputs are logits `[..., n]`."""

    def __init__(self, n: int):
        self.n = self.n_inputs = n
        self.action_shape: tuple = ()
        self.discrete = True

    def head_init(self, key, n_features: int) -> dict:
        return nets.dense_init(key, n_features, self.n, 0.01)

    def policy_head(self, params: dict, features: jax.Array) -> jax.Array:
        return features @ params["w"] + params["b"]

    def _dist(self, inputs):
        import distrax  # at the first trace (module docstring)

        return distrax.Categorical(logits=inputs)

    def sample(self, inputs, key, temperature: float = 1.0):
        if temperature == 0.0:
            return self.mode(inputs)
        return self._dist(inputs / temperature).sample(seed=key)

    def log_prob(self, inputs, actions):
        return self._dist(inputs).log_prob(actions)

    def entropy(self, inputs):
        return self._dist(inputs).entropy()

    def mode(self, inputs):
        return jnp.argmax(inputs, axis=-1)

    def init_noise(self, key, n: int) -> jax.Array:
        del key
        return jnp.zeros((n, 0), jnp.float32)  # a categorical keeps no noise

    def sample_correlated(self, inputs, noise, key, correlation):
        del correlation
        return self.sample(inputs, key), noise

    def clip_action(self, actions):
        return actions

    def outside_box(self, inputs):
        return jnp.zeros(inputs.shape[:-1])  # a categorical has no box


class DiagonalGaussian:
    """Diagonal Gaussian; inputs are `[..., 2 * d]` = (means, log stds)."""

    def __init__(self, shape: tuple, low, high, std: Std = "param"):
        self.action_shape = tuple(shape)
        self.d = int(np.prod(shape))
        self.n_inputs = 2 * self.d
        self.low, self.high = low, high
        self.std = std
        self.discrete = False

    def head_init(self, key, n_features: int) -> dict:
        if self.std == "param":
            return {
                **nets.dense_init(key, n_features, self.d, 0.01),
                "log_std": jnp.zeros((self.d,), jnp.float32),
            }
        return nets.dense_init(key, n_features, 2 * self.d, 0.01)

    def policy_head(self, params: dict, features: jax.Array) -> jax.Array:
        out = features @ params["w"] + params["b"]
        if self.std == "param":
            log_std = jnp.broadcast_to(params["log_std"], out.shape)
            out = jnp.concatenate([out, log_std], axis=-1)
        return out

    def _split(self, inputs):
        mean, log_std = jnp.split(inputs, 2, axis=-1)
        return mean, jnp.clip(log_std, -20.0, 2.0)

    def _dist(self, inputs):
        import distrax  # at the first trace (module docstring)

        mean, log_std = self._split(inputs)
        return distrax.MultivariateNormalDiag(mean, jnp.exp(log_std))

    def _shape(self, flat):
        return flat.reshape(flat.shape[:-1] + self.action_shape)

    def sample(self, inputs, key, temperature: float = 1.0):
        mean, log_std = self._split(inputs)
        noise = jax.random.normal(key, mean.shape)
        return self._shape(mean + temperature * jnp.exp(log_std) * noise)

    def log_prob(self, inputs, actions):
        flat = actions.reshape(actions.shape[: actions.ndim - len(self.action_shape)] + (self.d,))
        return self._dist(inputs).log_prob(flat)

    def entropy(self, inputs):
        # sum_i 0.5 * log(2 pi e sigma_i^2)
        return self._dist(inputs).entropy()

    def mode(self, inputs):
        return self._shape(self._split(inputs)[0])

    def init_noise(self, key, n: int) -> jax.Array:
        """The noise of `n` environments before their first step: a draw of the process's
        stationary law, N(0, I). It folds a key of its own from `key`, which the caller may go on
        using (the rollout's keys stay as they are without the noise)."""
        return jax.random.normal(jax.random.fold_in(key, 1), (n, self.d))

    def sample_correlated(self, inputs, noise, key, correlation):
        """`(actions, noise)`: actions of a batch of environments `[n, ...]`, each the mean plus the
        std times its environment's noise, that noise moved one step along its AR(1) process
        (module docstring). `correlation` 0 gives `sample`'s independent draws."""
        fresh = jax.random.normal(key, noise.shape)
        noise = correlation * noise + jnp.sqrt(1.0 - correlation**2) * fresh
        mean, log_std = self._split(inputs)
        return self._shape(mean + jnp.exp(log_std) * noise), noise

    def clip_action(self, actions):
        return jnp.clip(actions, self.low, self.high)

    def outside_box(self, inputs):
        """`[...]`: sum_i (distance of mean_i outside [low_i, high_i] / the half-width)^2; 0 for a
        mean inside the box, and for an unbounded dimension."""
        mean, _ = self._split(inputs)
        low, high = (
            jnp.broadcast_to(jnp.asarray(bound, jnp.float32), self.action_shape).reshape(self.d)
            for bound in (self.low, self.high)
        )
        outside = jax.nn.relu(mean - high) + jax.nn.relu(low - mean)
        return jnp.sum((outside / ((high - low) / 2)) ** 2, axis=-1)


def noise_correlation(noise_memory, max_steps: int):
    """The step-to-step correlation `c` of exploration noise whose correlation time, `-1 / log c`
    steps, is `noise_memory` times the episode's step limit (`noise_memory` 0: c = 0, white
    noise)."""
    steps = noise_memory * max_steps
    if isinstance(steps, (int, float)):  # a flag's value on the host: no program to compile
        return math.exp(-1.0 / steps) if steps > 0 else 0.0
    return jnp.exp(-1.0 / steps)  # traced; 0: 1 / 0 is inf, and c is 0


def make_distribution(space, std: Std = "param"):
    """The policy distribution for a gymnax action space (`std`: a Box's `--std`); a
    `cli.ConfigError` otherwise."""
    from gymnax.environments import spaces

    if isinstance(space, spaces.Discrete):
        cli.require(
            std == "param",
            f"--std {std} applies to continuous actions; this environment has "
            f"{int(space.n)} discrete ones",
        )
        return Categorical(int(space.n))
    if isinstance(space, spaces.Box):
        if std not in ("param", "network"):
            raise cli.ConfigError(f"std must be 'param' or 'network', got {std!r}")
        return DiagonalGaussian(tuple(space.shape), space.low, space.high, std)
    raise cli.ConfigError(
        f"no policy distribution for action space {space!r} "
        f"({type(space).__name__}); supported: gymnax Discrete and Box spaces"
    )
