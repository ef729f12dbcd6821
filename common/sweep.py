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

import copy
from typing import Any, Callable

import jax
import jax.numpy as jnp

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


def build(config, make_trainer: Callable, n_devices: int, init_key) -> tuple[Any, Any, dict]:
    """The run's trainer (a `run.Trainer`), the keys and the hyperparameter values its programs map
    over: `[n_devices, n_runs]`.

    The trainer's `init(key, values)`, `epoch(state, values)` (and `rollout`) make
    the script's trainer inside the program from `config` with `values`
    (`input_names`) as traced numbers; `act`, `policy` and the sizes are those
    of `make_trainer(config)`. `config.n_devices` counts the run's devices (every
    host's); `n_devices` this host's. With `--sweep`, seed i of every member starts
    from the key of seed i of a run without it (paired comparison).
    """
    trainer = make_trainer(config)
    members = cli.sweep_members(config)
    keys = jnp.tile(devices.seed_keys(init_key, config.num_seeds, n_devices), (1, len(members), 1))
    values = {
        name: jnp.broadcast_to(
            jnp.repeat(
                jnp.asarray([m.get(name, getattr(config, name)) for m in members], jnp.float32),
                config.num_seeds,
            ),
            keys.shape[:2],
        )
        for name in input_names(config)
    }

    def traced(values):
        member = copy.copy(config)  # frozen dataclass: set the traced values without validation
        for name, value in values.items():
            object.__setattr__(member, name, value)
        return make_trainer(member)

    def init(key, values):  # named functions: a profile (bench/phases.py) names their programs
        return traced(values).init(key)

    def epoch(state, values):
        return traced(values).epoch(state)

    rollout = trainer.rollout and (lambda state, values: traced(values).rollout(state))
    return trainer._replace(init=init, rollout=rollout, epoch=epoch), keys, values


def lower_init(trainer, keys, values, config, script: str, n_devices: int):
    """`init` lowered for `keys` and `values` (its output shapes are the state's template); with
    --sweep, the epoch traced too.

    The values are traced numbers: a script that reads a swept flag outside
    the compiled math (to choose a branch) cannot sweep it in one program.
    """
    init = devices.map_init(trainer.init)
    try:
        lowered = init.lower(keys, values)
        if config.sweep:
            jax.eval_shape(
                devices.map_epoch(trainer.epoch, n_devices, n_mapped=2), lowered.out_info, values
            )
    except jax.errors.JAXTypeError as error:
        if not config.sweep:
            raise
        raise cli.ConfigError(
            f"--sweep {' '.join(config.sweep)}: {script} uses "
            f"{', '.join(cli.sweep_members(config)[0])} outside the compiled math (e.g. to choose "
            f"a branch), so it cannot be swept in one program; run one process per value (e.g. a "
            f"wandb sweep, sweeps/). ({type(error).__name__})"
        ) from None
    return lowered
