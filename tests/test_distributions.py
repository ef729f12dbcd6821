"""common.distributions: closed forms, Monte-Carlo estimates, heads, bad spaces.

References are written with NumPy / math, never with distrax.
"""

import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gymnax.environments import spaces

from common.distributions import (
    Categorical,
    DiagonalGaussian,
    make_distribution,
    noise_correlation,
)
from helpers import np_log_softmax

N_MC = 200_000  # Monte-Carlo samples; tolerances below are ~5 standard errors


def np_gaussian_log_prob(x, mean, log_std):
    x, mean, log_std = (np.asarray(a, np.float64) for a in (x, mean, log_std))
    z = (x - mean) / np.exp(log_std)
    return np.sum(-0.5 * z**2 - log_std - 0.5 * math.log(2 * math.pi), axis=-1)


def np_gaussian_entropy(log_std):
    return np.sum(0.5 * math.log(2 * math.pi * math.e) + np.asarray(log_std, np.float64), axis=-1)


def box(shape=(2,), low=-1.0, high=1.0):
    return spaces.Box(low=low, high=high, shape=shape)


# ----------------------------------------------------------------------------
# make_distribution
# ----------------------------------------------------------------------------
def test_make_distribution_picks_by_space():
    cat = make_distribution(spaces.Discrete(5))
    assert isinstance(cat, Categorical) and cat.n_inputs == 5 and cat.discrete
    for std in ("param", "network"):
        gauss = make_distribution(box((3,)), std=std)
        assert isinstance(gauss, DiagonalGaussian) and not gauss.discrete
        assert gauss.std == std and gauss.action_shape == (3,)
        assert gauss.n_inputs == 6  # means then log stds


@pytest.mark.parametrize(
    "space, name",
    [
        (spaces.Dict({"a": spaces.Discrete(2), "b": spaces.Discrete(3)}), "Dict"),
        (spaces.Tuple([spaces.Discrete(2), spaces.Discrete(3)]), "Tuple"),
    ],
)
def test_unsupported_space_raises_naming_it(space, name):
    with pytest.raises(ValueError, match=name) as info:
        make_distribution(space)
    assert "Discrete" in str(info.value) and "Box" in str(info.value)  # says what is supported


def test_bad_std_option_raises():
    with pytest.raises(ValueError, match="std"):
        make_distribution(box(), std="learned")


# ----------------------------------------------------------------------------
# Categorical
# ----------------------------------------------------------------------------
LOGITS = np.array([[0.3, -1.2, 2.0, 0.0], [5.0, 5.0, -3.0, 1.0], [0.0, 0.0, 0.0, 0.0]], np.float32)


def test_categorical_log_prob_and_entropy_closed_form():
    dist = make_distribution(spaces.Discrete(4))
    ref = np_log_softmax(LOGITS)
    for a in range(4):
        actions = jnp.full((3,), a, jnp.int32)
        np.testing.assert_allclose(
            dist.log_prob(jnp.asarray(LOGITS), actions), ref[:, a], rtol=1e-5, atol=1e-6
        )
    mixed = jnp.array([2, 0, 3])
    np.testing.assert_allclose(
        dist.log_prob(jnp.asarray(LOGITS), mixed), ref[[0, 1, 2], [2, 0, 3]], rtol=1e-5
    )
    entropy = -np.sum(np.exp(ref) * ref, axis=-1)
    np.testing.assert_allclose(dist.entropy(jnp.asarray(LOGITS)), entropy, rtol=1e-5)
    # the uniform row, sanity of the reference
    np.testing.assert_allclose(entropy[2], math.log(4), rtol=1e-6)


def test_categorical_samples_match_probs_and_mc_entropy():
    dist = make_distribution(spaces.Discrete(4))
    logits = jnp.broadcast_to(jnp.asarray(LOGITS[0]), (N_MC, 4))
    samples = np.asarray(dist.sample(logits, jax.random.PRNGKey(0)))
    assert samples.shape == (N_MC,) and samples.min() >= 0 and samples.max() <= 3
    probs = np.exp(np_log_softmax(LOGITS[0]))
    freq = np.bincount(samples, minlength=4) / N_MC
    np.testing.assert_allclose(freq, probs, atol=5 * np.sqrt(probs.max() / N_MC))
    log_probs = np.asarray(dist.log_prob(logits, jnp.asarray(samples)), np.float64)
    closed = float(dist.entropy(jnp.asarray(LOGITS[0])))
    assert abs(-log_probs.mean() - closed) < 5 * log_probs.std() / np.sqrt(N_MC)


