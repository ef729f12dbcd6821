"""Hyperparameters as inputs of the compiled programs, and the in-process sweep (`--sweep
lr=1e-3,3e-4`).

Every float flag but the `STATIC_FLOATS` and a `SWITCHES` flag at 0
(`cli.RunConfig`) enters the programs as an input, not a constant folded
into them: `build` makes the trainer inside the program with traced values,
so a run that differs from an earlier one only in such flags finds its
programs in JAX's persistent cache, and `--resume` with a new value feeds it
to the same programs. The values are
an argument `[n_devices, n_runs(config)]` beside the runner state, never in
it: a checkpoint holds the state alone.

The seed axis holds `n_runs(config)` runs, member-major: the `--num-seeds`
seeds of sweep member 0, then of member 1, ... Seed i of every member starts
from the key of seed i of a run without the sweep and is evaluated on its
episodes (`eval_keys`), so members meet on equal terms.
"""

import contextlib
import copy
import dataclasses
import re
import sysconfig
import traceback
from pathlib import Path
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from common import cli, devices


def n_runs(config) -> int:
    """Seeds x sweep members: the length of the runner state's seed axis."""
    return config.num_seeds * len(cli.sweep_members(config))


def eval_keys(key, config):
    """One evaluation key per run; every sweep member meets the episodes of a run without the
    sweep."""
    return jnp.tile(jax.random.split(key, config.num_seeds), (len(cli.sweep_members(config)), 1))


def input_names(config) -> list[str]:
    """The float flags that are inputs of the programs: all but `STATIC_FLOATS` and the `SWITCHES`
    at 0.

    A constant of the programs cannot be swept in one program: a static float,
    or a switch swept across 0 (a program without its term) and other values.
    """
    members, cls = cli.sweep_members(config), type(config)
    names = []
    for name in cli.float_flags(cls):
        zero = [cli.off(member.get(name, getattr(config, name))) for member in members]
        if name in cls.STATIC_FLOATS or (name in cls.SWITCHES and any(zero)):
            why = "shapes the programs" if name in cls.STATIC_FLOATS else "0 switches its term off"
            cli.require(
                name not in members[0] or (name in cls.SWITCHES and all(zero)),
                f"--sweep {' '.join(config.sweep)}: {cli.flag_name(name)} {why}, a constant of the "
                "programs, so it cannot be swept in one program; run one process per value (e.g. "
                "a wandb sweep, sweeps/)"
                + ("" if name in cls.STATIC_FLOATS else " or sweep values above 0"),
            )
            continue
        names.append(name)
    return names


def build(config, make_trainer: Callable, n_devices: int) -> tuple[Any, dict]:
    """The run's trainer (a `run.Trainer`) and the hyperparameter values its programs map over:
    `[n_devices, n_runs]`.

    The trainer's `init(key, values)`, `epoch(state, values)` (and `rollout`) make
    the script's trainer inside the program from `config` with `values`
    (`input_names`) as traced numbers; `act`, `policy` and the sizes are those
    of `make_trainer(config)`. `config.n_devices` counts the run's devices (every
    host's); `n_devices` this host's.
    """
    config = config.resolved()
    trainer = make_trainer(config)
    members = cli.sweep_members(config)
    # each member's values as its config holds them (a script may set a flag's 0 to its default);
    # numpy arrays: jnp operations here would each be a small program to compile or load
    member_configs = [dataclasses.replace(config, sweep=(), **m) for m in members]
    values = {
        name: np.broadcast_to(
            np.repeat(
                np.asarray([getattr(c, name) for c in member_configs], np.float32),
                config.num_seeds,
            ),
            (n_devices, n_runs(config)),
        )
        for name in input_names(config)
    }

    def traced(values):
        member = copy.copy(config)  # frozen dataclass: set the traced values without validation
        for name, value in values.items():
            object.__setattr__(member, name, value)
        return make_trainer(member)

    # named functions: a profile (bench/peers/phases.py) names their programs
    def init(key, values):
        return traced(values).init(key)

    def epoch(state, values):
        return traced(values).epoch(state)

    rollout = trainer.rollout and (lambda state, values: traced(values).rollout(state))
    return trainer._replace(init=init, rollout=rollout, epoch=epoch), values


