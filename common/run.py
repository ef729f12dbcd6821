"""Everything a run does once: CLI, outputs, progress, wandb, checkpoints, the epoch loop.

A script defines a frozen `Config` (a subclass of `cli.RunConfig`) and a
`make_trainer(config) -> Trainer`; `main(Config, make_trainer)` does the rest.

What a run writes in `--out-dir DIR`:
- `config.json`: the full config, enough to rebuild the run.
- `metrics.jsonl`: one JSON object per epoch (`epoch`, `env_steps`, `sps`,
  `episode/*`, the algorithm's own keys, `eval/return` when evaluated).
- `summary.json`: at the end: `eval_return` (mean greedy return over
  `--eval-episodes`, and per seed), `env_steps`, `wall_time_s`,
  `compile_time_s`, `sps` (env steps per second after compilation, all seeds).
- `checkpoints/epoch_NNNNNN.npz`: the whole runner state (params, optimiser,
  environments, keys), written to a temporary file and renamed, no pickle;
  the newest `--keep-checkpoints`, each of them finite.
- `changes.jsonl`: the float flags each --resume changed, from which epoch.
- `run.lock`: held by the live run (`open_run_dir`).

On several hosts (`--coordinator`, see `devices.init_distributed`) every host
runs the same programs in the same order; only the chief (process 0) writes,
and a checkpoint holds every host's devices.
"""
from __future__ import annotations

import copy
import contextlib
import dataclasses
import fcntl
import json
import math
import os
import shutil
import signal
import sys
import threading
import time
import warnings
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from common import cli, devices
from common.envs import evaluate


def n_runs(config) -> int:
    """Seeds x sweep members: the length of the runner state's seed axis."""
    return config.num_seeds * len(cli.sweep_members(config))


def eval_keys(key, config):
    """One evaluation key per run; every sweep member meets the episodes of a run without the sweep."""
    return jnp.tile(jax.random.split(key, config.num_seeds), (len(cli.sweep_members(config)), 1))


# XLA options for programs that run rarely (init, evaluation): a quicker compile.
FAST_COMPILE = {"xla_backend_optimization_level": 0}


# ----------------------------------------------------------------------------
# What a script provides
# ----------------------------------------------------------------------------
class Trainer(NamedTuple):
    """An algorithm, as pure functions of one (device, seed) slice of the runner state.

    `init(key) -> state` and `epoch(state) -> (state, metrics)` run under
    `devices.compile_epoch`; `epoch` must average gradients over
    `devices.DEVICE_AXIS`. `act(policy, obs, key)` is the greedy action for one
    observation; `policy(state)` picks what `act` needs out of the state (an
    `envs.Policy`: the policy's parameters and observation statistics). An `env`
    that observes through a window of past observations (skip_transformer's
    `ContextWindow`) has `observe(window, obs, first) -> window`, `window_shape`
    and `raw_obs_shape`, so that `load_agent` can keep windows for a caller.
    `rollout(state)`, where a script has it, returns what `epoch(state)` computes before
    its update (the rollout and its targets) from the same code, so that tests can check
    the epoch's wiring; it runs under `devices.compile_epoch` as `epoch` does.
    """

    init: Callable
    epoch: Callable
    act: Callable
    policy: Callable
    env: Any
    env_params: Any
    steps_per_epoch: int  # environment steps of one seed in one epoch, all devices
    num_epochs: int  # every `loss/*` metric must stay finite
    rollout: Callable | None = None


# ----------------------------------------------------------------------------
# The run directory
# ----------------------------------------------------------------------------
RUN_FILES = ("config.json", "metrics.jsonl", "summary.json", "changes.jsonl", "checkpoints")  # a run's own


