"""Hosts, devices, seeds and the compiled epoch (Trax `_init_host_and_devices`).

Every runner-state leaf carries two leading axes: `[n_devices, num_seeds, ...]`.
Seeds are independent runs; the devices of one seed split its environments and
average their gradients over the named axis `DEVICE_AXIS`. `map_epoch`
maps a per-(device, seed) function over both axes: `jax.pmap` over devices
when there are several, otherwise `jax.jit` of a `shard_map` over the one
device, which names the same axis, so one code path (with `lax.pmean`) serves
both.

An axis of size one is not batched: the function of one run (one seed, no
sweep) sees its arguments without the runs axis (`over_runs`), and that of one
device without the device axis (`over_devices`); the arrays keep both axes
outside the function. A `vmap` of size one would compute the same, and make
XLA compile the program about a third longer.

Several hosts (`init_distributed`, JAX's own distributed runtime) train ONE
run: the `pmap` spans every device of every host, each host holding its own
rows `[local devices, num_seeds, ...]` of the state. Parameters start from the
same key on every host; `device_key` makes environments differ per device and
per host.
"""

from __future__ import annotations

import functools
import os
import socket
import sys
import time
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import PartitionSpec as P

from common import cli

DEVICE_AXIS = "devices"
ENV_COORDINATOR, ENV_NUM_PROCESSES, ENV_PROCESS_ID = (
    "JTRAX_COORDINATOR",
    "JTRAX_NUM_PROCESSES",
    "JTRAX_PROCESS_ID",
)


def init_distributed(
    coordinator: str = "", num_processes: int = 0, process_id: int = -1, timeout_s: int = 120
) -> None:
    """Joins a multi-host run with `jax.distributed.initialize`; call before anything touches a
    device.

    Unset arguments (`""`, 0, -1) come from $JTRAX_COORDINATOR, $JTRAX_NUM_PROCESSES
    and $JTRAX_PROCESS_ID; no coordinator at all: one process, nothing to do.
    Bad values are a `cli.ConfigError`. A process other than 0 first waits up to
    `timeout_s` for the coordinator's port to accept connections, and exits with
    a clear message if it never does (jax itself would abort the process, SIGABRT).
    """
    coordinator = coordinator or os.environ.get(ENV_COORDINATOR, "")
    num_processes = num_processes or _env_int(ENV_NUM_PROCESSES, "--num-processes", 0)
    process_id = process_id if process_id != -1 else _env_int(ENV_PROCESS_ID, "--process-id", -1)
    if not coordinator:
        if num_processes > 1 or process_id > 0:
            raise cli.ConfigError(
                f"--num-processes {num_processes} / --process-id {process_id} need "
                f"--coordinator HOST:PORT (or ${ENV_COORDINATOR}): the address of process 0"
            )
        return
    host, _, port = coordinator.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise cli.ConfigError(
            f"--coordinator {coordinator!r}: use HOST:PORT, e.g. 10.0.0.1:12345 "
            f"(process 0's address and a free port)"
        )
    if num_processes < 1:
        raise cli.ConfigError(
            f"--num-processes {num_processes}: give the number of processes of the run, "
            f"1 or more (--num-processes or ${ENV_NUM_PROCESSES})"
        )
    if not 0 <= process_id < num_processes:
        raise cli.ConfigError(
            f"--process-id {process_id}: use 0 to {num_processes - 1} (one per process, "
            f"0 is the chief; --process-id or ${ENV_PROCESS_ID})"
        )
    if timeout_s < 1:
        raise cli.ConfigError(f"--coordinator-timeout {timeout_s}: use 1 second or more")
    print(
        f"process {process_id} of {num_processes}: joining {coordinator}; jax aborts this process "
        f"if not every process has joined within {timeout_s} s",
        file=sys.stderr,
        flush=True,
    )
    if process_id != 0:
        _wait_for_port(host.strip("[]"), int(port), coordinator, timeout_s)
    jax.distributed.initialize(
        coordinator_address=coordinator,
        num_processes=num_processes,
        process_id=process_id,
        initialization_timeout=timeout_s,
    )


