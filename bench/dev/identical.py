"""Does a refactor change behaviour? Runs every script at two versions and compares what they end
with.

    python bench/dev/identical.py 7ec50eb .              # a commit against this working tree
    python bench/dev/identical.py 7ec50eb HEAD --only awr,dqn_value

Each side is a commit (checked out into a temporary worktree; its outputs are
cached under `--cache` by commit) or a directory holding a checkout (run as it
is, never cached). Every case -- each script's default run, `--normalize-obs`,
`--num-seeds 2` and `--n-devices 2` (two forced host devices), a few short
epochs with an evaluation -- must end with the same metrics (every key but
timings), the same evaluation returns and the same checkpoint arrays, bit for
bit. Checkpoint arrays are compared as a multiset of (dtype, shape, bytes), so
a refactor may reorder or rename the state's fields. Exit status 1 if any case
differs.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

SCRIPTS = ("awr", "ppo_joint", "actor_critic", "reinforce", "dqn_value", "skip_transformer")
NO_NORMALIZE = ("dqn_value",)  # its Q-network sees raw observations: no --normalize-obs flag
STEPS = {"dqn_value": 600, "reinforce": 12_288}  # three epochs (others: 1024-step epochs)
VARIANTS = {
    "default": "--n-devices 1",
    "normalize": "--n-devices 1 --normalize-obs",
    "seeds2": "--n-devices 1 --num-seeds 2",
    "devices2": "--n-devices 2",
}
TIMINGS = ("sps", "wall_time_s", "compile_time_s", "train_time_s")


def cases(only):
    for script in only:
        common = (
            f"--seed 3 --total-steps {STEPS.get(script, 3072)} --eval-every 2 --eval-episodes 4"
        )
        for name, variant in VARIANTS.items():
            if name == "normalize" and script in NO_NORMALIZE:
                continue
            yield script, name, f"{common} --no-compile-cache {variant}".split()


def checkout(side: str, tmp: Path) -> tuple[Path, str | None]:
    """A directory to run `side` in, and the commit to cache its outputs by (None: a directory)."""
    if Path(side).is_dir():
        return Path(side).resolve(), None
    sha = subprocess.run(
        ["git", "rev-parse", side], check=True, capture_output=True, text=True
    ).stdout.strip()
    where = tmp / sha[:12]
    if not where.exists():
        subprocess.run(["git", "worktree", "add", "--detach", "-q", str(where), sha], check=True)
    return where, sha


def run_case(code: Path, out: Path, script: str, flags: list[str]) -> None:
    if (out / "summary.json").is_file():
        return
    env = {
        **os.environ,
        "XLA_FLAGS": "--xla_force_host_platform_device_count=2",
        "WANDB_MODE": "disabled",
        "PYTHONPATH": str(code),  # that checkout's common/, not the one pip installed
    }
    done = subprocess.run(
        [sys.executable, f"algos/{script}.py", *flags, "--out-dir", str(out), "--overwrite"],
        cwd=code,
        env=env,
        capture_output=True,
        text=True,
    )
    if done.returncode:
        raise SystemExit(f"{script} {' '.join(flags)} failed in {code}:\n{done.stderr[-3000:]}")


def fingerprint(out: Path) -> dict:
    metrics = [
        {k: v for k, v in json.loads(line).items() if k not in TIMINGS}
        for line in (out / "metrics.jsonl").read_text().splitlines()
    ]
    summary = json.loads((out / "summary.json").read_text())
    [ckpt] = sorted((out / "checkpoints").glob("epoch_*.npz"))[-1:]
    with np.load(ckpt) as data:
        arrays = collections.Counter(
            (str(data[k].dtype), data[k].shape, hashlib.sha256(data[k].tobytes()).hexdigest())
            for k in data.files
            if k != "meta"
        )
    return {
        "metrics": metrics,
        "eval": (summary["eval_return"], summary["eval_return_per_seed"]),
        "arrays": arrays,
        "checkpoint": ckpt.name,
    }


def differences(a: dict, b: dict) -> list[str]:
    found = []
    if a["checkpoint"] != b["checkpoint"]:
        found.append(f"last checkpoint {a['checkpoint']} vs {b['checkpoint']}")
    if a["eval"] != b["eval"]:
        found.append(f"eval returns {a['eval']} vs {b['eval']}")
    if len(a["metrics"]) != len(b["metrics"]):
        found.append(f"{len(a['metrics'])} vs {len(b['metrics'])} metrics records")
    for i, (x, y) in enumerate(zip(a["metrics"], b["metrics"])):
        keys = sorted(set(x) | set(y))
        bad = [k for k in keys if x.get(k, "absent") != y.get(k, "absent")]
        if bad:
            found.append(
                f"epoch {i + 1} metrics differ: "
                + ", ".join(f"{k} {x.get(k, 'absent')} vs {y.get(k, 'absent')}" for k in bad[:4])
            )
            break
    if a["arrays"] != b["arrays"]:
        only_a, only_b = a["arrays"] - b["arrays"], b["arrays"] - a["arrays"]
        found.append(
            f"checkpoint arrays differ: {sum(only_a.values())} only in the first "
            f"(e.g. {next(iter(only_a), None)!s:.80}), {sum(only_b.values())} only in the second"
        )
    return found


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("old", help="commit or checkout directory")
    parser.add_argument("new", help="commit or checkout directory")
    parser.add_argument("--only", default=",".join(SCRIPTS), help="comma-separated scripts")
    parser.add_argument(
        "--cache",
        default=str(Path(tempfile.gettempdir()) / "jtrax-identical"),
        help="where commits are checked out and their outputs kept",
    )
    args = parser.parse_args(argv)
    only = args.only.split(",")
    unknown = sorted(set(only) - set(SCRIPTS))
    if unknown:
        parser.error(f"--only {','.join(unknown)}: not a script; use some of {','.join(SCRIPTS)}")
    cache = Path(args.cache)
    cache.mkdir(parents=True, exist_ok=True)
    sides = [checkout(side, cache) for side in (args.old, args.new)]
    scratch = Path(tempfile.mkdtemp(prefix="identical-"))
    failed = 0
    for script, name, flags in cases(only):
        prints = []
        for code, sha in sides:
            out = (cache / "runs" / sha[:12] if sha else scratch / code.name) / f"{script}-{name}"
            run_case(code, out, script, flags)
            prints.append(fingerprint(out))
        found = differences(*prints)
        failed += bool(found)
        print(
            f"{script:16} {name:9} "
            + ("identical" if not found else "DIFFERS: " + "; ".join(found)),
            flush=True,
        )
    print(f"{failed} case(s) differ" if failed else "every case is identical")
    return int(bool(failed))


if __name__ == "__main__":
    sys.exit(main())
