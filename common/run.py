"""Everything a run does once: CLI, outputs, progress, wandb, checkpoints, the epoch loop.

A script defines a frozen `Config` (a subclass of `RunConfig`) and a
`make_trainer(config) -> Trainer`; `main(Config, make_trainer)` does the rest.

What a run writes in `--out-dir DIR`:
- `config.json`: the full config, enough to rebuild the run.
- `metrics.jsonl`: one JSON object per epoch (`epoch`, `env_steps`, `sps`,
  `episode/*`, the algorithm's own keys, `eval/return` when evaluated).
- `summary.json`: at the end: `eval_return` (mean greedy return over
  `--eval-episodes`, and per seed), `env_steps`, `wall_time_s`,
  `compile_time_s`, `sps` (env steps per second after compilation, all seeds).
- `checkpoints/epoch_NNNNNN.npz`: the whole runner state (params, optimiser,
  environments, keys), written to a temporary file and renamed, no pickle.

On several hosts (`--coordinator`, see `devices.init_distributed`) every host
runs the same programs in the same order; only the chief (process 0) writes,
and a checkpoint holds every host's devices.
"""
from __future__ import annotations

import argparse
import ast
import copy
import dataclasses
import inspect
import itertools
import json
import math
import os
import signal
import sys
import threading
import time
import typing
import warnings
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from common import devices
from common.envs import evaluate


# ----------------------------------------------------------------------------
# Config and CLI
# ----------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class RunConfig:
    """Flags every script shares. Scripts subclass it with their own fields."""

    env: str = "CartPole-v1"
    """gymnax environment id"""
    seed: int = 0
    """random seed (runs with the same seed and flags are identical)"""
    num_seeds: int = 1
    """independent seeds trained side by side in one compiled program"""
    n_devices: int = 0
    """devices to split the environments over (0: all local devices)"""
    total_steps: int = 500_000
    """environment steps to train for (per seed)"""
    eval_every: int = 50
    """greedy evaluation every this many epochs (0: only at the end)"""
    eval_episodes: int = 32
    """episodes per greedy evaluation"""
    checkpoint_every: int = 50
    """save a checkpoint every this many epochs (and at the end, and on Ctrl-C)"""
    out_dir: str = ""
    """run directory; empty: runs/SCRIPT-ENV-seedSEED-TIME"""
    resume: str = ""
    """run directory to continue from its last checkpoint, with its config.json; empty: a new run"""
    eval_only: bool = False
    """with --resume: only evaluate the saved agent"""
    track: bool = False
    """log to Weights & Biases (offline when no API key is set)"""
    wandb_project: str = "jtrax"
    """wandb project name"""
    no_compile_cache: bool = False
    """do not use JAX's persistent compilation cache"""
    coordinator: str = ""
    """multi-host: HOST:PORT of process 0, JAX's coordinator (empty: $JTRAX_COORDINATOR; neither: one process)"""
    num_processes: int = 0
    """multi-host: number of processes, one per host (0: $JTRAX_NUM_PROCESSES)"""
    process_id: int = -1
    """multi-host: this process in [0, num-processes); 0, the chief, alone writes (-1: $JTRAX_PROCESS_ID)"""
    coordinator_timeout: int = 120
    """multi-host: seconds to wait for the coordinator and for every process to join"""
    sweep: tuple[str, ...] = ()
    """in-process sweep of float flags, NAME=V1,V2,... (e.g. --sweep lr=1e-3,3e-4 ent_coef=0,0.01: their grid);
    each member trains --num-seeds seeds, all in one compiled program"""

    def __post_init__(self):
        _require(self.num_seeds >= 1, f"--num-seeds {self.num_seeds}: use 1 or more")
        _require(self.n_devices >= 0, f"--n-devices {self.n_devices}: use 0 (all) or a positive count")
        _require(self.total_steps > 0, f"--total-steps {self.total_steps}: use a positive number")
        _require(self.eval_every >= 0, f"--eval-every {self.eval_every}: use 0 or more")
        _require(self.eval_episodes >= 1, f"--eval-episodes {self.eval_episodes}: use 1 or more")
        _require(self.checkpoint_every >= 1, f"--checkpoint-every {self.checkpoint_every}: use 1 or more")
        _require(not self.eval_only or self.resume, "--eval-only needs --resume DIR (the run to evaluate)")
        for member in sweep_members(self) if self.sweep else ():  # every member's flags must be valid
            dataclasses.replace(self, sweep=(), **member)


