"""dqn_value on a MinAtar game at a base commit and at this checkout: checkpoint size, SPS and where
the time goes.

    .venv/bin/python bench/minatar_dqn.py --base d8f633e               # SpaceInvaders-MinAtar, 4
    seeds
    .venv/bin/python bench/minatar_dqn.py --base d8f633e --new-flags="--torso mlp"

Each side runs `algos/dqn_value.py --env ENV --num-seeds 4` with its own
defaults (the base at its commit, checked out into a temporary worktree), one
after the other; this checkout adds `--new-flags` (by default the base's
network, `--torso mlp`: only the replay and the run's schedule differ, at the
same update-to-data ratio) and, with `--defaults`, runs its defaults too. Per
run: the newest checkpoint's size, the steady SPS (`summary.json`: training
time only), the training, compile and wall seconds, and what is left of the
wall time (evaluations, checkpoints, start-up).
The section "dqn_value on MinAtar: replay, checkpoints and speed" of
bench/RESULTS.md is rewritten.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import jax

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results import ROOT, commit, machine, write_section

SECTION = "## dqn_value on MinAtar: replay, checkpoints and speed"


def train(code: Path, flags: list[str], out: Path) -> dict:
    cmd = [sys.executable, str(code / "algos" / "dqn_value.py"), *flags, "--out-dir", str(out)]
    start = time.time()
    proc = subprocess.run(
        cmd, cwd=code, capture_output=True, text=True, env={**os.environ, "WANDB_MODE": "disabled"}
    )
    wall = time.time() - start
    if proc.returncode:
        sys.exit(f"failed: {' '.join(cmd)}\n{(proc.stdout + proc.stderr)[-3000:]}")
    summary = json.loads((out / "summary.json").read_text())
    newest = sorted((out / "checkpoints").glob("epoch_*.npz"))[-1]
    return {**summary, "process_s": wall, "checkpoint_mb": newest.stat().st_size / 1e6}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="the commit to compare with")
    parser.add_argument("--env", default="SpaceInvaders-MinAtar")
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument(
        "--new-flags", default="--torso mlp", help="this checkout's flags beyond the base's"
    )
    parser.add_argument(
        "--defaults", action="store_true", help="also a run of this checkout's defaults"
    )
    args = parser.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="bench-minatar-dqn-"))
    where = tmp / "base"
    subprocess.run(
        ["git", "worktree", "add", "--detach", "-q", str(where), args.base], cwd=ROOT, check=True
    )
    flags = ["--env", args.env, "--num-seeds", str(args.seeds)]
    load = os.getloadavg()[0]
    try:
        sides = [
            (f"base `{args.base}`", where, flags),
            (f"this checkout, {args.new_flags}", ROOT, flags + shlex.split(args.new_flags)),
        ]
        sides += [("this checkout, defaults", ROOT, flags)] if args.defaults else []
        runs = []
        for name, code, side_flags in sides:
            run = train(code, side_flags, tmp / str(len(runs)))
            runs.append((name, run))
            print(
                name,
                {k: run[k] for k in ("sps", "train_time_s", "wall_time_s", "checkpoint_mb")},
                flush=True,
            )
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(where)], cwd=ROOT, check=True)
    base = runs[0][1]
    command = f'bench/minatar_dqn.py --base {args.base} --new-flags="{args.new_flags}"' + (
        " --defaults" if args.defaults else ""
    )
    lines = [
        f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} with `.venv/bin/python "
        f"{command}` at {commit('algos', 'common')}:",
        f"- Machine: {machine()}; load average at start: {load:.2f}; jax {jax.__version__}",
        f"- Each run: `python algos/dqn_value.py {' '.join(flags)}` (plus the flags named), the "
        "side's defaults: 150k steps per seed, 50 gradient steps of 100 per 100-step epoch at "
        "both",
        "",
        "| run | checkpoint MB | steady SPS | train s | compile s | wall s | outside training | "
        "greedy return per seed |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for name, r in runs:
        outside = r["wall_time_s"] - r["train_time_s"]
        lines.append(
            f"| {name} | {r['checkpoint_mb']:,.1f} ({r['checkpoint_mb'] / base['checkpoint_mb']:.3f}x) "
            f"| {r['sps']:,.0f} ({r['sps'] / base['sps']:.2f}x) | {r['train_time_s']:.0f} | "
            f"{r['compile_time_s']:.1f} | {r['wall_time_s']:.0f} | {outside:.0f} s, {outside / r['wall_time_s']:.0%} "
            f"| {', '.join(f'{x:g}' for x in r['eval_return_per_seed'])} |"
        )
    write_section(SECTION, "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
