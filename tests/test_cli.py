"""The command line exactly as the README runs it: subprocesses from another directory."""

import dataclasses
import importlib
import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from common import cli
from helpers import PPO_CLI_TINY, SCRIPTS, command, help_text, run_outputs, run_script, script_env

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "algos" / "ppo_joint.py"
TINY = PPO_CLI_TINY


def tiny(*args):
    """TINY and `args`, which replace TINY's values of the flags they give (a flag may be given
    once)."""
    drop = {i for i, a in enumerate(TINY) if a.startswith("--") and a in args}
    drop |= {i + 1 for i in drop if i + 1 < len(TINY) and not TINY[i + 1].startswith("--")}
    return [a for i, a in enumerate(TINY) if i not in drop] + list(args)


@pytest.mark.parametrize("script", SCRIPTS)
def test_help_explains_every_flag_with_its_default(tmp_path, monkeypatch, script):
    """Each field of the script's Config is a flag whose --help entry is its docstring and its
    default."""
    monkeypatch.setenv("COLUMNS", "1000")  # argparse wraps no docstring
    out = command(script, "--help", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    entries = {}  # flag -> its entry, white space folded (a long flag puts its help on a new line)
    for line in out.stdout.splitlines():
        if line.startswith("  --"):
            flag = line.split()[0]
            entries[flag] = line
        elif line.startswith("    ") and entries:
            entries[flag] += line
    config = importlib.import_module(f"algos.{script}").Config
    docs = cli.field_docs(config)
    for field in dataclasses.fields(config):
        flag = cli.flag_name(field.name)
        help_line = " ".join(f"{docs[field.name]} (default: {field.default})".split())
        assert " ".join(entries[flag].split()).endswith(help_line), entries[flag]


def test_help_lists_the_algorithms_flags_then_the_run_flags(tmp_path):
    text = help_text("ppo_joint", tmp_path)
    own, run = text.split("the algorithm's flags:")[1].split("run flags, the same in every script")
    assert "--clip-eps" in own and "--torso" in own and "--out-dir" not in own
    assert "--out-dir" in run and "--num-seeds" in run and "--clip-eps" not in run


def test_run_writes_outputs(tmp_path):
    out_dir = tmp_path / "run"
    out = run_script("ppo_joint", *TINY, "--out-dir", out_dir, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "eval return" in out.stdout and "epoch" in out.stdout
    # each progress line: the epochs' rate, the run's own by the wall clock, the time elapsed and
    # left
    progress = [line for line in out.stdout.splitlines() if line.startswith("epoch")]
    assert progress and all(
        re.search(r"\| sps +[\d,]+ \|.*\| wall sps +[\d,]+ \| \d+s elapsed, ~\d+s left$", line)
        for line in progress
    ), progress
    config, lines, summary = run_outputs(out_dir)
    assert config["num_envs"] == 4 and config["env"] == "CartPole-v1"
    assert len(lines) == 10 and summary["env_steps"] == 1280
    assert "loss/joint" in lines[-1] and "eval/return" in lines[-1]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--env", "CartPol-v1"], "not a gymnax environment"),
        (["--std", "network"], "applies to continuous actions"),
        (["--num-minibatches", "5"], "does not divide the per-device batch"),
        (["--n-devices", "3"], "--n-devices 3"),
        (["--num-envs", "0"], "--num-envs must be at least 1"),
        (["--lr", "-1"], "positive learning rate"),
    ],
)
def test_bad_input_fails_before_compiling(tmp_path, args, message):
    out = command("ppo_joint", *tiny(*args), "--out-dir", tmp_path / "run", cwd=tmp_path)
    assert out.returncode != 0
    assert message in out.stderr
    assert "compiled in" not in out.stdout
    assert not (tmp_path / "run" / "checkpoints").exists()


@pytest.mark.slow  # a whole run in a new process: CI runs it, the fast suite does not
def test_corrupt_checkpoint_is_reported(tmp_path):
    out_dir = tmp_path / "run"
    assert run_script("ppo_joint", *TINY, "--out-dir", out_dir, cwd=tmp_path).returncode == 0
    ckpt = next((out_dir / "checkpoints").glob("*.npz"))
    ckpt.write_bytes(ckpt.read_bytes()[:100])
    out = run_script("ppo_joint", "--resume", out_dir, cwd=tmp_path)
    assert out.returncode != 0 and "corrupt" in out.stderr and "compiled in" not in out.stdout


