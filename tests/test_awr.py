"""algos/awr.py: weights, Q aggregates, sampled and enumerated actions, replay, TD(lambda), epochs,
the CLI. Learning: tests/test_learning.py and bench/suite/learning.py."""

import subprocess
import sys
from pathlib import Path

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from algos import awr
from algos.awr import (
    Config,
    Replay,
    Transition,
    aggregate_q,
    awr_weights,
    make_trainer,
    replay_push,
    td_lambda,
)
from common import checkpoints, devices, nets, run
from common.distributions import Categorical, DiagonalGaussian
from helpers import TINY_BY_SCRIPT, command, run_outputs, script_env

ROOT = Path(__file__).resolve().parents[1]
# awr's tiny config (helpers.TINY_BY_SCRIPT) with a replay of 3 epochs and one small layer
TINY = dict(
    TINY_BY_SCRIPT["awr"],
    n_replay_epochs=3,
    hidden=(16,),
    total_steps=4 * 16 * 6,
    eval_every=0,
    eval_episodes=2,
)


# ----------------------------------------------------------------------------
# Pure math against NumPy
# ----------------------------------------------------------------------------
def test_weights_are_exp_a_over_beta_clipped_at_w_max():
    a = jnp.array([-50.0, -1.0, 0.0, 0.5, 2.0, 3.0, 1e4])
    w = np.asarray(awr_weights(a, 0.5, 20.0))
    want = np.minimum(np.exp(np.minimum(np.float64(a) / 0.5, 50.0)), 20.0)
    np.testing.assert_allclose(w, want, rtol=1e-5, atol=1e-30)
    # no overflow on the way to the clip
    assert w[-1] == pytest.approx(20.0) and np.all(np.isfinite(w))
    grad = jax.grad(lambda x: jnp.sum(awr_weights(x, 0.5, 20.0)))(a)
    assert np.all(np.isfinite(grad))


def numpy_scale(q, normalization):
    return {"none": 1.0, "std": q.std() + 1e-5, "abs": np.abs(q - q.mean()).mean() + 1e-5}[
        normalization
    ]


def numpy_aggregate(q, log_mu, how, t, normalization, enumerated):
    q = np.float64(q)
    scale = numpy_scale(q, normalization)
    q = q / scale
    if how == "mean":
        out = (np.exp(log_mu) * q).sum(1) if enumerated else q.mean(1)
    elif how == "max":
        out = q.max(1)
    elif how == "softmax":
        e = np.exp(q / t - (q / t).max(1, keepdims=True))
        out = (e / e.sum(1, keepdims=True) * q).sum(1)
    else:
        z = q / t
        out = t * (
            z.max(1) + np.log(np.exp(z - z.max(1, keepdims=True)).sum(1)) - np.log(q.shape[1])
        )
    return out * scale


@pytest.mark.parametrize("how", ["mean", "max", "softmax", "logsumexp"])
@pytest.mark.parametrize("normalization", ["none", "std", "abs"])
@pytest.mark.parametrize("enumerated", [False, True])
def test_aggregates_match_numpy(how, normalization, enumerated):
    q = jax.random.normal(jax.random.PRNGKey(0), (16, 5)) * 3.0 + 1.0
    log_mu = jax.nn.log_softmax(jax.random.normal(jax.random.PRNGKey(1), (16, 5)))
    scale = numpy_scale(np.float64(q), normalization)
    got = aggregate_q(q, log_mu, how, 0.7, enumerated, jnp.float32(scale))
    want = numpy_aggregate(np.asarray(q), np.asarray(log_mu), how, 0.7, normalization, enumerated)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_normalization_changes_only_temperature_dependent_aggregates():
    q = jax.random.normal(jax.random.PRNGKey(2), (8, 4)) * 10.0
    log_mu = jnp.zeros((8, 4))
    for how, invariant in (("mean", True), ("max", True), ("logsumexp", False)):
        raw, std = (
            aggregate_q(q, log_mu, how, 1.0, False, numpy_scale(np.float64(q), n))
            for n in ("none", "std")
        )
        assert np.allclose(raw, std, rtol=1e-4) == invariant, how