def run_keys(seed, config, n_devices: int):
    """The runs' init keys `[n_devices, n_runs, 2]` and the evaluation's key, from the run's
    seed (`seed_input`).

    Called inside the programs that use them: as operations on the host, each
    random function would compile a small program of its own at every start.
    With `--sweep`, seed i of every member starts from the key of seed i of a
    run without it (paired comparison).
    """
    rng = jax.random.fold_in(jax.random.PRNGKey(seed), 0)  # 0: the chief's key, on every host
    init_key, eval_key = jax.random.split(rng)
    keys = devices.seed_keys(init_key, config.num_seeds, n_devices)
    return jnp.tile(keys, (1, len(cli.sweep_members(config)), 1)), eval_key


def seed_input(seed: int) -> np.uint32:
    """`--seed` as the programs take it: the 32 bits of an integer that `jax.random.PRNGKey`
    keeps."""
    return np.uint32(seed % 2**32)


def trace_init(trainer, seed, values, config, n_devices: int):
    """The runs' `init` from the seed (`seed_input`) and `values`, traced (its output shapes are
    the state's template; `.lower()` goes on to the program).

    Several hosts compile the epoch at its first call, so with several hosts its trace is checked
    here, before anything runs (`inputs_stay_traced`).
    """
    init_runs = devices.map_init(trainer.init)

    def init(seed, values):  # named: a profile (bench/peers/phases.py) names its program
        keys, _ = run_keys(seed, config, n_devices)
        return init_runs(keys, values)

    with inputs_stay_traced(config):
        traced = jax.jit(init).trace(seed, values)
        if jax.process_count() > 1:
            epoch = devices.map_epoch(trainer.epoch, n_devices, n_mapped=2)
            jax.eval_shape(epoch, traced.out_info, values)
    return traced


@contextlib.contextmanager
def inputs_stay_traced(config):
    """Turns the error of a script that needs an input float's value in Python (`if config.lr >
    0.01:`, `int(config.gamma)`) while the programs are traced into one line: the file and line,
    the flag, and the two fixes."""
    try:
        yield
    except (jax.errors.ConcretizationTypeError, jax.errors.TracerArrayConversionError) as error:
        frames = [f for f in traceback.extract_tb(error.__traceback__) if _user_code(f.filename)]
        where = frames[-1] if frames else None
        code = where.line if where else ""
        names = [n for n in input_names(config) if re.search(rf"\b{n}\b", code)]
        names = names or re.findall(r"values\['(\w+)'\]", str(error))
        flags = " and ".join(map(cli.flag_name, dict.fromkeys(names))) or "a float flag"
        place = f"{_shown(where.filename)}:{where.lineno}: `{code}`" if where else "the script"
        raise cli.ConfigError(
            f"{place} needs the value of {flags} in Python (a branch, int() or float()), but float "
            "flags are inputs of the compiled programs, traced numbers, so that runs that differ "
            "only in them share their programs: compute with it instead (jnp.where, "
            "jax.lax.cond), or name it in the Config's STATIC_FLOATS to make it a constant of the "
            "programs (each value then compiles its own)"
        ) from None


def _user_code(filename: str) -> bool:
    """Whether a traceback frame is the project's or a user's code, not Python's or a library's."""
    return not (
        filename.startswith("<")
        or "site-packages" in filename
        or filename.startswith(sysconfig.get_paths()["stdlib"])
    )


def _shown(filename: str) -> str:
    """`filename` relative to the working directory where it lies below it."""
    path = Path(filename)
    return str(path.relative_to(Path.cwd())) if path.is_relative_to(Path.cwd()) else filename
