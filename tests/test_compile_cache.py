"""JAX's persistent compilation cache never stands in for a different program, and serves a run that
differs from an earlier one only in float flags, the inputs of its programs (`sweep.build`).

Runs one after another against ONE cache directory (`$XDG_CACHE_HOME`, as
`run.enable_compile_cache` reads it), in subprocesses (this process runs
without the cache, see conftest.py). The same flags again load every program
from the cache and give the same metrics; a run that differs in a flag its
programs hold as a constant (a static float, a boolean) adds its own entries
and gives other metrics; one that differs only in input floats adds none,
still gives other metrics, and ends with the parameters of a run without the
cache, bit for bit. (Only skip_transformer's epoch program depends on
--skip-fraction: a second skip fraction loads init and evaluation from the
cache and compiles less. Its metrics equal the first's while the skip warmup
runs every block; see `skipping.steps_without_skipping`.)
"""

import json
from pathlib import Path

import numpy as np
import pytest
from helpers import run_script

# 10 epochs of 4 gradient steps, blocks skippable from the 3rd: the depths drawn for --skip-fraction
# 0.4 and 0.5 part in epoch 2 (layer 1 is skipped when its uniform draw u < skip_fraction / 2 after
# warmup).
TINY = (
    "--num-envs 4 --num-steps 32 --total-steps 1280 --update-passes 2 --num-minibatches 2 "
    "--context-len 3 --d-model 8 --d-ff 16 --n-layers 2 --skip-warmup-steps 4 --eval-every 0 "
    "--eval-episodes 2 --checkpoint-every 1000"
).split()
PPO_TINY = (
    "--num-envs 4 --num-steps 16 --total-steps 256 --update-passes 2 --num-minibatches 2 "
    "--eval-every 0 --eval-episodes 2"
).split()


def run_metrics(cache: Path, out_dir: Path, *flags, script: str = "skip_transformer") -> list[dict]:
    """metrics.jsonl of a run of `script` with `flags`, without `sps` (a timing)."""
    out = run_script(
        script, *flags, "--out-dir", out_dir, cwd=out_dir.parent, XDG_CACHE_HOME=str(cache)
    )
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in line.items() if k != "sps"} for line in lines]


def checkpoint(out_dir: Path) -> dict:
    [path] = sorted((out_dir / "checkpoints").glob("epoch_*.npz"))[-1:]
    with np.load(path) as data:
        return {k: data[k] for k in data.files}


@pytest.mark.slow  # 4 runs: about 30 s on 2 cores
def test_a_run_that_differs_in_input_floats_compiles_nothing(tmp_path):
    """ppo_joint: --lr 1e-3, then --lr 3e-3 (and other input floats): no new cache entry, other
    metrics; the parameters equal those of a --no-compile-cache run of the same flags, bit for
    bit."""
    cache = tmp_path / "cache"
    entries = lambda: set((cache / "jtrax" / "jax").iterdir())  # noqa: E731
    base = run_metrics(cache, tmp_path / "base", *PPO_TINY, "--lr", "1e-3", script="ppo_joint")
    cached = entries()
    for flags in (
        ["--lr", "3e-3"],
        ["--lr", "1e-3", "--gamma", "0.9", "--clip-eps", "0.1", "--max-grad-norm", "0.1"],
    ):
        name = "_".join(flags).replace("-", "")
        other = run_metrics(cache, tmp_path / name, *PPO_TINY, *flags, script="ppo_joint")
        assert entries() == cached, f"{flags}: compiled programs of its own"
        assert other[-1]["loss/joint"] != base[-1]["loss/joint"], (
            f"{flags}: the same metrics as --lr 1e-3"
        )
    run_metrics(
        cache, tmp_path / "no_cache", *PPO_TINY, *flags, "--no-compile-cache", script="ppo_joint"
    )
    with_cache, without = checkpoint(tmp_path / name), checkpoint(tmp_path / "no_cache")
    assert with_cache.keys() == without.keys()
    for k in with_cache:
        np.testing.assert_array_equal(with_cache[k], without[k], err_msg=k)


@pytest.mark.slow  # 5 runs: about 2 minutes on 2 loaded cores
def test_runs_that_differ_in_one_flag_never_share_a_cache_entry(tmp_path):
    cache = tmp_path / "cache"
    entries = lambda: set((cache / "jtrax" / "jax").iterdir())  # noqa: E731
    base = run_metrics(cache, tmp_path / "base", *TINY, "--skip-fraction", "0.4")
    cached = entries()
    assert cached, "the first run wrote nothing to the cache"
    # the same programs...
    assert run_metrics(cache, tmp_path / "again", *TINY, "--skip-fraction", "0.4") == base
    assert entries() == cached  # ... loaded from the cache: nothing compiled anew
    for flags in (
        # a static float (one depth drawn for every run of the program)
        ["--skip-fraction", "0.5"],
        # a switch at 0: a program without clipping
        ["--skip-fraction", "0.4", "--max-grad-norm", "0"],
        # a boolean (a branch of the program)
        ["--skip-fraction", "0.4", "--normalize-advantages"],
    ):
        other = run_metrics(cache, tmp_path / "_".join(flags).replace("-", ""), *TINY, *flags)
        assert entries() > cached, f"{flags}: no program of its own in the cache"
        cached = entries()
        assert [line["epoch"] for line in other] == [line["epoch"] for line in base]
        differ = [k for k in base[-1] if other[-1][k] != base[-1][k]]
        assert differ, f"{flags}: the same metrics as --skip-fraction 0.4"
