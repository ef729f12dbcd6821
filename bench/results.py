"""bench/RESULTS.md: each benchmark script rewrites only its own section."""
from __future__ import annotations

import re
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"


def write_section(section: str, body: str, path: Path = RESULTS) -> None:
    """Replaces `section` (a '## ' heading, up to the next one) in path, or appends it."""
    text = path.read_text()
    block = f"{section}\n\n{body.strip()}\n"
    pattern = re.compile(rf"^{re.escape(section)}\n.*?(?=^## |\Z)", re.S | re.M)
    text = pattern.sub(lambda _: block + "\n", text) if pattern.search(text) else text.rstrip() + "\n\n" + block
    path.write_text(text.rstrip() + "\n")


def machine() -> str:
    """CPU model and core count of this machine."""
    import os
    import platform

    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    return f"{cpu}, {os.cpu_count()} cores"