def test_categorical_temperature():
    dist = make_distribution(spaces.Discrete(4))
    logits = jnp.broadcast_to(jnp.asarray(LOGITS[0]), (N_MC, 4))
    # temperature 0: greedy, whatever the key
    for seed in range(3):
        greedy = dist.sample(jnp.asarray(LOGITS), jax.random.PRNGKey(seed), temperature=0.0)
        np.testing.assert_array_equal(greedy, [2, 0, 0])
    np.testing.assert_array_equal(dist.mode(jnp.asarray(LOGITS)), [2, 0, 0])
    # temperature 2: samples from softmax(logits / 2)
    samples = np.asarray(dist.sample(logits, jax.random.PRNGKey(1), temperature=2.0))
    probs = np.exp(np_log_softmax(LOGITS[0] / 2.0))
    np.testing.assert_allclose(
        np.bincount(samples, minlength=4) / N_MC, probs, atol=5 * np.sqrt(0.25 / N_MC)
    )


def test_categorical_head_and_clip():
    dist = make_distribution(spaces.Discrete(3))
    head = dist.head_init(jax.random.PRNGKey(0), 7)
    chex.assert_shape(head["w"], (7, 3))
    chex.assert_shape(head["b"], (3,))
    out = dist.policy_head(head, jnp.ones((5, 7)))
    chex.assert_shape(out, (5, dist.n_inputs))
    assert 0 < float(jnp.abs(head["w"]).max()) < 0.1  # small last layer, not zero
    actions = jnp.array([0, 2, 1])
    np.testing.assert_array_equal(dist.clip_action(actions), actions)


# ----------------------------------------------------------------------------
# Diagonal Gaussian
# ----------------------------------------------------------------------------
MEAN = np.array([[0.5, -1.0], [2.0, 0.0]], np.float32)
LOG_STD = np.array([[0.0, -0.7], [0.4, -2.0]], np.float32)


@pytest.mark.parametrize("std", ["param", "network"])
def test_gaussian_log_prob_and_entropy_closed_form(std):
    dist = make_distribution(box((2,)), std=std)
    inputs = jnp.asarray(np.concatenate([MEAN, LOG_STD], -1))
    x = np.array([[0.1, -0.4], [3.5, 0.05]], np.float32)
    np.testing.assert_allclose(
        dist.log_prob(inputs, jnp.asarray(x)), np_gaussian_log_prob(x, MEAN, LOG_STD), rtol=1e-5
    )
    np.testing.assert_allclose(dist.entropy(inputs), np_gaussian_entropy(LOG_STD), rtol=1e-5)


def test_gaussian_matrix_shaped_box():
    dist = make_distribution(box((2, 3)))
    assert dist.n_inputs == 12 and dist.action_shape == (2, 3)
    rng = np.random.default_rng(0)
    mean, log_std = (
        rng.normal(size=(4, 6)).astype(np.float32),
        rng.normal(size=(4, 6)).astype(np.float32) * 0.3,
    )
    inputs = jnp.asarray(np.concatenate([mean, log_std], -1))
    x = rng.normal(size=(4, 2, 3)).astype(np.float32)
    np.testing.assert_allclose(
        dist.log_prob(inputs, jnp.asarray(x)),
        np_gaussian_log_prob(x.reshape(4, 6), mean, log_std),
        rtol=1e-5,
    )
    chex.assert_shape(dist.sample(inputs, jax.random.PRNGKey(0)), (4, 2, 3))
    np.testing.assert_allclose(dist.mode(inputs), mean.reshape(4, 2, 3))


