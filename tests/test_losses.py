"""PPO's clipped surrogate: every script's copy against one NumPy reference.

Each copy is, or is called as, `fn(log_prob, old_log_prob, advantage, clip_eps) -> (loss, metrics)`
over `[N]` arrays, with `loss = -mean(min(r A, clip(r, 1 - eps, 1 + eps) A))`, `r = exp(log_prob -
old_log_prob)`, and `metrics` holding `ppo/approx_kl` and `ppo/clip_fraction`. The reference below
is written case by case from the objective's definition (Schulman et al. 2017, eq. 7), not with the
min-of-two form the scripts use. Each copy is checked in value, metrics and gradient (zero exactly
where the clip binds) on random inputs, most of them with the clip binding; deliberately wrong
copies show that the check fails on them. No script clips its value loss, so there is no value
clipping to hold to a reference."""

import functools
import importlib
from pathlib import Path
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gymnax.environments import spaces

from common.distributions import make_distribution

ROOT = Path(__file__).resolve().parent.parent

# Every copy of the clipped surrogate in the scripts, as "module.function". A new copy is one more
# line here.
COPIES = [
    "algos.ppo_joint.clipped_surrogate",
    "algos.actor_critic.clipped_surrogate",
    "algos.skip_transformer.ppo_loss",
]


def whole_loss(module):
    """A script's whole loss `ppo_loss(params, batch, step, rng, dist, config) -> (loss, (metrics,
    step))` in the common form: its network stood in by one whose policy over two actions gives
    action 0 (the one taken) the probability exp(log_prob), and whose value is the target; no
    entropy bonus and no advantage normalization, so that the loss is the surrogate alone."""
    dist = make_distribution(spaces.Discrete(2))

    def fn(log_prob, old_log_prob, advantage, clip_eps):
        n = log_prob.shape[0]
        # already normalized: log pi(. | s)
        logits = jnp.stack([log_prob, jnp.log1p(-jnp.exp(log_prob))], -1)
        target = jnp.zeros(n, jnp.float32)

        def network(params, windows, dist, config, mode="eval", step=0, rng=None, eval_depth=None):
            return params, target, step + 1

        config = module.Config(clip_eps=clip_eps, ent_coef=0.0, normalize_advantages=False)
        batch = module.Batch(
            obs=jnp.zeros((n, 1, 1)),
            action=jnp.zeros(n, jnp.int32),
            log_prob=old_log_prob,
            advantage=advantage,
            target=target,
        )
        with mock.patch.object(module, "network", network):
            loss, (metrics, _) = module.ppo_loss(
                logits, batch, 0, jax.random.PRNGKey(0), dist, config
            )
        return loss, metrics

    return fn


ADAPTERS = {"algos.skip_transformer.ppo_loss": whole_loss}


def resolve(path: str):
    module_name, name = path.rsplit(".", 1)
    module = importlib.import_module(module_name)
    return ADAPTERS[path](module) if path in ADAPTERS else getattr(module, name)


# ----------------------------------------------------------------------------
# The reference
# ----------------------------------------------------------------------------
def np_clipped_surrogate(log_prob, old_log_prob, advantage, eps):
    """`(loss, d loss / d log_prob, metrics)` in float64, case by case.

    The objective per sample is r A, except that it stops improving once r has moved eps past 1 in
    the direction the advantage favours: A >= 0: min(r, 1 + eps) A; A < 0: max(r, 1 - eps) A. Its
    gradient in log pi is r A where the objective still moves with r, and 0 where it is flat."""
    log_prob, old_log_prob, advantage = (
        np.asarray(x, np.float64) for x in (log_prob, old_log_prob, advantage)
    )
    r = np.exp(log_prob - old_log_prob)
    objective = np.where(advantage >= 0, np.minimum(r, 1 + eps), np.maximum(r, 1 - eps)) * advantage
    moving = np.where(advantage >= 0, r < 1 + eps, r > 1 - eps)
    grad = -np.where(moving, r * advantage, 0.0) / len(r)
    metrics = {
        "ppo/approx_kl": np.mean(r - 1 - np.log(r)),
        "ppo/clip_fraction": np.mean(np.abs(r - 1) > eps),
    }
    return -np.mean(objective), grad, metrics


def test_reference_by_hand():
    # r = 1.5, 0.5, 1.5, 0.5 with A = 1, 1, -1, -1 and eps 0.2: the objectives are 1.2 (clipped),
    # 0.5, -1.5, -0.8 (clipped); the loss is -(1.2 + 0.5 - 1.5 - 0.8) / 4 = 0.15, and only samples 2
    # and 3 have a gradient
    old = np.log(np.full(4, 0.4))
    new = old + np.log([1.5, 0.5, 1.5, 0.5])
    loss, grad, metrics = np_clipped_surrogate(new, old, np.array([1.0, 1.0, -1.0, -1.0]), 0.2)
    np.testing.assert_allclose(loss, 0.15, rtol=1e-12)
    np.testing.assert_allclose(grad, [0.0, -0.5 / 4, 1.5 / 4, 0.0], rtol=1e-12)
    np.testing.assert_allclose(
        metrics["ppo/approx_kl"], np.mean([0.5 - np.log(1.5), -0.5 + np.log(2)] * 2)
    )
    assert metrics["ppo/clip_fraction"] == 1.0


