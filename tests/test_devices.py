"""common.devices: hosts, device counts, seed keys and the compiled epoch (2 forced CPU devices)."""

import functools
import importlib

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from algos import ppo_joint
from common import devices, nets, run, sweep
from helpers import slow_for


def test_two_forced_devices():
    assert jax.local_device_count() == 2, (
        "tests/conftest.py must force 2 host devices before jax is imported"
    )


def test_defaults_all_local_devices_chief_fixed_seed():
    is_chief, n_devices, seed = devices.init_host_and_devices()
    assert is_chief is True
    assert n_devices == 2
    assert seed == 0  # one host, no seed: reproducible
    assert devices.init_host_and_devices(random_seed=1).seed == 1


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


@pytest.mark.parametrize("seed", [0, 7, -3, 2**31, 2**32 + 5])
def test_run_keys_inside_a_program_are_the_seeds_keys_on_the_host(seed):
    """The programs derive the keys from `seed_input(seed)`: the same keys as `jax.random` gives
    the integer itself (negative and past 32 bits too), so a seed names the same run as before."""
    config = ppo_joint.Config(num_seeds=3, n_devices=2)
    keys, eval_key = jax.jit(sweep.run_keys, static_argnums=(1, 2))(
        sweep.seed_input(seed), config, 2
    )
    init_key, host_eval_key = jax.random.split(jax.random.fold_in(jax.random.PRNGKey(seed), 0))
    np.testing.assert_array_equal(keys, devices.seed_keys(init_key, 3, 2))
    np.testing.assert_array_equal(eval_key, host_eval_key)


def test_device_key_differs_per_device_under_map_epoch():
    keys = devices.seed_keys(jax.random.PRNGKey(0), num_seeds=3, n_devices=2)
    out = np.asarray(devices.map_epoch(devices.device_key, 2, donate=False)(keys))
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

    out2 = devices.map_epoch(fn, 2, donate=False)(keys2)
    out1 = devices.map_epoch(fn, 1, donate=False)(keys1)
    np.testing.assert_array_equal(out1[0], out2[0])
    assert not np.array_equal(out2[0], out2[1])


@pytest.mark.parametrize("n_devices", [1, 2])
def test_map_epoch_pmean_averages_over_devices(n_devices):
    x = jnp.arange(n_devices * 3, dtype=jnp.float32).reshape(n_devices, 3) ** 2  # [devices, seeds]

    def fn(v):
        return jax.lax.pmean(v, devices.DEVICE_AXIS), jax.lax.axis_index(devices.DEVICE_AXIS)

    mean, index = devices.map_epoch(fn, n_devices, donate=False)(x)
    np.testing.assert_allclose(mean, np.broadcast_to(np.asarray(x).mean(0), x.shape))
    np.testing.assert_array_equal(index, np.broadcast_to(np.arange(n_devices)[:, None], x.shape))


def test_unreplicate():
    tree = {
        "a": jnp.arange(6).reshape(2, 3),
        "b": (jnp.ones((2, 3, 4)) * jnp.array([1.0, 2.0])[:, None, None],),
    }
    out = devices.unreplicate(tree)
    np.testing.assert_array_equal(out["a"], [0, 1, 2])
    np.testing.assert_array_equal(out["b"][0], np.ones((3, 4)))


def test_map_init_on_one_device_equals_the_pmap_path():
    """The runner state is built on one device with the device axis vmapped; device keys still
    differ."""
    keys = devices.seed_keys(jax.random.PRNGKey(2), num_seeds=2, n_devices=2)

    def fn(key):
        return jax.random.normal(devices.device_key(key), (3,))

    one = devices.map_init(fn)(keys)
    assert len(one.sharding.device_set) == 1
    chex.assert_shape(one, (2, 2, 3))
    np.testing.assert_array_equal(one, devices.map_epoch(fn, 2, donate=False)(keys))
    assert not np.array_equal(one[0], one[1])


