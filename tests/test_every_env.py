"""Every environment gymnax registers (in ppo_joint; in the other scripts, the ones that differ in
their spaces), with the script's defaults at tiny sizes: the trainer builds, and its init and epoch
trace (abstractly, with `jax.eval_shape`: nothing is compiled or run), with the hyperparameters as
program inputs as a run has them (`sweep.build`).

An environment whose constructor branches in Python on array values (FourRooms-misc, MetaMaze-misc)
once crashed every script here, because the scripts built it inside a traced function."""

import importlib

import gymnax
import jax
import pytest
from gymnax.environments import spaces

from common import cli, devices, envs, sweep
from helpers import SCRIPTS, TINY_BY_SCRIPT

# built from MNIST, which gymnax downloads: offline, a one-line error
NEEDS_DATA = {"MNISTBandit-bsuite"}


# Every environment in ppo_joint (the path all scripts share: make_env, sweep.build, the runner
# state), and every other script on the environments that differ in what a script reads: a
# constructor that branches on arrays, a Discrete observation (one-hot), images (the conv torso),
# Box actions. The other pairs repeat these paths at about 1.5 s each (skip_transformer's 4 s),
# which the suite's time cannot pay for.
DISTINCT = ["FourRooms-misc", "FrozenLake-misc", "Breakout-MinAtar", "Pendulum-v1"]
PAIRS = [("ppo_joint", env_id) for env_id in gymnax.registered_envs] + [
    (name, env_id) for name in SCRIPTS if name != "ppo_joint" for env_id in DISTINCT
]


@pytest.mark.parametrize("name, env_id", PAIRS)
def test_every_environment_builds_and_traces_in_every_script(name, env_id):
    module = importlib.import_module(f"algos.{name}")
    tiny = TINY_BY_SCRIPT[name]
    config = module.Config(
        **tiny, env=env_id, n_devices=1, total_steps=tiny["num_envs"] * tiny["num_steps"]
    )
    try:
        env, env_params = envs.make_env(env_id)
    except cli.ConfigError as error:
        assert env_id in NEEDS_DATA and "/tmp/mnist" in str(error), error
        return
    if name == "dqn_value" and not isinstance(env.action_space(env_params), spaces.Discrete):
        with pytest.raises(cli.ConfigError, match=f"--env {env_id}: DQN needs discrete actions"):
            module.make_trainer(config)
        return
    trainer, values = sweep.build(config, module.make_trainer, 1)
    keys, _ = sweep.run_keys(0, config, 1)
    state = jax.eval_shape(devices.map_init(trainer.init), keys, values)
    _, metrics = jax.eval_shape(devices.map_epoch(trainer.epoch, 1, n_mapped=2), state, values)
    assert any(key.startswith("loss/") for key in metrics), sorted(metrics)