@pytest.mark.parametrize("normalization", ["std", "abs"])
def test_q_scale_uses_filled_rows_of_every_device(normalization):
    q = (
        jax.random.normal(jax.random.PRNGKey(6), (2, 12, 3)) * jnp.array([1.0, 5.0])[:, None, None]
        + 2.0
    )
    valid = jnp.arange(12) < 5  # 5 of 12 rows filled on each device; the rest hold Q of empty slots
    q = jnp.where(valid[None, :, None], q, 0.0)
    got = jax.vmap(awr.q_scale, (0, None, None), axis_name=devices.DEVICE_AXIS)(
        q, valid, normalization
    )
    # both devices' filled rows, pooled
    want = numpy_scale(np.float64(q[:, :5]).ravel(), normalization)
    np.testing.assert_allclose(got, [want, want], rtol=1e-5)
    assert awr.q_scale(q[0], valid, "none") == 1.0
    # one device, empty rows
    assert not np.isclose(want, numpy_scale(np.float64(q[0]).ravel(), normalization))


def test_logsumexp_tends_to_max_when_cold_and_to_mean_when_hot():
    q = jax.random.normal(jax.random.PRNGKey(3), (32, 4))
    log_mu = jnp.zeros_like(q)
    lse = lambda t: np.asarray(aggregate_q(q, log_mu, "logsumexp", t, False))  # noqa: E731
    gaps_max = [np.abs(lse(t) - np.max(q, 1)).max() for t in (1.0, 0.1, 0.01)]
    gaps_mean = [np.abs(lse(t) - np.mean(q, 1)).max() for t in (1.0, 10.0, 1000.0)]
    # T log K gap: 0.014 at T 0.01
    assert gaps_max[0] > gaps_max[1] > gaps_max[2] and gaps_max[2] < 0.02
    # var(Q) / (2 T) + rounding
    assert gaps_mean[0] > gaps_mean[1] > gaps_mean[2] and gaps_mean[2] < 3e-3


def test_enumerating_every_discrete_action_gives_the_policy_expectation():
    dist = Categorical(3)
    inputs = jnp.array([0.3, -1.2, 2.0])
    actions, log_mu = awr.sample_actions(
        dist, inputs[None], jax.random.PRNGKey(0), 3, enumerate_all=True
    )
    np.testing.assert_array_equal(actions, [[0, 1, 2]])
    probs = np.exp(np.float64(inputs)) / np.exp(np.float64(inputs)).sum()
    np.testing.assert_allclose(np.exp(log_mu), probs[None], rtol=1e-5)
    q = jnp.array([[1.0, 5.0, -2.0]])
    baseline = aggregate_q(q, log_mu, "mean", 1.0, enumerated=True)
    np.testing.assert_allclose(baseline, [(probs * [1.0, 5.0, -2.0]).sum()], rtol=1e-5)
    assert not np.isclose(baseline[0], q.mean())  # unlike the plain mean of sampled actions


def test_sampled_actions_follow_each_state_s_recorded_behaviour_policy():
    dist = Categorical(3)
    probs = np.array([[0.6, 0.3, 0.1], [0.1, 0.1, 0.8]])
    actions, log_mu = awr.sample_actions(
        dist, jnp.log(probs), jax.random.PRNGKey(4), 4000, enumerate_all=False
    )
    chex.assert_shape(actions, (2, 4000))
    for state in range(2):
        freq = np.bincount(np.asarray(actions[state]), minlength=3) / 4000
        np.testing.assert_allclose(freq, probs[state], atol=0.025)  # ~3 standard errors
        np.testing.assert_allclose(
            log_mu[state], np.log(probs[state])[np.asarray(actions[state])], rtol=1e-5
        )
    box = DiagonalGaussian((2,), -1.0, 1.0)
    inputs = jnp.array([[0.5, -2.0, np.log(0.1), np.log(2.0)]])  # means, log stds
    actions, _ = awr.sample_actions(box, inputs, jax.random.PRNGKey(5), 4000, enumerate_all=False)
    chex.assert_shape(actions, (1, 4000, 2))
    np.testing.assert_allclose(actions[0].mean(0), [0.5, -2.0], atol=0.1)
    np.testing.assert_allclose(actions[0].std(0), [0.1, 2.0], rtol=0.05)