def _env_int(name: str, flag: str, default: int) -> int:
    text = os.environ.get(name, "")
    try:
        return int(text) if text else default
    except ValueError:
        raise cli.ConfigError(f"${name}={text!r}: {flag} must be an integer") from None


def _wait_for_port(host: str, port: int, coordinator: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            socket.create_connection(
                (host, port), timeout=max(0.1, min(2.0, deadline - time.monotonic()))
            ).close()
            return
        except OSError as error:
            if time.monotonic() >= deadline:
                raise SystemExit(
                    f"error: no coordinator at {coordinator} after {timeout_s} s ({error}). Check "
                    f"that process 0 runs with the same --coordinator, that {host} is its address "
                    f"as seen from this host, and that port {port} is open between the hosts."
                ) from None
            time.sleep(0.5)


class Host(NamedTuple):
    is_chief: bool  # process 0: it alone writes
    n_devices: int  # this host's devices in the run
    seed: int  # the run's seed, the same on every host (`sweep.run_keys` makes its keys)


def init_host_and_devices(n_devices: int | None = None, random_seed: int | None = None) -> Host:
    """This host's part in the run: the chief is host 0, `n_devices` counts this host's.

    `n_devices` defaults to every local device; more than exist is an error, and
    so is fewer on several hosts (the `pmap` spans every device of every host).
    `seed` is the same on every host (parameters must start equal); `device_key`
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
            raise cli.ConfigError(
                f"--n-devices {n_devices}: a run over {host_count} hosts uses every device of "
                f"every host, the same number on each (devices per host: {per_host}); "
                f"leave --n-devices at 0"
            )
    if random_seed is None:
        random_seed = (
            0
            if host_count == 1
            else int(multihost_utils.broadcast_one_to_all(np.int32(time.time() * 1000 % 2**31)))
        )
    return Host(is_chief=host_id == 0, n_devices=n_devices, seed=random_seed)


def check_n_devices(n_devices: int) -> None:
    available = jax.local_device_count()
    if not 1 <= n_devices <= available:
        raise cli.ConfigError(
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
    """`key` made distinct per device (call inside `map_init` or `map_epoch`).

    Folds in the device's index on `DEVICE_AXIS` (local to the host under
    `map_init`, across all hosts under a multi-host `pmap`) and, on
    several hosts, the host's index, so no two devices of the run share a key.
    """
    key = jax.random.fold_in(key, jax.lax.axis_index(DEVICE_AXIS))
    return jax.random.fold_in(key, jax.process_index()) if jax.process_count() > 1 else key


def map_init(fn):
    """Maps `fn(key, ...)` over `[n_devices, num_seeds]` keys (and values) on ONE device, ready to
    compile.

    The device axis carries `DEVICE_AXIS` (so `device_key` works), as a `vmap`
    when there are several devices: the epoch's `pmap` then spreads the state
    over them. Initialise weights with `orthogonal`, not
    `jax.nn.initializers.orthogonal` (see there).
    """

    @functools.wraps(fn)
    def init(keys, *values):
        in_axes = (0,) * (1 + len(values))
        return over_devices(over_runs(fn, in_axes), in_axes, keys.shape[0])(keys, *values)

    return jax.jit(init)


def map_epoch(fn, n_devices: int, donate: bool = True, n_shared: int = 0, n_mapped: int = 1):
    """Maps `fn(runner_state, *mapped, *shared)` over `[n_devices, num_seeds]`, ready to compile.

    The runner state and the `n_mapped - 1` arguments after it (the hyperparameter
    values, `sweep.build`) are mapped; the `n_shared` trailing arguments are the same
    for every device and seed. With `donate`, the input state's buffers are reused.
    """
    in_axes = (0,) * n_mapped + (None,) * n_shared
    per_device = over_runs(fn, in_axes)
    donate_argnums = (0,) if donate else ()
    if n_devices > 1 or jax.process_count() > 1:
        return jax.pmap(
            per_device, axis_name=DEVICE_AXIS, in_axes=in_axes, donate_argnums=donate_argnums
        )
    return jax.jit(over_devices(per_device, in_axes, 1), donate_argnums=donate_argnums)


def over_runs(fn, in_axes: tuple):
    """`jax.vmap(fn, in_axes)` over the runs (seeds, and sweep members) of the arguments' leading
    axis; for one run, `without_axis(fn, in_axes)`."""

    @functools.wraps(fn)
    def mapped(*args):
        leaf = jax.tree.leaves([a for a, axis in zip(args, in_axes) if axis == 0])[0]
        one_run = leaf.shape[0] == 1
        return (without_axis(fn, in_axes) if one_run else jax.vmap(fn, in_axes))(*args)

    return mapped


def over_devices(fn, in_axes: tuple, n_devices: int):
    """`fn` mapped over the device axis of `n_devices` on one device, with `DEVICE_AXIS` named: a
    `vmap`, or for one device `without_axis(fn, in_axes)` under a `shard_map` of that device."""
    if n_devices > 1:
        return jax.vmap(fn, in_axes, axis_name=DEVICE_AXIS)
    mesh = jax.sharding.Mesh(np.array(jax.local_devices()[:1]), (DEVICE_AXIS,))
    return jax.shard_map(
        without_axis(fn, in_axes),
        mesh=mesh,
        in_specs=tuple(P(DEVICE_AXIS) if axis == 0 else P() for axis in in_axes),
        out_specs=P(DEVICE_AXIS),
        check_vma=False,  # collectives over one device: the values are their own sums
    )


def without_axis(fn, in_axes: tuple):
    """`fn` on its mapped arguments (`in_axes` 0) without their leading axis of size one; its
    outputs get the axis back."""

    @functools.wraps(fn)
    def one(*args):
        args = [
            jax.tree.map(lambda x: x[0], a) if axis == 0 else a for a, axis in zip(args, in_axes)
        ]
        return jax.tree.map(lambda x: x[None], fn(*args))

    return one


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
    return jax.tree.map(lambda x: x[i * n : (i + 1) * n], tree)


def any_host(flag: bool) -> bool:
    """`flag` or'ed over hosts, so that every host takes the same branch (a collective)."""
    return (
        flag
        if jax.process_count() == 1
        else bool(multihost_utils.process_allgather(np.bool_(flag)).any())
    )


