"""common/checkpoints.py: a round trip, the newest `keep` kept, a mismatched or corrupt file named
with its fix, and a write that dies leaving the last good checkpoint. The state is the tiny
ppo_joint trainer's (`helpers.initial_state`)."""

import collections
import dataclasses
import json

import chex
import jax
import numpy as np
import pytest

from common import checkpoints, cli, devices
from helpers import host, initial_state, make_trainer, run_keys, tiny


@pytest.fixture
def init_state():
    return initial_state()


def test_checkpoint_round_trip(tmp_path, init_state):
    c, state = init_state
    template = jax.eval_shape(c.init, run_keys(0))
    path = checkpoints.save(tmp_path, state, 3)
    assert path == tmp_path / "epoch_000003.npz"
    loaded, epoch = checkpoints.load(path, template)
    assert epoch == 3
    assert jax.tree.structure(loaded) == jax.tree.structure(state)
    chex.assert_trees_all_equal(loaded, host(state))
    chex.assert_trees_all_equal_shapes_and_dtypes(loaded, host(state))
    # the newest `keep` stay; nothing temporary is left behind
    checkpoints.save(tmp_path, state, 5, keep=2)
    checkpoints.save(tmp_path, state, 6, keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["epoch_000005.npz", "epoch_000006.npz"]
    checkpoints.save(tmp_path, state, 7, keep=1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["epoch_000007.npz"]
    assert checkpoints.latest(tmp_path) == tmp_path / "epoch_000007.npz"
    # plain arrays, no pickle
    with np.load(tmp_path / "epoch_000007.npz", allow_pickle=False) as data:
        assert json.loads(bytes(data["meta"]).decode())["epoch"] == 7


def test_checkpoint_mismatched_template(tmp_path, init_state):
    c, state = init_state
    path = checkpoints.save(tmp_path, state, 1)
    wider = make_trainer(tiny(hidden=(64, 32)))
    template = jax.eval_shape(devices.map_init(wider.init), run_keys(0))
    with pytest.raises(ValueError, match=r"leaf \d+ is .* expects") as info:
        checkpoints.load(path, template)
    assert str(path) in str(info.value) and "--out-dir" in str(info.value)
    other = make_trainer(tiny(env="Pendulum-v1"))
    template = jax.eval_shape(devices.map_init(other.init), run_keys(0))
    with pytest.raises(ValueError, match="different state structure"):
        checkpoints.load(path, template)


@pytest.mark.parametrize("damage", ["garbage", "truncated", "empty"])
def test_corrupt_checkpoint_raises(tmp_path, init_state, damage):
    c, state = init_state
    path = checkpoints.save(tmp_path, state, 1)
    data = path.read_bytes()
    path.write_bytes(
        {"garbage": b"not a checkpoint" * 100, "truncated": data[: len(data) // 2], "empty": b""}[
            damage
        ]
    )
    with pytest.raises(ValueError, match="corrupt") as info:
        checkpoints.load(path, jax.eval_shape(c.init, run_keys(0)))
    assert str(path) in str(info.value)


def test_checkpoint_write_is_atomic(tmp_path, init_state, monkeypatch):
    c, state = init_state
    good = checkpoints.save(tmp_path, state, 1)

    def fail(fd):
        raise OSError("disk full")

    monkeypatch.setattr(checkpoints.os, "fsync", fail)  # the write dies before the rename
    with pytest.raises(OSError):
        checkpoints.save(tmp_path, state, 2)
    monkeypatch.undo()
    assert not (tmp_path / "epoch_000002.npz").exists()
    assert not list(tmp_path.glob(".tmp_*"))  # no half-written file left behind
    assert checkpoints.latest(tmp_path) == good
    loaded, epoch = checkpoints.load(good, jax.eval_shape(c.init, run_keys(0)))
    assert epoch == 1
    chex.assert_trees_all_equal(loaded, host(state))


def test_a_checkpoint_of_other_devices_names_the_device_flag(tmp_path, init_state):
    """A one-device run resumed where two devices are the default: the message says --n-devices 1.
    Two devices hold half of the environments each, so the state's other axes differ too."""
    c, state = init_state
    path = checkpoints.save(tmp_path, state, 1)
    trainer = make_trainer(dataclasses.replace(c.config, n_devices=2))
    two = jax.eval_shape(devices.map_init(trainer.init), run_keys(0, n_devices=2))
    # [devices, seeds, envs]
    assert two.obs.shape[:3] == (2, 2, 2) and state.obs.shape[:3] == (
        1,
        2,
        4,
    )
    with pytest.raises(
        cli.ConfigError,
        match=r"holds the state of 1 device\(s\) and this run has 2: resume with "
        r"--n-devices 1",
    ):
        checkpoints.load(path, two)


def test_a_checkpoint_written_before_a_key_was_renamed_loads_under_the_new_name(
    tmp_path, init_state
):
    """dqn_value's "body" and "head" became "torso" and "value" (`checkpoints.RENAMED`): a checkpoint
    with the old keys (here ppo_joint's state written so: its keys then sort otherwise, so the leaves
    come in another order) loads into the new layout, every leaf in its place."""
    c, state = init_state
    template = jax.eval_shape(c.init, run_keys(0))
    old = checkpoints._renamed(host(state), {new: k for k, new in checkpoints.RENAMED.items()})
    assert jax.tree.structure(old) != jax.tree.structure(host(state))
    loaded, _ = checkpoints.load(checkpoints.save(tmp_path, old, 1), template)
    chex.assert_trees_all_equal(loaded, host(state))


@pytest.mark.parametrize("missing", [("epoch",), ("noise",), ("epoch", "noise")])
def test_a_checkpoint_written_before_a_field_was_added_resumes(tmp_path, init_state, missing):
    """Runner states gained `epoch` (the epochs done) and `noise` (each environment's exploration
    noise): a checkpoint of a state without them (saved from the other fields under a NamedTuple
    of the same name) loads with every other leaf in its place, the counter at the checkpoint's
    epoch and the noise at 0."""
    c, state = init_state
    template = jax.eval_shape(c.init, run_keys(0))
    rest = [name for name in state._fields if name not in missing]
    older = collections.namedtuple(type(state).__name__, rest)(*(getattr(state, k) for k in rest))
    loaded, epoch = checkpoints.load(checkpoints.save(tmp_path, host(older), 7), template)
    assert epoch == 7
    chex.assert_trees_all_equal_shapes_and_dtypes(loaded, template)
    if "epoch" in missing:
        np.testing.assert_array_equal(loaded.epoch, np.full(template.epoch.shape, 7))
    if "noise" in missing:
        np.testing.assert_array_equal(loaded.noise, np.zeros(template.noise.shape))
    blank = dict.fromkeys(missing)
    chex.assert_trees_all_equal(loaded._replace(**blank), host(state)._replace(**blank))