def sweep_members(config) -> list[dict]:
    """The grid of `--sweep`: one `{flag: value}` per member, in order (`[{}]` without a sweep)."""
    floats = sorted(k for k, v in typing.get_type_hints(type(config)).items() if v is float)
    axes: dict[str, list[float]] = {}
    for item in config.sweep:
        name, _, text = item.partition("=")
        name = name.lstrip("-").replace("-", "_")
        _require(bool(text), f"--sweep {item!r}: use NAME=V1,V2,..., e.g. --sweep lr=1e-3,3e-4")
        _require(name in floats, f"--sweep {item!r}: {name} is not a float flag of this script; "
                                 f"sweep one of {', '.join(floats)}")
        _require(name not in axes, f"--sweep {item!r}: {name} is swept twice; give its values once")
        try:
            axes[name] = [float(v) for v in text.split(",")]
        except ValueError:
            raise ValueError(f"--sweep {item!r}: {text!r} holds a value that is not a number") from None
    return [dict(zip(axes, values)) for values in itertools.product(*axes.values())]


def n_runs(config) -> int:
    """Seeds x sweep members: the length of the runner state's seed axis."""
    return config.num_seeds * len(sweep_members(config))


def eval_keys(key, config):
    """One evaluation key per run; every sweep member meets the episodes of a run without the sweep."""
    return jnp.tile(jax.random.split(key, config.num_seeds), (len(sweep_members(config)), 1))


# Flags that steer this invocation rather than define the run: on --resume they
# come from the command line, everything else from the run's config.json.
RUN_CONTROL = ("resume", "eval_only", "track", "no_compile_cache", "eval_episodes", "n_devices",
               "coordinator", "num_processes", "process_id", "coordinator_timeout")


# XLA options for programs that run rarely (init, evaluation): a quicker compile.
FAST_COMPILE = {"xla_backend_optimization_level": 0}


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