def open_run_dir(run_dir: Path, config):
    """Creates the run directory (or opens it, on --resume) and locks it; returns the open lock file.

    The lock (`flock` on `run.lock`, which names the holder's pid) lasts until
    the file is closed or the process ends, however it ends: a second run in the
    directory is refused while the first lives, and a dead one's lock file
    blocks nothing. A new run refuses a directory that holds a run, unless
    `--overwrite`, which deletes that run's files.
    """
    flag = f"--resume {run_dir}" if config.resume else f"--out-dir {run_dir}"
    if run_dir.exists() and not run_dir.is_dir():
        raise ValueError(f"{flag} is a file, not a directory; give a directory for the run")
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        lock = open(run_dir / "run.lock", "a+")
    except OSError as error:
        raise ValueError(f"{flag}: cannot write there ({error.strerror}); give a directory you can write") from None
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.seek(0)
        holder = lock.read().strip() or "unknown"
        lock.close()
        raise ValueError(f"{flag}: another run (pid {holder}) is using this directory; wait for it to end "
                         f"or give another --out-dir") from None
    lock.truncate(0)
    lock.write(f"{os.getpid()}\n")
    lock.flush()
    held = [name for name in RUN_FILES if (run_dir / name).exists()]
    if not config.resume and held and not config.overwrite:
        lock.close()
        raise ValueError(f"{flag} already holds a run ({', '.join(held)}); continue it with --resume {run_dir}, "
                         f"give another --out-dir, or add --overwrite to delete it and start again")
    for path in [] if config.resume else [run_dir / name for name in held]:  # --overwrite
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()
    for tmp in [*run_dir.glob(".tmp_*"), *run_dir.glob("checkpoints/.tmp_*")]:  # writes cut short by a crash
        tmp.unlink()
    return lock


# ----------------------------------------------------------------------------
# Checkpoints
# ----------------------------------------------------------------------------
def save_checkpoint(directory: Path, state, epoch: int, keep: int = cli.RunConfig.keep_checkpoints) -> Path:
    """Writes the whole state atomically (temporary file, then rename); keeps the newest `keep`."""
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
    for old in sorted(directory.glob("epoch_*.npz"))[:-keep]:
        old.unlink()
    return path


def non_finite(state) -> list[str]:
    """The paths of the state's floating-point leaves holding a NaN or an infinity."""
    return [jax.tree_util.keystr(path) for path, x in jax.tree_util.tree_leaves_with_path(state)
            if np.issubdtype(np.asarray(x).dtype, np.inexact) and not np.isfinite(x).all()]


def divergence_advice(config, saved: Path | None, run_dir: Path) -> str:
    """What to do after a divergence: --resume with a lower learning rate, or without a checkpoint a new run."""
    lower = " ".join(f"{cli.flag_name(k)} {getattr(config, k) / 10:.3g}" for k in cli.float_flags(type(config))
                     if "lr" in k.split("_"))
    if saved is None:
        return f"No checkpoint was saved: start a new run with a lower learning rate ({lower}) or a --max-grad-norm."
    return (f"Last good checkpoint: {saved}. Continue from it with a lower learning rate: --resume {run_dir} {lower} "
            f"(--resume takes the float flags: {', '.join(map(cli.flag_name, cli.float_flags(type(config))))}, and records "
            f"the change in {run_dir / 'changes.jsonl'}); or start a new run.")


def record_changes(run_dir: Path, config, epoch: int) -> None:
    """--resume with other float flags: config.json takes them (a later --resume keeps them), and
    `changes.jsonl` gets a line `{"epoch": from, flag: [old, new], ...}`."""
    path = run_dir / "config.json"
    saved = json.loads(path.read_text()) if path.is_file() else {}
    changed = {k: [saved[k], getattr(config, k)] for k in cli.float_flags(type(config))
               if k in saved and saved[k] != getattr(config, k)}
    if not changed:
        return
    with open(run_dir / "changes.jsonl", "a") as fh:
        fh.write(json.dumps({"epoch": epoch, **changed}) + "\n")
    write_atomic(path, json.dumps({**saved, **{k: new for k, (_, new) in changed.items()}}, indent=2) + "\n")
    print(f"--resume changes {', '.join(f'{cli.flag_name(k)} {old} -> {new}' for k, (old, new) in changed.items())} "
          f"from epoch {epoch} (recorded in {run_dir / 'changes.jsonl'})", flush=True)


def latest_checkpoint(directory: Path) -> Path | None:
    found = sorted(directory.glob("epoch_*.npz"))
    return found[-1] if found else None


class CorruptCheckpoint(ValueError):
    """A checkpoint file that cannot be read: cut short, overwritten, not a checkpoint."""


