"""Hosts, devices, seeds and the compiled epoch (Trax `_init_host_and_devices`).

Every runner-state leaf carries two leading axes: `[n_devices, num_seeds, ...]`.
Seeds are independent runs; the devices of one seed split its environments and
average their gradients over the named axis `DEVICE_AXIS`. `compile_epoch`
maps a per-(device, seed) function over both axes: `jax.pmap` over devices
when there are several, otherwise `jax.jit` of a `vmap` that carries the same
axis name, so one code path (with `lax.pmean`) serves both.

Several hosts (`init_distributed`, JAX's own distributed runtime) train ONE
run: the `pmap` spans every device of every host, each host holding its own
rows `[local devices, num_seeds, ...]` of the state. Parameters start from the
same key on every host; `device_key` makes environments differ per device and
per host.
"""
from __future__ import annotations

import os
import socket
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils

DEVICE_AXIS = "devices"
ENV_COORDINATOR, ENV_NUM_PROCESSES, ENV_PROCESS_ID = "JTRAX_COORDINATOR", "JTRAX_NUM_PROCESSES", "JTRAX_PROCESS_ID"


def init_distributed(coordinator: str = "", num_processes: int = 0, process_id: int = -1,
                     timeout_s: int = 120) -> None:
    """Joins a multi-host run with `jax.distributed.initialize`; call before anything touches a device.

    Unset arguments (`""`, 0, -1) come from $JTRAX_COORDINATOR, $JTRAX_NUM_PROCESSES
    and $JTRAX_PROCESS_ID; no coordinator at all: one process, nothing to do.
    Bad values are a ValueError. A process other than 0 first waits up to
    `timeout_s` for the coordinator's port to accept connections, and exits with
    a clear message if it never does (jax itself would abort the process, SIGABRT).
    """
    coordinator = coordinator or os.environ.get(ENV_COORDINATOR, "")
    num_processes = num_processes or _env_int(ENV_NUM_PROCESSES, "--num-processes", 0)
    process_id = process_id if process_id != -1 else _env_int(ENV_PROCESS_ID, "--process-id", -1)
    if not coordinator:
        if num_processes > 1 or process_id > 0:
            raise ValueError(f"--num-processes {num_processes} / --process-id {process_id} need "
                             f"--coordinator HOST:PORT (or ${ENV_COORDINATOR}): the address of process 0")
        return
    host, _, port = coordinator.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"--coordinator {coordinator!r}: use HOST:PORT, e.g. 10.0.0.1:12345 "
                         f"(process 0's address and a free port)")
    if num_processes < 1:
        raise ValueError(f"--num-processes {num_processes}: give the number of processes of the run, "
                         f"1 or more (--num-processes or ${ENV_NUM_PROCESSES})")
    if not 0 <= process_id < num_processes:
        raise ValueError(f"--process-id {process_id}: use 0 to {num_processes - 1} (one per process, "
                         f"0 is the chief; --process-id or ${ENV_PROCESS_ID})")
    if timeout_s < 1:
        raise ValueError(f"--coordinator-timeout {timeout_s}: use 1 second or more")
    print(f"process {process_id} of {num_processes}: joining {coordinator}; jax aborts this process if "
          f"not every process has joined within {timeout_s} s", file=sys.stderr, flush=True)
    if process_id != 0:
        _wait_for_port(host.strip("[]"), int(port), coordinator, timeout_s)
    jax.distributed.initialize(coordinator_address=coordinator, num_processes=num_processes,
                               process_id=process_id, initialization_timeout=timeout_s)


def _env_int(name: str, flag: str, default: int) -> int:
    text = os.environ.get(name, "")
    try:
        return int(text) if text else default
    except ValueError:
        raise ValueError(f"${name}={text!r}: {flag} must be an integer") from None


def _wait_for_port(host: str, port: int, coordinator: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            socket.create_connection((host, port), timeout=max(0.1, min(2.0, deadline - time.monotonic()))).close()
            return
        except OSError as error:
            if time.monotonic() >= deadline:
                raise SystemExit(
                    f"error: no coordinator at {coordinator} after {timeout_s} s ({error}). Check that process 0 "
                    f"runs with the same --coordinator, that {host} is its address as seen from this host, "
                    f"and that port {port} is open between the hosts.") from None
            time.sleep(0.5)


def init_host_and_devices(n_devices: int | None = None, random_seed: int | None = None):
    """Returns `(is_chief, n_devices, rng)`: the chief is host 0, `n_devices` counts this host's.

    `n_devices` defaults to every local device; more than exist is an error, and
    so is fewer on several hosts (the `pmap` spans every device of every host).
    `rng` is the same on every host (parameters must start equal); `device_key`
    tells hosts apart. Without a seed, one host uses seed 0 (reproducible);
    several hosts use one drawn from the chief's clock.
    """
    host_id, host_count = jax.process_index(), jax.process_count()
    available = jax.local_device_count()
    n_devices = available if n_devices is None else n_devices
    check_n_devices(n_devices)
    if host_count > 1:
        per_host = [sum(d.process_index == p for d in jax.devices()) for p in range(host_count)]
        if n_devices != available or len(set(per_host)) > 1:
            raise ValueError(f"--n-devices {n_devices}: a run over {host_count} hosts uses every device of "
                             f"every host, the same number on each (devices per host: {per_host}); "
                             f"leave --n-devices at 0")
    if random_seed is None:
        random_seed = 0 if host_count == 1 else int(multihost_utils.broadcast_one_to_all(
            np.int32(time.time() * 1000 % 2**31)))
    rng = jax.random.fold_in(jax.random.PRNGKey(random_seed), 0)  # 0: the chief's key, on every host
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
    """`key` made distinct per device (call inside `compile_init` or `compile_epoch`).

    Folds in the device's index on `DEVICE_AXIS` (local to the host under
    `compile_init`'s vmap, across all hosts under a multi-host `pmap`) and, on
    several hosts, the host's index, so no two devices of the run share a key.
    """
    key = jax.random.fold_in(key, jax.lax.axis_index(DEVICE_AXIS))
    return jax.random.fold_in(key, jax.process_index()) if jax.process_count() > 1 else key


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
    if n_devices > 1 or jax.process_count() > 1:
        return jax.pmap(per_device, axis_name=DEVICE_AXIS, in_axes=in_axes, donate_argnums=donate_argnums)
    return jax.jit(jax.vmap(per_device, in_axes, axis_name=DEVICE_AXIS), donate_argnums=donate_argnums)


def gather(tree):
    """Every host's rows of a `[n_devices, ...]` tree, in host order: the whole run's state.

    A collective: every host must call it at the same point. One host: `tree` itself.
    """
    return tree if jax.process_count() == 1 else multihost_utils.process_allgather(tree, tiled=True)


def this_host(tree):
    """This host's rows of a whole run's tree (the inverse of `gather`)."""
    if jax.process_count() == 1:
        return tree
    n, i = jax.local_device_count(), jax.process_index()
    return jax.tree.map(lambda x: x[i * n:(i + 1) * n], tree)


def any_host(flag: bool) -> bool:
    """`flag` or'ed over hosts, so that every host takes the same branch (a collective)."""
    return flag if jax.process_count() == 1 else bool(multihost_utils.process_allgather(np.bool_(flag)).any())


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
