"""common.devices: hosts, device counts, seed keys and the compiled epoch (2 forced CPU devices)."""
import importlib

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from common import devices, run


def test_two_forced_devices():
    assert jax.local_device_count() == 2, "tests/conftest.py must force 2 host devices before jax is imported"


def test_defaults_all_local_devices_chief_fixed_seed():
    is_chief, n_devices, rng = devices.init_host_and_devices()
    assert is_chief is True
    assert n_devices == 2
    _, _, again = devices.init_host_and_devices()
    np.testing.assert_array_equal(rng, again)  # one host, no seed: reproducible
    _, _, seed0 = devices.init_host_and_devices(random_seed=0)
    np.testing.assert_array_equal(rng, seed0)
    _, _, seed1 = devices.init_host_and_devices(random_seed=1)
    assert not np.array_equal(rng, seed1)


def test_explicit_device_count():
    _, n_devices, _ = devices.init_host_and_devices(n_devices=1, random_seed=3)
    assert n_devices == 1


@pytest.mark.parametrize("n", [3, 0, -1])
def test_bad_device_count_raises(n):
    with pytest.raises(ValueError, match=rf"--n-devices {n}\b.*2"):
        devices.init_host_and_devices(n_devices=n)


def test_seed_keys_shape_and_identical_across_devices():
    rng = jax.random.PRNGKey(7)
    keys = devices.seed_keys(rng, num_seeds=3, n_devices=2)
    chex.assert_shape(keys, (2, 3) + rng.shape)
    np.testing.assert_array_equal(keys[0], keys[1])
    host = np.asarray(keys[0])
    assert len({tuple(k) for k in host}) == 3  # seeds differ
    assert not any(np.array_equal(k, rng) for k in host)  # split, not the run key itself


def test_device_key_differs_per_device_under_compile_epoch():
    keys = devices.seed_keys(jax.random.PRNGKey(0), num_seeds=3, n_devices=2)
    out = np.asarray(devices.compile_epoch(devices.device_key, 2, donate=False)(keys))
    chex.assert_shape(out, keys.shape)
    for s in range(3):
        assert not np.array_equal(out[0, s], out[1, s])
        for d in range(2):  # the documented construction: fold in the device index
            np.testing.assert_array_equal(out[d, s], jax.random.fold_in(keys[d, s], d))
    assert len({tuple(k) for k in out.reshape(-1, out.shape[-1])}) == 6


def test_single_device_path_matches_pmap_path():
    """n_devices=1 (jit of vmap) and device 0 of n_devices=2 (pmap) compute the same thing."""
    keys2 = devices.seed_keys(jax.random.PRNGKey(1), num_seeds=2, n_devices=2)
    keys1 = devices.seed_keys(jax.random.PRNGKey(1), num_seeds=2, n_devices=1)

    def fn(key):
        return jax.random.normal(devices.device_key(key), (3,))

    out2 = devices.compile_epoch(fn, 2, donate=False)(keys2)
    out1 = devices.compile_epoch(fn, 1, donate=False)(keys1)
    np.testing.assert_array_equal(out1[0], out2[0])
    assert not np.array_equal(out2[0], out2[1])


@pytest.mark.parametrize("n_devices", [1, 2])
def test_compile_epoch_pmean_averages_over_devices(n_devices):
    x = jnp.arange(n_devices * 3, dtype=jnp.float32).reshape(n_devices, 3) ** 2  # [devices, seeds]

    def fn(v):
        return jax.lax.pmean(v, devices.DEVICE_AXIS), jax.lax.axis_index(devices.DEVICE_AXIS)

    mean, index = devices.compile_epoch(fn, n_devices, donate=False)(x)
    np.testing.assert_allclose(mean, np.broadcast_to(np.asarray(x).mean(0), x.shape))
    np.testing.assert_array_equal(index, np.broadcast_to(np.arange(n_devices)[:, None], x.shape))


def test_unreplicate():
    tree = {"a": jnp.arange(6).reshape(2, 3), "b": (jnp.ones((2, 3, 4)) * jnp.array([1.0, 2.0])[:, None, None],)}
    out = devices.unreplicate(tree)
    np.testing.assert_array_equal(out["a"], [0, 1, 2])
    np.testing.assert_array_equal(out["b"][0], np.ones((3, 4)))


def test_compile_init_on_one_device_equals_the_pmap_path():
    """The runner state is built on one device with the device axis vmapped; device keys still differ."""
    keys = devices.seed_keys(jax.random.PRNGKey(2), num_seeds=2, n_devices=2)

    def fn(key):
        return jax.random.normal(devices.device_key(key), (3,))

    one = devices.compile_init(fn)(keys)
    assert len(one.sharding.device_set) == 1
    chex.assert_shape(one, (2, 2, 3))
    np.testing.assert_array_equal(one, devices.compile_epoch(fn, 2, donate=False)(keys))
    assert not np.array_equal(one[0], one[1])


