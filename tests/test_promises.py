"""What every script promises about a run: a non-finite loss term stops it, --resume continues it exactly,
load_agent acts as it trained, and --sweep members train as runs of their values.

Tiny configurations (an epoch is a few hundred steps); the runs share the session's compile cache."""
import dataclasses
import importlib

import pytest

from common import run

SCRIPTS = ["ppo_joint", "awr", "actor_critic", "reinforce", "dqn_value", "skip_transformer"]
TINY = {"ppo_joint": dict(num_envs=4, num_steps=16, num_minibatches=2, update_epochs=2),
        "awr": dict(num_envs=4, num_steps=16, policy_steps=4, value_steps=4, policy_batch_size=32,
                    value_batch_size=32, n_replay_epochs=2),
        "actor_critic": dict(num_envs=4, num_steps=16, policy_batch_size=32, value_batch_size=32, value_train_steps=4),
        "reinforce": dict(num_envs=4, num_steps=16, batch_size=32),
        "dqn_value": dict(num_envs=4, num_steps=4, update_steps=4, batch_size=8, n_replay_epochs=8),
        "skip_transformer": dict(num_envs=4, num_steps=16, num_minibatches=2, update_epochs=1, skip_warmup_steps=0)}
RUN = dict(n_devices=1, eval_every=0, eval_episodes=2, no_compile_cache=True)


def config(name, out_dir, epochs=3, **overrides):
    module = importlib.import_module(f"algos.{name}")
    steps = TINY[name]["num_envs"] * TINY[name]["num_steps"]
    return module, module.Config(**{**TINY[name], **RUN, "total_steps": epochs * steps, "out_dir": str(out_dir),
                                    **overrides})


# ----------------------------------------------------------------------------
# A non-finite loss term stops the run
# ----------------------------------------------------------------------------
@pytest.mark.parametrize("name, overrides", [
    # Sampling AWR weighs the policy with the critic's copy from the epoch's start, and actor_critic's
    # advantages come from the value net before its update: a diverged critic reaches their policy loss
    # only in the next epoch (and never in a run of one epoch)
    ("awr", dict(value_lr=float("inf"), q_value=True, n_samples=2)),
    ("actor_critic", dict(value_lr=float("inf"))),
])
def test_a_non_finite_value_loss_stops_the_run_in_its_epoch(tmp_path, name, overrides):
    """An infinite value learning rate makes the critic's first Adam step non-finite, so loss/value is NaN in
    the first epoch while loss/policy is not yet: the run stops there, naming it, without a checkpoint."""
    module, cfg = config(name, tmp_path / "run", epochs=1, **overrides)
    with pytest.raises(SystemExit) as info:
        run.train(cfg, module.make_trainer, name)
    message = str(info.value.code)
    assert message.startswith("loss/value is nan at epoch 1: training diverged"), message
    assert "Last good checkpoint: none" in message
    assert run.latest_checkpoint(tmp_path / "run" / "checkpoints") is None
