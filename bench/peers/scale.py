"""Throughput at scale: ppo_joint's steady SPS from 16 to 4096 environments, against Rejax PPO and
two ceilings.

    .venv/bin/python bench/peers/scale.py                    # ~5 min on 2 cores
    .venv/bin/python bench/peers/scale.py --sizes 16,64 --no-write

Needs the peer venv (bench/peers/setup_peer.sh). Same work per step on every side:
N environments x 128 steps per rollout, 4 update epochs x 4 minibatches, a
64x64 tanh network, CartPole-v1, at least 8 rollouts (and 1M steps) per run;
steady SPS excludes the compile. Ours: ppo_joint's defaults with those sizes
(one device); Rejax: rejax_ppo.py with the same sizes; the bare rollout
and the compute ceiling (the same rollout plus the update's forward and
backward passes at the same batch shapes, nothing else): ceiling.py.
For each size the four run one after the other. Prints a Markdown table and
rewrites this benchmark's entry of bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from bench.peers.runs import (
    HERE,
    PEER_PY,
    launch_peer,
    launch_run,
    load_average,
    measured,
    need_peer,
)
from bench.results import SCALE, commit, launch, write_section

SECTION = "### Throughput at scale: ppo_joint vs Rejax PPO and the ceilings, CartPole-v1"
T, EPOCHS, MINIBATCHES = 128, 4, 4


def total_steps(n: int) -> int:
    return max(8, -(-1_000_000 // (n * T))) * n * T


def measure(n: int, scratch: Path, timeout: float) -> dict:
    steps, sizes = total_steps(n), ["--num-envs", str(n)]
    out = scratch / f"ours-{n}"
    _, summary = launch_run(
        [
            sys.executable,
            "algos/ppo_joint.py",
            *sizes,
            "--num-steps",
            str(T),
            "--update-passes",
            str(EPOCHS),
            "--num-minibatches",
            str(MINIBATCHES),
            "--total-steps",
            str(steps),
            "--n-devices",
            "1",
            "--eval-every",
            "0",
            "--eval-episodes",
            "4",
            "--out-dir",
            str(out),
        ],
        out,
        timeout,
    )
    _, rejax = launch_peer(
        [
            str(PEER_PY),
            f"{HERE}/rejax_ppo.py",
            *sizes,
            "--num-steps",
            str(T),
            "--num-epochs",
            str(EPOCHS),
            "--num-minibatches",
            str(MINIBATCHES),
            "--total-timesteps",
            str(steps),
            "--eval-episodes",
            "4",
        ],
        scratch / f"rejax-{n}.log",
        timeout,
    )
    ceiling = [
        sys.executable,
        f"{HERE}/ceiling.py",
        *sizes,
        "--num-steps",
        str(steps // n),
        "--rollout",
        str(T),
        "--reps",
        "3",
    ]
    bare = json.loads(launch(ceiling, scratch / f"bare-{n}.log", timeout)[1])["sps"]
    compute = json.loads(
        launch(
            ceiling + ["--update-epochs", str(EPOCHS), "--num-minibatches", str(MINIBATCHES)],
            scratch / f"compute-{n}.log",
            timeout,
        )[1]
    )["sps"]
    return {
        "n": n,
        "ours": summary["sps"],
        "rejax": rejax["sps"],
        "bare": bare,
        "compute": compute,
        "versions": rejax["versions"],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="16,64,256,1024,4096")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per run")
    p.add_argument(
        "--no-write", action="store_true", help="print only; leave bench/RESULTS.md alone"
    )
    args = p.parse_args()
    need_peer()
    load_start = load_average()
    rows = [
        "| envs | ours SPS | Rejax SPS | ours / Rejax | bare rollout SPS | compute ceiling SPS "
        "| ours / compute | ours / bare |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    results = []
    with tempfile.TemporaryDirectory(prefix="jtrax-scale-") as tmp:
        for n in map(int, args.sizes.split(",")):
            r = measure(n, Path(tmp), args.timeout)
            results.append(r)
            rows.append(
                f"| {n:,} | {r['ours']:,.0f} | {r['rejax']:,.0f} | {r['ours'] / r['rejax']:.2f} "
                f"| {r['bare']:,.0f} | {r['compute']:,.0f} | {r['ours'] / r['compute']:.2f} "
                f"| {r['ours'] / r['bare']:.2f} |"
            )
            print(rows[-1], flush=True)
    met_rejax = all(r["ours"] >= 1.25 * r["rejax"] for r in results)
    met_compute = all(r["ours"] >= 0.7 * r["compute"] for r in results if r["n"] >= 256)
    head = measured(
        f".venv/bin/python {HERE}/scale.py --sizes {args.sizes}",
        load_start,
        commit("algos", "common"),
        results[0]["versions"],
    )
    body = (
        f"{head}\n\nWork per size: N envs x {T} steps, {EPOCHS} epochs x {MINIBATCHES} "
        "minibatches, 64x64 tanh; max(8 rollouts, 1M steps).\n\n"
        + "\n".join(rows)
        + f"\n\nGoals: ours >= 1.25x Rejax at every size: {'met' if met_rejax else 'not met'}; "
        f"ours >= 0.7x the compute ceiling from 256 envs up: {'met' if met_compute else 'not met'}."
    )
    print(body)
    if not args.no_write:
        write_section(SECTION, body, under=SCALE)


if __name__ == "__main__":
    main()