@pytest.mark.parametrize("shape", [(4, 64), (64, 64), (64, 2), (3, 8), (1, 16), (16, 1)])
def test_orthogonal_is_jax_orthogonal_without_lapack(shape):
    for seed in range(3):
        key = jax.random.PRNGKey(seed)
        ours = devices.orthogonal(key, shape, 1.7)
        np.testing.assert_allclose(ours, jax.nn.initializers.orthogonal(1.7)(key, shape, jnp.float32), atol=2e-5)
        small = min(shape)
        gram = ours.T @ ours if shape[0] >= shape[1] else ours @ ours.T
        np.testing.assert_allclose(gram, 1.7**2 * np.eye(small), atol=1e-4)
    # a seed's weights do not depend on how many devices or seeds are mapped with it
    alone = jax.jit(lambda k: devices.orthogonal(k, shape))(key)
    for batch in ((1,), (2,), (4,), (2, 3)):
        mapped = jax.jit(lambda k: jax.vmap(jax.vmap(lambda k: devices.orthogonal(k, shape)))(k.reshape(-1, 1, 2)))
        together = mapped(jnp.broadcast_to(key, batch + (2,)))
        np.testing.assert_array_equal(together, np.broadcast_to(alone, together.shape))
    # vmapped over seeds it stays matmuls: no custom call (LAPACK) in the program
    text = jax.jit(jax.vmap(lambda k: devices.orthogonal(k, shape))).lower(jax.random.split(key, 3)).as_text()
    assert "custom_call" not in text
    text = jax.jit(jax.vmap(lambda k: jax.nn.initializers.orthogonal()(k, shape))).lower(jax.random.split(key, 3)).as_text()
    assert "custom_call" in text  # the check above can fail: jax's own init calls LAPACK's QR


@pytest.mark.parametrize("name", ["ppo_joint", "awr", "actor_critic", "reinforce", "dqn_value", "skip_transformer"])
def test_no_script_compiles_a_lapack_call(name):
    """jaxlib 0.10's batched LAPACK kernels wait on XLA:CPU's thread pool from inside it and can
    deadlock a 2-core host (seen as a hung CI run); every script's init and epoch avoid them."""
    module = importlib.import_module(f"algos.{name}")
    config = module.Config(num_seeds=2, **({"q_value": True, "n_samples": 4} if name == "awr" else {}))
    trainer = module.make_trainer(config)
    init = devices.compile_init(trainer.init).lower(devices.seed_keys(jax.random.PRNGKey(0), 2, 1))
    epoch = devices.compile_epoch(trainer.epoch, 1, donate=False).lower(init.out_info)
    for program in (init, epoch):
        assert "custom_call" not in program.as_text()


# Small configurations: one epoch of each script is a few hundred steps.
SMALL = {"ppo_joint": dict(num_envs=4, num_steps=16, num_minibatches=2, update_epochs=2),
         "awr": dict(num_envs=4, num_steps=16, policy_steps=4, value_steps=4, policy_batch_size=32,
                     value_batch_size=32),
         "actor_critic": dict(num_envs=4, num_steps=16, policy_batch_size=32, value_batch_size=32,
                              value_train_steps=4),
         "reinforce": dict(num_envs=4, num_steps=16, batch_size=32),
         "dqn_value": dict(num_envs=4, num_steps=4, update_steps=4, batch_size=8, n_replay_epochs=8),
         "skip_transformer": dict(num_envs=4, num_steps=16, num_minibatches=2, update_epochs=1)}


@pytest.mark.parametrize("name", sorted(SMALL))
def test_epoch_on_two_devices_equals_the_one_device_program(name):
    """The same state and keys (a device axis of 2) through `pmap` on 2 devices and through the
    one-device program (`vmap` carrying the axis name): equal for 3 epochs, up to float rounding
    (the two compile the per-device math with different batch sizes)."""
    module = importlib.import_module(f"algos.{name}")
    trainer = module.make_trainer(module.Config(n_devices=2, num_seeds=2, **SMALL[name]))
    two = one = devices.compile_init(trainer.init)(devices.seed_keys(jax.random.PRNGKey(0), 2, 2))
    quick = lambda fn: fn.lower(one).compile(run.FAST_COMPILE)  # noqa: E731
    on_two_devices = quick(devices.compile_epoch(trainer.epoch, 2, donate=False))
    on_one_device = quick(jax.jit(jax.vmap(jax.vmap(trainer.epoch), axis_name=devices.DEVICE_AXIS)))
    assert len(on_one_device(one)[0].obs.sharding.device_set) == 1
    for _ in range(3):
        (two, two_metrics), (one, one_metrics) = on_two_devices(two), on_one_device(one)
        for x, y in zip(jax.tree.leaves((two, two_metrics)), jax.tree.leaves((one, one_metrics))):
            if np.issubdtype(x.dtype, np.floating):
                np.testing.assert_allclose(x, y, rtol=2e-3, atol=2e-4)
            else:
                np.testing.assert_array_equal(x, y)
    assert not np.array_equal(two.obs[0], two.obs[1])  # the devices did explore differently


@pytest.mark.parametrize("name", ["ppo_joint", "actor_critic", "skip_transformer"])
def test_value_metrics_count_every_devices_batch(name):
    """Two devices holding the same state run the same rollout twice: their batch together is the
    one-device batch twice over, so ||R - V|| is sqrt(2) times the one-device norm while the mean and
    the explained variance are the one-device figures (the mean of per-device norms was not)."""
    module = importlib.import_module(f"algos.{name}")
    trainer = module.make_trainer(module.Config(n_devices=1, num_seeds=2, **SMALL[name]))
    one = devices.compile_init(trainer.init)(devices.seed_keys(jax.random.PRNGKey(0), 2, 1))
    two = jax.tree.map(lambda x: jnp.concatenate([x, x]), one)  # [2, seeds, ...]: device 1 a copy of device 0
    quick = lambda fn, state: fn.lower(state).compile(run.FAST_COMPILE)(state)  # noqa: E731
    _, on_one = quick(devices.compile_epoch(trainer.epoch, 1, donate=False), one)
    _, on_two = quick(devices.compile_epoch(trainer.epoch, 2, donate=False), two)
    close = lambda x, y, key: np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-5, err_msg=key)  # noqa: E731
    for key, value in on_one.items():
        for device in range(2):
            want = np.sqrt(2) * value[0] if key == "value/advantage_norm" else value[0]
            want = 2 * value[0] if key == "episode/count" else want
            close(on_two[key][device], want, key)
