"""common/nets.py's conv torso: its shapes, its convolution against a NumPy loop, when it is chosen,
and that every script builds it for image observations."""

import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from common import cli, devices, nets


def np_conv(x, w, b):
    """A 3x3 valid convolution, stride 1, by loops: x [H, W, C], w [3, 3, C, F] -> [H - 2, W - 2,
    F]."""
    height, width, _ = x.shape
    out = np.zeros((height - 2, width - 2, w.shape[-1]))
    for i in range(height - 2):
        for j in range(width - 2):
            out[i, j] = np.einsum("hwc,hwcf->f", x[i : i + 3, j : j + 3], w) + b
    return out


@pytest.mark.parametrize("obs_shape", [(10, 10, 4), (10, 7, 6), (3, 5, 1)])
def test_conv_torso_shapes_and_values(obs_shape):
    keys = jax.random.split(jax.random.PRNGKey(0), 2)
    layers = nets.torso_init(keys, obs_shape, (32, 8), conv=True)
    height, width, channels = obs_shape
    assert [layer["w"].shape for layer in layers] == [
        (3, 3, channels, 16),
        ((height - 2) * (width - 2) * 16, 32),
        (32, 8),
    ]
    kernel = np.asarray(layers[0]["w"]).reshape(-1, 16)
    # orthogonal, scale sqrt 2
    gram = kernel.T @ kernel if kernel.shape[0] >= 16 else kernel @ kernel.T
    np.testing.assert_allclose(gram, 2 * np.eye(len(gram)), atol=1e-4)
    # the dense layers are drawn as without the convolution (the conv's key is folded out of the
    # first)
    plain = nets.torso_init(keys, ((height - 2) * (width - 2) * 16,), (32, 8))
    np.testing.assert_array_equal(layers[1]["w"], plain[0]["w"])

    x = np.asarray(jax.random.bernoulli(jax.random.PRNGKey(1), 0.3, obs_shape), np.float32)
    layers[0]["b"] = jnp.linspace(-0.5, 0.5, 16)

    def np_torso(x):
        out = np.maximum(
            np_conv(x, np.asarray(layers[0]["w"], np.float64), np.asarray(layers[0]["b"])), 0
        ).ravel()
        for layer in layers[1:]:
            out = np.maximum(out @ np.asarray(layer["w"], np.float64) + np.asarray(layer["b"]), 0)
        return out

    np.testing.assert_allclose(
        nets.torso(layers, jnp.asarray(x), "relu"), np_torso(x), rtol=1e-4, atol=1e-5
    )
    # a batch: each row its own observation's features (the batched convolution mixes no rows)
    batched = jax.vmap(nets.torso, (None, 0, None))(
        layers, jnp.stack([jnp.asarray(x), 1 - jnp.asarray(x)]), "relu"
    )
    for row, obs in zip(batched, (x, 1 - x)):
        np.testing.assert_allclose(row, np_torso(obs), rtol=1e-4, atol=1e-5)


def test_the_conv_torso_is_chosen_for_images_only():
    assert nets.uses_conv("auto", (10, 10, 4)) and nets.uses_conv("conv", (10, 10, 4))
    assert not nets.uses_conv("mlp", (10, 10, 4))
    # vectors, grids without channels, too small for a 3x3 kernel
    for shape in [
        (4,),
        (10, 5),
        (2, 10, 3),
        (),
    ]:
        assert not nets.uses_conv("auto", shape)
        with pytest.raises(
            cli.ConfigError,
            match=r"--torso conv needs image observations \[H, W, C\].*use --torso mlp",
        ):
            nets.uses_conv("conv", shape)


@pytest.mark.parametrize("script", ["ppo_joint", "actor_critic", "reinforce", "awr", "dqn_value"])
@pytest.mark.parametrize("torso", ["auto", "mlp"])
def test_every_script_builds_the_conv_torso_for_minatar(script, torso):
    """Breakout-MinAtar's [10, 10, 4] grids: a 3x3x4x16 kernel in the state with --torso auto, none
    with mlp."""
    module = importlib.import_module(f"algos.{script}")
    trainer = module.make_trainer(module.Config(env="Breakout-MinAtar", n_devices=1, torso=torso))
    state = jax.eval_shape(
        devices.map_init(trainer.init), jax.random.split(jax.random.PRNGKey(0), (1, 1))
    )
    # [n_devices, seeds, ...]
    kernels = [x for x in jax.tree.leaves(state) if x.shape[2:] == (3, 3, 4, 16)]
    assert bool(kernels) == (torso == "auto"), [x.shape for x in kernels]
