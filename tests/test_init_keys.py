"""Every script draws each initialised array of its parameters from a key of its own.

Under jax's partitionable threefry `fold_in(k, i)` can equal `split(k, n)[i]`, so
keys made by folding beside keys made by splitting may collide: two layers then
start from the same draw. The test records the key of every parameter draw that
a script's `init` makes (every random array goes through `nets.orthogonal` or
`jax.random.normal`) and requires them distinct.
"""

import importlib

import jax
import numpy as np
import pytest

from common import devices, nets

CASES = [
    ("ppo_joint", {}),
    ("awr", {}),
    ("awr", {"q_value": True, "n_samples": 2}),
    ("actor_critic", {}),
    ("reinforce", {}),
    ("dqn_value", {}),
    ("skip_transformer", {}),
    ("ppo_joint", {"env": "Pendulum-v1"}),
]


def drawn_keys(monkeypatch, script: str, flags: dict) -> list[tuple]:
    module = importlib.import_module(f"algos.{script}")
    trainer = module.make_trainer(module.Config(**flags, n_devices=1))
    keys: list[tuple] = []
    record = lambda key: keys.append(tuple(np.asarray(jax.random.key_data(key)).ravel()))  # noqa: E731
    orthogonal, normal = nets.orthogonal, jax.random.normal

    def spy_orthogonal(key, *args, **kwargs):
        record(key)
        return orthogonal(key, *args, **kwargs)

    def spy_normal(key, *args, **kwargs):
        if not isinstance(key, jax.core.Tracer):  # draws inside `orthogonal` are recorded there
            record(key)
        return normal(key, *args, **kwargs)

    monkeypatch.setattr(nets, "orthogonal", spy_orthogonal)
    monkeypatch.setattr(jax.random, "normal", spy_normal)
    # init runs eagerly, outside the device axis
    monkeypatch.setattr(devices, "device_key", lambda key: key)
    with jax.disable_jit():
        trainer.init(jax.random.PRNGKey(0))
    return keys


@pytest.mark.parametrize(
    "script, flags", CASES, ids=[f"{s}-{'-'.join(f) or 'default'}" for s, f in CASES]
)
def test_every_parameter_draw_has_its_own_key(monkeypatch, script, flags):
    keys = drawn_keys(monkeypatch, script, flags)
    assert len(keys) >= 3, keys  # at least two layers and a head were drawn
    repeated = {k for k in keys if keys.count(k) > 1}
    assert not repeated, f"{script}: {len(repeated)} key(s) used for more than one parameter draw"