def field_docs(cls) -> dict[str, str]:
    """Attribute docstrings (the string after each field) of a dataclass and its bases."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        try:
            tree = ast.parse(inspect.getsource(klass).lstrip())
        except (OSError, TypeError):
            continue
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for node, nxt in zip(body, body[1:]):
            if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                    and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)):
                docs[node.target.id] = str(nxt.value.value).strip()
    return docs


def _parse_bool(text: str) -> bool:
    if text.lower() in ("1", "true", "yes"):
        return True
    if text.lower() in ("0", "false", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _list_of(item: type) -> Callable:
    """Parses `64` or a list as Python prints it, `[64, 64]`, into a list of `item` (str: as given)."""
    def parse(text: str) -> list:
        if item is str:
            return [text]
        try:
            return [item(part) for part in text.replace("[", " ").replace("]", " ").replace(",", " ").split()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {item.__name__} values, got {text!r}") from None
    return parse


class _Concatenate(argparse.Action):
    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, tuple(x for value in values for x in value))


def build_parser(cls, description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=description, formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    docs, hints = field_docs(cls), typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        kind = hints[f.name]
        if kind is bool:  # `--flag` or `--flag=True/False` (as a wandb agent passes it)
            spec = dict(type=_parse_bool, nargs="?", const=True, metavar="BOOL")
        elif typing.get_origin(kind) is typing.Literal:
            spec = dict(choices=typing.get_args(kind))
        elif typing.get_origin(kind) is tuple:  # `--hidden 64 64` or `--hidden=[64, 64]` (a wandb agent)
            item = typing.get_args(kind)[0]
            spec = dict(type=_list_of(item), nargs="+", action=_Concatenate, metavar=item.__name__.upper())
        else:
            spec = dict(type=kind, metavar=kind.__name__.upper())
        parser.add_argument(f"--{f.name.replace('_', '-')}", dest=f.name, default=f.default,
                            help=docs.get(f.name, f.name), **spec)
        if "_" in f.name:  # snake_case alias, hidden from --help
            parser.add_argument(f"--{f.name}", dest=f.name, help=argparse.SUPPRESS, **spec)
    return parser


def parse_config(cls, argv=None, description: str = ""):
    """Config from the command line; a bad value exits with its message, before any compile."""
    parser = build_parser(cls, description)
    args = vars(parser.parse_args(argv))
    try:
        if args["resume"]:
            saved = load_config(cls, Path(args["resume"]))
            for f in dataclasses.fields(cls):
                given = tuple(args[f.name]) if isinstance(args[f.name], list) else args[f.name]
                if f.name not in RUN_CONTROL and given != f.default and given != getattr(saved, f.name):
                    print(f"warning: --resume ignores --{f.name.replace('_', '-')} {given}; the run's "
                          f"config.json sets it to {getattr(saved, f.name)}", file=sys.stderr)
            config = dataclasses.replace(saved, **{k: args[k] for k in RUN_CONTROL},
                                         out_dir=args["resume"])
        else:
            config = cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in args.items()})
    except ValueError as error:
        parser.error(str(error))
    return config


def load_config(cls, run_dir: Path):
    path = run_dir / "config.json"
    if not path.is_file():
        raise ValueError(f"--resume {run_dir}: no config.json there; pass the directory of an earlier run")
    saved = json.loads(path.read_text())
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = set(saved) - names
    if unknown:
        raise ValueError(f"--resume {run_dir}: config.json has flags this script does not know "
                         f"({', '.join(sorted(unknown))}); was it written by another script?")
    return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in saved.items()})


# ----------------------------------------------------------------------------
# What a script provides
# ----------------------------------------------------------------------------
class Trainer(NamedTuple):
    """An algorithm, as pure functions of one (device, seed) slice of the runner state.

    `init(key) -> state` and `epoch(state) -> (state, metrics)` run under
    `devices.compile_epoch`; `epoch` must average gradients over
    `devices.DEVICE_AXIS`. `act(params, obs, key)` is the greedy action for one
    observation; `params(state)` picks what `act` needs out of the state. An `env`
    that observes through a window of past observations (skip_transformer's
    `ContextWindow`) has `observe(window, obs, first) -> window`, `window_shape`
    and `raw_obs_shape`, so that `load_agent` can keep windows for a caller.
    """

    init: Callable
    epoch: Callable
    act: Callable
    params: Callable
    env: Any
    env_params: Any
    steps_per_epoch: int  # environment steps of one seed in one epoch, all devices
    num_epochs: int  # every `loss/*` metric must stay finite


# ----------------------------------------------------------------------------
# Checkpoints
# ----------------------------------------------------------------------------
def save_checkpoint(directory: Path, state, epoch: int) -> Path:
    """Writes the whole state atomically (temporary file, then rename); keeps the newest."""
    directory.mkdir(parents=True, exist_ok=True)
    leaves, treedef = jax.tree.flatten(jax.device_get(state))
    meta = {"epoch": epoch, "treedef": str(treedef),
            "leaves": [[list(np.shape(x)), str(np.asarray(x).dtype)] for x in leaves]}
    arrays = {f"leaf_{i:05d}": np.asarray(x) for i, x in enumerate(leaves)}
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    path = directory / f"epoch_{epoch:06d}.npz"
    tmp = directory / f".tmp_{epoch:06d}.npz"
    try:
        with open(tmp, "wb") as fh:
            np.savez(fh, **arrays)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:  # the last good checkpoint stays; no half-written file is left
        tmp.unlink(missing_ok=True)
        raise
    for old in directory.glob("epoch_*.npz"):
        if old != path:
            old.unlink()
    return path


def latest_checkpoint(directory: Path) -> Path | None:
    found = sorted(directory.glob("epoch_*.npz"))
    return found[-1] if found else None


def load_checkpoint(path: Path, template):
    """`(state, epoch)` from `path`, checked leaf by leaf against `template` (shapes/dtypes)."""
    fix = "resume with the run's own flags (they are read from its config.json) or start a new --out-dir"
    try:
        with np.load(path, allow_pickle=False) as data:
            meta = json.loads(bytes(data["meta"]).decode())
            leaves = [data[f"leaf_{i:05d}"] for i in range(len(meta["leaves"]))]
    except (OSError, KeyError, ValueError, zipfile.BadZipFile, EOFError) as error:
        raise ValueError(f"checkpoint {path} is unreadable or corrupt ({error}); "
                         f"delete it to fall back to none, or start a new --out-dir") from None
    want, treedef = jax.tree.flatten(template)
    if len(want) != len(leaves) or str(treedef) != meta["treedef"]:
        raise ValueError(f"checkpoint {path} holds a different state structure than this script builds; {fix}")
    for i, (w, got) in enumerate(zip(want, leaves)):
        if tuple(w.shape) != got.shape or np.dtype(w.dtype) != got.dtype:
            raise ValueError(f"checkpoint {path}: leaf {i} is {got.shape} {got.dtype}, this run expects "
                             f"{tuple(w.shape)} {np.dtype(w.dtype)}; {fix}")
    return jax.tree.unflatten(treedef, leaves), int(meta["epoch"])


def load_agent(run_dir, config_cls, make_trainer: Callable, seed: int | None = None) -> Callable:
    """The greedy policy of a saved run: `act(obs, key=None) -> action`.

    `obs` is one observation or a batch `[N, *obs_shape]`; the action keeps the
    batch axis. A run of several seeds (`--num-seeds`) gives actions of every seed,
    `[num_seeds, ...]` (with `--sweep`, member-major: `[members * num_seeds, ...]`),
    unless `seed` picks one. A policy that reads a window of past observations
    (skip_transformer) gives a `WindowAgent`, `act(obs, key=None, first=False)`.

        act = run.load_agent("runs/awr-...", awr.Config, awr.make_trainer)
    """
    run_dir = Path(run_dir)
    config = load_config(config_cls, run_dir)
    ckpt = latest_checkpoint(run_dir / "checkpoints")
    if ckpt is None:
        raise ValueError(f"{run_dir}: no checkpoint in {run_dir / 'checkpoints'}")
    with np.load(ckpt, allow_pickle=False) as data:  # the state's leading axis counts the run's devices
        n_devices = json.loads(bytes(data["meta"]).decode())["leaves"][0][0][0]
    trainer, keys = build(dataclasses.replace(config, n_devices=n_devices), make_trainer, n_devices,
                          jax.random.PRNGKey(0))
    state, _ = load_checkpoint(ckpt, jax.eval_shape(devices.compile_init(trainer.init), keys))
    params = jax.tree.map(lambda x: x[0], trainer.params(state))  # as held by device 0: [runs, ...]
    runs = n_runs(config)
    if seed is not None or runs == 1:
        _require(0 <= (seed or 0) < runs, f"seed={seed}: the run has {runs} seed(s) (x sweep members)")
        params = jax.tree.map(lambda x: x[seed or 0], params)
    windowed = hasattr(trainer.env, "window_shape")  # the env's observations are windows (see Trainer): act reads those
    obs_ndim = len(trainer.env.window_shape if windowed else trainer.env.observation_space(trainer.env_params).shape)

    @jax.jit
    def greedy(obs, key):
        act = lambda p, o: trainer.act(p, o, key)  # noqa: E731
        if obs.ndim > obs_ndim:  # a batch
            act = jax.vmap(act, (None, 0))
        if seed is None and runs > 1:
            act = jax.vmap(act, (0, None))
        return act(params, obs)

    act = lambda obs, key=None: greedy(jnp.asarray(obs), jax.random.PRNGKey(0) if key is None else key)  # noqa: E731
    return WindowAgent(act, trainer.env) if windowed else act


class WindowAgent:
    """`load_agent`'s policy for a run whose policy reads a window of past observations (skip_transformer).

        agent = run.load_agent("runs/skip_transformer-...", skip_transformer.Config, skip_transformer.make_trainer)
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
        batch = obs.shape[:obs.ndim - len(self._env.raw_obs_shape)]
        if self.windows is None:
            self.windows = jnp.zeros(batch + self._env.window_shape, jnp.float32)
        _require(self.windows.shape[:-2] == batch, f"obs holds observations of {batch or 'one'} environment(s), "
                                                   f"the agent's windows {self.windows.shape[:-2] or 'one'}; "
                                                   f"call reset() first to act on another number")
        first = jnp.broadcast_to(jnp.asarray(first, bool), batch)
        self.windows = (self._observe_batch if batch else self._observe)(self.windows, obs, first)
        return self._act(self.windows, key)


