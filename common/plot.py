"""Learning curves of finished or running runs, drawn to a PNG (no account, no network).

    python -m common.plot RUN_DIR [RUN_DIR ...] [--metric episode/return] [--out curves.png]

One line per run directory: the mean over the run's seeds of `--metric`
against environment steps (per seed), read from its `metrics.jsonl`, with the
band between the lowest and the highest seed when the run has several.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np


def load_curve(run_dir: Path, metric: str) -> tuple[np.ndarray, np.ndarray]:
    """`(env_steps [n], values [n, num_seeds])` of the epochs that logged `metric` (NaN: no value).

    Seeds come from `METRIC_per_seed` where a script logs it (episode/return,
    eval/return), otherwise the one (mean) value is the only seed."""
    steps, values = [], []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record.get(metric) is None:
            continue
        seeds = record.get(f"{metric}_per_seed", [record[metric]])
        steps.append(record["env_steps"])
        values.append([np.nan if v is None else v for v in seeds])
    if not steps:
        raise ValueError(f"{run_dir}: no epoch logged {metric}; try --metric episode/return")
    return np.asarray(steps, dtype=float), np.asarray(values, dtype=float)


def plot(run_dirs: list[Path], metric: str, out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")  # files only: no screen needed
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for run_dir in run_dirs:
        steps, values = load_curve(run_dir, metric)
        mean = np.nanmean(values, axis=1)
        label = run_dir.name + (f" ({values.shape[1]} seeds)" if values.shape[1] > 1 else "")
        (line,) = ax.plot(steps, mean, label=label, marker="o" if len(steps) < 20 else None)
        if values.shape[1] > 1:
            ax.fill_between(
                steps,
                np.nanmin(values, axis=1),
                np.nanmax(values, axis=1),
                color=line.get_color(),
                alpha=0.2,
                linewidth=0,
            )
    ax.set_xlabel("environment steps (per seed)")
    ax.set_ylabel(metric)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def main(argv=None) -> Path:
    parser = argparse.ArgumentParser(
        prog="python -m common.plot",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "run_dirs",
        nargs="+",
        type=Path,
        metavar="RUN_DIR",
        help="run directories (each with the metrics.jsonl a script wrote)",
    )
    parser.add_argument(
        "--metric",
        default="episode/return",
        help="metric to draw, e.g. eval/return (greedy, at evaluation epochs) or loss/value",
    )
    parser.add_argument("--out", type=Path, default=Path("curves.png"), help="PNG file to write")
    args = parser.parse_args(argv)
    for run_dir in args.run_dirs:
        if not (run_dir / "metrics.jsonl").is_file():
            parser.error(f"{run_dir}: no metrics.jsonl; pass the --out-dir of a run")
    try:
        out = plot(args.run_dirs, args.metric, args.out)
    except ValueError as error:
        parser.error(str(error))
    print(f"wrote {out}")
    return out


if __name__ == "__main__":
    main()
