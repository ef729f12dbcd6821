"""Network pieces every script builds from: plain functions over parameter pytrees.

A dense layer is `{"w": [n_in, n_out], "b": [n_out]}` with orthogonal
weights (`orthogonal`) and a zero bias; a torso is a list of them, each
followed by the activation. What makes an algorithm's network its own (heads,
a Q(s, a) critic's action input, a Transformer) stays in its script.
"""
from __future__ import annotations

from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np

Activation = Literal["tanh", "relu"]
ACTIVATIONS = {"tanh": jnp.tanh, "relu": jax.nn.relu}


def orthogonal(key: jax.Array, shape: tuple, scale: float = 1.0) -> jax.Array:
    """`jax.nn.initializers.orthogonal(scale)` for a 2-D `shape` (same draw, equal up to rounding).

    Built from matmuls (Gram-Schmidt, two passes) because jaxlib 0.10's batched
    LAPACK QR deadlocks XLA:CPU's thread pool on 2 cores. Under `vmap` the keys
    are mapped one by one: a batched matmul rounds differently per batch size,
    and a seed's parameters must not depend on how many seeds or devices run.
    """
    n_rows, n_cols = shape
    transpose = n_rows < n_cols

    @jax.custom_batching.custom_vmap
    def draw(key):
        a = jax.random.normal(key, (n_cols, n_rows) if transpose else (n_rows, n_cols), jnp.float32)

        def add_column(q, j):
            v = a[:, j]
            for _ in range(2):  # the second pass restores orthogonality lost to rounding
                v = v - q @ (q.T @ v)  # columns not yet filled are zero
            return q.at[:, j].set(v / jnp.linalg.norm(v)), None

        q, _ = jax.lax.scan(add_column, jnp.zeros_like(a), np.arange(a.shape[1]))
        return q.T if transpose else q

    @draw.def_vmap
    def _draw_each(axis_size, in_batched, keys):
        return (jax.lax.map(draw, keys), True) if in_batched[0] else (draw(keys), False)

    return scale * draw(key)


def dense_init(key: jax.Array, n_in: int, n_out: int, scale: float) -> dict:
    """Orthogonal weights times `scale`, zero bias."""
    return {"w": orthogonal(key, (n_in, n_out), scale), "b": jnp.zeros((n_out,), jnp.float32)}


def torso_init(keys: jax.Array, n_in: int, hidden: tuple[int, ...]) -> list:
    """Hidden layers `n_in -> hidden[0] -> ... -> hidden[-1]`, scale sqrt 2, one key each: `keys` `[len(hidden), 2]`."""
    sizes = (n_in,) + tuple(hidden)
    return [dense_init(k, a, b, np.sqrt(2)) for k, a, b in zip(keys, sizes[:-1], sizes[1:])]


def torso(layers: list, x: jax.Array, activation: Activation) -> jax.Array:
    """One input (flattened to a float32 vector) through the hidden layers: `[hidden[-1]]`."""
    act = ACTIVATIONS[activation]
    x = jnp.ravel(x).astype(jnp.float32)
    for layer in layers:
        x = act(x @ layer["w"] + layer["b"])
    return x