@pytest.mark.parametrize("std", ["param", "network"])
def test_gaussian_samples_and_mc_entropy(std):
    dist = make_distribution(box((2,)), std=std)
    row = np.concatenate([MEAN[0], LOG_STD[0]])
    inputs = jnp.broadcast_to(jnp.asarray(row), (N_MC, 4))
    samples = dist.sample(inputs, jax.random.PRNGKey(2))
    chex.assert_shape(samples, (N_MC, 2))
    x = np.asarray(samples, np.float64)
    sigma = np.exp(LOG_STD[0])
    np.testing.assert_allclose(x.mean(0), MEAN[0], atol=5 * sigma.max() / np.sqrt(N_MC))
    np.testing.assert_allclose(x.std(0), sigma, rtol=0.01)
    np.testing.assert_allclose(np.corrcoef(x.T)[0, 1], 0.0, atol=0.01)  # diagonal
    log_probs = np.asarray(dist.log_prob(inputs, samples), np.float64)
    closed = np_gaussian_entropy(LOG_STD[0])
    assert abs(-log_probs.mean() - closed) < 5 * log_probs.std() / np.sqrt(N_MC)


def test_correlated_noise_keeps_the_policy_law_and_correlates_successive_actions():
    """Every step's actions, over many environments, are N(mean, std) as the policy says (the
    first step's too: the noise starts from its stationary law); one environment's noise at lags 1
    and 3 is correlated by c and c^3; the two action dimensions are independent."""
    dist = make_distribution(box((2,)))
    n, steps, c = 50_000, 6, 0.7
    inputs = jnp.broadcast_to(jnp.asarray(np.concatenate([MEAN[0], LOG_STD[0]])), (n, 4))
    noise = dist.init_noise(jax.random.PRNGKey(0), n)
    sigma = np.exp(LOG_STD[0])
    noises = []
    for t, key in enumerate(jax.random.split(jax.random.PRNGKey(1), steps)):
        actions, noise = dist.sample_correlated(inputs, noise, key, c)
        x = np.asarray(actions, np.float64)
        np.testing.assert_allclose(x.mean(0), MEAN[0], atol=5 * sigma.max() / np.sqrt(n))
        np.testing.assert_allclose(x.std(0), sigma, rtol=0.02, err_msg=f"step {t}")
        np.testing.assert_allclose((x - MEAN[0]) / sigma, noise, rtol=1e-4, atol=1e-5)
        noises.append(np.asarray(noise, np.float64))
    for lag in (1, 3):
        corr = np.mean(noises[0] * noises[lag], axis=0)
        np.testing.assert_allclose(corr, c**lag, atol=5 / np.sqrt(n))
    np.testing.assert_allclose(
        np.mean(noises[-1][:, 0] * noises[-1][:, 1]), 0.0, atol=5 / np.sqrt(n)
    )


def test_uncorrelated_noise_is_sample_and_a_categorical_keeps_none():
    """Correlation 0 draws what `sample` draws with the same key, bit for bit; a categorical
    samples as `sample` does and its noise, [n, 0], passes through."""
    gaussian = make_distribution(box((2,)))
    inputs = jnp.asarray(np.concatenate([MEAN, LOG_STD], -1))
    key = jax.random.PRNGKey(4)
    noise = gaussian.init_noise(jax.random.PRNGKey(5), len(MEAN))
    actions, _ = gaussian.sample_correlated(inputs, noise, key, noise_correlation(0.0, 200))
    np.testing.assert_array_equal(actions, gaussian.sample(inputs, key))
    cat = make_distribution(spaces.Discrete(3))
    logits = jnp.log(jnp.asarray([[0.2, 0.3, 0.5]] * 4))
    none = cat.init_noise(key, 4)
    chex.assert_shape(none, (4, 0))
    actions, kept = cat.sample_correlated(logits, none, key, 0.9)
    np.testing.assert_array_equal(actions, cat.sample(logits, key))
    assert kept is none


def test_noise_correlation_lasts_a_fraction_of_the_episode():
    """c = exp(-1 / (memory * limit)): the noise's correlation time -1 / log c is memory * limit
    steps; memory 0 gives white noise."""
    for memory, limit in [(0.0025, 999), (0.0025, 200), (0.01, 100)]:
        c = float(noise_correlation(memory, limit))
        np.testing.assert_allclose(-1 / math.log(c), memory * limit, rtol=1e-5)
    assert float(noise_correlation(0.0, 999)) == 0.0