def test_replay_keeps_exactly_the_last_m_epochs_in_order():
    m, t, b = 3, 4, 2

    def epoch_data(i):  # every field encodes its epoch index
        full = lambda shape, dtype=jnp.float32: jnp.full(shape, i, dtype)  # noqa: E731
        return Transition(
            obs=full((t, b, 3)),
            action=full((t, b), jnp.int32),
            reward=full((t, b)),
            terminated=full((t, b), bool),
            done=full((t, b), bool),
            final_obs=full((t, b, 3)),
            inputs=full((t, b, 2)),
            next_inputs=full((t, b, 2)),
        )

    empty = jax.tree.map(lambda x: jnp.zeros((m,) + x.shape, x.dtype), epoch_data(0))
    replay = Replay(data=empty, position=jnp.array(0), filled=jnp.array(0))
    push = jax.jit(replay_push)
    for i in range(1, 8):
        replay = push(replay, epoch_data(i))
        assert int(replay.filled) == min(i, m)
        # oldest first: rolling the ring by its write position gives the last min(i, m) epochs in
        # order
        ordered = np.roll(np.asarray(replay.data.action[:, 0, 0]), -int(replay.position))
        want = list(range(max(1, i - m + 1), i + 1))
        assert list(ordered[-len(want) :]) == want, (i, ordered)
        for leaf in jax.tree.leaves(replay.data):  # every field of a slot comes from the same epoch
            if leaf.dtype == bool:
                continue
            np.testing.assert_array_equal(
                np.asarray(leaf).reshape(m, -1).astype(int)[:, 0],
                np.asarray(replay.data.action[:, 0, 0]),
            )


def numpy_td_lambda(r, v_next, term, done, gamma, lam):
    t_len = r.shape[0]
    g = np.zeros_like(r, dtype=np.float64)
    for b in range(r.shape[1]):
        following = v_next[-1, b]
        for t in reversed(range(t_len)):
            if done[t, b]:  # the episode ended at t: nothing after t leaks in
                g[t, b] = r[t, b] + (0.0 if term[t, b] else gamma * v_next[t, b])
            else:
                g[t, b] = r[t, b] + gamma * ((1 - lam) * v_next[t, b] + lam * following)
            following = g[t, b]
    return g


def random_episodes(seed, t=24, b=5):
    rng = np.random.default_rng(seed)
    term = rng.random((t, b)) < 0.1
    trunc = (rng.random((t, b)) < 0.08) & ~term
    return (rng.normal(size=(t, b)), rng.normal(size=(t, b)), term, term | trunc)


@pytest.mark.parametrize("lam", [0.0, 0.7, 1.0])
def test_td_lambda_matches_numpy_with_episode_ends_inside(lam):
    r, v_next, term, done = random_episodes(int(10 * lam))
    got = td_lambda(*(jnp.asarray(x) for x in (r, v_next, term, done)), 0.9, lam)
    np.testing.assert_allclose(
        got, numpy_td_lambda(r, v_next, term, done, 0.9, lam), rtol=1e-5, atol=1e-5
    )
    if lam == 0.0:  # TD(0)
        np.testing.assert_allclose(got, r + 0.9 * (1 - term) * v_next, rtol=1e-5, atol=1e-5)


def test_td_lambda_bootstraps_truncation_not_termination():
    r = jnp.zeros((3, 2))
    v_next = jnp.full((3, 2), 10.0)
    ends = jnp.array([[False, False], [True, True], [False, False]])
    term = ends.at[:, 1].set(False)  # column 0 terminates at t=1, column 1 is truncated there
    g = td_lambda(r, v_next, term, ends, 0.5, 1.0)
    assert float(g[1, 0]) == 0.0 and float(g[1, 1]) == 5.0  # 0.5 * V(final obs)
    # the earlier step sees only its own episode
    assert float(g[0, 0]) == 0.0 and float(g[0, 1]) == 2.5


def policy_setup(n=6, k=3):
    dist = Categorical(2)
    params = {
        "torso": nets.torso_init(jax.random.split(jax.random.PRNGKey(0), 1), 4, (8,)),
        "head": dist.head_init(jax.random.PRNGKey(1), 8),
    }
    obs = jax.random.normal(jax.random.PRNGKey(2), (n, 4))
    actions = jax.random.bernoulli(jax.random.PRNGKey(3), 0.5, (n, k)).astype(jnp.int32)
    inputs = jax.vmap(awr.policy_net, (None, 0, None, None))(params, obs, dist, "tanh")
    log_pi = np.asarray(jax.nn.log_softmax(inputs))[np.arange(n)[:, None], np.asarray(actions)]
    return dist, params, obs, actions, log_pi


