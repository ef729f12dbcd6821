"""Helpers of the bench tools; each tool rewrites only its own entry of bench/RESULTS.md.

bench/RESULTS.md is organised by question ('## ' headings, the constants below); a tool's figures are
one '### ' entry under its question, which the tool rewrites in place (a new entry goes first under
its question: newest figures first). Entries written by hand sit between them and are left alone.
"""

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
HEADER = "# Benchmarks\n\nMeasured by the tools in bench/ (index: bench/README.md).\n"
# The questions of bench/RESULTS.md that a tool writes under.
SPEED = "## Speed against peers"
SCALE = "## Scale"
COMPILE = "## Compile and start-up"
ALGORITHMS = "## Our algorithms against each other"


def write_section(section: str, body: str, path: Path = RESULTS, under: str | None = None) -> None:
    """Replaces `section` (a '## ' or '### ' heading, up to the next heading of its level or above)
    in path. A section not there yet goes first under the '## ' heading `under` (added at the end if
    missing), or at the end of the file; a file not there yet starts with HEADER."""
    text = path.read_text() if path.exists() else HEADER
    level = len(section) - len(section.lstrip("#"))
    block = f"{section}\n\n{body.strip()}\n\n"
    pattern = re.compile(rf"^{re.escape(section)}\n.*?(?=^#{{1,{level}}} |\Z)", re.S | re.M)
    if pattern.search(text):
        text = pattern.sub(lambda _: block, text, count=1)
    elif under is None:
        text = text.rstrip() + "\n\n" + block
    elif not (head := re.search(rf"^{re.escape(under)}\n", text, re.M)):
        text = text.rstrip() + f"\n\n{under}\n\n" + block
    else:  # before the question's first entry (or the next question)
        after = re.compile(r"^#{1,3} ", re.M).search(text, head.end())
        at = after.start() if after else len(text)
        text = text[:at].rstrip() + "\n\n" + block + text[at:]
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
