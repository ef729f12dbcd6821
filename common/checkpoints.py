"""Checkpoints: the whole runner state in `checkpoints/epoch_NNNNNN.npz`, and a saved run's greedy
policy.

A checkpoint holds every leaf of the state (params, optimiser, environments,
keys, observation statistics) as a NumPy array `leaf_NNNNN`, and `meta`: the
epoch, the state's tree structure and each leaf's shape and dtype. It is
written to a temporary file and renamed (a crash leaves the last good one), no
pickle; `run.train` saves a finite state only. `load` checks the file against
the state the script builds now, leaf by leaf, so a checkpoint of other flags,
of another script or of an older layout of this script's state is refused
with a message, before anything compiles.

    act = checkpoints.load_agent("runs/awr-...", awr.Config, awr.make_trainer)
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import json
import os
import sys
import zipfile
from pathlib import Path
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from common import cli, devices, sweep


def save(directory: Path, state, epoch: int, keep: int = cli.RunConfig.keep_checkpoints) -> Path:
    """Writes the whole state atomically (temporary file, then rename); keeps the newest `keep`."""
    directory.mkdir(parents=True, exist_ok=True)
    leaves, treedef = jax.tree.flatten(jax.device_get(state))
    meta = {
        "epoch": epoch,
        "treedef": str(treedef),
        "leaves": [[list(np.shape(x)), str(np.asarray(x).dtype)] for x in leaves],
    }
    arrays = {f"leaf_{i:05d}": np.asarray(x) for i, x in enumerate(leaves)}
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    path = directory / f"epoch_{epoch:06d}.npz"
    tmp = directory / f".tmp_{epoch:06d}.npz"
    try:
        with open(tmp, "wb") as fh:
            # MinAtar's replay of sparse 0/1 observations: ~70x smaller
            np.savez_compressed(fh, **arrays)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:  # the last good checkpoint stays; no half-written file is left
        tmp.unlink(missing_ok=True)
        raise
    for old in sorted(directory.glob("epoch_*.npz"))[:-keep]:
        old.unlink()
    return path


def non_finite(state) -> list[str]:
    """The paths of the state's floating-point leaves holding a NaN or an infinity."""
    return [
        jax.tree_util.keystr(path)
        for path, x in jax.tree_util.tree_leaves_with_path(state)
        if np.issubdtype(np.asarray(x).dtype, np.inexact) and not np.isfinite(x).all()
    ]


# A policy parameter larger than this in magnitude marks a run that diverged before its values
# became inf or NaN: a checkpoint with such parameters is finite but not a state worth resuming from
# (initializations and trained networks stay many orders of magnitude below it).
DIVERGED_PARAMETER = 1e6


def divergence_advice(
    config, saved: Path | None, run_dir: Path, largest_parameter: float = 0.0
) -> str:
    """What to do after a divergence: --resume with a lower learning rate, or without a good
    checkpoint a new run.

    `largest_parameter` is the largest magnitude among the policy's parameters in `saved`.
    """
    lower = " ".join(
        f"{cli.flag_name(k)} {getattr(config, k) / 10:.3g}"
        for k in cli.float_flags(type(config))
        if "lr" in k.split("_")
    )
    if saved is None:
        return (
            f"No checkpoint was saved: start a new run with a lower learning rate ({lower}) or a "
            "--max-grad-norm."
        )
    if largest_parameter > DIVERGED_PARAMETER:
        return (
            f"The newest checkpoint, {saved}, is finite but its policy's parameters reach "
            f"{largest_parameter:.3g}: it had diverged already. Start a new run with a lower "
            f"learning rate ({lower}) or a --max-grad-norm: --out-dir {run_dir} --overwrite, or "
            "another --out-dir."
        )
    floats = ", ".join(map(cli.flag_name, cli.float_flags(type(config))))
    return (
        f"Last good checkpoint: {saved}. Continue from it with a lower learning rate: --resume "
        f"{run_dir} {lower} (--resume takes the float flags: {floats}, and records the change in "
        f"{run_dir / 'changes.jsonl'}); or start a new run."
    )


def latest(directory: Path) -> Path | None:
    """The newest checkpoint in `directory` (None: none)."""
    found = sorted(directory.glob("epoch_*.npz"))
    return found[-1] if found else None