def load_checkpoint(path: Path, template):
    """`(state, epoch)` from `path`, checked leaf by leaf against `template` (shapes/dtypes)."""
    fix = "resume with the run's own flags (they are read from its config.json) or start a new --out-dir"
    try:
        with np.load(path, allow_pickle=False) as data:
            meta = json.loads(bytes(data["meta"]).decode())
            leaves = [data[f"leaf_{i:05d}"] for i in range(len(meta["leaves"]))]
    except (OSError, KeyError, ValueError, zipfile.BadZipFile, EOFError) as error:
        raise CorruptCheckpoint(f"checkpoint {path} is unreadable or corrupt ({error}); delete it to fall back "
                                f"to an older one, or start a new --out-dir") from None
    want, treedef = jax.tree.flatten(template)
    if len(want) != len(leaves) or str(treedef) != meta["treedef"]:
        raise ValueError(f"checkpoint {path} holds a different state structure than this script builds; {fix}")
    for i, (w, got) in enumerate(zip(want, leaves)):
        if tuple(w.shape) != got.shape or np.dtype(w.dtype) != got.dtype:
            raise ValueError(f"checkpoint {path}: leaf {i} is {got.shape} {got.dtype}, this run expects "
                             f"{tuple(w.shape)} {np.dtype(w.dtype)}; {fix}")
    return jax.tree.unflatten(treedef, leaves), int(meta["epoch"])


def load_newest_checkpoint(directory: Path, template):
    """`(state, epoch)` from the newest readable checkpoint in `directory`, saying which ones it skips."""
    found = sorted(directory.glob("epoch_*.npz"), reverse=True)
    if not found:
        raise ValueError(f"no checkpoint in {directory}")
    for path in found:
        try:
            return load_checkpoint(path, template)
        except CorruptCheckpoint as error:
            print(f"warning: {error}", file=sys.stderr, flush=True)
    raise ValueError(f"every checkpoint in {directory} is unreadable or corrupt; start a new --out-dir")


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
    config = cli.load_config(config_cls, run_dir)
    ckpt = latest_checkpoint(run_dir / "checkpoints")
    if ckpt is None:
        raise ValueError(f"{run_dir}: no checkpoint in {run_dir / 'checkpoints'}")
    with np.load(ckpt, allow_pickle=False) as data:  # the state's leading axis counts the run's devices
        n_devices = json.loads(bytes(data["meta"]).decode())["leaves"][0][0][0]
    trainer, keys = build(dataclasses.replace(config, n_devices=n_devices), make_trainer, n_devices,
                          jax.random.PRNGKey(0))
    state, _ = load_checkpoint(ckpt, jax.eval_shape(devices.compile_init(trainer.init), keys))
    params = jax.tree.map(lambda x: x[0], trainer.policy(state))  # as held by device 0: [runs, ...]
    runs = n_runs(config)
    if seed is not None or runs == 1:
        cli.require(0 <= (seed or 0) < runs, f"seed={seed}: the run has {runs} seed(s) (x sweep members)")
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
        cli.require(self.windows.shape[:-2] == batch, f"obs holds observations of {batch or 'one'} environment(s), "
                                                      f"the agent's windows {self.windows.shape[:-2] or 'one'}; "
                                                      f"call reset() first to act on another number")
        first = jnp.broadcast_to(jnp.asarray(first, bool), batch)
        self.windows = (self._observe_batch if batch else self._observe)(self.windows, obs, first)
        return self._act(self.windows, key)


# ----------------------------------------------------------------------------
# Logging
# ----------------------------------------------------------------------------
def write_atomic(path: Path, text: str) -> None:
    """`path` holds the old text or the new one, never a part (temporary file, then rename)."""
    tmp = path.with_name(f".tmp_{path.name}")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def trim_metrics(path: Path, epoch: int) -> None:
    """On --resume: `metrics.jsonl` keeps the epochs up to the checkpoint's, saying what it drops.

    A last line that is no record is a write cut short (a full disk, a power cut): it goes too.
    """
    if not path.exists():
        return
    text = path.read_text(errors="replace")
    lines, kept, torn = text.splitlines(), [], False
    for i, line in enumerate(lines):
        try:
            if json.loads(line)["epoch"] <= epoch:
                kept.append(line)
        except (ValueError, KeyError, TypeError):
            if i < len(lines) - 1:
                raise ValueError(f"{path}, line {i + 1}, is not a metrics record ({line[:40]!r}); "
                                 f"repair or delete that line, then --resume again") from None
            torn = True
    if torn:
        print(f"{path}: dropped its last line, cut short ({lines[-1][:40]!r})", file=sys.stderr)
    if len(lines) - torn > len(kept):
        print(f"{path}: dropped {len(lines) - torn - len(kept)} line(s) past the checkpoint's epoch {epoch}",
              file=sys.stderr)
    if len(kept) < len(lines) or not text.endswith("\n"):
        write_atomic(path, "".join(line + "\n" for line in kept))


