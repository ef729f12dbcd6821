"""sweeps/*.yaml: every wandb sweep starts only runs the script accepts, with the values it was
given.

Each sweep's parameters are sampled (every grid point; for random and bayes
sweeps the ends of each range and random draws), turned into the command line
by wandb's own agent code (`--key=value`, values as `str()` renders them:
`True`, `1e-05`, `[64, 64]`), parsed by the script's parser, and the config
must hold exactly the sampled values.
"""

import dataclasses
import importlib
import itertools
from pathlib import Path

import numpy as np
import pytest
import yaml
from wandb.sdk.launch.sweeps.utils import create_sweep_command_args

from common import cli

ROOT = Path(__file__).resolve().parents[1]
SWEEPS = sorted((ROOT / "sweeps").glob("*.yaml"))
COMMAND = ["${env}", "${interpreter}", "${program}", "--track", "${args}"]


SCRIPTS = sorted(p.stem for p in (ROOT / "algos").glob("*.py") if p.stem != "__init__")


def test_every_script_has_a_sweep_and_every_sweep_a_script():
    for script in SCRIPTS:
        assert (ROOT / "sweeps" / f"{script}.yaml").is_file(), (
            f"add sweeps/{script}.yaml, a wandb sweep of {script}'s flags (copy another script's)"
        )
    assert {p.stem for p in SWEEPS} <= set(SCRIPTS)


def candidates(block: dict, rng) -> list:
    """Values a sweep may give one parameter."""
    if "value" in block:
        return [block["value"]]
    if "values" in block:
        return list(block["values"])
    low, high = block["min"], block["max"]
    if block["distribution"] == "log_uniform_values":
        draws = np.exp(rng.uniform(np.log(low), np.log(high), 3))
    else:
        draws = rng.uniform(low, high, 3)
    return [low, high] + [float(x) for x in draws]


def samples(spec: dict, rng) -> list[dict]:
    values = {name: candidates(block, rng) for name, block in spec["parameters"].items()}
    if spec["method"] == "grid":
        return [dict(zip(values, combo)) for combo in itertools.product(*values.values())]
    draws = [
        {name: vals[rng.integers(len(vals))] for name, vals in values.items()} for _ in range(20)
    ]
    ends = [{name: vals[i % len(vals)] for name, vals in values.items()} for i in range(2)]
    return ends + draws


@pytest.mark.parametrize("path", SWEEPS, ids=lambda p: p.stem)
def test_sweep_runs_start_with_the_sampled_values(path):
    spec = yaml.safe_load(path.read_text())
    assert spec["program"] == f"algos/{path.stem}.py" and (ROOT / spec["program"]).is_file()
    assert spec["method"] in ("grid", "random", "bayes")
    assert spec["metric"] == {"name": "eval/return", "goal": "maximize"}  # logged by run.train
    assert spec["command"] == COMMAND  # --track: the agent's run logs to its sweep
    Config = importlib.import_module(f"algos.{path.stem}").Config
    fields = {f.name for f in dataclasses.fields(Config)}
    for name, block in spec["parameters"].items():
        assert name in fields, f"{path.name}: {name} is not a flag of {spec['program']}"
        assert set(block) in ({"value"}, {"values"}, {"distribution", "min", "max"}), (name, block)
        if "distribution" in block:
            assert spec["method"] != "grid", f"{name}: a grid sweep needs values"
            assert block["distribution"] in ("uniform", "log_uniform_values", "int_uniform")
    rng = np.random.default_rng(0)
    for sample in samples(spec, rng):
        argv = create_sweep_command_args({"args": {k: {"value": v} for k, v in sample.items()}})[
            "args"
        ]
        config = cli.parse_config(Config, argv)
        for name, value in sample.items():
            got = getattr(config, name)
            assert got == (tuple(value) if isinstance(value, list) else value), (argv, name, got)


def test_the_agent_renders_values_as_the_parser_expects():
    """The renderings the agent produces, one by one (not only those the YAML files happen to
    use)."""
    Config = importlib.import_module("algos.awr").Config
    argv = create_sweep_command_args(
        {
            "args": {
                "q_value": {"value": True},
                "reweight": {"value": False},
                "n_samples": {"value": 4},
                "policy_lr": {"value": 1e-05},
                "hidden": {"value": [32, 16, 8]},
                "q_aggregate": {"value": "max"},
            }
        }
    )["args"]
    assert argv == [
        "--q_value=True",
        "--reweight=False",
        "--n_samples=4",
        "--policy_lr=1e-05",
        "--hidden=[32, 16, 8]",
        "--q_aggregate=max",
    ]
    config = cli.parse_config(Config, argv)
    assert (
        config.q_value,
        config.reweight,
        config.n_samples,
        config.policy_lr,
        config.hidden,
        config.q_aggregate,
    ) == (True, False, 4, 1e-05, (32, 16, 8), "max")
    # the plain form still works
    assert cli.parse_config(Config, ["--hidden", "32", "16"]).hidden == (
        32,
        16,
    )
    with pytest.raises(SystemExit):
        cli.parse_config(Config, ["--hidden=[32, x]"])
