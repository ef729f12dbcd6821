"""Cost of one AWR epoch against Sampling AWR with K = 1, 2, 4, 8 sampled actions.

    .venv/bin/python bench/awr_cost.py          # ~2 min on 2 cores

One process, CartPole-v1, each script default otherwise, one device. Every variant
is compiled first; then rounds of 10 epochs run variant after variant, and the
fastest round of each counts (the least disturbed by other load). Rewrites this
benchmark's section of bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import jax  # noqa: E402

from algos import awr  # noqa: E402
from common import devices  # noqa: E402

from results import machine, write_section  # noqa: E402  (bench/ is on sys.path when this file runs)

SECTION = "## AWR epoch cost: plain against --q-value --n-samples K"
VARIANTS = {
    "awr": {},
    **{f"awr --q-value --n-samples {k}": dict(q_value=True, n_samples=k) for k in (1, 2, 4, 8)},
}


def compiled(flags: dict):
    trainer = awr.make_trainer(awr.Config(n_devices=1, **flags))
    state = devices.map_init(trainer.init)(devices.seed_keys(jax.random.PRNGKey(0), 1, 1))
    epoch = devices.map_epoch(trainer.epoch, 1)
    for _ in range(3):
        state, _ = epoch(state)
    return [epoch, jax.block_until_ready(state)]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=8, help="rounds of 10 epochs per variant")
    p.add_argument("--no-write", action="store_true", help="print only, leave RESULTS.md alone")
    args = p.parse_args()
    load_start = os.getloadavg()[0]
    runs = {name: compiled(flags) for name, flags in VARIANTS.items()}
    best = {name: float("inf") for name in VARIANTS}
    for _ in range(args.rounds):
        for name, (epoch, state) in runs.items():
            t0 = time.perf_counter()
            for _ in range(10):
                state, _ = epoch(state)
            runs[name][1] = jax.block_until_ready(state)
            best[name] = min(best[name], (time.perf_counter() - t0) / 10)
    base = best["awr"]
    rows = ["| variant | ms / epoch (1,024 env steps) | relative to plain AWR |", "|---|---:|---:|"]
    rows += [f"| `{name}` | {t * 1e3:.1f} | {t / base:.2f}x |" for name, t in best.items()]
    tbl = "\n".join(rows)
    print(tbl)
    if args.no_write:
        return
    body = f"""
Measured {time.strftime("%Y-%m-%d %H:%M %Z")} with `.venv/bin/python bench/awr_cost.py --rounds {args.rounds}`:
{machine()}, load average {load_start:.2f} / {os.getloadavg()[0]:.2f},
jax {jax.__version__}. Fastest of {args.rounds} interleaved rounds of 10 epochs; defaults otherwise (8 envs x 128
steps, a replay of 4 epochs, 32 critic and 32 policy steps of 256). Plain AWR evaluates V twice over the replay
(targets before, advantages after the critic's update); Sampling AWR evaluates the target Q once, for K actions
at s and K at s'. Target: K = 4 under 1.5x plain AWR.

{tbl}
"""
    write_section(SECTION, body)


if __name__ == "__main__":
    main()