@pytest.mark.parametrize("shape", [(4, 64), (64, 64), (64, 2), (3, 8), (1, 16), (16, 1)])
def test_orthogonal_is_jax_orthogonal_without_lapack(shape):
    for seed in range(3):
        key = jax.random.PRNGKey(seed)
        ours = nets.orthogonal(key, shape, 1.7)
        np.testing.assert_allclose(
            ours, jax.nn.initializers.orthogonal(1.7)(key, shape, jnp.float32), atol=2e-5
        )
        small = min(shape)
        gram = ours.T @ ours if shape[0] >= shape[1] else ours @ ours.T
        np.testing.assert_allclose(gram, 1.7**2 * np.eye(small), atol=1e-4)
    # a seed's weights do not depend on how many devices or seeds are mapped with it
    alone = jax.jit(lambda k: nets.orthogonal(k, shape))(key)
    for batch in ((1,), (2,), (4,), (2, 3)):
        mapped = jax.jit(
            lambda k: jax.vmap(jax.vmap(lambda k: nets.orthogonal(k, shape)))(k.reshape(-1, 1, 2))
        )
        together = mapped(jnp.broadcast_to(key, batch + (2,)))
        np.testing.assert_array_equal(together, np.broadcast_to(alone, together.shape))
    # vmapped over seeds it stays matmuls: no custom call (LAPACK) in the program
    text = (
        jax.jit(jax.vmap(lambda k: nets.orthogonal(k, shape)))
        .lower(jax.random.split(key, 3))
        .as_text()
    )
    assert "custom_call" not in text
    text = (
        jax.jit(jax.vmap(lambda k: jax.nn.initializers.orthogonal()(k, shape)))
        .lower(jax.random.split(key, 3))
        .as_text()
    )
    assert "custom_call" in text  # the check above can fail: jax's own init calls LAPACK's QR


@pytest.mark.parametrize(
    "name", ["ppo_joint", "awr", "actor_critic", "reinforce", "dqn_value", "skip_transformer"]
)
def test_no_script_compiles_a_lapack_call(name):
    """jaxlib 0.10's batched LAPACK kernels wait on XLA:CPU's thread pool from inside it and can
    deadlock a 2-core host (seen as a hung CI run); every script's init and epoch avoid them."""
    module = importlib.import_module(f"algos.{name}")
    config = module.Config(
        num_seeds=2, **({"q_value": True, "n_samples": 4} if name == "awr" else {})
    )
    trainer = module.make_trainer(config)
    init = devices.map_init(trainer.init).lower(devices.seed_keys(jax.random.PRNGKey(0), 2, 1))
    epoch = devices.map_epoch(trainer.epoch, 1, donate=False).lower(init.out_info)
    for program in (init, epoch):
        assert "custom_call" not in program.as_text()


# Small configurations: one epoch of each script is a few hundred steps.
SMALL = {
    "ppo_joint": dict(num_envs=4, num_steps=16, num_minibatches=2, update_passes=2),
    "actor_critic": dict(
        num_envs=4, num_steps=16, policy_batch_size=32, value_batch_size=32, value_steps=4
    ),
    "skip_transformer": dict(num_envs=4, num_steps=16, num_minibatches=2, update_passes=1),
}


@pytest.mark.parametrize("name", slow_for(sorted(SMALL), "skip_transformer"))
def test_value_metrics_count_every_devices_batch(name):
    """Two devices holding the same state run the same rollout twice: their batch together is the
    one-device batch twice over, so ||R - V|| is sqrt(2) times the one-device norm while the mean
    and the explained variance are the one-device figures (the mean of per-device norms was not)."""
    module = importlib.import_module(f"algos.{name}")
    trainer = module.make_trainer(module.Config(n_devices=1, num_seeds=2, **SMALL[name]))
    one = devices.map_init(trainer.init)(devices.seed_keys(jax.random.PRNGKey(0), 2, 1))
    # [2, seeds, ...]: device 1 a copy of device 0 (on the host: `one` is placed for one device)
    two = jax.tree.map(lambda x: np.concatenate([x, x]), jax.device_get(one))
    quick = lambda fn, state: fn.lower(state).compile(run.FAST_COMPILE)(state)  # noqa: E731
    _, on_one = quick(devices.map_epoch(trainer.epoch, 1, donate=False), one)
    _, on_two = quick(devices.map_epoch(trainer.epoch, 2, donate=False), two)
    close = lambda x, y, key: np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-5, err_msg=key)  # noqa: E731
    for key, value in on_one.items():
        for device in range(2):
            want = np.sqrt(2) * value[0] if key == "value/advantage_norm" else value[0]
            want = 2 * value[0] if key == "episode/count" else want
            close(on_two[key][device], want, key)


