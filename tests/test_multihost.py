"""Multi-host runs: two processes on 127.0.0.1 form one JAX cluster (one CPU device each).

Every subprocess has a hard timeout: a process waiting for a peer that never
comes must fail the test, not hang it.
"""

import json
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import jax
import numpy as np
import pytest

from common import checkpoints, cli, devices
from helpers import script_env

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "algos" / "ppo_joint.py"
TINY = ["--num-envs", "4", "--num-steps", "16", "--total-steps", "128", "--eval-episodes", "2"]
LIMIT_S = 240


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env(**extra):
    clean = {k: v for k, v in script_env().items() if not k.startswith("JTRAX_")}
    return {**clean, **extra}  # one CPU device per process


def launch(commands, cwd: Path, envs) -> list[tuple[int, str]]:
    """Runs the commands side by side; `(exit status, output)` of each, or fails after LIMIT_S."""
    logs = [open(cwd / f"process{i}.log", "w+") for i in range(len(commands))]
    procs = [
        subprocess.Popen(c, cwd=cwd, env=e, stdout=log, stderr=subprocess.STDOUT, text=True)
        for c, e, log in zip(commands, envs, logs)
    ]
    deadline, timed_out = time.monotonic() + LIMIT_S, False
    try:
        for p in procs:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        timed_out = True
        for p in procs:
            p.kill()
            p.wait()
    texts = []
    for log in logs:
        log.seek(0)
        texts.append(log.read())
        log.close()
    if timed_out:
        pytest.fail(f"killed after {LIMIT_S} s:\n" + "\n----\n".join(t[-3000:] for t in texts))
    return [(p.returncode, t) for p, t in zip(procs, texts)]


def two_processes(cwd: Path, args_of) -> list[tuple[int, str]]:
    """`launch` of the script as processes 0 and 1 of one cluster on a free port, process i with
    the flags `args_of(i)`."""
    cluster = ["--coordinator", f"127.0.0.1:{free_port()}", "--num-processes", "2"]
    commands = [
        [sys.executable, str(SCRIPT), *args_of(i), *cluster, "--process-id", str(i)]
        for i in range(2)
    ]
    return launch(commands, cwd, [env(), env()])


@pytest.mark.slow  # about 30-50 s on 2 cores: two processes compile side by side, twice
def test_two_processes_train_one_run(tmp_path):
    out = two_processes(tmp_path, lambda i: [*TINY, "--out-dir", f"run{i}"])
    for code, text in out:
        assert code == 0, text
        assert "on 2 cpu device(s) of 2 processes" in text, text
    # Only the chief writes (and holds the directory's lock); the other process's --out-dir is never
    # created.
    assert {p.name for p in (tmp_path / "run0").iterdir()} == {
        "config.json",
        "metrics.jsonl",
        "summary.json",
        "checkpoints",
        "run.lock",
    }
    assert not (tmp_path / "run1").exists()
    returns = [float(text.split("eval return ")[1].split()[0]) for _, text in out]
    assert returns[0] == returns[1]  # same parameters, same evaluation episodes

    # The checkpoint gathers both hosts' rows: parameters and optimiser equal, environments and keys
    # not.
    from algos import ppo_joint

    config = ppo_joint.Config(num_envs=4, num_steps=16, total_steps=128, n_devices=2)
    trainer = ppo_joint.make_trainer(config)
    template = jax.eval_shape(
        devices.map_init(trainer.init), devices.seed_keys(jax.random.PRNGKey(0), 1, 2)
    )
    state, epoch = checkpoints.load(checkpoints.latest(tmp_path / "run0" / "checkpoints"), template)
    assert epoch == trainer.num_epochs == 2
    for tree in (state.params, state.opt_state):
        for leaf in jax.tree.leaves(tree):
            np.testing.assert_array_equal(leaf[0], leaf[1])
    assert not np.array_equal(state.key[0], state.key[1])
    assert not np.array_equal(state.obs[0], state.obs[1])
    assert json.loads((tmp_path / "run0" / "summary.json").read_text())["env_steps"] == 128

    # Both processes resume from the chief's directory: each loads the whole checkpoint, keeps its
    # own rows.
    out = two_processes(
        tmp_path, lambda i: ["--resume", "run0", "--eval-only", "--eval-episodes", "2"]
    )
    for code, text in out:
        assert code == 0 and "resumed run0 at epoch 2" in text, text
        assert f"eval return {returns[0]:.2f}" in text, text


DRIVER = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, sys.argv[1])
    import jax, numpy as np
    from common import devices
    devices.init_distributed()  # from $JTRAX_*
    is_chief, n, seed = devices.init_host_and_devices()  # no seed: the chief's clock
    keys = devices.seed_keys(jax.random.PRNGKey(seed), 2, n)
    init = devices.map_init(devices.device_key)(keys)
    epoch = devices.map_epoch(devices.device_key, n, donate=False)(keys)
    print(json.dumps({"chief": is_chief, "count": jax.process_count(), "seed": seed,
                      "init": np.asarray(init).tolist(), "epoch": np.asarray(epoch).tolist()}))
