"""Compiled programs kept between runs (`common.executables`, and JAX's persistent compilation cache
for the rest) never stand in for a different program, and serve a run that differs from an earlier
one only in float flags, the inputs of its programs (`sweep.build`).

Runs one after another against ONE cache directory (`$XDG_CACHE_HOME`, as
`run.enable_compile_cache` and `executables.directory` read it), in subprocesses.
The same flags again load the run's programs whole and give the same metrics; a
run that differs in a flag its programs hold as a constant (a static float, a
boolean) stores programs of its own and gives other metrics; one that differs
only in input floats loads the first run's programs, compiles nothing, still
gives other metrics, and ends with the parameters of a run without the cache, bit
for bit. A run on loaded programs never imports distrax. A damaged entry is
compiled again. The key and the store's bound are checked in this process.
"""

import json
import os
import subprocess
from pathlib import Path

import jax
import numpy as np
import pytest
from helpers import run_script

from common import executables

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
LOADED = "programs of an earlier run loaded in"


def run_metrics(
    cache: Path, out_dir: Path, *flags, script: str = "skip_transformer", **env
) -> tuple[list[dict], subprocess.CompletedProcess]:
    """metrics.jsonl of a run of `script` with `flags` (and environment variables `env`), without
    `sps` (a timing), and the finished process."""
    out = run_script(
        script, *flags, "--out-dir", out_dir, cwd=out_dir.parent, XDG_CACHE_HOME=str(cache), **env
    )
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in line.items() if k != "sps"} for line in lines], out


def imported(out: subprocess.CompletedProcess) -> set:
    """The modules a process run with PYTHONPROFILEIMPORTTIME=1 imported."""
    lines = out.stderr.splitlines()
    return {line.split("|")[-1].strip() for line in lines if line.startswith("import time:")}


def stored(cache: Path) -> set:
    """The names of the program store's entries."""
    return {p.name for p in (cache / "jtrax" / "programs").glob("*.pkl")}


def checkpoint(out_dir: Path) -> dict:
    [path] = sorted((out_dir / "checkpoints").glob("epoch_*.npz"))[-1:]
    with np.load(path) as data:
        return {k: data[k] for k in data.files}


@pytest.mark.slow  # 4 runs: about 25 s on 2 cores
def test_a_run_that_differs_in_input_floats_compiles_nothing(tmp_path):
    """ppo_joint: --lr 1e-3, then --lr 3e-3 (and other input floats): the first run's programs,
    nothing compiled, other metrics; the parameters equal those of a --no-compile-cache run of the
    same flags, bit for bit. distrax, and TensorFlow Probability under it, load at the first trace
    of a log-prob (common/distributions.py): the first run imports them, a run on loaded programs
    traces nothing and does not."""
    cache = tmp_path / "cache"
    jax_entries = lambda: set((cache / "jtrax" / "jax").iterdir())  # noqa: E731
    profile = dict(script="ppo_joint", PYTHONPROFILEIMPORTTIME="1")
    base, out = run_metrics(cache, tmp_path / "base", *PPO_TINY, "--lr", "1e-3", **profile)
    assert LOADED not in out.stdout and len(stored(cache)) == 1
    assert {"distrax", "tensorflow_probability"} <= imported(out)
    cached, programs = jax_entries(), stored(cache)
    for flags in (
        ["--lr", "3e-3"],
        ["--lr", "1e-3", "--gamma", "0.9", "--clip-eps", "0.1", "--max-grad-norm", "0.1"],
    ):
        name = "_".join(flags).replace("-", "")
        other, out = run_metrics(cache, tmp_path / name, *PPO_TINY, *flags, **profile)
        assert LOADED in out.stdout and stored(cache) == programs, f"{flags}: programs of its own"
        assert "jax" in imported(out), "no import profile"
        assert not {"distrax", "tensorflow_probability"} & imported(out), f"{flags}: distrax"
        assert jax_entries() == cached, f"{flags}: compiled programs of its own"
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


