"""Benchmark the LayerDrop Transformer (algos/skip_transformer.py): does skipping save compute, and
what does a pruned net return?

    .venv/bin/python bench/skip_transformer.py              # ~5 min on 2 cores
    .venv/bin/python bench/skip_transformer.py --rounds 5 --no-write

1. Training speed: the compiled epoch (default config, 2 seeds, one device, warmup 0 so
   every gradient step draws a depth) timed with --skip-fraction 0 and 0.5 in the same
   process, rounds interleaved. A third row draws one depth per seed instead of one for all
   (the block's `first_copy` replaced by the identity): the `lax.cond` predicate is then
   batched, the cond becomes a select, and every block runs.
2. Greedy return against depth: full training runs of the script (CLI, default flags) with
   --skip-fraction 0 and 0.5, each reporting the greedy return with the first 1..n blocks.

Prints Markdown and rewrites this benchmark's section of bench/RESULTS.md, leaving the others.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from results import commit, machine, write_section  # noqa: E402  (bench/ is on sys.path when this file runs)

SECTION = "## Skip transformer (LayerDrop): training speed and greedy return against depth, CartPoleNoVel-v1"


class Epoch:
    """The compiled epoch of one variant and its runner state."""

    def __init__(self, skip_fraction: float, per_seed_depth: bool):
        import jax

        from algos import skip_transformer as st
        from common import devices, skipping

        original = skipping.first_copy
        if per_seed_depth:  # each vmapped seed keeps its own draw: a batched predicate
            skipping.first_copy = lambda x: x
        try:
            config = st.Config(
                n_devices=1,
                num_seeds=2,
                skip_fraction=skip_fraction,
                skip_warmup_steps=0,
                total_steps=10**7,
            )
            trainer = st.make_trainer(config)
            keys = devices.seed_keys(jax.random.PRNGKey(0), config.num_seeds, 1)
            self.state = devices.map_init(trainer.init)(keys)
            self.epoch = devices.map_epoch(trainer.epoch, 1).lower(self.state).compile()
        finally:
            skipping.first_copy = original
        self.steps = trainer.steps_per_epoch * config.num_seeds
        self.state, metrics = self.epoch(self.state)
        jax.block_until_ready(metrics)

    def speed(self, epochs: int) -> dict:
        """Env steps per second over `epochs` epochs, and the mean blocks run per gradient step."""
        import jax

        layers = []
        start = time.perf_counter()
        for _ in range(epochs):
            self.state, metrics = self.epoch(self.state)
            layers.append(metrics["skip/layers_run"])
        jax.block_until_ready(self.state)
        seconds = time.perf_counter() - start
        return {
            "sps": epochs * self.steps / seconds,
            "layers_run": float(sum(x.mean() for x in layers) / epochs),
        }


def train_run(skip_fraction: float, seed: int, scratch: Path, timeout: float) -> dict:
    out = scratch / f"run-skip{skip_fraction}-seed{seed}"
    cmd = [
        sys.executable,
        "algos/skip_transformer.py",
        "--skip-fraction",
        str(skip_fraction),
        "--seed",
        str(seed),
        "--n-devices",
        "1",
        "--eval-every",
        "0",
        "--out-dir",
        str(out),
    ]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    if proc.returncode:
        sys.exit(f"failed: {' '.join(cmd)}\n{(proc.stdout + proc.stderr)[-3000:]}")
    summary = json.loads((out / "summary.json").read_text())
    return {"cmd": cmd, **summary}


def main():
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="interleaved timing rounds per variant (median reported)",
    )
    p.add_argument("--epochs", type=int, default=20, help="timed epochs per round")
    p.add_argument(
        "--seeds",
        type=int,
        nargs="+",
        default=[0],
        help="seeds of the training runs (return vs depth)",
    )
    p.add_argument(
        "--results", default=str(ROOT / "bench" / "RESULTS.md"), help="Markdown file to update"
    )
    p.add_argument("--no-write", action="store_true", help="print only, leave RESULTS.md alone")
    p.add_argument("--timeout", type=float, default=600, help="seconds allowed per training run")
    args = p.parse_args()
    load_start = os.getloadavg()[0]

    variants = {
        "--skip-fraction 0 (every block)": (0.0, False),
        "--skip-fraction 0.5, one depth for all seeds (this script)": (0.5, False),
        "--skip-fraction 0.5, one depth per seed (batched predicate)": (0.5, True),
    }
    compiled = {name: Epoch(*variant) for name, variant in variants.items()}
    speed = {name: [] for name in variants}
    for r in range(args.rounds):
        for name, epoch in compiled.items():
            speed[name].append(epoch.speed(args.epochs))
            print(
                f"round {r + 1}: {name}: {speed[name][-1]['sps']:,.0f} sps, "
                f"{speed[name][-1]['layers_run']:.2f} blocks per gradient step",
                flush=True,
            )
    base = statistics.median(x["sps"] for x in speed["--skip-fraction 0 (every block)"])
    rows = [
        "| variant | blocks run per gradient step | training SPS, median (min-max) | vs every "
        "block |",
        "|---|---:|---:|---:|",
    ]
    for name, runs in speed.items():
        sps = [x["sps"] for x in runs]
        rows.append(
            f"| {name} | {statistics.mean(x['layers_run'] for x in runs):.2f} | "
            f"{statistics.median(sps):,.0f} ({min(sps):,.0f}-{max(sps):,.0f}) | "
            f"{statistics.median(sps) / base:.2f}x |"
        )
    speed_table = "\n".join(rows)
    print("\n" + speed_table, flush=True)

    scratch = Path(tempfile.mkdtemp(prefix="bench-skip-"))
    runs = {
        sf: [train_run(sf, seed, scratch, args.timeout) for seed in args.seeds] for sf in (0.0, 0.5)
    }
    n_layers = len(runs[0.0][0]["eval_return_by_depth"])
    rows = [
        "| training | "
        + " | ".join(
            f"depth {d}" + (" (full)" if d == n_layers else "") for d in range(1, n_layers + 1)
        )
        + " | train SPS | wall s |",
        "|---|" + "---:|" * (n_layers + 2),
    ]
    for sf, results in runs.items():
        cells = [
            " / ".join(f"{r['eval_return_by_depth'][str(d)]:.0f}" for r in results)
            for d in range(1, n_layers + 1)
        ]
        rows.append(
            f"| --skip-fraction {sf} | "
            + " | ".join(cells)
            + " | "
            + " / ".join(f"{r['sps']:,.0f}" for r in results)
            + " | "
            + " / ".join(f"{r['wall_time_s']:.0f}" for r in results)
            + " |"
        )
    depth_table = "\n".join(rows)
    print("\n" + depth_table, flush=True)
    shutil.rmtree(scratch)
    if args.no_write:
        return

    import importlib.metadata as md

    command = " ".join(runs[0.5][0]["cmd"][1:]).replace(str(scratch), "/tmp/bench-skip")
    body = f"""
