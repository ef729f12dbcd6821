"""Network pieces every script builds from: plain functions over parameter pytrees.

A dense layer is `{"w": [n_in, n_out], "b": [n_out]}` with orthogonal
weights (`orthogonal`) and a zero bias; a torso is a list of them, each
followed by the activation. Image-like observations (`[H, W, C]`, as MinAtar's
grids) get a conv torso (`--torso`): one 3x3 convolution of 16 channels
(`{"w": [3, 3, C, 16], "b": [16]}`, stride 1, no padding) before the dense
layers, the network of MinAtar's paper (Young & Tian 2019, arXiv:1903.03176).
What makes an algorithm's network its own (heads, a Q(s, a) critic's action
input, a Transformer) stays in its script.
"""

from __future__ import annotations

from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np

from common import cli

Activation = Literal["tanh", "relu"]
Torso = Literal["auto", "mlp", "conv"]  # a script's --torso
ACTIVATIONS = {"tanh": jnp.tanh, "relu": jax.nn.relu}
CONV_KERNEL, CONV_CHANNELS = 3, 16


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


def uses_conv(torso: str, obs_shape: tuple) -> bool:
    """Whether the network starts with the convolution: `--torso auto` gives it to `[H, W, C]`
    observations (an image) and not to others; `--torso conv` on another shape is a
    `cli.ConfigError`."""
    image = len(obs_shape) == 3 and min(obs_shape[:2]) >= CONV_KERNEL
    cli.require(
        torso != "conv" or image,
        f"--torso conv needs image observations [H, W, C] with H, W >= "
        f"{CONV_KERNEL}; these are {list(obs_shape)}: use --torso mlp",
    )
    return torso == "conv" or (torso == "auto" and image)


def torso_init(
    keys: jax.Array,
    obs_shape: tuple,
    hidden: tuple[int, ...],
    conv: bool = False,
    extra_inputs: int = 0,
) -> list:
    """Hidden layers `obs -> hidden[0] -> ... -> hidden[-1]`, scale sqrt 2, one key each: `keys`
    `[len(hidden), 2]`.

    With `conv`, the convolution comes first (its kernel orthogonal as a `[9 C, 16]` matrix, from a
    key folded out of `keys[0]`, so the dense layers draw what they draw without it). `extra_inputs`
    widens the first dense layer for inputs appended to the observation's features (a Q(s, a)
    critic's action)."""
    layers, n_in = [], int(np.prod(obs_shape))
    if conv:
        (height, width, channels), k = obs_shape, CONV_KERNEL
        kernel = orthogonal(
            jax.random.fold_in(keys[0], len(hidden)), (k * k * channels, CONV_CHANNELS), np.sqrt(2)
        )
        layers.append(
            {"w": kernel.reshape(k, k, channels, CONV_CHANNELS), "b": jnp.zeros((CONV_CHANNELS,))}
        )
        n_in = (height - k + 1) * (width - k + 1) * CONV_CHANNELS
    sizes = (n_in + extra_inputs,) + tuple(hidden)
    return layers + [
        dense_init(k, a, b, np.sqrt(2)) for k, a, b in zip(keys, sizes[:-1], sizes[1:])
    ]


def torso(layers: list, x: jax.Array, activation: Activation) -> jax.Array:
    """One observation through the layers (float32; the convolution, if any, on its `[H, W, C]`
    form, the dense layers on it flattened): `[hidden[-1]]`; with no layers, the observation
    flattened."""
    act = ACTIVATIONS[activation]
    x = x.astype(jnp.float32)
    for layer in layers:
        if layer["w"].ndim == 4:
            # the convolution [H, W, C] -> [H - 2, W - 2, 16] as one matmul of the 3x3 patches [H -
            # 2, W - 2, 9 C]: under vmap, XLA:CPU's own convolution made a MinAtar DQN epoch ~25x
            # slower
            k, (height, width, _) = layer["w"].shape[0], x.shape
            patches = jnp.concatenate(
                [
                    x[i : height - k + 1 + i, j : width - k + 1 + j]
                    for i in range(k)
                    for j in range(k)
                ],
                -1,
            )
            x = act(patches @ layer["w"].reshape(-1, layer["w"].shape[-1]) + layer["b"])
        else:
            x = act(jnp.ravel(x) @ layer["w"] + layer["b"])
    return jnp.ravel(x)