""")


def test_hosts_share_the_run_key_and_no_device_shares_an_env_key(tmp_path):
    port = free_port()
    out = launch(
        [[sys.executable, "-c", DRIVER, str(ROOT)]] * 2,
        tmp_path,
        [
            env(
                JTRAX_COORDINATOR=f"127.0.0.1:{port}",
                JTRAX_NUM_PROCESSES="2",
                JTRAX_PROCESS_ID=str(i),
            )
            for i in range(2)
        ],
    )
    for code, text in out:
        assert code == 0, text
    chief, other = (json.loads(text.strip().splitlines()[-1]) for _, text in out)
    assert (chief["chief"], other["chief"], chief["count"]) == (True, False, 2)
    assert chief["seed"] == other["seed"]  # parameters start from the same key
    for where in ("init", "epoch"):  # [1 device, 2 seeds, 2] on each host: 4 distinct keys
        keys = [tuple(k) for host in (chief, other) for k in np.asarray(host[where]).reshape(-1, 2)]
        assert len(set(keys)) == 4, where


@pytest.mark.parametrize(
    "flags, environ, message",
    [
        # nothing listens on the port
        (
            ["--num-processes", "2", "--process-id", "1", "--coordinator-timeout", "3"],
            {},
            "error: no coordinator at 127.0.0.1:{port} after 3 s",
        ),
        (
            [],
            {"JTRAX_NUM_PROCESSES": "2", "JTRAX_PROCESS_ID": "2"},
            "error: --process-id 2: use 0 to 1",
        ),
    ],
)
def test_cli_cluster_errors_are_clear_and_quick(tmp_path, flags, environ, message):
    port = free_port()
    tick = time.monotonic()
    [(code, text)] = launch(
        [[sys.executable, str(SCRIPT), *TINY, "--coordinator", f"127.0.0.1:{port}", *flags]],
        tmp_path,
        [env(**environ)],
    )
    assert code == 1, text
    assert message.format(port=port) in text, text
    assert "Traceback" not in text and "training" not in text
    assert time.monotonic() - tick < 60


@pytest.mark.parametrize(
    "args, message",
    [
        (
            dict(coordinator="127.0.0.1:1234", num_processes=2, process_id=2),
            r"--process-id 2: use 0 to 1",
        ),
        (
            dict(coordinator="127.0.0.1:1234", num_processes=2, process_id=-3),
            r"--process-id -3: use 0 to 1",
        ),
        (
            dict(coordinator="127.0.0.1:1234", num_processes=-1, process_id=0),
            r"--num-processes -1: .* 1 or more",
        ),
        (dict(coordinator="127.0.0.1:1234", process_id=0), r"--num-processes 0: .* 1 or more"),
        (
            dict(coordinator="127.0.0.1", num_processes=2, process_id=0),
            r"--coordinator '127.0.0.1': use HOST:PORT",
        ),
        (
            dict(coordinator="host:99999", num_processes=2, process_id=0),
            r"--coordinator 'host:99999': use HOST:PORT",
        ),
        (
            dict(coordinator=":1234", num_processes=2, process_id=0),
            r"--coordinator ':1234': use HOST:PORT",
        ),
        (dict(num_processes=2, process_id=1), r"need --coordinator HOST:PORT"),
        (
            dict(coordinator="127.0.0.1:1234", num_processes=2, process_id=1, timeout_s=0),
            r"--coordinator-timeout 0",
        ),
    ],
)
def test_bad_cluster_flags_are_errors_before_anything_starts(args, message):
    with pytest.raises(ValueError, match=message):
        devices.init_distributed(**args)


def test_cluster_flags_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("JTRAX_COORDINATOR", "127.0.0.1:1234")
    monkeypatch.setenv("JTRAX_NUM_PROCESSES", "2")
    monkeypatch.setenv("JTRAX_PROCESS_ID", "5")
    with pytest.raises(ValueError, match=r"--process-id 5: use 0 to 1"):
        devices.init_distributed()
    # flags win over the environment
    with pytest.raises(ValueError, match=r"--process-id 7: use 0 to 3"):
        devices.init_distributed(num_processes=4, process_id=7)
    monkeypatch.setenv("JTRAX_NUM_PROCESSES", "two")
    with pytest.raises(ValueError, match=r"\$JTRAX_NUM_PROCESSES='two'"):
        devices.init_distributed()


def test_no_coordinator_is_one_process(monkeypatch):
    for name in ("JTRAX_COORDINATOR", "JTRAX_NUM_PROCESSES", "JTRAX_PROCESS_ID"):
        monkeypatch.delenv(name, raising=False)
    devices.init_distributed(num_processes=1, process_id=0)  # nothing to join
    assert jax.process_count() == 1


def test_cluster_flags_are_run_control():
    """On --resume they come from the command line (each host has its own), not from config.json."""
    for name in ("coordinator", "num_processes", "process_id", "coordinator_timeout"):
        assert name in cli.RUN_CONTROL
