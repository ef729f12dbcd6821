"""common/skipping.py: the skip rule's statistics, exact identity and zero gradient of skipped
layers, eval depth, one draw for every vmapped copy (an unbatched `lax.cond`), and devices."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from common import devices, skipping
from helpers import count_primitive

N_LAYERS = 4


def draws(step, n_keys, skip_fraction, warmup_steps, n_layers=N_LAYERS, seed=0):
    """`n_keys` independent draws of n_forward at `step`, one key each (`lax.map`: no vmap)."""
    keys = jax.random.split(jax.random.PRNGKey(seed), n_keys)

    def draw(key):
        return skipping.n_forward_layers(
            step,
            key,
            n_layers,
            "train",
            skip_fraction,
            warmup_steps,
        )

    return np.asarray(jax.jit(lambda keys: jax.lax.map(draw, keys))(keys))


def ran(n_forward, n_layers=N_LAYERS):
    """[draws, n_layers] booleans: layer i ran iff i < n_forward."""
    return np.arange(n_layers)[None, :] < n_forward[:, None]


# ----------------------------------------------------------------------------
# The skip rule's statistics
# ----------------------------------------------------------------------------
def test_warmup_factor():
    np.testing.assert_allclose(
        [skipping.warmup_factor(s, 100) for s in (0, 25, 100, 250)], [1, 0.75, 0, 0]
    )
    assert skipping.warmup_factor(0, 0) == 0  # no warmup


@pytest.mark.parametrize("step", [0, 10, 24])
def test_start_of_warmup_skips_nothing(step):
    # low = (1 - step / 100) * 4 > 3 for step < 25: the last layer (i = 3) always runs
    n_forward = draws(step, 2000, 0.5, warmup_steps=100)
    assert ran(n_forward).all()
    assert (n_forward >= (1 - step / 100) * N_LAYERS).all()


@pytest.mark.parametrize(
    "n_layers, warmup_steps, first_skip", [(4, 100, 25), (2, 1000, 500), (3, 10, 4)]
)
def test_steps_without_skipping_end_where_the_last_layer_can_first_be_skipped(
    n_layers, warmup_steps, first_skip
):
    assert skipping.steps_without_skipping(n_layers, warmup_steps) == first_skip
    for step in (0, first_skip - 1):  # every layer runs, even at the largest skip fraction
        assert ran(draws(step, 2000, 0.99, warmup_steps, n_layers), n_layers).all()
    assert not ran(draws(first_skip + 1, 2000, 0.99, warmup_steps, n_layers), n_layers).all()


@pytest.mark.parametrize("skip_fraction", [0.25, 0.5, 0.9])
def test_after_warmup_layer_i_runs_with_probability_of_the_formula(skip_fraction):
    n = 8000
    freq = ran(draws(1000, n, skip_fraction, warmup_steps=100)).mean(0)
    expected = np.minimum(1.0, 1.0 - np.arange(N_LAYERS) * skip_fraction / N_LAYERS)
    sigma = np.sqrt(expected * (1 - expected) / n)
    np.testing.assert_array_less(np.abs(freq - expected), 4 * sigma + 1e-9)
    # all layers run iff the last one does: 1 - (n_layers - 1) * skip_fraction / n_layers
    all_run = ran(draws(1000, n, skip_fraction, 100, seed=1)).all(1).mean()
    p = 1 - (N_LAYERS - 1) * skip_fraction / N_LAYERS
    assert abs(all_run - p) < 4 * np.sqrt(p * (1 - p) / n), (all_run, p)


def test_half_way_through_warmup():
    # step 50 of 100: n_forward ~ U(0.5 * 4, 4 / 0.5) = U(2, 8); layer i >= 2 runs w.p. (8 - i) / 6
    n = 8000
    freq = ran(draws(50, n, 0.5, warmup_steps=100)).mean(0)
    expected = np.array([1.0, 1.0, 1.0, 5 / 6])
    np.testing.assert_array_less(
        np.abs(freq - expected), 4 * np.sqrt(expected * (1 - expected) / n) + 1e-9
    )


def test_skip_fraction_zero_never_skips_and_builds_no_cond():
    assert (
        skipping.n_forward_layers(10**6, jax.random.PRNGKey(0), N_LAYERS, "train", 0.0, 0)
        == N_LAYERS
    )
    layers, params, x = stack()
    jaxpr = jax.make_jaxpr(
        lambda x: skipping.skipping_serial(
            layers, params, x, 5, jax.random.PRNGKey(0), "train", 0.0, 0
        )
    )(x)
    assert count_primitive(jaxpr.jaxpr, "cond") == 0


# ----------------------------------------------------------------------------
# A stack of layers: skipped ones are the identity, get zero gradient, cost a cond
# ----------------------------------------------------------------------------
def stack(n_layers=N_LAYERS, width=5, seed=0):
    keys = jax.random.split(jax.random.PRNGKey(seed), n_layers + 1)
    params = [
        {"w": jax.random.normal(k, (width, width)), "b": jnp.full((width,), 0.1 * i)}
        for i, k in enumerate(keys[:-1])
    ]
    layer = lambda p, x: x + jnp.tanh(x @ p["w"] + p["b"])  # noqa: E731
    return [layer] * n_layers, params, jax.random.normal(keys[-1], (3, width))


def manual(layers, params, x, depth):
    for layer, p in zip(layers[:depth], params[:depth]):
        x = layer(p, x)
    return x


def key_with_depth(depth, skip_fraction=0.5, step=10**6):
    """A key whose draw runs exactly `depth` layers (found by search)."""
    n_forward = draws(step, 200, skip_fraction, 100)
    found = np.flatnonzero(ran(n_forward).sum(1) == depth)
    assert len(found), f"no key gives depth {depth}"
    return jax.random.split(jax.random.PRNGKey(0), 200)[found[0]]


@pytest.mark.parametrize("depth", [1, 2, 3])
def test_skipped_layers_are_the_identity_and_get_zero_gradient(depth):
    layers, params, x = stack()
    key = key_with_depth(depth)

    def loss(params):
        y, _ = skipping.skipping_serial(layers, params, x, 10**6, key, "train", 0.5, 100)
        return jnp.sum(y**2), y

    (_, y), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
    np.testing.assert_array_equal(y, jax.jit(lambda p: manual(layers, p, x, depth))(params))
    assert not np.allclose(y, manual(layers, params, x, depth + 1))
    for i, g in enumerate(grads):
        for leaf in jax.tree.leaves(g):
            if i < depth:
                assert np.abs(leaf).max() > 0, f"layer {i} ran but got no gradient"
            else:
                np.testing.assert_array_equal(leaf, 0.0, err_msg=f"layer {i} was skipped")


def test_returns_step_plus_one():
    layers, params, x = stack()
    for mode in ("train", "eval"):
        _, step = skipping.skipping_serial(
            layers, params, x, jnp.int32(7), jax.random.PRNGKey(0), mode, 0.5, 10
        )
        assert int(step) == 8


def test_eval_mode_runs_every_layer_or_the_first_eval_depth():
    layers, params, x = stack()
    # eval mode ignores skip_fraction and the key: all layers, even past the warmup
    y, _ = skipping.skipping_serial(layers, params, x, 10**6, jax.random.PRNGKey(0), "eval", 0.9, 1)
    np.testing.assert_allclose(y, manual(layers, params, x, N_LAYERS), rtol=1e-6)
    for depth in range(1, N_LAYERS + 1):
        y, _ = skipping.skipping_serial(
            layers, params, x, 0, None, "eval", 0.5, 1, eval_depth=depth
        )
        np.testing.assert_allclose(y, manual(layers, params, x, depth), rtol=1e-6)

    # a traced (unbatched) depth: one program for every depth, each further layer behind a cond
    def run(d):
        return skipping.skipping_serial(layers, params, x, 0, None, "eval", 0.5, 1, eval_depth=d)[0]

    ys = jax.jit(lambda: jax.lax.map(run, jnp.arange(1, N_LAYERS + 1)))()
    for depth in range(1, N_LAYERS + 1):
        np.testing.assert_allclose(ys[depth - 1], manual(layers, params, x, depth), rtol=1e-5)


# ----------------------------------------------------------------------------
# One draw for every vmapped copy: the predicate stays unbatched
# ----------------------------------------------------------------------------
def test_vmapped_copies_share_the_first_copys_draw_and_keep_the_cond():
    layers, params, x = stack()
    # [devices, seeds] as map_epoch
    keys = jax.random.split(jax.random.PRNGKey(3), 6).reshape(2, 3, 2)
    steps = jnp.full((2, 3), 10**6)

    def f(x, step, key):
        n_forward = skipping.n_forward_layers(step, key, N_LAYERS, "train", 0.5, 100)
        return skipping.skipping_serial(layers, params, x, step, key, "train", 0.5, 100)[
            0
        ], n_forward

    mapped = jax.vmap(jax.vmap(f), axis_name=devices.DEVICE_AXIS)
    xs = jnp.broadcast_to(x, (2, 3) + x.shape)
    ys, n_forward = jax.jit(mapped)(xs, steps, keys)
    first = skipping.n_forward_layers(10**6, keys[0, 0], N_LAYERS, "train", 0.5, 100)
    np.testing.assert_array_equal(n_forward, np.full((2, 3), first))
    own = [
        skipping.n_forward_layers(10**6, k, N_LAYERS, "train", 0.5, 100) for k in keys.reshape(6, 2)
    ]
    assert len(set(np.asarray(own).tolist())) > 1  # the keys alone would disagree
    depth = int(skipping.layers_run(first, N_LAYERS))
    np.testing.assert_allclose(
        ys, jnp.broadcast_to(manual(layers, params, x, depth), ys.shape), rtol=1e-6
    )
    # a batched predicate would have become a select running both branches: the cond is still there
    jaxpr = jax.make_jaxpr(mapped)(xs, steps, keys)
    assert count_primitive(jaxpr.jaxpr, "cond") == N_LAYERS
    assert count_primitive(jaxpr.jaxpr, "select_n") == 0


def test_same_key_on_two_devices_draws_the_same_depth():
    """Under pmap each device draws for itself: a key shared by the devices gives one depth."""
    # same on both devices
    keys = devices.seed_keys(jax.random.PRNGKey(5), num_seeds=3, n_devices=2)

    def draw(key, fold_device):
        key = devices.device_key(key) if fold_device else key
        return jnp.stack(
            [
                skipping.n_forward_layers(s, jax.random.fold_in(key, s), N_LAYERS, "train", 0.5, 0)
                for s in range(8)
            ]
        )

    shared = np.asarray(devices.map_epoch(lambda k: draw(k, False), 2, donate=False)(keys))
    assert np.all(shared == shared[0, 0])  # every device and every seed draws the same 8 depths
    assert len(np.unique(shared[0, 0])) == 8  # a new depth each step
    per_device = np.asarray(devices.map_epoch(lambda k: draw(k, True), 2, donate=False)(keys))
    assert not np.array_equal(per_device[0], per_device[1])  # a device-folded key would disagree


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(skip_fraction=1.0), "skip_fraction 1.0"),
        (dict(skip_fraction=-0.1), "skip_fraction -0.1"),
        (dict(mode="collect"), "mode 'collect'"),
        (dict(mode="eval", eval_depth=0), "eval_depth 0: use 1 to 4"),
        (dict(mode="eval", eval_depth=5), "eval_depth 5: use 1 to 4"),
    ],
)
def test_bad_input(kwargs, match):
    layers, params, x = stack()
    args = {**dict(mode="train", skip_fraction=0.5, eval_depth=None), **kwargs}
    with pytest.raises(ValueError, match=match):
        skipping.skipping_serial(
            layers,
            params,
            x,
            0,
            jax.random.PRNGKey(0),
            args["mode"],
            args["skip_fraction"],
            10,
            args["eval_depth"],
        )
    with pytest.raises(ValueError, match="4 layers but 3 parameter sets"):
        skipping.skipping_serial(layers, params[:3], x, 0, jax.random.PRNGKey(0), "train", 0.5, 10)