# Every script's epoch with full-batch updates: each update step sees every transition of its device
# (and the gradient of a mean over equal halves is the mean of the halves' gradients).
WHOLE_BATCH = {
    "ppo_joint": lambda envs, steps: dict(num_minibatches=1, update_passes=2),
    "awr": lambda envs, steps: dict(
        n_replay_epochs=1,
        policy_steps=2,
        value_steps=2,
        beta=0.2,
        policy_batch_size=envs * steps,
        value_batch_size=envs * steps,
    ),
    "actor_critic": lambda envs, steps: dict(
        policy_batch_size=envs * steps, value_steps=2, value_batch_size=envs * steps
    ),
    "reinforce": lambda envs, steps: dict(batch_size=envs * steps, update_steps=2, baseline=True),
    "dqn_value": lambda envs, steps: dict(
        n_replay_epochs=1,
        update_steps=2,
        batch_size=envs * steps,
        sync_freq=3,
        eps_start=0.0,
        eps_min=0.0,
    ),
    "skip_transformer": lambda envs, steps: dict(
        num_minibatches=1, update_passes=2, skip_warmup_steps=0
    ),
}
PER_DEVICE_BATCH = ("awr",)  # batch sizes counted per device


def draws_in_order(key, shape, minval, maxval, *_, **__):
    """`jax.random.randint` as a test seam: draw i is i modulo the range, so a batch the size of the
    range takes every row once (dqn_value draws a row and an environment: with R rows and E
    environments coprime, R * E draws take every pair once)."""
    del key
    return minval + jnp.arange(int(np.prod(shape)), dtype=jnp.int32).reshape(shape) % maxval


def sampling_without_keys(make_distribution, *args, **kwargs):
    """The distribution with a `sample` (and a `sample_correlated`, its noise left as it is) that
    is a smooth function of the inputs alone: a Gaussian's mean plus 0.5 tanh(100 mean) standard
    deviations (off the mean by an amount that differs from state to state, so that the gradients of
    the log-likelihood do not cancel out), a categorical's mode."""
    dist = make_distribution(*args, **kwargs)

    def sample(inputs, key, temperature=1.0):
        if dist.discrete:
            return dist.mode(inputs)
        mean, log_std = dist._split(inputs)
        return dist._shape(mean + jnp.exp(log_std) * 0.5 * jnp.tanh(100.0 * mean))

    dist.sample = sample
    dist.sample_correlated = lambda inputs, noise, key, correlation: (sample(inputs, key), noise)
    return dist