def disk_error(path: Path, error: OSError, run_dir: Path) -> SystemExit:
    """A failed write (a full disk): one line, and what is left to resume from."""
    last = latest_checkpoint(run_dir / "checkpoints")
    left = (f"the last checkpoint, {last}, is intact: make room, then --resume {run_dir}" if last else
            "no checkpoint was written yet: make room and start again")
    return SystemExit(f"error: cannot write {path} ({error.strerror or error}); {left}")


class Logger:
    """Metrics to the console (throttled), `metrics.jsonl` and, with --track, wandb."""

    def __init__(self, config, run_dir: Path, is_chief: bool):
        self.is_chief, self.wandb, self.run_dir = is_chief, None, run_dir
        self.last_print, self.last_return = 0.0, float("nan")
        self.path = run_dir / "metrics.jsonl"
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
        try:
            with open(self.path, "a") as fh:
                fh.write(json.dumps(clean) + "\n")
        except OSError as error:
            raise disk_error(self.path, error, self.run_dir) from None
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


def check_memory(template, config, n_devices: int) -> None:
    """Refuses a runner state larger than the memory that must hold it, naming the flags that size it."""
    leaves = jax.tree_util.tree_leaves_with_path(template)
    need = sum(x.size * np.dtype(x.dtype).itemsize for _, x in leaves)
    limit = (jax.local_devices()[0].memory_stats() or {}).get("bytes_limit", 0) * n_devices
    have = limit or os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")  # a CPU: the host's memory
    if need <= have:
        return
    path, biggest = max(leaves, key=lambda leaf: leaf[1].size)
    sizes = set(biggest.shape[2:])  # [n_devices, runs, ...]
    values = {f.name: getattr(config, f.name) for f in dataclasses.fields(config) if f.name not in cli.RUN_CONTROL}
    flags = [cli.flag_name(k) for k, v in values.items() if not isinstance(v, (bool, str, float))
             and set(v if isinstance(v, tuple) else (v,)) & sizes - {0, 1}]
    raise ValueError(f"the runner state needs {need / 2**30:,.1f} GiB, more than the {have / 2**30:,.1f} GiB of "
                     f"memory here; its largest array, {jax.tree_util.keystr(path)} {tuple(biggest.shape)}, "
                     f"is sized by {' and '.join(flags) or 'the network and buffer flags'}: make it smaller")


# ----------------------------------------------------------------------------
# The run
# ----------------------------------------------------------------------------
def train(config, make_trainer: Callable, script: str = "run", max_epochs: int | None = None) -> dict:
    """Trains (or, with --eval-only, evaluates) and returns the summary.

    `max_epochs` stops early after that many epochs of this call (as Ctrl-C
    would), leaving a checkpoint to --resume from. The chief holds the run
    directory's lock (`open_run_dir`) from before the compile to the return.
    """
    with contextlib.ExitStack() as held:  # the run directory's lock, released however the run ends
        return _train(config, make_trainer, script, max_epochs, held)


