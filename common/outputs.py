"""The run directory: its lock, what a run writes there, and writes that fail in one line.

What a run writes in `--out-dir DIR`:
- `config.json`: the full config, enough to rebuild the run.
- `metrics.jsonl`: one JSON object per epoch (`epoch`, `env_steps`, `sps`,
  `episode/*`, the algorithm's own keys, `eval/return` when evaluated).
- `summary.json`: at the end: `eval_return` (mean greedy return over
  `--eval-episodes`, and per seed), `env_steps`, `wall_time_s`,
  `compile_time_s` (tracing, lowering and compiling the programs, or loading them:
  `programs_loaded`), `sps` (env steps per second after compilation, all seeds),
  `wall_sps`, `episode_return` with `episode_return_epoch` (the newest epoch in which
  training episodes ended).
- `checkpoints/epoch_NNNNNN.npz`: the whole runner state (params, optimiser,
  environments, keys), written to a temporary file and renamed, no pickle;
  the newest `--keep-checkpoints`, each of them finite (`common.checkpoints`).
- `changes.jsonl`: the float flags each --resume changed, from which epoch.
- `run.lock`: held by the live run (`open_run_dir`).

Only the chief (process 0) writes. Every write goes through `writing` (or
`write_json`): a failed one (a full disk) ends the run with one line naming
what is left to resume from.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import math
import os
import shutil
import sys
import time
from pathlib import Path

import jax

from common import checkpoints, cli, nets, sweep

# a run's own, beside checkpoints/
RUN_FILES = (
    "config.json",
    "metrics.jsonl",
    "summary.json",
    "changes.jsonl",
)
# what a run writes in checkpoints/ (and .tmp_* beside RUN_FILES)
CHECKPOINT_FILES = (
    "epoch_*.npz",
    ".tmp_*",
)


def is_run(run_dir: Path) -> bool:
    """Whether `run_dir` holds a run: a config.json that a run wrote (a JSON object with a run's
    keys)."""
    try:
        saved = json.loads((run_dir / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(saved, dict) and {"env", "seed", "out_dir"} <= saved.keys()


def run_files(run_dir: Path) -> list[Path]:
    """The files in `run_dir` with the names a run writes: all that `--overwrite` may delete."""
    found = [run_dir / name for name in RUN_FILES if (run_dir / name).exists()]
    found += sorted(run_dir.glob(".tmp_*"))
    for pattern in CHECKPOINT_FILES:
        found += sorted((run_dir / "checkpoints").glob(pattern))
    return found


def open_run_dir(run_dir: Path, config):
    """Creates the run directory (or opens it, on --resume) and locks it; returns the open lock
    file.

    The lock (`flock` on `run.lock`, which names the holder's pid) lasts until
    the file is closed or the process ends, however it ends: a second run in the
    directory is refused while the first lives, and a dead one's lock file
    blocks nothing. A new run refuses a directory that holds a run (`is_run`),
    unless `--overwrite`, which deletes that run's files (`run_files`) and
    nothing else. A directory that is not a run but holds a file a run would
    write (a metrics.jsonl of the user's) is refused, `--overwrite` or not: no
    run deletes or replaces what it did not write.
    """
    flag = f"--resume {run_dir}" if config.resume else f"--out-dir {run_dir}"
    cli.require(
        not run_dir.exists() or run_dir.is_dir(),
        f"{flag} is a file, not a directory; give a directory for the run",
    )
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        lock = open(run_dir / "run.lock", "a+")
    except OSError as error:
        raise cli.ConfigError(
            f"{flag}: cannot write there ({error.strerror}); give a directory you can write"
        ) from None
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.seek(0)
        holder = lock.read().strip() or "unknown"
        lock.close()
        raise cli.ConfigError(
            f"{flag}: another run (pid {holder}) is using this directory; wait for it to end "
            f"or give another --out-dir"
        ) from None
    with writing(run_dir / "run.lock", run_dir):
        lock.truncate(0)
        lock.write(f"{os.getpid()}\n")
        lock.flush()
    found = run_files(run_dir)
    names = ", ".join(str(path.relative_to(run_dir)) for path in found[:3]) + (
        ", ..." if len(found) > 3 else ""
    )
    if config.resume:
        # writes cut short by a crash
        deleted = [path for path in found if path.name.startswith(".tmp_")]
    elif not found:
        deleted = []
    elif not is_run(run_dir):
        lock.close()
        raise cli.ConfigError(
            f"{flag} holds {names}, names a run writes, but is not a run (no run's "
            f"config.json): nothing there is replaced or deleted; give another --out-dir"
        )
    elif config.overwrite:
        deleted = found
    else:
        lock.close()
        raise cli.ConfigError(
            f"{flag} already holds a run ({names}); continue it with --resume {run_dir}, give "
            f"another --out-dir, or add --overwrite to delete that run's files and start again"
        )
    for path in deleted:
        _delete(path, flag)
    return lock


def _delete(path: Path, flag: str) -> None:
    try:
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()
    except OSError as error:
        raise cli.ConfigError(
            f"{flag}: cannot delete {path} ({error.strerror}); delete it yourself or give "
            f"another --out-dir"
        ) from None


def disk_error(path: Path, error: OSError, run_dir: Path) -> SystemExit:
    """A failed write (a full disk): one line, and what is left to resume from."""
    last = checkpoints.latest(run_dir / "checkpoints")
    left = (
        f"the last checkpoint, {last}, is intact: make room, then --resume {run_dir}"
        if last
        else "no checkpoint was written yet: make room and start again"
    )
    return SystemExit(f"error: cannot write {path} ({error.strerror or error}); {left}")


@contextlib.contextmanager
def writing(path: Path, run_dir: Path):
    """Writes to `path` in the block; a failure of the file system ends the run with `disk_error`'s
    line."""
    try:
        yield
    except OSError as error:
        raise disk_error(path, error, run_dir) from None


def write_atomic(path: Path, text: str) -> None:
    """`path` holds the old text or the new one, never a part (temporary file, then rename)."""
    tmp = path.with_name(f".tmp_{path.name}")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def strict(value):
    """`value` with every NaN or infinity replaced by None (null): JSON that a strict parser
    reads."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: strict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict(v) for v in value]
    return value


def write_json(path: Path, value, run_dir: Path) -> None:
    """`value` as indented strict JSON (NaN as null) in `path`, atomically, through `writing`."""
    with writing(path, run_dir):
        write_atomic(path, json.dumps(strict(value), indent=2, allow_nan=False) + "\n")


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
            cli.require(
                i == len(lines) - 1,
                f"{path}, line {i + 1}, is not a metrics record ({line[:40]!r}); "
                f"repair or delete that line, then --resume again",
            )
            torn = True
    if torn:
        print(f"{path}: dropped its last line, cut short ({lines[-1][:40]!r})", file=sys.stderr)
    if len(lines) - torn > len(kept):
        print(
            f"{path}: dropped {len(lines) - torn - len(kept)} line(s) past the checkpoint's epoch "
            f"{epoch}",
            file=sys.stderr,
        )
    if len(kept) < len(lines) or not text.endswith("\n"):
        with writing(path, path.parent):
            write_atomic(path, "".join(line + "\n" for line in kept))


def record_changes(run_dir: Path, config, epoch: int) -> None:
    """--resume with other float flags: config.json takes them (a later --resume keeps them), and
    `changes.jsonl` gets a line `{"epoch": from, flag: [old, new], ...}`."""
    path = run_dir / "config.json"
    saved = json.loads(path.read_text()) if path.is_file() else {}
    changed = {
        k: [saved[k], getattr(config, k)]
        for k in cli.float_flags(type(config))
        if k in saved and saved[k] != getattr(config, k)
    }
    if not changed:
        return
    with writing(run_dir / "changes.jsonl", run_dir), open(run_dir / "changes.jsonl", "a") as fh:
        fh.write(json.dumps({"epoch": epoch, **changed}) + "\n")
    write_json(path, {**saved, **{k: new for k, (_, new) in changed.items()}}, run_dir)
    changes = ", ".join(f"{cli.flag_name(k)} {old} -> {new}" for k, (old, new) in changed.items())
    print(
        f"--resume changes {changes} from epoch {epoch} (recorded in {run_dir / 'changes.jsonl'})",
        flush=True,
    )


def clock(seconds: float) -> str:
    """A duration as a person reads it: 42s, 5m12s, 2h03m."""
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


class Logger:
    """Metrics to the console (throttled), `metrics.jsonl` and, with --track, wandb."""

    def __init__(self, config, run_dir: Path, is_chief: bool, wall_start: float | None = None):
        self.config, self.is_chief, self.wandb, self.run_dir = config, is_chief, None, run_dir
        self.last_print, self.last_return = 0.0, float("nan")
        # the run's, imports aside
        self.wall_start = time.time() if wall_start is None else wall_start
        self.train_start, self.first_epoch, self.num_epochs, self.steps_per_epoch = (
            time.time(),
            None,
            None,
            0,
        )
        self.path = run_dir / "metrics.jsonl"
        if is_chief and config.track:
            self._start_wandb(config, run_dir)

    def _start_wandb(self, config, run_dir: Path) -> None:
        try:
            import wandb

            online = os.environ.get("WANDB_API_KEY") or (Path.home() / ".netrc").exists()
            mode = os.environ.get("WANDB_MODE", "online" if online else "offline")
            self.wandb = wandb.init(
                project=config.wandb_project,
                config=dataclasses.asdict(config),
                dir=str(run_dir),
                mode=mode,
                name=run_dir.name,
            )
        except Exception as error:  # wandb must never stop training
            print(f"wandb disabled: {error}", file=sys.stderr)

    def start(
        self, script: str, trainer, n_devices: int, compile_time: float, loaded: bool = False
    ) -> None:
        """The run's first line: what trains, on what (`n_devices`: every host's), how long its
        programs took (`loaded`: built by an earlier run, `executables`), and where it writes."""
        config, hosts, runs = self.config, jax.process_count(), sweep.n_runs(self.config)
        self.train_start, self.num_epochs = time.time(), trainer.num_epochs
        # every seed's and member's, as `sps` counts them
        self.steps_per_epoch = trainer.steps_per_epoch * runs
        where = f"{n_devices} {jax.default_backend()} device(s)" + (
            f" of {hosts} processes" if hosts > 1 else ""
        )
        env = trainer.env  # a context window (skip_transformer) names the shape of one observation
        shape = (
            env.raw_obs_shape
            if hasattr(env, "raw_obs_shape")
            else env.observation_space(trainer.env_params).shape
        )
        # skip_transformer has no --torso: its Transformer embeds each observation
        observes = f"observations {list(shape)}"
        if hasattr(config, "torso"):
            torso = "conv" if nets.uses_conv(config.torso, shape) else "mlp"
            observes = f"{torso} torso for {observes}"
        print(
            f"training {script} on {config.env} ({observes}): "
            f"{trainer.num_epochs} epochs of "
            f"{trainer.steps_per_epoch:,} steps x {config.num_seeds} seed(s)"
            + (f" x {runs // config.num_seeds} sweep members" if config.sweep else "")
            + f" on {where}; "
            + (
                f"programs of an earlier run loaded in {compile_time:.1f} s; "
                if loaded
                else f"compiled in {compile_time:.1f} s; "
            )
            + (f"writing {self.run_dir}" if self.is_chief else "the chief writes"),
            flush=True,
        )

    def log(self, record: dict, force_print: bool = False) -> None:
        if not self.is_chief:
            return
        with writing(self.path, self.run_dir), open(self.path, "a") as fh:
            fh.write(json.dumps(strict(record), allow_nan=False) + "\n")
        if self.wandb is not None:
            try:
                self.wandb.log(
                    {k: v for k, v in record.items() if not isinstance(v, list)},
                    step=record["env_steps"],
                )
            except Exception as error:
                print(f"wandb disabled: {error}", file=sys.stderr)
                self.wandb = None
        if math.isfinite(record["episode/return"]):
            self.last_return = record["episode/return"]
        now = time.time()
        if force_print or now - self.last_print >= 1.0:
            self.last_print = now
            # return: of the latest epoch in which an episode ended
            line = (
                f"epoch {record['epoch']:>5} | steps {record['env_steps']:>10,} | "
                f"sps {record['sps']:>9,.0f} | return {self.last_return:8.2f}"
            )
            if "eval/return" in record:
                line += f" | eval {record['eval/return']:8.2f}"
            print(line + self.pace(record["epoch"], now), flush=True)

    def pace(self, epoch: int, now: float) -> str:
        """The run's own rate by the wall clock (evaluations and checkpoints included, unlike `sps`,
        the epochs' rate), the time since the run started and an estimate of the time left."""
        if self.first_epoch is None:
            # the epoch this invocation started from (a resumed run's checkpoint)
            self.first_epoch = epoch - 1
        if self.num_epochs is None:  # `start` was not called: nothing to pace against
            return ""
        done, seconds = epoch - self.first_epoch, max(now - self.train_start, 1e-9)
        left = (self.num_epochs - epoch) * seconds / done
        sps = done * self.steps_per_epoch / seconds
        elapsed = clock(now - self.wall_start)
        return f" | wall sps {sps:>9,.0f} | {elapsed} elapsed, ~{clock(left)} left"

    def close(self, summary: dict) -> None:
        if self.wandb is not None:
            try:
                self.wandb.summary.update(summary)
                self.wandb.finish()
            except Exception as error:
                print(f"wandb disabled: {error}", file=sys.stderr)
