"""Helpers of the bench scripts; each script rewrites only its own section of bench/RESULTS.md."""

from __future__ import annotations

import os
import platform
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "RESULTS.md"
HEADER = "# Benchmarks\n\nMeasured by the scripts in bench/; each section is rewritten by its own script.\n"


def write_section(section: str, body: str, path: Path = RESULTS) -> None:
    """Replaces `section` (a '## ' heading, up to the next one) in path, or appends it (to HEADER if
    no file)."""
    text = path.read_text() if path.exists() else HEADER
    block = f"{section}\n\n{body.strip()}\n"
    pattern = re.compile(rf"^{re.escape(section)}\n.*?(?=^## |\Z)", re.S | re.M)
    text = (
        pattern.sub(lambda _: block + "\n", text)
        if pattern.search(text)
        else text.rstrip() + "\n\n" + block
    )
    path.write_text(text.rstrip() + "\n")


def machine() -> str:
    """CPU model and core count of this machine."""
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    return f"{cpu}, {os.cpu_count()} cores"


def commit(*paths: str) -> str:
    """`short hash` of HEAD, with a note if any of paths had uncommitted changes."""

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()

    dirty = paths and git("status", "--porcelain", *paths)
    return f"`{git('rev-parse', '--short', 'HEAD')}`" + (
        f" ({' or '.join(paths)} had uncommitted changes when measured)" if dirty else ""
    )


def launch(cmd: list[str], log: Path, timeout: float) -> tuple[float, str]:
    """Runs cmd from the repository root; returns (wall seconds, stdout). Exits with the log tail on
    failure."""
    t0 = time.time()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    wall = time.time() - t0
    log.write_text(f"$ {' '.join(cmd)}\n{proc.stdout}\n--- stderr ---\n{proc.stderr}")
    if proc.returncode:
        sys.exit(
            f"failed ({proc.returncode}): {' '.join(cmd)}\n{(proc.stdout + proc.stderr)[-3000:]}"
        )
    return wall, proc.stdout


def med(runs: list[dict], key: str) -> float:
    """Median of run[key] over runs."""
    return statistics.median(r[key] for r in runs)
