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

from bench.peers.runs import HERE, PEER_PY, launch_peer, launch_run, measured, start
from bench.results import SCALE, commit, launch, write_section

SECTION = "### Throughput at scale: ppo_joint vs Rejax PPO and the ceilings, CartPole-v1"
T, EPOCHS, MINIBATCHES = 128, 4, 4


def total_steps(n: int) -> int:
    return max(8, -(-1_000_000 // (n * T))) * n * T


def measure(n: int, scratch: Path, timeout: float) -> dict:
    steps, out = total_steps(n), scratch / f"ours-{n}"
    ours = (
        f"--num-envs {n} --num-steps {T} --update-passes {EPOCHS} --num-minibatches {MINIBATCHES} "
        f"--total-steps {steps} --n-devices 1 --eval-every 0 --eval-episodes 4"
    )
    cmd = [sys.executable, "algos/ppo_joint.py", *ours.split(), "--out-dir", str(out)]
    _, summary = launch_run(cmd, out, timeout)
    peer = (
        f"--num-envs {n} --num-steps {T} --num-epochs {EPOCHS} --num-minibatches {MINIBATCHES} "
        f"--total-timesteps {steps} --eval-episodes 4"
    )
    cmd = [str(PEER_PY), f"{HERE}/rejax_ppo.py", *peer.split()]
    _, rejax = launch_peer(cmd, scratch / f"rejax-{n}.log", timeout)
    ceiling = f"{HERE}/ceiling.py --num-envs {n} --num-steps {steps // n} --rollout {T} --reps 3"
    ceiling = [sys.executable, *ceiling.split()]
    bare = json.loads(launch(ceiling, scratch / f"bare-{n}.log", timeout)[1])["sps"]
    compute = json.loads(
        launch(
            ceiling + f"--update-epochs {EPOCHS} --num-minibatches {MINIBATCHES}".split(),
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
    args, load_start = start(p)
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