Measured {time.strftime("%Y-%m-%d %H:%M %Z")} with `.venv/bin/python bench/skip_transformer.py --rounds {args.rounds}
--epochs {args.epochs} --seeds {" ".join(map(str, args.seeds))}`.

- Machine: {machine()}; load average at start/end: {load_start:.2f} / {os.getloadavg()[0]:.2f}
- Python {platform.python_version()}, jax {md.version("jax")}, gymnax {md.version("gymnax")}, commit
  {commit("algos/", "common/")}

Training speed: the compiled epoch of the default configuration (8 envs x 128 steps, 4 x 4 minibatch
updates) with `--num-seeds 2`, one device, `--skip-warmup-steps 0`; {args.epochs} epochs timed after one warm-up
call, {args.rounds} rounds with the variants interleaved. Collection and the advantage pass always run every
block (as Trax's collect mode); only the gradient steps skip. The last row draws one depth per seed instead of
one for all: under the seeds' `vmap` its `lax.cond` predicate is batched, so XLA runs every block and selects.
After the warmup a gradient step runs sum_i min(1, 1 - i * 0.5 / n) blocks on average (1.75 of 2): the
saving is bounded by that fraction of the update's block compute.

{speed_table}

Greedy return against depth (first d blocks, 32 episodes, after training with the script's default flags;
one value per seed {", ".join(map(str, args.seeds))}): LayerDrop is what keeps a pruned net acting.

```
.venv/bin/python {command}
```

{depth_table}
"""
    write_section(SECTION, body, Path(args.results))
    print(f"\nwrote {args.results}")


if __name__ == "__main__":
    main()