def test_policy_loss_normalizes_each_state_by_its_mask():
    dist, params, obs, actions, log_pi = policy_setup()
    weights = jax.random.uniform(jax.random.PRNGKey(4), (6, 3))
    mask = jax.random.uniform(jax.random.PRNGKey(5), (6, 3), minval=0.1, maxval=1.0)
    log_mu = jnp.log(jax.random.uniform(jax.random.PRNGKey(6), (6, 3), minval=0.2, maxval=0.8))
    loss, _ = awr.policy_loss(
        params, obs, actions, weights, mask, log_mu, dist, Config(hidden=(8,))
    )
    w, m = np.asarray(weights), np.asarray(mask)
    np.testing.assert_allclose(loss, -np.mean((w * m * log_pi).sum(1) / m.sum(1)), rtol=1e-5)
    ones, _ = awr.policy_loss(
        params, obs, actions, weights, jnp.ones((6, 3)), log_mu, dist, Config(hidden=(8,))
    )
    # sampled: 1/K each
    np.testing.assert_allclose(ones, -np.mean((w * log_pi).sum(1) / 3), rtol=1e-5)


def test_reweight_divides_by_the_sum_of_the_importance_weighted_mask():
    """SPEC 3.5: m_k = rho_k = pi(a_k|s) / mu(a_k|s); w = [1, 1], rho = [2, 0.5] weighs [0.8,
    0.2]."""
    dist, params, obs, actions, log_pi = policy_setup(n=1, k=2)
    log_mu = jnp.asarray(log_pi - np.log([[2.0, 0.5]]), jnp.float32)  # rho = [2, 0.5]
    config = Config(hidden=(8,), q_value=True, n_samples=2, reweight=True)
    args = (obs, actions, jnp.ones((1, 2)), jnp.ones((1, 2)), log_mu, dist, config)
    loss, _ = awr.policy_loss(params, *args)
    np.testing.assert_allclose(loss, -(0.8 * log_pi[0, 0] + 0.2 * log_pi[0, 1]), rtol=1e-5)
    # rho is a constant of the gradient (stop-gradient): the same gradient as fixed weights [0.8,
    # 0.2]
    grad = jax.grad(lambda p: awr.policy_loss(p, *args)[0])(params)
    fixed = Config(hidden=(8,), q_value=True, n_samples=2)
    want = jax.grad(
        lambda p: awr.policy_loss(
            p, obs, actions, jnp.ones((1, 2)), jnp.array([[0.8, 0.2]]), log_mu, dist, fixed
        )[0]
    )(params)
    chex.assert_trees_all_close(grad, want, rtol=1e-4, atol=1e-7)


# ----------------------------------------------------------------------------
# Epochs
# ----------------------------------------------------------------------------
def compiled_run(n_devices, **overrides):
    trainer = make_trainer(Config(**{**TINY, **overrides}, n_devices=n_devices))
    keys = devices.seed_keys(jax.random.PRNGKey(0), 1, n_devices)
    return (
        trainer,
        devices.map_init(trainer.init)(keys),
        devices.map_epoch(trainer.epoch, n_devices),
    )


@pytest.mark.parametrize(
    "flags",
    [{}, {"q_value": True, "n_samples": 2, "q_aggregate": "logsumexp", "reweight": True}],
    ids=["awr", "sampling-awr-enumerated"],
)
def test_two_device_epochs_fill_the_replay_and_keep_devices_in_sync(flags):
    trainer, state, epoch = compiled_run(2, **flags)
    before = jax.device_get(state.policy)
    for i in range(1, 5):
        state, metrics = epoch(state)
        metrics = jax.device_get(metrics)
        np.testing.assert_array_equal(
            metrics["replay/size"], min(i, TINY["n_replay_epochs"]) * 16 * 4
        )
    state = jax.device_get(state)
    first, second = (jax.tree.map(lambda x, i=i: x[i], state) for i in range(2))
    chex.assert_trees_all_equal(first.policy, second.policy)
    chex.assert_trees_all_equal(first.critic, second.critic)
    assert not np.array_equal(first.obs, second.obs)  # each device explores with its own key
    assert not np.allclose(first.policy["torso"][0]["w"], before["torso"][0]["w"][0])  # trained
    for key in (
        "loss/policy",
        "loss/value",
        "awr/weight_mean",
        "awr/weight_max",
        "awr/advantage_std",
    ):
        assert np.all(np.isfinite(metrics[key])), key
    assert np.all(metrics["awr/weight_max"] <= 20.0) and np.all(metrics["awr/weight_mean"] > 0)
    assert ("q/mean" in metrics) == bool(flags)
    # epochs 1..4 went to slots 0, 1, 2, 0
    assert int(first.replay.position[0]) == 4 % TINY["n_replay_epochs"]