def test_gaussian_temperature_and_mode():
    dist = make_distribution(box((2,)))
    inputs = jnp.asarray(np.concatenate([MEAN, LOG_STD], -1))
    for seed in range(3):
        np.testing.assert_array_equal(
            dist.sample(inputs, jax.random.PRNGKey(seed), temperature=0.0), MEAN
        )
    np.testing.assert_array_equal(dist.mode(inputs), MEAN)
    # temperature scales the noise: same key, twice the deviation from the mean
    key = jax.random.PRNGKey(3)
    dev1 = np.asarray(dist.sample(inputs, key, temperature=1.0)) - MEAN
    dev2 = np.asarray(dist.sample(inputs, key, temperature=2.0)) - MEAN
    assert np.abs(dev1).min() > 0
    np.testing.assert_allclose(dev2, 2 * dev1, rtol=1e-5, atol=1e-6)


def test_gaussian_clip_action_only_clips():
    dist = make_distribution(
        spaces.Box(low=jnp.array([-2.0, 0.0]), high=jnp.array([2.0, 1.0]), shape=(2,))
    )
    actions = jnp.array([[-3.0, 0.5], [1.0, 7.0], [0.0, -0.1]])
    np.testing.assert_array_equal(dist.clip_action(actions), [[-2.0, 0.5], [1.0, 1.0], [0.0, 0.0]])
    # log-probs use the unclipped sample: an action outside the box keeps its own density
    inputs = jnp.zeros((3, 4))
    lp = np.asarray(dist.log_prob(inputs, actions))
    np.testing.assert_allclose(
        lp, np_gaussian_log_prob(np.asarray(actions), np.zeros((3, 2)), np.zeros((3, 2))), rtol=1e-5
    )
    assert lp[0] != pytest.approx(
        float(dist.log_prob(inputs[:1], dist.clip_action(actions[:1]))[0])
    )


def test_outside_box_is_the_squared_distance_outside_in_half_widths():
    dist = make_distribution(
        spaces.Box(low=jnp.array([-2.0, 0.0]), high=jnp.array([2.0, 1.0]), shape=(2,))
    )
    means = jnp.array([[0.0, 0.5], [3.0, 0.5], [-2.0, 1.0], [-4.0, 2.0]])
    inputs = jnp.concatenate([means, jnp.full((4, 2), 0.3)], axis=-1)
    # half-widths 2 and 0.5: (1 / 2)^2; on the bounds 0; (2 / 2)^2 + (1 / 0.5)^2
    np.testing.assert_allclose(dist.outside_box(inputs), [0.0, 0.25, 0.0, 5.0], rtol=1e-6)
    # its gradient (descended) moves a mean outside back towards the box, and is 0 inside it
    grad = jax.grad(lambda x: jnp.sum(dist.outside_box(x)))(inputs)
    np.testing.assert_allclose(grad[:, :2], [[0, 0], [0.5, 0], [0, 0], [-1.0, 8.0]], rtol=1e-6)
    np.testing.assert_array_equal(grad[:, 2:], 0.0)  # the std is not penalized
    # an unbounded dimension is never outside; a categorical has no box
    free = make_distribution(
        spaces.Box(low=jnp.array([-1.0, -jnp.inf]), high=jnp.array([1.0, jnp.inf]), shape=(2,))
    )
    np.testing.assert_allclose(free.outside_box(jnp.array([[2.0, 1e9, 0.0, 0.0]])), [1.0])
    np.testing.assert_array_equal(Categorical(3).outside_box(jnp.ones((5, 3))), np.zeros(5))


