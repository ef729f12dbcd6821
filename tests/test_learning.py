"""Learning: greedy evaluation after training from a fixed seed reaches a threshold."""
import pytest

from algos import ppo_joint
from common import run

pytestmark = pytest.mark.slow


def test_ppo_joint_learns_cartpole(tmp_path):
    config = ppo_joint.Config(env="CartPole-v1", seed=0, n_devices=1, eval_every=0,
                              out_dir=str(tmp_path))
    summary = run.train(config, ppo_joint.make_trainer, "ppo_joint").summary
    assert summary["eval_return"] >= 475, summary


def test_ppo_joint_learns_pendulum(tmp_path):
    config = ppo_joint.Config(env="Pendulum-v1", seed=0, n_devices=1, eval_every=0, out_dir=str(tmp_path),
                              num_envs=16, num_steps=128, total_steps=300_000, gamma=0.9,
                              update_epochs=10, num_minibatches=8, normalize_advantages=True, vf_coef=0.1)
    summary = run.train(config, ppo_joint.make_trainer, "ppo_joint").summary
    assert summary["eval_return"] >= -300, summary