def test_k_at_least_the_number_of_actions_enumerates_them():
    """CartPole's 2 actions: K = 2 and K = 4 both take each action once, weighted by mu: the same
    epochs."""
    finals = []
    for k in (2, 4):
        _, state, epoch = compiled_run(1, q_value=True, n_samples=k)
        for _ in range(3):
            state, metrics = epoch(state)
        finals.append(jax.device_get((state.policy, state.critic, metrics)))
    chex.assert_trees_all_equal(*finals)  # sampled, K = 2 and K = 4 would draw different actions


def test_same_seed_same_params_other_seed_differs(tmp_path):
    def config(seed, name):
        return Config(
            **TINY,
            seed=seed,
            n_devices=1,
            q_value=True,
            n_samples=2,
            out_dir=str(tmp_path / name),
        )

    finals = {}
    for seed, name in ((0, "a"), (0, "b"), (1, "c")):
        run.train(config(seed, name), make_trainer, "awr")
        with np.load(checkpoints.latest(tmp_path / name / "checkpoints")) as data:
            finals[name] = {k: data[k] for k in data.files}
    for k in finals["a"]:
        np.testing.assert_array_equal(finals["a"][k], finals["b"][k], err_msg=k)
    assert any(not np.array_equal(finals["a"][k], finals["c"][k]) for k in finals["a"])


# ----------------------------------------------------------------------------
# Bad input, before anything compiles
# ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "overrides, match",
    [
        ({"n_samples": 0, "q_value": True}, "--n-samples 0"),
        ({"n_samples": 4}, "needs --q-value"),
        ({"reweight": True}, "--reweight .* add --q-value"),
        ({"q_aggregate": "max"}, "--q-aggregate .* add --q-value"),
        ({"q_normalization": "std"}, "--q-normalization .* add --q-value"),
        ({"n_replay_epochs": 0}, "at least one epoch"),
        ({"q_value": True, "q_temperature": 0.0}, "--q-temperature"),
    ],
)
def test_bad_config_is_rejected(overrides, match):
    with pytest.raises(ValueError, match=match):
        Config(**overrides)


def test_bad_setup_is_rejected_by_make_trainer():
    with pytest.raises(ValueError, match="--std network applies to continuous"):
        make_trainer(Config(std="network"))
    with pytest.raises(ValueError, match="--n-samples 1 learns nothing.*2 enumerates every action"):
        make_trainer(Config(q_value=True))  # K = 1: every advantage is Q(s, a_1) - Q(s, a_1) = 0
    with pytest.raises(
        ValueError, match="--n-samples 1 learns nothing.*use --n-samples 2 or more$"
    ):
        make_trainer(Config(q_value=True, env="Pendulum-v1"))


def test_q_value_with_one_sample_is_refused_in_one_line_before_compiling(tmp_path):
    out = command("awr", "--q-value", "--out-dir", tmp_path / "r", cwd=tmp_path)
    assert out.returncode != 0 and "Traceback" not in out.stderr, out.stderr
    assert (
        out.stderr.strip().splitlines() == [out.stderr.strip()] and "--n-samples 2" in out.stderr
    ), out.stderr
    assert not (tmp_path / "r").exists()


# ----------------------------------------------------------------------------
# The headline command, as a user runs it
# ----------------------------------------------------------------------------
@pytest.mark.slow  # a whole run in a new process: CI runs it, the fast suite does not
def test_headline_command_through_the_cli(tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "algos" / "awr.py"),
            "--q-value",
            "--n-samples",
            "4",
            "--total-steps",
            "2048",
            "--eval-every",
            "0",
            "--eval-episodes",
            "2",
            "--out-dir",
            str(tmp_path / "run"),
        ],
        cwd=tmp_path,
        env=script_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    config, lines, summary = run_outputs(tmp_path / "run")
    assert config["q_value"] is True and config["n_samples"] == 4
    assert len(lines) == 2 and summary["env_steps"] == 2048
    for key in (
        "loss/policy",
        "loss/value",
        "awr/advantage_mean",
        "awr/advantage_std",
        "awr/weight_mean",
        "awr/weight_max",
        "awr/weight_clipped_fraction",
        "q/mean",
        "episode/return",
    ):
        assert key in lines[-1], key