class Corrupt(cli.ConfigError):
    """A checkpoint file that cannot be read: cut short, overwritten, not a checkpoint."""


def load(path: Path, template):
    """`(state, epoch)` from `path`, checked leaf by leaf against `template` (shapes/dtypes)."""
    fix = (
        "resume with the run's own flags (they are read from its config.json) or start a new "
        "--out-dir"
    )
    meta, leaves = _read(path, leaves=True)
    want, treedef = jax.tree.flatten(template)
    saved_treedef = meta["treedef"]
    if str(treedef) != saved_treedef:
        older = _from_older_layout(template, saved_treedef, leaves, int(meta["epoch"]))
        if older is not None:
            leaves, saved_treedef = older, str(treedef)
    # e.g. obs_stats beside the state, not in it
    if len(want) != len(leaves) or str(treedef) != saved_treedef:
        raise cli.ConfigError(
            f"checkpoint {path} holds a different state structure than this script builds: it "
            f"was written by an older layout of this script's state (or with other flags, or by "
            f"another script); start a new run (another --out-dir), or use the commit that wrote it"
        )
    # Every leaf is [devices, ...]; other axes may differ too (the environments are split over the
    # devices).
    saved_rows, want_rows = {got.shape[0] for got in leaves}, {w.shape[0] for w in want}
    if len(saved_rows) == 1 and len(want_rows) == 1 and saved_rows != want_rows:
        [saved], [wanted] = saved_rows, want_rows
        raise cli.ConfigError(
            f"checkpoint {path} holds the state of {saved} device(s) and this run has {wanted}: "
            f"resume with --n-devices {saved} (the devices hold the environments and seeds)"
        )
    for i, (w, got) in enumerate(zip(want, leaves)):
        if tuple(w.shape) != got.shape or np.dtype(w.dtype) != got.dtype:
            raise cli.ConfigError(
                f"checkpoint {path}: leaf {i} is {got.shape} {got.dtype}, this run expects "
                f"{tuple(w.shape)} {np.dtype(w.dtype)}; {fix}"
            )
    return jax.tree.unflatten(treedef, leaves), int(meta["epoch"])


# Parameter keys renamed to the vocabulary of the other scripts: old -> new. A checkpoint written
# before reads under the new names.
RENAMED = {"body": "torso", "head": "value"}  # dqn_value's Q-network


def _from_older_layout(template, saved_treedef: str, leaves: list, epoch: int) -> list | None:
    """The leaves of a checkpoint written by an older layout of the script's state, in the layout
    of `template`; None if `saved_treedef` is none of them. The older layouts: parameter keys
    before `RENAMED`, and a runner state without some of the fields added since: its `epoch`
    counter (it starts at the checkpoint's epoch) and its exploration `noise` (it starts at 0, as
    a new run's does). A tree structure names its NamedTuples but not their fields: a structure
    that matches, with each leaf's rank and dtype, is then checked leaf by leaf, shapes and dtypes,
    as any checkpoint is."""
    renamed = jax.tree.structure(_renamed(template, {new: old for old, new in RENAMED.items()}))
    if str(renamed) == saved_treedef:
        return jax.tree.leaves(_renamed(jax.tree.unflatten(renamed, leaves), RENAMED))
    fields = getattr(template, "_fields", ())
    added = [name for name in ("epoch", "noise") if name in fields]
    for n in range(1, len(added) + 1):
        for missing in itertools.combinations(added, n):
            rest = [name for name in fields if name not in missing]
            without = collections.namedtuple(type(template).__name__, rest)
            kept = without(*(getattr(template, name) for name in rest))
            older = jax.tree.structure(kept)
            # one missing leaf looks like another in the structure: their ranks and dtypes tell
            if str(older) != saved_treedef or [(x.ndim, x.dtype) for x in leaves] != [
                (x.ndim, x.dtype) for x in jax.tree.leaves(kept)
            ]:
                continue
            saved = jax.tree.unflatten(older, leaves)
            # [devices, runs] as the checkpoint holds them: `load` refuses another --n-devices
            lead = saved.key.shape[: template.epoch.ndim]
            fills = {}
            if "epoch" in missing:
                fills["epoch"] = np.full(lead, epoch, template.epoch.dtype)
            if "noise" in missing:
                shape = lead + template.noise.shape[len(lead) :]
                fills["noise"] = np.zeros(shape, template.noise.dtype)
            return jax.tree.leaves(type(template)(**saved._asdict(), **fills))
    return None


