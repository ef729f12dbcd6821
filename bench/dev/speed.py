"""Is a change faster? Runs one script at two versions, in alternating rounds, and compares their
steady speed.

    python bench/dev/speed.py a582009 . ppo_joint --env SpaceInvaders-MinAtar --total-steps 65536 --num-seeds 4
    python bench/dev/speed.py HEAD~1 HEAD awr --rounds 5

Each side is a commit (checked out into a temporary worktree, as bench/dev/identical.py does) or a
directory holding a checkout. The flags after the script's name go to both runs, with
`--n-devices 1 --eval-every 0 --no-compile-cache`: every run compiles from scratch and trains
without evaluations. Round i runs the sides in the order old, new when i is even and new, old when
it is odd, so that a machine that slows down or speeds up during the rounds weighs on both. Prints
each run's line, then a Markdown table of the medians: steady SPS (summary.json's `sps`, every
seed's steps over the training time), compile seconds and wall seconds, and new / old.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.dev.identical import SCRIPTS, checkout

FIXED = ["--n-devices", "1", "--eval-every", "0", "--no-compile-cache"]
MEASURES = (("sps", "steady SPS", ",.0f"), ("compile_time_s", "compile s", ".1f"))


def run(code: Path, out: Path, script: str, flags: list[str]) -> dict:
    """One run of `script` in checkout `code`; its summary, with the wall seconds launch to exit."""
    shutil.rmtree(out, ignore_errors=True)
    env = {**os.environ, "PYTHONPATH": str(code), "WANDB_MODE": "disabled"}
    cmd = [sys.executable, f"algos/{script}.py", *flags, *FIXED, "--out-dir", str(out)]
    done = subprocess.run(cmd, cwd=code, env=env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed in {code}:\n{done.stderr[-3000:]}")
    return json.loads((out / "summary.json").read_text())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        usage="%(prog)s OLD NEW SCRIPT [--rounds N] [script flags ...]",
    )
    parser.add_argument("old", help="commit or checkout directory")
    parser.add_argument("new", help="commit or checkout directory")
    parser.add_argument("script", choices=SCRIPTS)
    parser.add_argument("--rounds", type=int, default=3, help="runs per side")
    args, flags = parser.parse_known_args(argv)
    cache = Path(tempfile.gettempdir()) / "jtrax-identical"
    cache.mkdir(parents=True, exist_ok=True)
    sides = {"old": checkout(args.old, cache)[0], "new": checkout(args.new, cache)[0]}
    scratch = Path(tempfile.mkdtemp(prefix="speed-"))
    runs = {"old": [], "new": []}
    for i in range(args.rounds):
        for side in ("old", "new") if i % 2 == 0 else ("new", "old"):
            summary = run(sides[side], scratch / side, args.script, flags)
            runs[side].append(summary)
            print(
                f"round {i + 1} {side}: "
                + ", ".join(f"{label} {summary[key]:{spec}}" for key, label, spec in MEASURES)
                + f", wall s {summary['wall_time_s']:.1f}",
                flush=True,
            )
    shutil.rmtree(scratch)
    print(f"\n`{args.script} {' '.join(flags)}`, medians of {args.rounds} runs per side\n")
    print(f"| | {args.old} | {args.new} | new / old |\n|---|---:|---:|---:|")
    for key, label, spec in (*MEASURES, ("wall_time_s", "wall s", ".1f")):
        old, new = (statistics.median(r[key] for r in runs[side]) for side in ("old", "new"))
        print(f"| {label} | {old:{spec}} | {new:{spec}} | {new / old:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
