"""Time to solve: whole-process seconds from launch to a greedy return of 475 on CartPole-v1.

    .venv/bin/python bench/peers/solve.py              # 5 seeds per side, ~20 min on 2 cores
    .venv/bin/python bench/peers/solve.py --seeds 2 --only "ppo_joint,Rejax PPO"

Needs the peer venv (bench/peers/setup_peer.sh). Every run is a separate process,
launched from this one; the sides run interleaved, seed by seed, in the order
of SIDES. Every side evaluates greedily (32 episodes) about every 10,000 env
steps, on its own defaults:

- ours: each script's defaults with `--target-return 475`; the run ends at the
  evaluation that reaches it, and its time is the whole process, launch to
  exit (the checkpoint and summary written). Cold: `--no-compile-cache`; warm:
  the persistent compilation cache, filled by one warm-up run of each script.
- Rejax PPO and DQN (rejax_ppo.py and rejax_dqn.py, Rejax's tuned CartPole configs): their
  program cannot end at an evaluation, so their time is from launch to the end
  of the first evaluation that reaches 475 (taken as it happens, from inside
  the program); what they train after it is not counted.

A run that never reaches 475 counts as unsolved: infinitely slow in the
medians. Prints a Markdown table and rewrites this benchmark's entry of
bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.peers.runs import HERE, PEER_PY, launch_peer, launch_run, measured, start
from bench.results import SPEED, commit, write_section

SECTION = "### Time to solve CartPole-v1 (greedy return 475), ours vs Rejax"
TARGET = 475.0
# name: script and flags; the evaluation interval in epochs: 10 x 1,024 steps, dqn 100 x 100 steps
OURS = {
    "ppo_joint": "algos/ppo_joint.py --eval-every 10",
    "awr": "algos/awr.py --eval-every 10",
    "awr --q-value --n-samples 4": "algos/awr.py --q-value --n-samples 4 --eval-every 10",
    "dqn_value": "algos/dqn_value.py --eval-every 100",
}
PEERS = {"Rejax PPO": f"{HERE}/rejax_ppo.py", "Rejax DQN": f"{HERE}/rejax_dqn.py"}
SIDES = [f"{name}, {cache}" for name in OURS for cache in ("cold", "warm")] + list(PEERS)


def run_ours(name: str, cold: bool, seed: int, scratch: Path, timeout: float) -> dict:
    out = scratch / f"ours{list(OURS).index(name)}-{'cold' if cold else 'warm'}-{seed}"
    flags = f"{OURS[name]} --eval-episodes 32 --n-devices 1 --target-return {TARGET} --seed {seed}"
    cmd = [sys.executable, *flags.split(), "--out-dir", str(out)]
    cmd += ["--no-compile-cache"] if cold else []
    wall, s = launch_run(cmd, out, timeout)
    solved = s["target_return"]["reached"]
    return {
        "seconds": wall if solved else math.inf,
        "steps": s["env_steps"] if solved else math.inf,
        "compile": s["compile_time_s"],
    }


def run_peer(name: str, seed: int, scratch: Path, timeout: float) -> dict:
    t_launch = time.time()
    flags = f"--eval-freq 10000 --eval-episodes 32 --seed {seed}"
    cmd = [str(PEER_PY), PEERS[name], *flags.split()]
    _, r = launch_peer(cmd, scratch / f"{name.replace(' ', '-')}-{seed}.log", timeout)
    hit = next(((t, step) for t, step, ret in r["evaluations"] if ret >= TARGET), None)
    return {
        "seconds": hit[0] - t_launch if hit else math.inf,
        "steps": hit[1] if hit else math.inf,
        "compile": r["compile_s"],
        "versions": r["versions"],
    }


def fmt(x: float, spec: str) -> str:
    return "never" if math.isinf(x) else format(x, spec)


def table(results: dict[str, list[dict]]) -> str:
    rows = [
        "| side | median s to 475 | range s | median env steps | solved | compile s |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, runs in results.items():
        secs = [r["seconds"] for r in runs]
        rows.append(
            f"| {name} | {fmt(statistics.median(secs), '.1f')} | {fmt(min(secs), '.1f')}-"
            f"{fmt(max(secs), '.1f')} | {fmt(statistics.median(r['steps'] for r in runs), ',.0f')} "
            f"| {sum(not math.isinf(s) for s in secs)}/{len(secs)} "
            f"| {statistics.median(r['compile'] for r in runs):.1f} |"
        )
    return "\n".join(rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument(
        "--only", default="", help="comma-separated side names (e.g. ppo_joint,Rejax PPO)"
    )
    args, load_start = start(p)
    only = [s for s in args.only.split(",") if s]
    names = [n for n in list(OURS) + list(PEERS) if not only or n in only]
    results: dict[str, list[dict]] = {s: [] for s in SIDES if s.rsplit(",", 1)[0] in names}
    with tempfile.TemporaryDirectory(prefix="jtrax-solve-") as tmp:
        scratch = Path(tmp)
        for name in (n for n in OURS if n in names):  # fill the persistent cache for the warm runs
            run_ours(name, cold=False, seed=10_000, scratch=scratch, timeout=args.timeout)
        for seed in range(args.seeds):
            for side in results:
                name, _, cache = side.rpartition(", ")
                r = (
                    run_ours(name, cache == "cold", seed, scratch, args.timeout)
                    if name in OURS
                    else run_peer(side, seed, scratch, args.timeout)
                )
                results[side].append(r)
                print(
                    f"seed {seed} | {side:<36} | {fmt(r['seconds'], '6.1f')} s | "
                    f"{fmt(r['steps'], ',.0f')} steps",
                    flush=True,
                )
    body = table(results)
    ours = [
        statistics.median(r["seconds"] for r in runs)
        for s, runs in results.items()
        if s not in PEERS
    ]
    peers = [
        statistics.median(r["seconds"] for r in runs) for s, runs in results.items() if s in PEERS
    ]
    if ours and peers:
        ratio = min(ours) / min(peers)
        body += (
            f"\n\nOur best median / Rejax's best median: **{ratio:.2f}x** (goal <= 0.5x: "
            f"{'met' if ratio <= 0.5 else 'not met'})."
        )
    peer = next((runs[0]["versions"] for s, runs in results.items() if s in PEERS), None)
    head = measured(
        f".venv/bin/python {HERE}/solve.py --seeds {args.seeds}"
        + (f" --only {args.only!r}" if only else ""),
        load_start,
        commit("algos", "common"),
        peer,
    )
    body = f"{head}\n\n{args.seeds} seeds (0-{args.seeds - 1}) per side, interleaved.\n\n{body}"
    print(body)
    if not args.no_write:
        write_section(SECTION, body, under=SPEED)


if __name__ == "__main__":
    main()