# ----------------------------------------------------------------------------
# Logging
# ----------------------------------------------------------------------------
class Logger:
    """Metrics to the console (throttled), `metrics.jsonl` and, with --track, wandb."""

    def __init__(self, config, run_dir: Path, is_chief: bool, start_epoch: int):
        self.is_chief, self.wandb = is_chief, None
        self.last_print, self.last_return = 0.0, float("nan")
        self.path = run_dir / "metrics.jsonl"
        if is_chief and self.path.exists():  # resuming: drop epochs after the checkpoint
            kept = [l for l in self.path.read_text().splitlines() if json.loads(l)["epoch"] <= start_epoch]
            self.path.write_text("".join(l + "\n" for l in kept))
        if is_chief and config.track:
            self._start_wandb(config, run_dir)

    def _start_wandb(self, config, run_dir: Path) -> None:
        try:
            import wandb

            online = os.environ.get("WANDB_API_KEY") or (Path.home() / ".netrc").exists()
            mode = os.environ.get("WANDB_MODE", "online" if online else "offline")
            self.wandb = wandb.init(project=config.wandb_project, config=dataclasses.asdict(config),
                                    dir=str(run_dir), mode=mode, name=run_dir.name)
        except Exception as error:  # wandb must never stop training
            print(f"wandb disabled: {error}", file=sys.stderr)

    def log(self, record: dict, force_print: bool = False) -> None:
        if not self.is_chief:
            return
        finite = lambda v: None if isinstance(v, float) and not math.isfinite(v) else v  # noqa: E731
        clean = {k: [finite(x) for x in v] if isinstance(v, list) else finite(v) for k, v in record.items()}
        with open(self.path, "a") as fh:
            fh.write(json.dumps(clean) + "\n")
        if self.wandb is not None:
            try:
                self.wandb.log({k: v for k, v in record.items() if not isinstance(v, list)}, step=record["env_steps"])
            except Exception as error:
                print(f"wandb disabled: {error}", file=sys.stderr)
                self.wandb = None
        if math.isfinite(record["episode/return"]):
            self.last_return = record["episode/return"]
        now = time.time()
        if force_print or now - self.last_print >= 1.0:
            self.last_print = now
            # return: of the latest epoch in which an episode ended
            line = (f"epoch {record['epoch']:>5} | steps {record['env_steps']:>10,} | "
                    f"sps {record['sps']:>9,.0f} | return {self.last_return:8.2f}")
            if "eval/return" in record:
                line += f" | eval {record['eval/return']:8.2f}"
            print(line, flush=True)

    def close(self, summary: dict) -> None:
        if self.wandb is not None:
            try:
                self.wandb.summary.update(summary)
                self.wandb.finish()
            except Exception as error:
                print(f"wandb disabled: {error}", file=sys.stderr)