def _train(config, make_trainer: Callable, script: str, max_epochs: int | None, held: contextlib.ExitStack) -> dict:
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
        raise SystemExit(f"--sweep {' '.join(config.sweep)}: {script} uses {', '.join(cli.sweep_members(config)[0])} "
                         f"outside the compiled math (e.g. to choose a branch), so it cannot be swept in one program; "
                         f"run one process per value (e.g. a wandb sweep, sweeps/). ({type(error).__name__})") from None
    template = init_lowered.out_info
    check_memory(template, config, n_devices)
    if is_chief and not config.eval_only:
        held.enter_context(open_run_dir(run_dir, config))
    start_epoch, state = 0, None
    if config.resume:
        whole = jax.tree.map(lambda s: jax.ShapeDtypeStruct((hosts * s.shape[0],) + s.shape[1:], s.dtype), template)
        try:
            state, start_epoch = load_newest_checkpoint(run_dir / "checkpoints", whole)
        except ValueError as error:
            raise SystemExit(f"--resume {run_dir}: {error}") from None
        state = devices.this_host(state)
        if start_epoch == trainer.num_epochs and not config.eval_only and (run_dir / "summary.json").is_file():
            print(f"{run_dir} finished at epoch {start_epoch}: nothing to train, its summary.json stays; "
                  f"--eval-only --resume {run_dir} evaluates it again", flush=True)
            return json.loads((run_dir / "summary.json").read_text())
        if is_chief and not config.eval_only:
            trim_metrics(run_dir / "metrics.jsonl", start_epoch)
            record_changes(run_dir, config, start_epoch)
        print(f"resumed {run_dir} at epoch {start_epoch}", flush=True)
    elif is_chief:
        write_atomic(run_dir / "config.json", json.dumps(dataclasses.asdict(config), indent=2) + "\n")

    # Init and evaluation run rarely: they compile unoptimised, on a second
    # thread, while this one compiles the epochs.
    t0 = time.time()
    act = jax.vmap(lambda params, key: evaluate(trainer.env, trainer.env_params, trainer.act, params,
                                                key, config.eval_episodes))
    evaluate_seeds = jax.jit(lambda params, key: act(params, eval_keys(key, config)))

    def first_device(state):  # the parameters of every seed (and member), as held by device 0: [runs, ...]
        return jax.device_put(trainer.policy(devices.unreplicate(state)), jax.local_devices()[0])

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

    logger = Logger(config, run_dir, is_chief)
    where = f"{n_devices * hosts} {jax.default_backend()} device(s)" + (f" of {hosts} processes" if hosts > 1 else "")
    print(f"training {script} on {config.env}: {trainer.num_epochs} epochs of "
          f"{trainer.steps_per_epoch:,} steps x {config.num_seeds} seed(s)"
          + (f" x {runs // config.num_seeds} sweep members" if config.sweep else "") + f" on {where}; "
          f"compiled in {compile_time:.1f} s; " + (f"writing {run_dir}" if is_chief else "the chief writes"),
          flush=True)
    ckpt_dir, epoch = run_dir / "checkpoints", start_epoch

    def checkpoint():  # every host takes part in the gather; the chief writes a finite state only
        whole = jax.device_get(devices.gather(state))
        bad = non_finite(whole)
        if bad:
            raise SystemExit(f"the state at epoch {epoch} is not finite ({len(bad)} leaves, e.g. {bad[0]}): "
                             f"training diverged; it was not saved. "
                             f"{divergence_advice(config, latest_checkpoint(ckpt_dir), run_dir)}")
        if is_chief:
            try:
                save_checkpoint(ckpt_dir, whole, epoch, config.keep_checkpoints)
            except OSError as error:
                raise disk_error(ckpt_dir / f"epoch_{epoch:06d}.npz", error, run_dir) from None

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
                    advice = divergence_advice(config, latest_checkpoint(ckpt_dir), run_dir)
                    raise SystemExit(f"{', '.join(diverged)} at epoch {epoch}: training diverged. {advice}")
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
                            for values, r in zip(cli.sweep_members(config), returns.reshape(-1, config.num_seeds))]
    if is_chief:
        write_atomic(run_dir / "summary.json", json.dumps(summary, indent=2) + "\n")
        logger.close(summary)
    return summary


def main(config_cls, make_trainer: Callable, script: str, description: str, argv=None) -> dict:
    config = cli.parse_config(config_cls, argv, description)
    try:
        summary = train(config, make_trainer, script)
    except ValueError as error:  # configuration that only the environment can reject
        raise SystemExit(f"error: {error}") from None
    except OSError as error:  # the file system (e.g. a full disk) where no message says more
        raise SystemExit(f"error: {error}") from None
    print(f"eval return {summary['eval_return']:.2f} (greedy, {config.eval_episodes} episodes)", flush=True)
    return summary
