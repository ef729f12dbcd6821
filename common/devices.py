"""Hosts, devices, seeds and the compiled epoch (Trax `_init_host_and_devices`).

Every runner-state leaf carries two leading axes: `[n_devices, num_seeds, ...]`.
Seeds are independent runs; the devices of one seed split its environments and
average their gradients over the named axis `DEVICE_AXIS`. `compile_epoch`
maps a per-(device, seed) function over both axes: `jax.pmap` over devices
when there are several, otherwise `jax.jit` of a `vmap` that carries the same
axis name, so one code path (with `lax.pmean`) serves both.
"""
from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

DEVICE_AXIS = "devices"


def init_host_and_devices(n_devices: int | None = None, random_seed: int | None = None):
    """Returns `(is_chief, n_devices, rng)`.

    `n_devices` defaults to every local device; more than exist is an error.
    Without a seed, one host uses seed 0 (reproducible); several hosts derive
    one from the time and the host id so that hosts explore differently.
    """
    host_id, host_count = jax.process_index(), jax.process_count()
    available = jax.local_device_count()
    n_devices = available if n_devices is None else n_devices
    check_n_devices(n_devices)
    if random_seed is None:
        random_seed = int(time.time() * 1000 + host_id) % 2**31 if host_count > 1 else 0
    rng = jax.random.fold_in(jax.random.PRNGKey(random_seed), host_id)
    return host_id == 0, n_devices, rng


def check_n_devices(n_devices: int) -> None:
    available = jax.local_device_count()
    if not 1 <= n_devices <= available:
        raise ValueError(
            f"--n-devices {n_devices}: this host has {available} "
            f"{jax.default_backend()} device(s); use --n-devices between 1 and {available}"
        )


def seed_keys(rng: jax.Array, num_seeds: int, n_devices: int) -> jax.Array:
    """Keys `[n_devices, num_seeds, 2]`: one key per seed, the same on every device.

    Use the key as it is for what must agree across devices (parameter
    initialisation), and `device_key` for what must differ (exploration).
    """
    keys = jax.random.split(rng, num_seeds)
    return jnp.broadcast_to(keys, (n_devices,) + keys.shape)


def device_key(key: jax.Array) -> jax.Array:
    """`key` made distinct per device (call inside `compile_epoch`)."""
    return jax.random.fold_in(key, jax.lax.axis_index(DEVICE_AXIS))


def compile_init(fn):
    """Maps `fn(key)` over `[n_devices, num_seeds]` keys on ONE device, ready to compile.

    The device axis is a `vmap` carrying `DEVICE_AXIS` (so `device_key` works);
    the epoch's `pmap` then spreads the state over the devices. Initialise
    weights with `orthogonal`, not `jax.nn.initializers.orthogonal` (see there).
    """
    return jax.jit(jax.vmap(jax.vmap(fn), axis_name=DEVICE_AXIS))


def compile_epoch(fn, n_devices: int, donate: bool = True, n_shared: int = 0):
    """Maps `fn(runner_state, *shared)` over `[n_devices, num_seeds]`, ready to compile.

    The runner state is mapped; the `n_shared` trailing arguments are the same
    for every device and seed. With `donate`, the input state's buffers are reused.
    """
    in_axes = (0,) + (None,) * n_shared
    per_device = jax.vmap(fn, in_axes)
    donate_argnums = (0,) if donate else ()
    if n_devices > 1:
        return jax.pmap(per_device, axis_name=DEVICE_AXIS, in_axes=in_axes, donate_argnums=donate_argnums)
    return jax.jit(jax.vmap(per_device, in_axes, axis_name=DEVICE_AXIS), donate_argnums=donate_argnums)


def unreplicate(tree):
    """The first device's copy: `[n_devices, num_seeds, ...] -> [num_seeds, ...]`."""
    return jax.tree.map(lambda x: x[0], tree)


def orthogonal(key: jax.Array, shape: tuple, scale: float = 1.0) -> jax.Array:
    """`jax.nn.initializers.orthogonal(scale)` for a 2-D `shape`, built from matmuls only.

    Same Gaussian draw, same result up to rounding (Q of its QR with R's
    diagonal positive): Gram-Schmidt with a second projection pass, one column
    per scan step. Why not jax's: jaxlib 0.10's LAPACK QR runs a batch (seeds x
    devices) by handing chunks to XLA:CPU's thread pool from a worker of that
    pool and waiting; as many concurrent QRs as workers (policy and value nets
    on 2 cores) deadlock the process.

    Under `vmap` the keys are mapped one by one (`lax.map`), never batched:
    XLA rounds a batched matmul differently for different batch sizes, and the
    parameters of a seed must not depend on how many devices or seeds run.
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