def box_penalty_loss(name: str, box_coef: float):
    """`(loss, metrics)` of script `name`'s policy loss on Pendulum's box [-2, 2], its network
    patched to emit the batch's observations as the distribution inputs: 8 states whose mean is 3,
    outside the box by half a half-width (outside_box 0.25)."""
    import importlib
    from unittest import mock

    module = importlib.import_module(f"algos.{name}")
    dist = make_distribution(spaces.Box(low=-2.0, high=2.0, shape=(1,)))
    n = 8
    inputs = jnp.tile(jnp.array([[3.0, -0.5]]), (n, 1))
    action, zeros = jnp.full((n, 1), 2.5), jnp.zeros(n)
    config = module.Config(box_coef=box_coef).resolved()
    if name == "awr":
        net = {"policy_net": lambda params, obs, *_: obs}
        args = (inputs, action[:, None], jnp.ones((n, 1)), jnp.ones((n, 1)), jnp.zeros((n, 1)))
    else:
        batch_type = module.Batch
        fields = dict(obs=inputs, action=action, log_prob=zeros, advantage=zeros, target=zeros)
        if name == "reinforce":
            fields = dict(obs=inputs, action=action, log_prob=zeros, weight=zeros)
        args = (batch_type(**fields),)
        net = {
            "ppo_joint": {"network": lambda params, obs, *_: (obs, obs[0])},
            "skip_transformer": {
                "network": lambda params, windows, dist, config, mode, step, rng: (
                    windows[:, -1],
                    windows[:, -1, 0],
                    step + 1,
                )
            },
            "actor_critic": {"policy_network": lambda params, obs, *_: obs},
            "reinforce": {"network": lambda params, obs, *_: obs},
        }[name]
        if name == "skip_transformer":  # a window of one observation per state
            args = (args[0]._replace(obs=inputs[:, None]), 0, jax.random.PRNGKey(0))
    loss_fn = {
        "ppo_joint": "ppo_loss",
        "skip_transformer": "ppo_loss",
        "awr": "policy_loss",
        "actor_critic": "policy_loss",
        "reinforce": "reinforce_loss",
    }[name]
    with mock.patch.multiple(module, **net):
        loss, aux = getattr(module, loss_fn)({}, *args, dist, config)
    metrics = aux[0] if name == "skip_transformer" else aux
    return loss, metrics


@pytest.mark.parametrize(
    "name", ["ppo_joint", "awr", "actor_critic", "reinforce", "skip_transformer"]
)
def test_every_policy_loss_adds_box_coef_times_the_mean_outside_the_box(name):
    without, metrics = box_penalty_loss(name, 0.0)
    with_penalty, _ = box_penalty_loss(name, 2.0)
    np.testing.assert_allclose(metrics["policy/outside_box"], 0.25, rtol=1e-6)
    np.testing.assert_allclose(with_penalty - without, 2.0 * 0.25, rtol=1e-5)


def test_gaussian_heads():
    features = jnp.asarray(np.random.default_rng(1).normal(size=(5, 8)), jnp.float32)
    # param: the dense layer emits d means; the log std is one learned vector appended to them
    dist = make_distribution(box((3,)), std="param")
    head = dist.head_init(jax.random.PRNGKey(0), 8)
    chex.assert_shape(head["w"], (8, 3))
    chex.assert_shape(head["log_std"], (3,))
    head = {**head, "log_std": jnp.array([0.1, -0.2, 0.3])}
    out = dist.policy_head(head, features)
    chex.assert_shape(out, (5, dist.n_inputs))
    np.testing.assert_allclose(out[:, 3:], np.broadcast_to([0.1, -0.2, 0.3], (5, 3)))
    np.testing.assert_allclose(out[:, :3], features @ head["w"] + head["b"], rtol=1e-6)
    # the log std gets a gradient through log_prob
    grad = jax.grad(lambda h: dist.log_prob(dist.policy_head(h, features), jnp.ones((5, 3))).sum())(
        head
    )
    assert np.all(np.asarray(grad["log_std"]) != 0)
    # network: the dense layer emits means and log stds, which depend on the state
    dist = make_distribution(box((3,)), std="network")
    head = dist.head_init(jax.random.PRNGKey(0), 8)
    chex.assert_shape(head["w"], (8, 6))
    assert "log_std" not in head
    out = dist.policy_head(head, features)
    chex.assert_shape(out, (5, dist.n_inputs))
    assert float(jnp.std(out[:, 3:], axis=0).min()) > 0
