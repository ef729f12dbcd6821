"""Compiled programs kept between runs, so that a run whose programs were built before starts
without tracing, lowering or compiling them.

JAX's persistent compilation cache (`run.enable_compile_cache`) skips only XLA's compile: it keys a
program by its lowered text, so a run still traces and lowers every program to look it up. Here a
run's three programs (init, the epochs, the greedy evaluation) are stored together under a key
computed before anything is traced, from everything that shapes them: the script's flags but the
float inputs' values (`sweep.input_names`), the source of the script and of common/ (and of an
environment of the user's own), the versions of the packages, the devices and XLA's and JAX's
settings. A key that misses, or an entry that cannot be read, falls back to compiling (and stores
the result). One device and one host only: a `pmap` over several devices compiles at its first
call. The store keeps at most `MAX_BYTES`, dropping the entries used longest ago.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib
import importlib.metadata
import inspect
import json
import os
import pickle
import platform
import sys
from pathlib import Path

import jax
from jax.experimental import serialize_executable
from jax.experimental.compilation_cache import compilation_cache

from common import cli, sweep

MAX_BYTES = 256 * 2**20
PROGRAMS = ("init", "epochs", "evaluate")
# flags that shape no program: those that steer an invocation (`cli.RUN_CONTROL`) but the
# evaluation's episodes and the device count, and where a run writes and when it evaluates or saves
# (the evaluation's and checkpoint's programs do not depend on the epoch they run at)
NOT_IN_PROGRAMS = {
    *cli.RUN_CONTROL,
    "seed",
    "out_dir",
    "wandb_project",
    "checkpoint_every",
    "eval_every",
} - {"eval_episodes", "n_devices"}
PACKAGES = ("jax", "jaxlib", "gymnax", "distrax", "optax", "chex", "numpy")


def directory() -> Path:
    root = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return root / "jtrax" / "programs"


def key(config, make_trainer, n_devices: int) -> str | None:
    """The store's key of a run's programs (a hex digest), or None where they cannot be stored
    (several devices or hosts)."""
    if n_devices > 1 or jax.process_count() > 1:
        return None
    inputs = set(sweep.input_names(config))
    flags = {
        k: v
        for k, v in dataclasses.asdict(config).items()
        if k not in NOT_IN_PROGRAMS and k not in inputs
    }
    sources = [inspect.getsourcefile(make_trainer), *sorted(Path(cli.__file__).parent.glob("*.py"))]
    if ":" in config.env:  # an environment of the user's own: its module's source
        sources.append(inspect.getsourcefile(importlib.import_module(config.env.split(":")[0])))
    if None in sources:  # code without a file (typed into an interpreter): not stored
        return None
    device = jax.local_devices()[0]
    described = {
        "script": type(config).__module__,
        "flags": flags,
        "inputs": sorted(inputs),
        "sources": [hashlib.sha256(Path(s).read_bytes()).hexdigest() for s in sources],
        "versions": {p: importlib.metadata.version(p) for p in PACKAGES},
        "python": sys.version,
        "devices": [
            device.platform,
            device.device_kind,
            device.client.platform_version,
            platform.machine(),
            _cpu(),
        ],
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "jax_config": {k: repr(v) for k, v in sorted(jax.config.values.items())},
    }
    text = json.dumps(described, sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()


def _cpu() -> str:
    """The processor's model and features: a program compiled for one CPU may not run on another
    that reads the same cache directory."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor()
    wanted = ("model name", "flags")
    return "|".join(line for line in info.splitlines()[:40] if line.startswith(wanted))


def load(name: str | None) -> dict | None:
    """The programs stored under `name` (`{"init": Compiled, ...}`), or None: a miss, or an entry
    that cannot be read or loaded (then removed)."""
    if name is None:
        return None
    path = directory() / f"{name}.pkl"
    try:
        stored = pickle.loads(path.read_bytes())
        programs = {  # on the one device a run of one device uses, however many there are
            program: serialize_executable.deserialize_and_load(
                *stored[program], execution_devices=jax.local_devices()[:1]
            )
            for program in PROGRAMS
        }
    except OSError:  # none stored, or a store that cannot be read
        return None
    except Exception:  # a damaged or incompatible entry: compile instead
        with contextlib.suppress(OSError):
            path.unlink(missing_ok=True)
        return None
    with contextlib.suppress(OSError):  # used now: kept longest
        os.utime(path)
    return programs


@contextlib.contextmanager
def compiled_afresh(name: str | None):
    """Compiles what it holds without JAX's persistent cache where the programs are to be stored
    under `name`: XLA:CPU serializes a program it loaded from that cache without all of its
    kernels, so that a run loading it would fail."""
    if name is None:
        yield
        return
    # JAX decides once whether its cache is used: reset, it decides again at the next compile
    was = jax.config.values["jax_enable_compilation_cache"]
    jax.config.update("jax_enable_compilation_cache", False)
    compilation_cache.reset_cache()
    try:
        yield
    finally:
        jax.config.update("jax_enable_compilation_cache", was)
        compilation_cache.reset_cache()


def save(name: str | None, programs: dict) -> None:
    """Stores a run's compiled programs under `name` (written whole or not at all), then drops the
    entries used longest ago until the store holds at most `MAX_BYTES`."""
    if name is None:
        return
    try:
        blob = pickle.dumps(
            {program: serialize_executable.serialize(programs[program]) for program in PROGRAMS}
        )
    except Exception:  # a program XLA cannot serialize: the run goes on without storing it
        return
    folder = directory()
    tmp = folder / f".{name}.{os.getpid()}.tmp"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tmp.write_bytes(blob)
        os.replace(tmp, folder / f"{name}.pkl")
    except OSError:  # a full or read-only disk: the run goes on without storing
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        return
    entries = []
    for entry in folder.glob("*.pkl"):
        with contextlib.suppress(FileNotFoundError):  # another run may drop one meanwhile
            entries.append((entry.stat().st_mtime, entry.stat().st_size, entry))
    total = 0
    for _, size, entry in sorted(entries, key=lambda e: e[0], reverse=True):
        total += size
        if total > MAX_BYTES:
            entry.unlink(missing_ok=True)