def _renamed(tree, names: dict):
    """`tree` with its dict keys renamed by `names` (a pytree of dicts, lists, tuples, NamedTuples;
    other nodes are left as they are)."""
    if isinstance(tree, dict):
        return {names.get(k, k): _renamed(v, names) for k, v in tree.items()}
    if isinstance(tree, tuple) and hasattr(tree, "_fields"):
        return type(tree)(*(_renamed(v, names) for v in tree))
    if isinstance(tree, (list, tuple)):
        return type(tree)(_renamed(v, names) for v in tree)
    return tree


def _read(path: Path, leaves: bool):
    """`(meta, leaves)` of the checkpoint `path` (without `leaves`: `(meta, None)`)."""
    try:
        with np.load(path, allow_pickle=False) as data:
            meta = json.loads(bytes(data["meta"]).decode())
            if not leaves:
                return meta, None
            return meta, [data[f"leaf_{i:05d}"] for i in range(len(meta["leaves"]))]
    except (OSError, KeyError, ValueError, zipfile.BadZipFile, EOFError) as error:
        raise Corrupt(
            f"checkpoint {path} is unreadable or corrupt ({error}); delete it to fall back "
            f"to an older one, or start a new --out-dir"
        ) from None


def load_newest(directory: Path, template):
    """`(state, epoch)` from the newest readable checkpoint in `directory`, saying which ones it
    skips."""
    found = sorted(directory.glob("epoch_*.npz"), reverse=True)
    cli.require(bool(found), f"no checkpoint in {directory}")
    for path in found:
        try:
            return load(path, template)
        except Corrupt as error:
            print(f"warning: {error}", file=sys.stderr, flush=True)
    raise cli.ConfigError(
        f"every checkpoint in {directory} is unreadable or corrupt; start a new --out-dir"
    )


def resume(run_dir: Path, template, hosts: int):
    """`(epoch, state)` for --resume: the run's newest readable checkpoint, this host's part
    (`template`'s shapes).

    The checkpoint holds every host's devices: `hosts` times the rows of `template`.
    """
    whole = jax.tree.map(
        lambda s: jax.ShapeDtypeStruct((hosts * s.shape[0],) + s.shape[1:], s.dtype), template
    )
    cli.require(
        latest(run_dir / "checkpoints") is not None,
        f"--resume {run_dir}: no checkpoint in {run_dir / 'checkpoints'}, the run stopped before "
        f"its first; start it again with its flags and --out-dir {run_dir} --overwrite",
    )
    try:
        state, epoch = load_newest(run_dir / "checkpoints", whole)
    except cli.ConfigError as error:
        raise cli.ConfigError(f"--resume {run_dir}: {error}") from None
    return epoch, devices.this_host(state)


# ----------------------------------------------------------------------------
# A saved run's policy
# ----------------------------------------------------------------------------
def load_policy(run_dir: Path, config, make_trainer: Callable, n_devices: int):
    """`(trainer, policy, epoch)` of a saved run's newest checkpoint: `make_trainer(config)` for the
    run's `n_devices` (every host's) and every run's policy as device 0 holds it, `[runs, ...]`."""
    config = dataclasses.replace(config, n_devices=n_devices)
    trainer, values = sweep.build(config, make_trainer, n_devices)
    keys, _ = jax.eval_shape(lambda: sweep.run_keys(0, config, n_devices))
    template = jax.eval_shape(devices.map_init(trainer.init), keys, values)
    state, epoch = load(latest(run_dir / "checkpoints"), template)
    return trainer, devices.unreplicate(trainer.policy(state)), epoch