@pytest.mark.slow  # a whole run in a new process: CI runs it, the fast suite does not
@pytest.mark.parametrize("signum, exit_code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_interrupt_then_resume_and_eval_only(tmp_path, signum, exit_code):
    """Ctrl-C, or SIGTERM as a job scheduler sends it, stops after the running epochs with a
    checkpoint."""
    out_dir = tmp_path / "run"
    args = [*tiny("--total-steps", "4000000"), "--checkpoint-every", "1000", "--out-dir", out_dir]
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPT), *map(str, args)],
        cwd=tmp_path,
        env=script_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    metrics = out_dir / "metrics.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and not (metrics.exists() and metrics.stat().st_size > 0):
        time.sleep(0.2)
    proc.send_signal(signum)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == exit_code, stdout + stderr
    assert "interrupted: saved epoch" in stdout and "--resume" in stdout
    ckpt = next((out_dir / "checkpoints").glob("epoch_*.npz"))
    stopped_at = int(ckpt.stem.split("_")[1])
    assert stopped_at >= 1
    if signum == signal.SIGTERM:
        return  # what follows reads the checkpoint, whichever signal wrote it

    out = run_script("ppo_joint", "--eval-only", "--resume", out_dir, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "eval return" in out.stdout and "compiled in" not in out.stdout


# ----------------------------------------------------------------------------
# One vocabulary: booleans in every form, renamed flags
# ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "args, value",
    [
        ([], True),
        (["--normalize-reward"], True),
        (["--normalize-reward", "false"], False),
        (["--normalize-reward=False"], False),  # as a wandb agent passes it
        (["--no-normalize-reward"], False),
    ],
)
def test_a_boolean_takes_every_form(args, value):
    from algos import ppo_joint
    from common import cli

    assert cli.parse_config(ppo_joint.Config, args).normalize_reward is value


@pytest.mark.parametrize(
    "script, args, new",
    [
        ("actor_critic", ["--lam", "0.9"], "--gae-lambda"),
        ("awr", ["--td-lambda", "0.9"], "--gae-lambda"),
        ("actor_critic", ["--policy-train-steps", "4"], "--policy-steps"),
        ("reinforce", ["--train-steps", "2"], "--update-steps"),
        ("awr", ["--policy-lr-schedule", "constant"], "--anneal-lr true or false"),
    ],
)
def test_a_renamed_flag_is_refused_with_its_new_name(tmp_path, script, args, new):
    out = command(script, *args, cwd=tmp_path)
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert f"{args[0]} is now {new}" in out.stderr, out.stderr


def test_a_run_written_with_the_old_names_resumes_under_the_new(tmp_path):
    """config.json of a run written before the renames: each old flag maps to its new name (a no_x
    flips), the retired --n-replay-epochs 1 is dropped; two old flags that disagree on one new flag
    are refused in one line."""
    import dataclasses

    from algos import actor_critic
    from common import cli

    saved = dataclasses.asdict(actor_critic.Config())
    for new in ("gae_lambda", "anneal_lr", "policy_steps", "value_steps", "normalize_reward"):
        del saved[new]
    del saved["compile_cache"]
    old = dict(
        lam=0.8,
        policy_lr_schedule="constant",
        value_lr_schedule="constant",
        policy_train_steps=3,
        value_train_steps=5,
        no_normalize_reward=True,
        no_compile_cache=True,
        n_replay_epochs=1,
    )
    (tmp_path / "config.json").write_text(json.dumps({**saved, **old}))
    config = cli.load_config(actor_critic.Config, tmp_path)
    assert (config.gae_lambda, config.anneal_lr, config.normalize_reward) == (0.8, False, False)
    assert (config.policy_steps, config.value_steps, config.compile_cache) == (3, 5, False)
    (tmp_path / "config.json").write_text(
        json.dumps({**saved, **old, "value_lr_schedule": "linear"})
    )
    with pytest.raises(cli.ConfigError, match="--value-lr-schedule against the other flag"):
        cli.load_config(actor_critic.Config, tmp_path)
