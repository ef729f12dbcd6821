"""The five MinAtar games with the defaults and only `--env`: two epochs train through the conv
torso, the runner state keeps its shapes and every metric is finite (the episodes' statistics where
episodes ended). ppo_joint runs every game; awr and dqn_value, the other scripts with MinAtar cells,
run one game each (their conv torso is the same for every game).
tests/test_every_env.py traces every environment without running it; bench/suite/learning.py checks
that ppo_joint learns Breakout-MinAtar."""

import importlib

import jax
import numpy as np
import pytest

from common import devices, nets
from helpers import quick_compile

GAMES = ["Asterix", "Breakout", "Freeway", "Seaquest", "SpaceInvaders"]
EPOCHS = 2

pytestmark = pytest.mark.slow  # 7 programs with a conv torso: about 20 s on 2 cores
CASES = [("ppo_joint", game) for game in GAMES] + [("awr", "Breakout"), ("dqn_value", "Freeway")]


@pytest.mark.parametrize("name, game", CASES)
def test_two_epochs_of_every_game_train_with_the_defaults(name, game):
    module = importlib.import_module(f"algos.{name}")
    defaults = module.Config()
    config = module.Config(
        env=f"{game}-MinAtar",
        n_devices=1,
        total_steps=EPOCHS * defaults.num_envs * defaults.num_steps,
    )
    keys = devices.seed_keys(jax.random.PRNGKey(0), config.num_seeds, 1)
    trainer, init, epoch = quick_compile(module.make_trainer, config, keys)
    state = init(keys)
    channels = trainer.env.observation_space(trainer.env_params).shape[-1]
    kernel = (nets.CONV_KERNEL, nets.CONV_KERNEL, channels, nets.CONV_CHANNELS)
    assert any(x.shape[-4:] == kernel for x in jax.tree.leaves(state)), "no conv torso"
    shapes = jax.tree.map(lambda x: (x.shape, x.dtype), state)
    for _ in range(EPOCHS):
        state, metrics = epoch(state)
        assert jax.tree.map(lambda x: (x.shape, x.dtype), state) == shapes
        ended = np.asarray(metrics["episode/count"]).all()
        for key, value in metrics.items():
            # no episode ended in the epoch (Freeway's last 2,500 steps): its statistics are NaN
            if ended or not key.startswith("episode/"):
                assert np.isfinite(np.asarray(value)).all(), (key, value)
    assert any(key.startswith("loss/") for key in metrics), sorted(metrics)
    np.testing.assert_array_equal(state.epoch, EPOCHS)
