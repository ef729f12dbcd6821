"""What the conv torso costs on MinAtar: steady training steps per second of ppo_joint, awr and
dqn_value with `--torso conv` (the default for image observations) and `--torso mlp`, side by side.

    .venv/bin/python bench/peers/minatar_torso.py                      # SpaceInvaders-MinAtar, 4 seeds
    .venv/bin/python bench/peers/minatar_torso.py --env Breakout-MinAtar --reps 1

Each run is one process of the script's defaults with `--env`, `--num-seeds`,
`--torso` and a short budget (`--total-steps`, per script below), evaluated once
at the end; its figure is summary.json's `sps` (every seed's env steps over the
training time, compile and evaluation left out). The two torsos of a script run
one after the other, in alternating order across `--reps`, so that a drift in the
machine's load falls on both. Prints a markdown table: the median over the
reps, and conv / mlp.
"""

import argparse
import json
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# env steps per seed: a few seconds of training at the slower torso's speed
BUDGETS = {"ppo_joint": 65_536, "awr": 32_768, "dqn_value": 5_000}


def run(script: str, env: str, seeds: int, torso: str, out: Path) -> dict:
    command = [
        sys.executable,
        str(ROOT / "algos" / f"{script}.py"),
        "--env",
        env,
        "--num-seeds",
        str(seeds),
        "--torso",
        torso,
        "--total-steps",
        str(BUDGETS[script]),
        "--eval-every",
        "0",
        "--eval-episodes",
        "1",
        "--out-dir",
        str(out),
    ]
    subprocess.run(command, check=True, cwd=ROOT, capture_output=True)
    return json.loads((out / "summary.json").read_text())


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="SpaceInvaders-MinAtar")
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--reps", type=int, default=2)
    args = parser.parse_args()

    sps = {(script, torso): [] for script in BUDGETS for torso in ("conv", "mlp")}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.reps):
            for script in BUDGETS:
                torsos = ("conv", "mlp") if rep % 2 == 0 else ("mlp", "conv")
                for torso in torsos:
                    out = Path(tmp) / f"{script}-{torso}-{rep}"
                    summary = run(script, args.env, args.seeds, torso, out)
                    sps[script, torso].append(summary["sps"])
                    print(f"{script} {torso} rep {rep}: {summary['sps']:,.0f} SPS", flush=True)

    print(
        f"\n{args.env}, {args.seeds} seeds, {platform.processor() or platform.machine()}, "
        f"median of {args.reps} rep(s)\n"
    )
    print("| script | steps per seed | conv SPS | mlp SPS | conv / mlp |")
    print("|---|---:|---:|---:|---:|")
    for script, budget in BUDGETS.items():
        conv = statistics.median(sps[script, "conv"])
        mlp = statistics.median(sps[script, "mlp"])
        print(f"| {script} | {budget:,} | {conv:,.0f} | {mlp:,.0f} | {conv / mlp:.2f}x |")


if __name__ == "__main__":
    main()
