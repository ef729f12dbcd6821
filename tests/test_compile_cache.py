"""JAX's persistent compilation cache never stands in for a different program.

Runs of skip_transformer one after another against ONE cache directory
(`$XDG_CACHE_HOME`, as `run.enable_compile_cache` reads it): the same flags
again load every program from the cache and give the same metrics; a run that
differs in one flag adds its own entries and gives other metrics. (Only the
epoch program depends on --skip-fraction: a second skip fraction loads init
and evaluation from the cache and compiles less. Its metrics equal the
first's while the skip warmup runs every block; see
`skipping.steps_without_skipping`.)
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "algos" / "skip_transformer.py"
# 10 epochs of 4 gradient steps, blocks skippable from the 3rd: the depths drawn for --skip-fraction 0.4
# and 0.5 part in epoch 2 (layer 1 is skipped when its uniform draw u < skip_fraction / 2 after warmup).
TINY = ["--num-envs", "4", "--num-steps", "32", "--total-steps", "1280", "--update-epochs", "2",
        "--num-minibatches", "2", "--context-len", "3", "--d-model", "8", "--d-ff", "16", "--n-layers", "2",
        "--skip-warmup-steps", "4", "--eval-every", "0", "--eval-episodes", "2", "--checkpoint-every", "1000"]


def run_metrics(cache: Path, out_dir: Path, *flags) -> list[dict]:
    """metrics.jsonl of a run with `flags`, without `sps` (a timing)."""
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # one device, as a user has
    env.update(XDG_CACHE_HOME=str(cache), WANDB_MODE="disabled", JAX_PLATFORMS="cpu")
    out = subprocess.run([sys.executable, str(SCRIPT), *TINY, *flags, "--out-dir", str(out_dir)], cwd=out_dir.parent,
                         env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in line.items() if k != "sps"} for line in lines]


@pytest.mark.slow  # 5 runs: about 2 minutes on 2 loaded cores
def test_runs_that_differ_in_one_flag_never_share_a_cache_entry(tmp_path):
    cache = tmp_path / "cache"
    entries = lambda: set((cache / "jtrax" / "jax").iterdir())  # noqa: E731
    base = run_metrics(cache, tmp_path / "base", "--skip-fraction", "0.4")
    cached = entries()
    assert cached, "the first run wrote nothing to the cache"
    assert run_metrics(cache, tmp_path / "again", "--skip-fraction", "0.4") == base  # the same programs...
    assert entries() == cached  # ... loaded from the cache: nothing compiled anew
    for flags in (["--skip-fraction", "0.5"],  # a float fixed at trace time (the bounds of the depth draw)
                  ["--skip-fraction", "0.4", "--lr", "2e-3"],  # a float of the compiled math
                  ["--skip-fraction", "0.4", "--normalize-advantages"]):  # a boolean (a branch of the program)
        other = run_metrics(cache, tmp_path / "_".join(flags).replace("-", ""), *flags)
        assert entries() > cached, f"{flags}: no program of its own in the cache"
        cached = entries()
        assert [line["epoch"] for line in other] == [line["epoch"] for line in base]
        differ = [k for k in base[-1] if other[-1][k] != base[-1][k]]
        assert differ, f"{flags}: the same metrics as --skip-fraction 0.4"