@pytest.mark.parametrize("name", sorted(WHOLE_BATCH))
def test_two_devices_holding_halves_train_as_one_device_holding_everything(name, monkeypatch):
    """The collectives, checked against math that has none: 2 devices with 2 environments each end 3
    epochs with the parameters, optimiser state, environments and metrics of 1 device holding all 4
    and their data. And `pmap` over the 2 devices computes what the one-device program (`vmap`
    carrying the axis name) does with the same 2-device state, up to float rounding.

    The 1-device state is the 2-device one with the environment axis of both devices joined (and
    device 0's key), so the two runs see the same transitions only if nothing random tells them
    apart. Controlled here: actions are a function of the policy's inputs (`sampling_without_keys`;
    DQN explores with epsilon 0), the steps of Pendulum-v1 (MountainCar-v0 for DQN's discrete
    actions) are deterministic and no episode ends within 3 x 16 steps (a reset would draw a new
    state per device key), and every update step takes every transition of its device: full batches,
    shuffled (the mean does not depend on the order) or, where a script draws indices with
    replacement (awr, dqn_value), `draws_in_order`. Then a mean over the whole batch (a loss, an
    advantage or return statistic) is the mean of the devices' means, and a maximum (awr/weight_max)
    the maximum of their maxima: a collective that is missing, or averages something else, moves the
    2-device run away from the 1-device one (and a missing gradient pmean also lets the devices'
    parameters differ). Bugs it catches, each planted once: no gradient pmean (every script), a psum
    instead (ppo_joint), reinforce's baseline or awr's advantage mean over one device,
    awr/weight_max a mean of maxima."""
    module = importlib.import_module(f"algos.{name}")
    if hasattr(module, "make_distribution"):
        monkeypatch.setattr(
            module,
            "make_distribution",
            functools.partial(sampling_without_keys, module.make_distribution),
        )
    monkeypatch.setattr(jax.random, "randint", draws_in_order)
    # dqn_value: 3 replay rows, coprime with 2 and 4
    num_envs, num_steps = (
        4,
        3 if name == "dqn_value" else 16,
    )
    size = lambda n_devices: num_envs // (n_devices if name in PER_DEVICE_BATCH else 1)  # noqa: E731
    env = "MountainCar-v0" if name == "dqn_value" else "Pendulum-v1"

    def make(n_devices):
        return module.make_trainer(
            module.Config(
                env=env,
                num_envs=num_envs,
                num_steps=num_steps,
                n_devices=n_devices,
                total_steps=3 * 64,
                **WHOLE_BATCH[name](size(n_devices), num_steps),
            )
        )

    two_trainer, one_trainer = make(2), make(1)
    quick = lambda fn, *args: fn.lower(*args).compile(run.FAST_COMPILE)  # noqa: E731
    keys = devices.seed_keys(jax.random.PRNGKey(0), 1, 2)
    two = quick(devices.map_init(two_trainer.init), keys)(keys)
    template = jax.eval_shape(devices.map_init(one_trainer.init), keys[:1])

    # [2, seeds, ...] -> [1, seeds, ...]: device 0's copy, or both devices' environments
    def join(x, like):
        for axis, (a, b) in enumerate(zip(x.shape[1:], like.shape[1:]), 1):
            if a != b:
                assert b == 2 * a, (x.shape, like.shape)
                return jnp.concatenate([x[:1], x[1:]], axis=axis)
        return x[:1]

    to_one = lambda state: jax.tree.map(join, state, template)  # noqa: E731
    one = to_one(two)
    on_two = quick(devices.map_epoch(two_trainer.epoch, 2, donate=False), two)
    on_one = quick(devices.map_epoch(one_trainer.epoch, 1, donate=False), one)
    vmapped = quick(
        jax.jit(jax.vmap(jax.vmap(two_trainer.epoch), axis_name=devices.DEVICE_AXIS)), two
    )
    two_on_one_device = two
    for _ in range(3):
        (two, two_metrics), (one, one_metrics) = on_two(two), on_one(one)
        two_on_one_device, vmapped_metrics = vmapped(two_on_one_device)
    assert len(two_on_one_device.obs.sharding.device_set) == 1
    for x, y in zip(
        jax.tree.leaves((two, two_metrics)), jax.tree.leaves((two_on_one_device, vmapped_metrics))
    ):
        if np.issubdtype(x.dtype, np.floating):
            np.testing.assert_allclose(x, y, rtol=2e-3, atol=2e-4)
        else:
            np.testing.assert_array_equal(x, y)
    first, second = (jax.tree.map(lambda x, i=i: np.asarray(x[i]), two) for i in range(2))
    replicated = jax.tree.map(lambda x, like: x.shape[1:] == like.shape[1:], two, template)
    for same, (path, a), b in zip(
        jax.tree.leaves(replicated),
        jax.tree_util.tree_leaves_with_path(first),
        jax.tree.leaves(second),
    ):
        # parameters, optimiser state, counters (not keys): one copy for all
        if same and a.dtype != jnp.uint32:
            np.testing.assert_array_equal(a, b, err_msg=jax.tree_util.keystr(path))
    assert not np.array_equal(first.obs, second.obs)  # the devices hold other environments
    np.testing.assert_array_equal(two.epoch, 3)  # every script's state counts its epochs
    joined = to_one(two)
    for (path, x), y in zip(jax.tree_util.tree_leaves_with_path(joined), jax.tree.leaves(one)):
        np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-5, err_msg=jax.tree_util.keystr(path))
    # atol: reinforce's policy loss, ~1e-2 left of terms ~1e1, moves by ~1e-5 when summed in halves
    for key in one_metrics:
        np.testing.assert_allclose(
            two_metrics[key][0], one_metrics[key][0], rtol=1e-4, atol=5e-5, err_msg=key
        )