def load_agent(run_dir, config_cls, make_trainer: Callable, seed: int | None = None) -> Callable:
    """The greedy policy of a saved run: `act(obs, key=None) -> action`.

    `obs` is one observation of the environment, or a batch `[N, *obs_shape]`, as gymnax returns it
    (a Discrete observation as its index: `act` encodes it as training did); the action keeps the
    batch axis. A run of several seeds (`--num-seeds`) gives actions of every seed, `[num_seeds,
    ...]` (with `--sweep`, member-major: `[members * num_seeds, ...]`), unless `seed` picks one. A
    policy that reads a window of past observations (skip_transformer) gives a `WindowAgent`,
    `act(obs, key=None, first=False)`.

        act = checkpoints.load_agent("runs/awr-...", awr.Config, awr.make_trainer)
    """
    run_dir = Path(run_dir)
    config = cli.load_config(config_cls, run_dir)
    ckpt = latest(run_dir / "checkpoints")
    cli.require(ckpt is not None, f"{run_dir}: no checkpoint in {run_dir / 'checkpoints'}")
    # the state's leading axis: the run's devices
    n_devices = _read(ckpt, leaves=False)[0]["leaves"][0][0][0]
    trainer, params, _ = load_policy(run_dir, config, make_trainer, n_devices)
    runs = sweep.n_runs(config)
    if seed is not None or runs == 1:
        cli.require(
            0 <= (seed or 0) < runs, f"seed={seed}: the run has {runs} seed(s) (x sweep members)"
        )
        params = jax.tree.map(lambda x: x[seed or 0], params)
    # the env's observations are windows (see Trainer): act reads those
    windowed = hasattr(trainer.env, "window_shape")
    obs_ndim = len(
        trainer.env.window_shape
        if windowed
        else trainer.env.observation_space(trainer.env_params).shape
    )

    @jax.jit
    def greedy(obs, key):
        def act(p, o):
            return trainer.act(p, o, key)

        if obs.ndim > obs_ndim:  # a batch
            act = jax.vmap(act, (None, 0))
        if seed is None and runs > 1:
            act = jax.vmap(act, (0, None))
        return act(params, obs)

    # the environment's own observations, as trained on
    encode = getattr(trainer.env, "encode", lambda obs: obs)

    def act(obs, key=None):
        return greedy(encode(jnp.asarray(obs)), jax.random.PRNGKey(0) if key is None else key)

    return WindowAgent(act, trainer.env) if windowed else act


class WindowAgent:
    """`load_agent`'s policy for a run whose policy reads a window of past observations
    (skip_transformer).

        agent = checkpoints.load_agent("runs/skip_transformer-...", skip_transformer.Config,
                                       skip_transformer.make_trainer)
        action = agent(obs, first=True)  # obs starts an episode
        action = agent(obs)              # ... and continues it

    `agent(obs, key=None, first=False)` takes the observations of the wrapped
    gymnax environment (one, or a batch `[N, *obs_shape]` of N environments),
    adds each to its environment's window and returns the greedy actions on the
    windows, as `load_agent`'s `act` (every seed, `[num_seeds, ...]`, or `seed`).
    `first` (a bool, or one per environment) says that `obs` starts an episode:
    its window is cleared first, as training clears it at an episode end. With
    gymnax's automatic resets pass the `terminated | truncated` of the step that
    gave `obs`. The windows (`agent.windows`, `[N, L, F + 1]`) are kept between
    calls; a new agent, or `reset()`, starts them empty. They hold observations
    only, so every seed reads the same ones: to run each seed in its own
    environments, load one agent per seed (`seed=i`).
    """

    def __init__(self, act: Callable, env):
        self._act, self._env, self.windows = act, env, None
        self._observe = jax.jit(env.observe)
        self._observe_batch = jax.jit(jax.vmap(env.observe))

    def reset(self) -> None:
        """Forgets every window (e.g. to act on another number of environments)."""
        self.windows = None

    def __call__(self, obs, key=None, first=False):
        obs = jnp.asarray(obs)
        batch = obs.shape[: obs.ndim - len(self._env.raw_obs_shape)]
        if self.windows is None:
            self.windows = jnp.zeros(batch + self._env.window_shape, jnp.float32)
        cli.require(
            self.windows.shape[:-2] == batch,
            f"obs holds observations of {batch or 'one'} environment(s), "
            f"the agent's windows {self.windows.shape[:-2] or 'one'}; "
            f"call reset() first to act on another number",
        )
        first = jnp.broadcast_to(jnp.asarray(first, bool), batch)
        self.windows = (self._observe_batch if batch else self._observe)(self.windows, obs, first)
        return self._act(self.windows, key)