def unreplicate(tree):
    """The first device's copy: `[n_devices, num_seeds, ...] -> [num_seeds, ...]`."""
    return jax.tree.map(lambda x: x[0], tree)


class Layout(NamedTuple):
    n_devices: int  # devices the environments are split over (every host's)
    envs_per_device: int
    rollout_size: int  # transitions of one device and seed per epoch: envs_per_device * num_steps
    # environment steps of one seed per epoch, all devices: num_envs * num_steps
    steps_per_epoch: int
    num_epochs: int  # total_steps // steps_per_epoch


def layout(config) -> Layout:
    """How a config's `num_envs` environments, `num_steps` long, split over its devices, and for how
    many epochs.

    `config.n_devices` 0 means every local device; `--num-envs` must divide
    evenly and `--total-steps` must hold one epoch (`cli.ConfigError` otherwise).
    """
    n_devices = config.n_devices or jax.local_device_count()
    cli.require(
        config.num_envs % n_devices == 0,
        f"--num-envs {config.num_envs} is not divisible by --n-devices "
        f"{n_devices}; use a multiple of {n_devices}",
    )
    steps_per_epoch = config.num_envs * config.num_steps
    cli.require(
        config.total_steps >= steps_per_epoch,
        f"--total-steps {config.total_steps} is less than one epoch "
        f"({config.num_envs} envs x {config.num_steps} steps = "
        f"{steps_per_epoch})",
    )
    envs_per_device = config.num_envs // n_devices
    return Layout(
        n_devices=n_devices,
        envs_per_device=envs_per_device,
        rollout_size=envs_per_device * config.num_steps,
        steps_per_epoch=steps_per_epoch,
        num_epochs=config.total_steps // steps_per_epoch,
    )