class _StopOnInterrupt:
    """Ctrl-C finishes the running epoch, then stops with a checkpoint; a second Ctrl-C stops at once.

    (An epoch interrupted half-way would leave the donated runner state deleted.)
    """

    requested = False

    def __enter__(self):
        self.previous = None
        if threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, *_):
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        print("\nstopping after this epoch (Ctrl-C again to abort without saving)", flush=True)

    def __exit__(self, *_):
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)


def enable_compile_cache() -> None:
    """JAX's persistent compilation cache in a user cache directory."""
    root = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    jax.config.update("jax_compilation_cache_dir", str(root / "jtrax" / "jax"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def _records(metrics, n: int) -> list[dict]:
    """`[n_devices, num_seeds, epochs]` metrics -> one dict of floats per epoch.

    Device 0 (metrics agree across devices), mean over seeds (`episode/return`
    also seed by seed, as `episode/return_per_seed`). Seeds with no
    finished episode in an epoch (NaN `episode/*`) are left out of that mean;
    any other NaN (a diverged seed) stays NaN.
    """
    host = {k: np.asarray(v)[0, :, :n] for k, v in jax.device_get(metrics).items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # nanmean of all-NaN
        records = [{k: float(np.nanmean(v[:, j]) if k.startswith("episode/") else np.mean(v[:, j]))
                    for k, v in host.items()} for j in range(n)]
    if "episode/return" in host:  # each seed's too (for the spread in common.plot)
        for j, record in enumerate(records):
            record["episode/return_per_seed"] = host["episode/return"][:, j].tolist()
    return records


def epochs_per_call(steps_per_epoch: int, num_epochs: int) -> int:
    """Epochs run by one compiled call: about 64k environment steps, at most 64.

    Each call costs a dispatch and a metrics transfer (milliseconds on a CPU),
    as much as a small epoch; grouping epochs amortises it.
    """
    return int(min(num_epochs, 64, max(1, 65_536 // steps_per_epoch)))


def chunk_epochs(epoch: Callable, k: int) -> Callable:
    """`fn(state, n) -> (state, metrics [k, ...])` running `epoch` n <= k times.

    One program serves every n: a `lax.scan` over k slots, slot i runs the epoch
    iff i < n. The predicate is the same for every device and seed (not
    batched), so `lax.cond` truly skips the unused slots.
    """

    def run_n(state, n):
        shapes = jax.eval_shape(epoch, state)[1]
        skip = lambda s: (s, jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), shapes))  # noqa: E731
        return jax.lax.scan(lambda s, i: jax.lax.cond(i < n, epoch, skip, s), state, jnp.arange(k))

    return run_n


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
    members = sweep_members(config)
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

    swept = trainer._replace(init=init, epoch=epoch, params=lambda state: trainer.params(state[0]))
    return swept, (jnp.tile(keys, (1, len(members), 1)), values)


# ----------------------------------------------------------------------------
# The run
# ----------------------------------------------------------------------------
def train(config, make_trainer: Callable, script: str = "run", max_epochs: int | None = None) -> dict:
    """Trains (or, with --eval-only, evaluates) and returns the summary.

    `max_epochs` stops early after that many epochs of this call (as Ctrl-C
    would), leaving a checkpoint to --resume from.
    """
    wall_start = time.time()
    devices.init_distributed(config.coordinator, config.num_processes, config.process_id, config.coordinator_timeout)
    if not config.no_compile_cache:
        enable_compile_cache()
    is_chief, n_devices, rng = devices.init_host_and_devices(config.n_devices or None, config.seed)
    hosts = jax.process_count()
    # The flags describe the whole run: its environments and batches split over every host's devices.
    run_dir = Path(config.resume or config.out_dir or
                   f"runs/{script}-{config.env}-seed{config.seed}-{time.strftime('%Y%m%d-%H%M%S')}")
    init_key, eval_key = jax.random.split(rng)
    runs = n_runs(config)
    trainer, keys = build(dataclasses.replace(config, n_devices=n_devices * hosts), make_trainer, n_devices, init_key)

    # The state's shapes, and a resumed state, come before any compile, so that
    # a bad checkpoint fails at once.
    init = devices.compile_init(trainer.init)
    try:
        init_lowered = init.lower(keys)  # traced once: its output shapes are the template
        if config.sweep:  # the epoch too, for the error below
            jax.eval_shape(devices.compile_epoch(trainer.epoch, n_devices), init_lowered.out_info)
    except jax.errors.JAXTypeError as error:
        if not config.sweep:
            raise
        raise SystemExit(f"--sweep {' '.join(config.sweep)}: {script} uses {', '.join(sweep_members(config)[0])} "
                         f"outside the compiled math (e.g. to choose a branch), so it cannot be swept in one program; "
                         f"run one process per value (e.g. a wandb sweep, sweeps/). ({type(error).__name__})") from None
    template = init_lowered.out_info
    start_epoch, state = 0, None
    if config.resume:
        ckpt = latest_checkpoint(run_dir / "checkpoints")
        if ckpt is None:
            raise SystemExit(f"--resume {run_dir}: no checkpoint in {run_dir / 'checkpoints'}")
        whole = jax.tree.map(lambda s: jax.ShapeDtypeStruct((hosts * s.shape[0],) + s.shape[1:], s.dtype), template)
        try:
            state, start_epoch = load_checkpoint(ckpt, whole)
        except ValueError as error:
            raise SystemExit(str(error)) from None
        state = devices.this_host(state)
        print(f"resumed {run_dir} at epoch {start_epoch}", flush=True)
    elif is_chief:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.json").write_text(json.dumps(dataclasses.asdict(config), indent=2) + "\n")

    # Init and evaluation run rarely: they compile unoptimised, on a second
    # thread, while this one compiles the epochs.
    t0 = time.time()
    act = jax.vmap(lambda params, key: evaluate(trainer.env, trainer.env_params, trainer.act, params,
                                                key, config.eval_episodes))
    evaluate_seeds = jax.jit(lambda params, key: act(params, eval_keys(key, config)))

    def first_device(state):  # the parameters of every seed (and member), as held by device 0: [runs, ...]
        return jax.device_put(trainer.params(devices.unreplicate(state)), jax.local_devices()[0])

    def compile_init_and_eval():  # only compiles: running a program beside a compile once hung in XLA:CPU
        params = jax.eval_shape(first_device, template)
        return init_lowered.compile(FAST_COMPILE), evaluate_seeds.lower(params, eval_key).compile(FAST_COMPILE)

    with ThreadPoolExecutor(1) as pool:
        side = pool.submit(compile_init_and_eval)
        k = epochs_per_call(trainer.steps_per_epoch, trainer.num_epochs)
        epochs_fn = None if config.eval_only else devices.compile_epoch(
            chunk_epochs(trainer.epoch, k), n_devices, n_shared=1)
        if epochs_fn is not None and hosts == 1:  # jax 0.10 cannot run a pmap over hosts compiled
            epochs_fn = epochs_fn.lower(template, 1).compile()  # ahead of time: it compiles at its first call
        init_fn, eval_fn = side.result()
    state = state if state is not None else init_fn(keys)
    compile_time = time.time() - t0

    def evaluate_now(epoch):
        return np.asarray(eval_fn(first_device(state), jax.random.fold_in(eval_key, epoch)))

    if config.eval_only:
        returns = evaluate_now(start_epoch)
        return {"eval_return": float(returns.mean()), "eval_return_per_seed": returns.tolist()}

    logger = Logger(config, run_dir, is_chief, start_epoch)
    where = f"{n_devices * hosts} {jax.default_backend()} device(s)" + (f" of {hosts} processes" if hosts > 1 else "")
    print(f"training {script} on {config.env}: {trainer.num_epochs} epochs of "
          f"{trainer.steps_per_epoch:,} steps x {config.num_seeds} seed(s)"
          + (f" x {runs // config.num_seeds} sweep members" if config.sweep else "") + f" on {where}; "
          f"compiled in {compile_time:.1f} s; " + (f"writing {run_dir}" if is_chief else "the chief writes"),
          flush=True)
    ckpt_dir, epoch = run_dir / "checkpoints", start_epoch

    def checkpoint():  # every host takes part in the gather; the chief writes
        whole = devices.gather(state)
        if is_chief:
            save_checkpoint(ckpt_dir, whole, epoch)

    last_epoch = trainer.num_epochs if max_epochs is None else min(trainer.num_epochs, start_epoch + max_epochs)
    train_time, returns, record = 0.0, None, {}
    with _StopOnInterrupt() as interrupt:
        while epoch < last_epoch and not devices.any_host(interrupt.requested):
            # Run up to the next evaluation, checkpoint or end, at most k epochs.
            n = min(k, last_epoch - epoch, config.checkpoint_every - epoch % config.checkpoint_every)
            if config.eval_every:
                n = min(n, config.eval_every - epoch % config.eval_every)
            tick = time.time()
            state, metrics = epochs_fn(state, n)
            records = _records(metrics, n)
            chunk_time, time_before = time.time() - tick, train_time
            train_time += chunk_time
            for j, record in enumerate(records):
                epoch += 1
                diverged = [f"{k} is {v}" for k, v in record.items() if k.startswith("loss/") and not math.isfinite(v)]
                if diverged:  # any loss term: a NaN value loss reaches the policy loss only epochs later
                    saved = latest_checkpoint(ckpt_dir)
                    raise SystemExit(
                        f"{', '.join(diverged)} at epoch {epoch}: training diverged. "
                        f"Last good checkpoint: {saved or 'none'}. Try a lower learning rate or a "
                        f"--max-grad-norm, then --resume {run_dir} or start again.")
                steps_done = (epoch - start_epoch) * trainer.steps_per_epoch * runs
                record = {"epoch": epoch, "env_steps": epoch * trainer.steps_per_epoch,
                          "sps": steps_done / (time_before + chunk_time * (j + 1) / n), **record}
                final = epoch == trainer.num_epochs
                if final or (config.eval_every and epoch % config.eval_every == 0):
                    returns = evaluate_now(epoch)
                    record["eval/return"] = float(returns.mean())
                    record["eval/return_per_seed"] = returns.tolist()
                logger.log(record, force_print=final or "eval/return" in record)
            if epoch == trainer.num_epochs or epoch % config.checkpoint_every == 0:
                checkpoint()
    if devices.any_host(interrupt.requested):
        if epoch > start_epoch:
            checkpoint()
            if is_chief:
                print(f"interrupted: saved epoch {epoch}; continue with --resume {run_dir}", flush=True)
        raise SystemExit(130)
    if epoch > start_epoch and epoch < trainer.num_epochs:
        checkpoint()
    if returns is None or "eval/return" not in record:
        returns = evaluate_now(epoch)
    summary = {
        "eval_return": float(returns.mean()),
        "eval_return_per_seed": returns.tolist(),
        "episode_return": record.get("episode/return", float("nan")),
        "epoch": epoch,
        "env_steps": epoch * trainer.steps_per_epoch,
        "wall_time_s": time.time() - wall_start,
        "compile_time_s": compile_time,
        "train_time_s": train_time,
        "sps": (epoch - start_epoch) * trainer.steps_per_epoch * runs / max(train_time, 1e-9),
    }
    if config.sweep:  # member-major: the seeds of member 0, then of member 1, ...
        summary["sweep"] = [{**values, "eval_return": float(np.mean(r)), "eval_return_per_seed": r.tolist()}
                            for values, r in zip(sweep_members(config), returns.reshape(-1, config.num_seeds))]
    if is_chief:
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        logger.close(summary)
    return summary


def main(config_cls, make_trainer: Callable, script: str, description: str, argv=None) -> dict:
    config = parse_config(config_cls, argv, description)
    try:
        summary = train(config, make_trainer, script)
    except ValueError as error:  # configuration that only the environment can reject
        raise SystemExit(f"error: {error}") from None
    print(f"eval return {summary['eval_return']:.2f} (greedy, {config.eval_episodes} episodes)", flush=True)
    return summary
