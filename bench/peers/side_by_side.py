"""Every algorithm script side by side on CartPole-v1, each with its default flags.

    .venv/bin/python bench/peers/side_by_side.py            # 2 rounds, ~5 min on 2 cores
    .venv/bin/python bench/peers/side_by_side.py --runs 3

Each run is a separate process (`--n-devices 1 --eval-every 0 --no-compile-cache`,
so every run compiles from scratch), one round runs every entry once, and rounds
are interleaved so that load on the machine spreads over all entries. Reported per
entry: compile time, steady SPS, the epoch's cost (ms per epoch and relative to
ppo_joint), env steps until the mean return of the training episodes finished in
an epoch first reaches 475, and the final greedy return. Rewrites this benchmark's
entry of bench/RESULTS.md, leaving the others alone.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

from bench.peers.runs import HERE, launch_run, load_average, measured, parser, write
from bench.results import ALGORITHMS, commit, med

SECTION = "### Algorithms side by side, CartPole-v1"
THRESHOLD = 475.0
# name -> script and flags; every entry runs with its script's defaults otherwise.
ENTRIES = {
    "ppo_joint": "algos/ppo_joint.py",
    "awr": "algos/awr.py",
    "awr --q-value --n-samples 4": "algos/awr.py --q-value --n-samples 4",
    "actor_critic": "algos/actor_critic.py",
    "actor_critic --loss ppo": (
        "algos/actor_critic.py --loss ppo --policy-steps 16 --policy-batch-size 256"
    ),
    "reinforce --baseline": "algos/reinforce.py --baseline",
}
COMMON = "--env CartPole-v1 --n-devices 1 --eval-every 0 --no-compile-cache"


def run_entry(entry: str, seed: int, out: Path, timeout: float) -> dict:
    cmd = [sys.executable, *f"{entry} {COMMON} --seed {seed}".split(), "--out-dir", str(out)]
    wall, summary = launch_run(cmd, out, timeout)
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps_per_epoch = lines[0]["env_steps"]
    reached = next(
        (line["env_steps"] for line in lines if (line.get("episode/return") or 0) >= THRESHOLD),
        None,
    )
    return {
        "wall": wall,
        "compile": summary["compile_time_s"],
        "sps": summary["sps"],
        "epoch_ms": 1e3 * steps_per_epoch / summary["sps"],
        "steps_per_epoch": steps_per_epoch,
        "reached": reached,
        "ret": summary["eval_return"],
        "total": summary["env_steps"],
    }


def table(results: dict[str, list[dict]]) -> str:
    base = med(results["ppo_joint"], "epoch_ms") / results["ppo_joint"][0]["steps_per_epoch"]
    rows = [
        "| script and flags | compile s | steady SPS | ms / epoch (steps) | cost per step vs "
        "ppo_joint | env steps to return 475 | greedy return |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, runs in results.items():
        reached = [r["reached"] for r in runs]
        shown = ", ".join(f"{x:,}" if x else f"not in {runs[0]['total']:,}" for x in reached)
        per_step = med(runs, "epoch_ms") / runs[0]["steps_per_epoch"]
        returns = ", ".join(f"{r['ret']:.0f}" for r in runs)
        rows.append(
            f"| `{name}` | {med(runs, 'compile'):.1f} | {med(runs, 'sps'):,.0f} | {med(runs, 'epoch_ms'):.1f} "
            f"({runs[0]['steps_per_epoch']:,}) | {per_step / base:.2f}x | {shown} | {returns} |"
        )
    return "\n".join(rows)


def main():
    args = parser(__doc__, runs=2, timeout=600).parse_args()

    scratch = Path(tempfile.mkdtemp(prefix="bench-algos-"))
    load_start = load_average()
    results = {name: [] for name in ENTRIES}
    for i in range(args.runs):
        for j, (name, entry) in enumerate(ENTRIES.items()):
            results[name].append(
                run_entry(entry, args.seed + i, scratch / f"{j}-{i}", args.timeout)
            )
            r = results[name][-1]
            print(
                f"round {i + 1}/{args.runs} {name}: compile {r['compile']:.1f} s, {r['sps']:,.0f} "
                f"sps, 475 at {r['reached']}, return {r['ret']:.0f}",
                flush=True,
            )
    if not args.keep:
        shutil.rmtree(scratch)
    tbl = table(results)
    print("\n" + tbl)
    if args.no_write:
        return
    commands = "\n".join(
        f".venv/bin/python {entry} {COMMON} --seed SEED" for entry in ENTRIES.values()
    )
    head = measured(
        f".venv/bin/python {HERE}/side_by_side.py --runs {args.runs} --seed {args.seed}",
        load_start,
        commit(),
    )
    body = f"""
{head}

Commands (each script's defaults otherwise; round i uses SEED = {args.seed} + i, the entries run one after the other):

```
{commands}
```

Medians over {args.runs} rounds. compile = init + eval + epoch compile (summary.json `compile_time_s`);
steady SPS = env steps / training seconds; ms / epoch = steps per epoch / SPS; cost per step is relative to
ppo_joint (the scripts' epochs differ in size and in work per step: AWR trains two networks for a fixed number
of minibatch steps on its replay). Env steps to 475: the first epoch whose finished training episodes (sampled
actions) average at least 475, per round. Greedy return: 32 episodes after training, per round.

{tbl}
"""
    write(SECTION, body, args, under=ALGORITHMS)


if __name__ == "__main__":
    main()
