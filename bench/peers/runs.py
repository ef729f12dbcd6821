"""What the drivers in bench/peers share (ppo.py, dqn.py, side_by_side.py, solve.py, scale.py): the
peer's interpreter, their flags, running each side as a process, the races of ppo.py and dqn.py
(our command, the rounds, the targets both have), and the pieces of their tables and of the entry
they write to bench/RESULTS.md.

They run in the project's venv. The Rejax drivers they launch run in the peer's and share
rejax_common.py instead (see its docstring for why).
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench.results import RESULTS, ROOT, commit, launch, machine, med, write_section

PEER_PY = ROOT / "bench" / ".peer-venv" / "bin" / "python"  # made by bench/peers/setup_peer.sh
HERE = "bench/peers"  # the drivers' folder, as the commands name it from the repository root


def need_peer() -> None:
    """Exits unless the peer venv is there."""
    if not PEER_PY.exists():
        sys.exit(f"no peer venv at {PEER_PY}: run {HERE}/setup_peer.sh first")


def parser(doc: str, runs: int, timeout: float) -> argparse.ArgumentParser:
    """The flags of a driver that runs rounds: --runs, --seed, --results, --no-write, --timeout,
    --keep."""
    p = argparse.ArgumentParser(
        description=doc.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument(
        "--runs", type=int, default=runs, help="runs per side (rounds), each with its own seed"
    )
    p.add_argument(
        "--seed", type=int, default=0, help="seed of the first round (round i uses SEED + i)"
    )
    p.add_argument("--results", default=str(RESULTS), help="Markdown file to update")
    p.add_argument(
        "--no-write", action="store_true", help="print the table only, leave RESULTS.md alone"
    )
    p.add_argument("--timeout", type=float, default=timeout, help="seconds allowed per subprocess")
    p.add_argument(
        "--keep", action="store_true", help="keep the scratch directory (run dirs and logs)"
    )
    return p


def start(p: argparse.ArgumentParser) -> tuple[argparse.Namespace, float]:
    """Adds --timeout and --no-write to the flags of a driver that runs each of its cases once
    (scale.py, solve.py) and parses them; exits unless the peer venv is there. Returns (the flags,
    the load average at start)."""
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per run")
    p.add_argument(
        "--no-write", action="store_true", help="print only; leave bench/RESULTS.md alone"
    )
    args = p.parse_args()
    need_peer()
    return args, load_average()


def launch_run(cmd: list[str], out: Path, timeout: float) -> tuple[float, dict]:
    """Runs cmd, one of our scripts writing its run to out (emptied first), with its log beside out;
    returns (wall seconds, launch to exit; the run's summary.json)."""
    shutil.rmtree(out, ignore_errors=True)
    wall, _ = launch(cmd, out.parent / f"{out.name}.log", timeout)
    return wall, json.loads((out / "summary.json").read_text())


def launch_peer(cmd: list[str], log: Path, timeout: float) -> tuple[float, dict]:
    """Runs cmd, a Rejax driver; returns (wall seconds, the JSON line it printed last)."""
    wall, out = launch(cmd, log, timeout)
    return wall, json.loads(out.strip().splitlines()[-1])


def race_cmd(script: str, flags: str, seed: int, out_dir: Path, cold: bool) -> list[str]:
    """The command of a run of ours in a race: script with flags (words separated by spaces), on one
    device, no evaluation during training and 32 greedy episodes after; cold: without the
    persistent compilation cache."""
    flags += f" --n-devices 1 --eval-every 0 --eval-episodes 32 --seed {seed}"
    cmd = [sys.executable, script, *flags.split(), "--out-dir", str(out_dir)]
    return cmd + (["--no-compile-cache"] if cold else [])


def race(
    prefix: str,
    run_ours: Callable[..., dict],
    run_rejax: Callable[..., dict],
    args: argparse.Namespace,
    after: Callable[[int, Path], str] | None = None,
) -> tuple[float, dict[str, list[dict]]]:
    """Exits unless the peer venv is there. In a new scratch directory (named prefix...), one
    warm-up run of ours fills the compilation cache; then round i runs ours cold, Rejax and ours
    warm, in that order, with seed SEED + i, and after(i, scratch), whose text ends the round's
    printed line. run_ours(seed, scratch, cold, timeout) and run_rejax(seed, scratch, timeout)
    return a run (with wall, sps and ret). The scratch directory is removed at the end unless
    --keep. Returns (the load average at start, each side's runs)."""
    need_peer()
    scratch = Path(tempfile.mkdtemp(prefix=prefix))
    load_start = load_average()
    print(f"scratch {scratch}; warm-up run to fill the compilation cache", flush=True)
    run_ours(args.seed + 1000, scratch, cold=False, timeout=args.timeout)
    sides = {"ours, cold": [], "Rejax": [], "ours, warm cache": []}
    for i in range(args.runs):
        seed = args.seed + i
        sides["ours, cold"].append(run_ours(seed, scratch, cold=True, timeout=args.timeout))
        sides["Rejax"].append(run_rejax(seed, scratch, args.timeout))
        sides["ours, warm cache"].append(run_ours(seed, scratch, cold=False, timeout=args.timeout))
        print(
            f"round {i + 1}/{args.runs}: "
            + ", ".join(
                f"{k} {v[-1]['wall']:.1f} s / {v[-1]['sps']:,.0f} sps / return {v[-1]['ret']:.0f}"
                for k, v in sides.items()
            )
            + (after(i, scratch) if after else ""),
            flush=True,
        )
    if not args.keep:
        shutil.rmtree(scratch)
    return load_start, sides


def spread(runs: list[dict], key: str, spec: str) -> str:
    """'median (min-max)' of run[key] over runs, each formatted with spec."""
    values = [r[key] for r in runs]
    return f"{med(runs, key):{spec}} ({min(values):{spec}}-{max(values):{spec}})"


def returns(runs: list[dict]) -> str:
    """'mean (per-run values)' of the runs' greedy returns."""
    rets = [r["ret"] for r in runs]
    return f"{statistics.mean(rets):.1f} ({', '.join(f'{x:.0f}' for x in rets)})"


def verdicts(checks: list[tuple[str, float, str, bool, str | None]]) -> str:
    """The table of (ratio, value, target, met, short name if a primary target), and which primary
    targets were met."""
    rows = ["| ratio | value | target | met |", "|---|---:|---:|---|"]
    rows += [
        f"| {name} | {value:.2f} | {target} | {'**yes**' if ok else '**NO**'} |"
        for name, value, target, ok, _ in checks
    ]
    met = [short for *_, ok, short in checks if short and ok]
    missed = [short for *_, ok, short in checks if short and not ok]
    rows.append(
        f"\nPrimary targets (cold) met: {', '.join(met) or 'none'}. "
        f"Not met: {', '.join(missed) or 'none'}."
    )
    return "\n".join(rows)


def wall_checks(sides: dict[str, list[dict]]) -> list[tuple[str, float, str, bool, str | None]]:
    """The checks (as `verdicts` takes them) of a race's wall-time targets: ours cold, the primary
    one, and ours warm, each at most 0.8x Rejax's median wall time."""
    wall_rejax = med(sides["Rejax"], "wall")
    wall_cold, wall_warm = med(sides["ours, cold"], "wall"), med(sides["ours, warm cache"], "wall")
    return [
        (
            "total wall time, ours cold / Rejax",
            wall_cold / wall_rejax,
            "<= 0.80",
            wall_cold <= 0.8 * wall_rejax,
            "wall time",
        ),
        (
            "total wall time, ours warm / Rejax (secondary)",
            wall_warm / wall_rejax,
            "<= 0.80",
            wall_warm <= 0.8 * wall_rejax,
            None,
        ),
    ]


def return_check(sides: dict[str, list[dict]]) -> tuple[str, float, str, bool, str]:
    """The check of a race's return target: ours cold's mean greedy return at least Rejax's."""
    ret_o = statistics.mean(r["ret"] for r in sides["ours, cold"])
    ret_r = statistics.mean(r["ret"] for r in sides["Rejax"])
    name = f"greedy return, ours cold - Rejax ({ret_o:.1f} vs {ret_r:.1f})"
    return name, ret_o - ret_r, ">= 0", ret_o >= ret_r, "return"


def shown(cmd: list[str]) -> str:
    """cmd as typed from the repository root, round 0's seed shown as SEED."""
    return (
        " ".join(str(Path(c).relative_to(ROOT)) if c.startswith(str(ROOT)) else c for c in cmd)
        .replace(sys.executable, ".venv/bin/python")
        .replace("--seed 0", "--seed SEED")
    )


def load_average() -> float:
    return os.getloadavg()[0]


def measured(command: str, load_start: float, head: str, peer: dict | None = None) -> str:
    """The entry's first lines: when, with what command, on what machine (load average at start
    and now), our versions and commit head, and the peer's versions."""
    ours = f"Python {platform.python_version()}, jax {md.version('jax')}, gymnax {md.version('gymnax')}"
    lines = [
        f"Measured {time.strftime('%Y-%m-%d %H:%M %Z')} with `{command}`.",
        "",
        f"- Machine: {machine()}; load average at start/end: {load_start:.2f} / {load_average():.2f}",
    ]
    if peer is None:
        return "\n".join(lines + [f"- {ours}, commit {head}"])
    versions = ", ".join(f"{k} {v}" for k, v in peer.items())
    return "\n".join(
        lines + [f"- Ours: {ours}, commit {head}", f"- Rejax: {versions} (bench/.peer-venv)"]
    )


def race_measured(
    driver: str,
    args: argparse.Namespace,
    load_start: float,
    sides: dict[str, list[dict]],
    *code: str,
) -> str:
    """`measured` for a race run by driver with args: its command, the commit (with a note if any of
    the code paths it measures had uncommitted changes) and Rejax's versions."""
    command = f".venv/bin/python {HERE}/{driver} --runs {args.runs} --seed {args.seed}"
    return measured(command, load_start, commit(*code), sides["Rejax"][0]["versions"])


def write(section: str, body: str, args: argparse.Namespace, under: str) -> None:
    """Rewrites the entry `section` of the driver's --results (a new one goes under the question
    `under`) with body."""
    write_section(section, body, Path(args.results), under=under)
    print(f"\nwrote {args.results}")
