"""Hyperparameters as program inputs: what a run that changes one float flag compiles, and the
steady SPS.

    python bench/dev/inputs.py                 # compile times of this checkout, ~5 min on 2 cores
    python bench/dev/inputs.py --base e65a50f  # and steady SPS against a commit, ~10 min more

Compile times, per script: a cold run against a fresh cache directory, then
one run per input float flag (`sweep.input_names` of the defaults) with that
flag times 0.9 (0: 0.01), against the same cache; each run is a process of its own
(`--n-devices 1 --eval-every 0`, three epochs). Reported: the cold run's
`compile_time_s` (summary.json: tracing, compiling or loading, and init), each
flag's and its ratio to the cold one, and the cache entries a run added (0:
every program came from the cache). A flag the defaults refuse to change (awr's
--q-temperature needs --q-value) is left out.

SPS (`--base`): each script's default run for `SPS_STEPS` environment steps,
the base commit (a temporary worktree) and this checkout one after the other
in each of `--rounds` rounds, each side with a warm cache of its own; summary.json's
`sps` (steps over the time in the epochs' calls), medians. Rewrites this
benchmark's entry of bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata as md
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.results import COMPILE, ROOT, commit, machine, write_section

SECTION = "### Hyperparameters as program inputs"
SCRIPTS = ("ppo_joint", "awr", "actor_critic", "reinforce", "dqn_value", "skip_transformer")
EPOCH_STEPS = {"dqn_value": 100, "reinforce": 4096}  # others: 1024-step epochs
SPS_STEPS = {
    "ppo_joint": 300_000,
    "awr": 100_000,
    "actor_critic": 200_000,
    "reinforce": 400_000,
    "dqn_value": 30_000,
    "skip_transformer": 100_000,
}


def train(code: Path, script: str, flags: list[str], out: Path, cache: Path) -> dict:
    """summary.json of one run of `code`'s script, and the cache entries it added
    (`new_entries`)."""
    before = set(cache.rglob("*"))
    env = {
        **os.environ,
        "XDG_CACHE_HOME": str(cache),
        "WANDB_MODE": "disabled",
        "JAX_PLATFORMS": "cpu",
        "PYTHONPATH": str(code),  # that checkout's common/, not the one pip installed
    }
    env.pop("XLA_FLAGS", None)
    cmd = [sys.executable, f"algos/{script}.py", "--n-devices", "1", "--eval-every", "0", *flags]
    done = subprocess.run(
        cmd + ["--out-dir", str(out), "--overwrite"],
        cwd=code,
        env=env,
        capture_output=True,
        text=True,
    )
    if done.returncode:
        sys.exit(f"{script} {' '.join(flags)} failed in {code}:\n{done.stderr[-3000:]}")
    return {
        **json.loads((out / "summary.json").read_text()),
        "new_entries": len(set(cache.rglob("*")) - before),
    }


def changes(script: str) -> list[tuple[str, float]]:
    """(flag, value) for each input float flag of the script's defaults that the Config accepts
    times 0.9."""
    from common import cli, sweep

    config_cls = importlib.import_module(f"algos.{script}").Config
    found = []
    for name in sweep.input_names(config_cls()):
        # a default of 0 (ent_coef): 0.01
        value = round(getattr(config_cls(), name) * 0.9, 6) or 0.01
        try:
            config_cls(**{name: value})
        except cli.ConfigError:
            continue
        found.append((name, value))
    return found


def compile_times(tmp: Path) -> list[str]:
    lines = [
        "| script | cold compile (s) | flag: compile (s), ratio to cold, new cache entries |",
        "|---|---|---|",
    ]
    for script in SCRIPTS:
        cache, steps = (
            tmp / f"cache-{script}",
            ["--total-steps", str(3 * EPOCH_STEPS.get(script, 1024))],
        )
        cold = train(ROOT, script, steps, tmp / script / "cold", cache)
        cells = []
        for name, value in changes(script):
            flag = "--" + name.replace("_", "-")
            run = train(ROOT, script, [*steps, flag, str(value)], tmp / script / name, cache)
            cells.append(
                f"{flag} {value}: {run['compile_time_s']:.2f}, "
                f"{run['compile_time_s'] / cold['compile_time_s']:.2f}x, {run['new_entries']}"
            )
        lines.append(f"| {script} | {cold['compile_time_s']:.2f} | {'; '.join(cells)} |")
        print(lines[-1], flush=True)
    return lines


def sps(base: str, rounds: int, tmp: Path) -> list[str]:
    where = tmp / "base"
    subprocess.run(
        ["git", "worktree", "add", "--detach", "-q", str(where), base], cwd=ROOT, check=True
    )
    try:
        sides = {"base": where, "new": ROOT}
        runs = {(script, side): [] for script in SCRIPTS for side in sides}
        for i in range(rounds + 1):  # round 0 fills each side's cache
            for script in SCRIPTS:
                for side, code in sides.items():
                    summary = train(
                        code,
                        script,
                        ["--total-steps", str(SPS_STEPS[script])],
                        tmp / f"sps-{side}" / script,
                        tmp / f"cache-sps-{side}",
                    )
                    if i:
                        runs[script, side].append(summary["sps"])
        lines = ["| script | steps | base SPS | new SPS | new / base |", "|---|---|---|---|---|"]
        for script in SCRIPTS:
            old, new = (statistics.median(runs[script, side]) for side in sides)
            lines.append(
                f"| {script} | {SPS_STEPS[script]:,} | {old:,.0f} ({min(runs[script, 'base']):,.0f}-{max(runs[script, 'base']):,.0f}) "
                f"| {new:,.0f} ({min(runs[script, 'new']):,.0f}-{max(runs[script, 'new']):,.0f}) | "
                f"{new / old:.3f} |"
            )
            print(lines[-1], flush=True)
        return lines
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(where)], cwd=ROOT, check=True)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--base", help="commit to compare steady SPS with (omit: compile times only)"
    )
    parser.add_argument(
        "--rounds", type=int, default=2, help="SPS rounds (after one that fills the caches)"
    )
    parser.add_argument("--skip-compile", action="store_true", help="only the SPS comparison")
    args = parser.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="bench-inputs-"))
    load = os.getloadavg()[0]
    body = [
        f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} with `python "
        f"bench/dev/inputs.py{f' --base {args.base} --rounds {args.rounds}' if args.base else ''}`, "
        f"commit {commit()}.",
        "",
        f"- Machine: {machine()}; load average at start: {load:.2f}",
        f"- Python {platform.python_version()}, jax {md.version('jax')}, gymnax {md.version('gymnax')}",
        "",
    ]
    if not args.skip_compile:
        body += [
            "Compile time of a run that changes one input float flag after a cold run (same "
            "cache):",
            "",
            *compile_times(tmp),
            "",
        ]
    if args.base:
        body += [
            f"Steady SPS, default flags, base {args.base} vs this checkout, medians of "
            f"{args.rounds} interleaved rounds (min-max):",
            "",
            *sps(args.base, args.rounds, tmp),
            "",
        ]
    write_section(SECTION, "\n".join(body), under=COMPILE)


if __name__ == "__main__":
    main()