# ----------------------------------------------------------------------------
# Every copy against it
# ----------------------------------------------------------------------------
# (seed, eps, spread of log r): r = 1 everywhere; small moves inside the clip; the clip binding for many
# samples; for nearly all of them
CASES = [(0, 0.2, 0.0), (1, 0.3, 0.05), (2, 0.2, 0.5), (3, 0.1, 1.5)]


def random_case(seed, spread, n=64):
    """`(log_prob, old_log_prob, advantage)` float32 `[n]`: probabilities in (0, 1), advantages of
    both signs."""
    rng = np.random.default_rng(seed)
    p_old = rng.uniform(0.05, 0.95, n)
    p_new = np.clip(p_old * np.exp(spread * rng.normal(size=n)), 0.02, 0.98)
    advantage = rng.normal(size=n) * 2 + 0.2
    return tuple(jnp.asarray(x, jnp.float32) for x in (np.log(p_new), np.log(p_old), advantage))


def check_copy(fn, seed, eps, spread):
    log_prob, old_log_prob, advantage = random_case(seed, spread)
    want, want_grad, want_metrics = np_clipped_surrogate(log_prob, old_log_prob, advantage, eps)
    loss, metrics = jax.jit(fn, static_argnums=3)(log_prob, old_log_prob, advantage, eps)
    grad = jax.grad(lambda lp: fn(lp, old_log_prob, advantage, eps)[0])(log_prob)
    np.testing.assert_allclose(loss, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-4, atol=1e-6)
    for key, value in want_metrics.items():
        np.testing.assert_allclose(metrics[key], value, rtol=1e-4, atol=1e-6, err_msg=key)


@pytest.mark.parametrize("seed, eps, spread", CASES)
def test_cases_reach_the_clip(seed, eps, spread):
    """The random cases are what they claim: past the first two, the clip binds and changes loss and
    gradient."""
    log_prob, old_log_prob, advantage = random_case(seed, spread)
    loss, grad, metrics = np_clipped_surrogate(log_prob, old_log_prob, advantage, eps)
    r = np.exp(np.asarray(log_prob, np.float64) - np.asarray(old_log_prob, np.float64))
    unclipped = -np.mean(r * np.asarray(advantage, np.float64))
    if spread <= 0.05:
        assert (
            metrics["ppo/clip_fraction"] == 0 and np.isclose(loss, unclipped) and np.all(grad != 0)
        )
    else:
        assert metrics["ppo/clip_fraction"] > 0.3 and abs(loss - unclipped) > 1e-2
        assert (
            0 < np.mean(grad == 0) < 1
            and (np.asarray(advantage) > 0).any()
            and (np.asarray(advantage) < 0).any()
        )


@pytest.mark.parametrize("seed, eps, spread", CASES)
@pytest.mark.parametrize("path", COPIES)
def test_copy_matches_reference(path, seed, eps, spread):
    check_copy(resolve(path), seed, eps, spread)


def _surrogate(log_prob, old_log_prob, advantage, eps, clip=jnp.clip, pick=jnp.minimum):
    log_ratio = log_prob - old_log_prob
    ratio = jnp.exp(log_ratio)
    loss = -jnp.mean(pick(ratio * advantage, clip(ratio, 1 - eps, 1 + eps) * advantage))
    return loss, {
        "ppo/approx_kl": jnp.mean((ratio - 1) - log_ratio),
        "ppo/clip_fraction": jnp.mean(jnp.abs(ratio - 1) > eps),
    }


WRONG = {  # one-token slips in a copy
    "no clip": functools.partial(_surrogate, clip=lambda r, low, high: r),
    "max for min": functools.partial(_surrogate, pick=jnp.maximum),
    "clip asymmetric": functools.partial(
        _surrogate, clip=lambda r, low, high: jnp.clip(r, low, high + 0.1)
    ),
    "clip without gradient cut": functools.partial(
        _surrogate, clip=lambda r, low, high: r + jax.lax.stop_gradient(jnp.clip(r, low, high) - r)
    ),
}


@pytest.mark.parametrize("name", WRONG)
def test_check_fails_on_a_wrong_copy(name):
    check_copy(_surrogate, 2, 0.2, 0.5)  # the right form passes
    with pytest.raises(AssertionError):
        check_copy(WRONG[name], 2, 0.2, 0.5)


def test_every_copy_is_listed():
    """A script that clips a ratio holds a copy of the surrogate: it must be one of COPIES."""
    for path in sorted((ROOT / "algos").glob("*.py")):
        if "jnp.clip(ratio" in path.read_text():
            assert any(copy.startswith(f"algos.{path.stem}.") for copy in COPIES), (
                f"{path.name}: add it to COPIES"
            )
