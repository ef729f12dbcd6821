"""Learning curves of finished or running runs, drawn to a PNG (no account, no network).

    python -m common.plot RUN_DIR [RUN_DIR ...] [--metric episode/return] [--out curves.png]
    python -m common.plot runs/a runs/b --label "awr" --label "awr --q-value" --goal 475

One line per run directory: the mean over the run's seeds of `--metric`
against environment steps (per seed), read from its `metrics.jsonl`, with the
band between the lowest and the highest seed when the run has several, and the
`--goal` as a dashed line.
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


def draw(curves: dict, metric: str, out: Path, goal: float | None = None, title: str = "") -> Path:
    """Draws `curves`, `{label: (env_steps [n], values [n, num_seeds])}`, to the PNG `out`."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no screen needed
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, (steps, values) in curves.items():
        steps, values = np.asarray(steps, dtype=float), np.asarray(values, dtype=float)
        mean = np.nanmean(values, axis=1)
        seeds = values.shape[1]
        label = label + (f" ({seeds} seeds)" if seeds > 1 else "")
        (line,) = ax.plot(steps, mean, label=label, marker="o" if len(steps) < 20 else None)
        if seeds > 1:
            ax.fill_between(
                steps,
                np.nanmin(values, axis=1),
                np.nanmax(values, axis=1),
                color=line.get_color(),
                alpha=0.2,
                linewidth=0,
            )
    if goal is not None:
        ax.axhline(goal, color="black", linestyle="--", linewidth=1, label=f"goal {goal:g}")
    ax.set_xlabel("environment steps (per seed)")
    ax.set_ylabel(metric)
    if title:
        ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def plot(
    run_dirs: list[Path],
    metric: str,
    out: Path,
    labels: list[str] | None = None,
    goal: float | None = None,
) -> Path:
    """Draws each run directory's curve of `metric`, labelled by `labels` (default: its name)."""
    labels = labels or [run_dir.name for run_dir in run_dirs]
    curves = {label: load_curve(run_dir, metric) for label, run_dir in zip(labels, run_dirs)}
    return draw(curves, metric, out, goal)


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
    parser.add_argument(
        "--label",
        action="append",
        help="the legend of a run, once per RUN_DIR in their order (default: the directory's name)",
    )
    parser.add_argument("--goal", type=float, help="draw this value of the metric as a dashed line")
    parser.add_argument("--out", type=Path, default=Path("curves.png"), help="PNG file to write")
    args = parser.parse_args(argv)
    for run_dir in args.run_dirs:
        if not (run_dir / "metrics.jsonl").is_file():
            parser.error(f"{run_dir}: no metrics.jsonl; pass the --out-dir of a run")
    if args.label is not None and len(args.label) != len(args.run_dirs):
        parser.error(
            f"{len(args.label)} --label for {len(args.run_dirs)} run directories: give one per run"
        )
    try:
        out = plot(args.run_dirs, args.metric, args.out, args.label, args.goal)
    except ValueError as error:
        parser.error(str(error))
    print(f"wrote {out}")
    return out


if __name__ == "__main__":
    main()
