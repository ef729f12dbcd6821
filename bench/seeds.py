"""16 seeds in one compiled program (`--num-seeds 16`) against 16 separate runs of one seed.

    .venv/bin/python bench/seeds.py                     # ppo_joint, CartPole-v1, 100k steps per
    seed
    .venv/bin/python bench/seeds.py --script awr --seeds 8

Every run is a process as a user would start it (`--n-devices 1 --eval-every 0`).
The separate runs go one after another, as a loop in a shell would, and share
JAX's persistent compilation cache (a fresh directory for this benchmark), so
only the first of them compiles from scratch; the one-program run compiles on
its own. Reported: wall time of each way (process start to exit, all seeds),
compile time, training SPS over all seeds, mean greedy return, and the ratio.
Rewrites this benchmark's section of bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from results import machine, write_section

ROOT = Path(__file__).resolve().parent.parent
SECTION = "## Seeds in one program against separate runs"


def run(script: str, extra: list[str], out: Path, cache: Path) -> dict:
    cmd = [
        sys.executable,
        f"algos/{script}.py",
        "--n-devices",
        "1",
        "--eval-every",
        "0",
        "--out-dir",
        str(out),
        *extra,
    ]
    env = {**os.environ, "XDG_CACHE_HOME": str(cache), "WANDB_MODE": "disabled"}
    t0 = time.time()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=3600)
    if proc.returncode:
        sys.exit(
            f"failed ({proc.returncode}): {' '.join(cmd)}\n{(proc.stdout + proc.stderr)[-3000:]}"
        )
    return {**json.loads((out / "summary.json").read_text()), "wall": time.time() - t0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--script", default="ppo_joint", help="algorithm script in algos/")
    parser.add_argument(
        "--seeds", type=int, default=16, help="seeds, in one program and as separate runs"
    )
    parser.add_argument(
        "--total-steps", type=int, default=100_000, help="environment steps per seed"
    )
    parser.add_argument(
        "--no-write", action="store_true", help="print only; leave bench/RESULTS.md alone"
    )
    args = parser.parse_args()

    steps = ["--total-steps", str(args.total_steps)]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        together = run(
            args.script, [*steps, "--num-seeds", str(args.seeds)], tmp / "together", tmp / "cache1"
        )
        print(f"one program: {together['wall']:.1f} s", flush=True)
        apart = [
            run(args.script, [*steps, "--seed", str(s)], tmp / f"seed{s}", tmp / "cache2")
            for s in range(args.seeds)
        ]
        print(f"{args.seeds} runs: {sum(r['wall'] for r in apart):.1f} s", flush=True)

    wall_apart = sum(r["wall"] for r in apart)
    train_apart = sum(r["train_time_s"] for r in apart)
    ret_apart = sum(r["eval_return"] for r in apart) / len(apart)
    rows = [
        "| | wall s | compile s | train s | SPS (all seeds) | mean greedy return |",
        "|---|---:|---:|---:|---:|---:|",
        f"| `--num-seeds {args.seeds}`, one process | {together['wall']:.1f} | "
        f"{together['compile_time_s']:.1f} | {together['train_time_s']:.1f} | "
        f"{together['sps']:,.0f} | {together['eval_return']:.1f} |",
        f"| {args.seeds} processes of one seed, one after another | {wall_apart:.1f} | "
        f"{sum(r['compile_time_s'] for r in apart):.1f} (first {apart[0]['compile_time_s']:.1f}) | "
        f"{train_apart:.1f} | {args.seeds * args.total_steps / train_apart:,.0f} | {ret_apart:.1f} "
        "|",
    ]
    body = "\n".join(
        [
            f"`python bench/seeds.py --script {args.script} --seeds {args.seeds} --total-steps "
            f"{args.total_steps}`: `algos/{args.script}.py` on CartPole-v1 with its defaults "
            f"otherwise, {args.total_steps:,} steps per seed, one device. The separate runs share "
            "a persistent compilation cache (only the first compiles from scratch), as a shell "
            "loop would.",
            "",
            f"Machine: {machine()}; Python {platform.python_version()}, jax {md.version('jax')}, "
            f"gymnax {md.version('gymnax')}; {time.strftime('%Y-%m-%d')}.",
            "",
            *rows,
            "",
            f"One program takes **{together['wall'] / wall_apart:.2f}x** the wall time of the "
            f"separate runs ({wall_apart / together['wall']:.1f}x faster); steady SPS "
            f"{together['sps'] / (args.seeds * args.total_steps / train_apart):.2f}x.",
        ]
    )
    print(body)
    if not args.no_write:
        write_section(SECTION, body)


if __name__ == "__main__":
    main()