@pytest.mark.slow  # 7 runs: about a minute on 2 cores
def test_runs_that_differ_in_one_flag_never_share_programs(tmp_path):
    cache = tmp_path / "cache"
    base, out = run_metrics(cache, tmp_path / "base", *PPO_TINY, script="ppo_joint")
    programs = stored(cache)
    assert len(programs) == 1 and LOADED not in out.stdout, "the first run stored no programs"
    # the same programs, loaded whole
    again, out = run_metrics(cache, tmp_path / "again", *PPO_TINY, script="ppo_joint")
    assert again == base and LOADED in out.stdout and stored(cache) == programs
    # a damaged entry: compiled again, the same metrics, the entry written anew
    [entry] = (cache / "jtrax" / "programs").glob("*.pkl")
    entry.write_bytes(entry.read_bytes()[:1000])
    fixed, out = run_metrics(cache, tmp_path / "damaged", *PPO_TINY, script="ppo_joint")
    assert fixed == base and LOADED not in out.stdout and stored(cache) == programs
    assert entry.stat().st_size > 1000
    for flags in (
        ["--max-grad-norm", "0"],  # a switch at 0: a program without clipping
        ["--normalize-advantages"],  # a boolean (a branch of the program)
    ):
        name = "_".join(flags).replace("-", "")
        other, out = run_metrics(cache, tmp_path / name, *PPO_TINY, *flags, script="ppo_joint")
        assert LOADED not in out.stdout and stored(cache) > programs, (
            f"{flags}: no programs of its own"
        )
        programs = stored(cache)
        differ = [k for k in base[-1] if other[-1][k] != base[-1][k]]
        assert differ, f"{flags}: the same metrics as the defaults"
    # a static float (skip_transformer's --skip-fraction, the only one): one depth drawn for every
    # run of the program, so each value stores programs of its own
    runs = {}
    for fraction in ("0.4", "0.5"):
        runs[fraction], out = run_metrics(
            cache, tmp_path / fraction, *TINY, "--skip-fraction", fraction
        )
        assert LOADED not in out.stdout and stored(cache) > programs, (
            f"{fraction}: no programs of its own"
        )
        programs = stored(cache)
    assert [line["epoch"] for line in runs["0.4"]] == [line["epoch"] for line in runs["0.5"]]
    differ = [k for k in runs["0.4"][-1] if runs["0.5"][-1][k] != runs["0.4"][-1][k]]
    assert differ, "--skip-fraction 0.5: the same metrics as 0.4"


def test_the_key_holds_what_shapes_the_programs_and_not_the_input_floats():
    from algos import ppo_joint

    def key(**flags):
        return executables.key(ppo_joint.Config(**flags), ppo_joint.make_trainer, 1)

    base = key()
    assert key(lr=1e-3, gamma=0.9, seed=3, out_dir="elsewhere", eval_every=7) == base
    for flags in (
        dict(max_grad_norm=0.0),  # a switch at 0
        dict(normalize_advantages=True),
        dict(num_seeds=2),
        dict(hidden=(32, 32)),
        dict(eval_episodes=4),
        dict(sweep=("lr=1e-3,3e-3",)),
    ):
        assert key(**flags) != base, flags
    assert executables.key(ppo_joint.Config(), ppo_joint.make_trainer, 2) is None  # pmap


def test_the_store_keeps_the_newest_entries_within_its_bound(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    compiled = jax.jit(lambda x: x + 1).lower(1.0).compile()
    programs = dict.fromkeys(executables.PROGRAMS, compiled)
    executables.save("first", programs)
    size = (executables.directory() / "first.pkl").stat().st_size
    monkeypatch.setattr(executables, "MAX_BYTES", 2 * size)
    for age, name in enumerate(("second", "third")):
        executables.save(name, programs)
        os.utime(executables.directory() / f"{name}.pkl", (1e9 + age, 1e9 + age))
    os.utime(executables.directory() / "first.pkl", (1e9 + 5, 1e9 + 5))  # used last
    executables.save("fourth", programs)
    assert sorted(p.stem for p in executables.directory().glob("*.pkl")) == ["first", "fourth"]
    # a loaded entry runs as the compiled program did; an unreadable one is a miss, and goes
    loaded = executables.load("fourth")
    assert float(loaded["epochs"](1.0)) == 2.0
    (executables.directory() / "first.pkl").write_bytes(b"not a program")
    assert executables.load("first") is None and executables.load("absent") is None
    assert not (executables.directory() / "first.pkl").exists()
    # a store that cannot be written (here its folder is a file): the run goes on without it
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "file"))
    executables.save("fifth", programs)
    assert executables.load("fifth") is None
