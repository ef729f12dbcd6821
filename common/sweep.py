"""The in-process sweep: `--sweep lr=1e-3,3e-4` trains every member's seeds in one program.

The runner state's seed axis holds `n_runs(config)` runs, member-major: the
`--num-seeds` seeds of member 0, then of member 1, ... Seed i of every member
starts from the key of seed i of a run without the sweep and is evaluated on
its episodes (`eval_keys`), so members meet on equal terms. Each (device, seed)
slice of the state carries its member's values, and the trainer is made again
inside the compiled program with them as traced numbers (`build`).
"""
from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any, Callable

import jax
import jax.numpy as jnp

from common import cli, devices

if TYPE_CHECKING:
    from common.run import Trainer


def n_runs(config) -> int:
    """Seeds x sweep members: the length of the runner state's seed axis."""
    return config.num_seeds * len(cli.sweep_members(config))


def eval_keys(key, config):
    """One evaluation key per run; every sweep member meets the episodes of a run without the sweep."""
    return jnp.tile(jax.random.split(key, config.num_seeds), (len(cli.sweep_members(config)), 1))


def build(config, make_trainer: Callable, n_devices: int, init_key) -> tuple[Trainer, Any]:
    """The run's trainer and the keys its `init` maps over: `[n_devices, n_runs(config)]`.

    `config.n_devices` counts the run's devices (every host's); `n_devices`
    this host's. With `--sweep`, seed i of every member starts from the key of
    seed i of a run without it (paired comparison), and each (device, seed)
    slice of the state carries its member's values: the trainer is made again
    inside the compiled program with them as traced numbers.
    """
    trainer = make_trainer(config)
    keys = devices.seed_keys(init_key, config.num_seeds, n_devices)
    if not config.sweep:
        return trainer, keys
    members = cli.sweep_members(config)
    values = {name: jnp.broadcast_to(jnp.repeat(jnp.asarray([m[name] for m in members], jnp.float32),
                                                config.num_seeds), (n_devices, n_runs(config)))
              for name in members[0]}

    def member(values):
        member_config = copy.copy(config)  # frozen dataclass: set the traced values without validation
        for name, value in values.items():
            object.__setattr__(member_config, name, value)
        return make_trainer(member_config)

    def init(inputs):
        key, values = inputs
        return member(values).init(key), values

    def epoch(state):
        inner, values = state
        inner, metrics = member(values).epoch(inner)
        return (inner, values), metrics

    swept = trainer._replace(init=init, epoch=epoch, policy=lambda state: trainer.policy(state[0]))
    return swept, (jnp.tile(keys, (1, len(members), 1)), values)


def lower_init(trainer, keys, config, script: str, n_devices: int):
    """`init` lowered for `keys` (its output shapes are the state's template); with --sweep, the epoch traced too.

    A member's values are traced numbers: a script that reads a swept flag
    outside the compiled math (to choose a branch) cannot sweep it in one program.
    """
    init = devices.map_init(trainer.init)
    try:
        lowered = init.lower(keys)
        if config.sweep:
            jax.eval_shape(devices.map_epoch(trainer.epoch, n_devices), lowered.out_info)
    except jax.errors.JAXTypeError as error:
        if not config.sweep:
            raise
        raise cli.ConfigError(f"--sweep {' '.join(config.sweep)}: {script} uses "
                              f"{', '.join(cli.sweep_members(config)[0])} outside the compiled math (e.g. to choose "
                              f"a branch), so it cannot be swept in one program; run one process per value (e.g. a "
                              f"wandb sweep, sweeps/). ({type(error).__name__})") from None
    return lowered
