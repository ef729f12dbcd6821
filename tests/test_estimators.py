"""Advantage estimators: every script's copy against one NumPy reference, and their statistics.

Each copy is `fn(rewards, values, next_values, terminated, dones, gamma[, param])
-> (advantages, targets)` over time-major `[T, B]` arrays, where `param` is
lambda (`td_lambda`, `gae`), k (`td_k`) or absent (`monte_carlo`), and
`next_values[t]` is V of the observation after step t before any reset. The
reference below is written from the definitions (forward sums over the
episode), not from the recursions the scripts use.
"""

import functools
import importlib

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from algos import actor_critic, reinforce
from common import devices

# Every copy of an estimator in the scripts, as "module.function"; the function's name says which
# estimator it is. A new copy is one more line here.
COPIES = [
    "algos.ppo_joint.gae",
    "algos.actor_critic.monte_carlo",
    "algos.actor_critic.td_k",
    "algos.actor_critic.td_lambda",
    "algos.actor_critic.gae",
    "algos.awr.td_lambda",
    "algos.skip_transformer.gae",
    "algos.dqn_value.td_k",
]
PARAMS = {
    "monte_carlo": [None],
    "td_k": [1, 3, 100],
    "td_lambda": [0.0, 0.6, 0.95, 1.0],
    "gae": [0.0, 0.6, 0.95, 1.0],
}


def returns_only(fn):
    """A copy that returns only the targets G from (rewards, next_values, ...), in the common
    form."""

    def wrapped(rewards, values, next_values, terminated, dones, *args):
        returns = fn(rewards, next_values, terminated, dones, *args)
        return returns - values, returns

    return wrapped


def n_step_windows(fn):
    """dqn_value's `n_step_return` over `[N, n]` windows as a k-step estimator of `[T, B]` arrays:
    the window of step t holds steps t, ..., t + k - 1, cut at the rollout's last step (its newest
    stored step, as in the replay)."""

    def td_k(rewards, values, next_values, terminated, dones, gamma, k):
        chex.assert_rank(rewards, 2)
        chex.assert_equal_shape([rewards, values, next_values, terminated, dones])
        T, B = rewards.shape
        rows = jnp.minimum(jnp.arange(T)[:, None] + jnp.arange(k), T - 1)  # [T, k]
        window = lambda x: x[rows].transpose(0, 2, 1).reshape(T * B, k)  # noqa: E731  [T, B] -> [T*B, k]
        cut = window(dones) | window(jnp.broadcast_to(jnp.arange(T)[:, None] == T - 1, (T, B)))
        returns, discount, last = fn(window(rewards), window(terminated), cut, gamma)
        boot = jnp.take_along_axis(window(next_values), last[:, None], axis=1)[:, 0]
        targets = (returns + discount * boot).reshape(T, B)
        return targets - values, targets

    return td_k


# Copies with another signature, and how to call them in the common form; "module.name" names the
# estimator a function of another name computes.
ADAPTERS = {"algos.awr.td_lambda": returns_only, "algos.dqn_value.td_k": n_step_windows}
SOURCES = {"algos.dqn_value.td_k": "n_step_return"}


def resolve(path: str):
    module, name = path.rsplit(".", 1)
    fn = getattr(importlib.import_module(module), SOURCES.get(path, name))
    return ADAPTERS.get(path, lambda f: f)(fn), name


def call(fn, data, gamma, param):
    """The copy jitted, on float32 `data`; returns float64 `(advantages, targets)`."""
    args = (gamma,) if param is None else (gamma, param)
    jitted = jax.jit(lambda *arrays: fn(*arrays, *args))
    return tuple(np.asarray(x, np.float64) for x in jitted(*map(jnp.asarray, data)))


# ----------------------------------------------------------------------------
# The NumPy reference
# ----------------------------------------------------------------------------
def np_n_step(rewards, next_values, terminated, dones, gamma, t, b, n):
    """sum_{i<m} gamma^i r_{t+i} + gamma^m V(s'_{t+m-1}), m = min(n, steps to the episode's or
    rollout's end).

    No bootstrap when the episode terminated; after a truncation or at the rollout's end, V(s').
    """
    T = rewards.shape[0]
    ret, discount = 0.0, 1.0
    for u in range(t, min(t + n, T)):
        ret += discount * rewards[u, b]
        discount *= gamma
        if terminated[u, b]:
            return ret
        if dones[u, b] or u == T - 1 or u == t + n - 1:
            return ret + discount * next_values[u, b]
    raise AssertionError("unreachable")


def steps_to_end(dones, t, b):
    """Transitions from t to the episode's end or the rollout's end, both included."""
    u = t
    while not dones[u, b] and u < dones.shape[0] - 1:
        u += 1
    return u - t + 1


def np_reference(kind, rewards, values, next_values, terminated, dones, gamma, param):
    rewards, values, next_values = (
        np.asarray(x, np.float64) for x in (rewards, values, next_values)
    )
    T, B = rewards.shape
    out = np.zeros((T, B))
    for b in range(B):
        for t in range(T):
            n_max = steps_to_end(dones, t, b)
            n_step = functools.partial(
                np_n_step, rewards, next_values, terminated, dones, gamma, t, b
            )
            if kind == "monte_carlo":
                out[t, b] = n_step(T) - values[t, b]
            elif kind == "td_k":
                out[t, b] = n_step(param) - values[t, b]
            elif kind == "td_lambda":  # (1 - lam) sum_{n < N} lam^(n-1) G^(n) + lam^(N-1) G^(N)
                lam = param
                ret = sum((1 - lam) * lam ** (n - 1) * n_step(n) for n in range(1, n_max))
                out[t, b] = ret + lam ** (n_max - 1) * n_step(n_max) - values[t, b]
            elif kind == "gae":  # sum_l (gamma lam)^l delta_{t+l}
                delta = rewards + gamma * np.where(terminated, 0.0, next_values) - values
                out[t, b] = sum((gamma * param) ** i * delta[t + i, b] for i in range(n_max))
    return out


def rollout_data(seed, T=20, B=6):
    """Random `[T, B]` rollout: next_values[t] = values[t+1] unless step t ended an episode."""
    rng = np.random.default_rng(seed)
    all_values = rng.normal(size=(T + 1, B))
    values, next_values = all_values[:-1], all_values[1:].copy()
    terminated = rng.random((T, B)) < 0.12
    truncated = rng.random((T, B)) < 0.12
    terminated[4, 0] = truncated[4, 0] = True  # both at once: terminated wins, no bootstrap
    terminated[-1, 1], truncated[-1, 2] = True, True  # ends on the rollout's last step
    terminated[-1, 3:] = truncated[-1, 3:] = False  # and rollouts cut mid-episode
    dones = terminated | truncated
    # V(final observation), not V(reset observation)
    next_values[dones] = rng.normal(size=dones.sum()) * 3
    rewards = rng.normal(size=(T, B))
    assert (terminated[:-1] & ~truncated[:-1]).sum() >= 3 and (
        truncated[:-1] & ~terminated[:-1]
    ).sum() >= 3
    f32 = lambda x: x.astype(np.float32)  # noqa: E731
    return f32(rewards), f32(values), f32(next_values), terminated, dones


# ----------------------------------------------------------------------------
# Every copy against the reference
# ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "path, param", [(p, q) for p in COPIES for q in PARAMS[p.rsplit(".", 1)[1]]]
)
@pytest.mark.parametrize("seed, gamma", [(0, 0.99), (1, 0.8)])
def test_copy_matches_numpy_reference(path, param, seed, gamma):
    fn, kind = resolve(path)
    data = rollout_data(seed)
    advantages, targets = call(fn, data, gamma, param)
    expected = np_reference(kind, *data, gamma, param)
    np.testing.assert_allclose(advantages, expected, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(targets, expected + data[1], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("path", COPIES)
def test_nothing_leaks_across_an_episode_end(path):
    fn, kind = resolve(path)
    param = PARAMS[kind][-1]  # the longest trace
    rewards, values, next_values, terminated, dones = data = rollout_data(2, T=12, B=3)
    terminated[:, 0], dones[:, 0] = False, False
    dones[5, 0] = True  # env 0: truncated at t = 5, nothing else ends
    before, _ = call(fn, data, 0.99, param)
    changed = (rewards.copy(), values.copy(), next_values.copy(), terminated, dones)
    for x in changed[:3]:
        x[6:, 0] += 100.0  # everything after the end
    after, _ = call(fn, changed, 0.99, param)
    np.testing.assert_allclose(after[:6], before[:6], rtol=1e-5, atol=1e-5)
    assert np.all(np.abs(after[6:, 0] - before[6:, 0]) > 1)  # the change did reach the later steps


@pytest.mark.parametrize("path", COPIES)
def test_truncation_bootstraps_termination_does_not(path):
    # T = 2, gamma = 0.5; env 0 terminates at t = 0, env 1 is truncated at t = 0, env 2 runs on.
    # V(s_0) = 1, V(s'_0) = 4 (final observation) for envs 0 and 1, V(s_1) = 2, V(s'_1) = 3 (rollout
    # end); r_0 = 1, r_1 = 10.
    rewards = np.array([[1.0, 1.0, 1.0], [10.0, 10.0, 10.0]], np.float32)
    values = np.array([[1.0, 1.0, 1.0], [2.0, 2.0, 2.0]], np.float32)
    next_values = np.array([[4.0, 4.0, 2.0], [3.0, 3.0, 3.0]], np.float32)
    terminated = np.array([[True, False, False], [False, False, False]])
    dones = np.array([[True, True, False], [False, False, False]])
    fn, kind = resolve(path)
    param = {"monte_carlo": None, "td_k": 1, "td_lambda": 0.5, "gae": 0.5}[kind]
    advantages, _ = call(fn, (rewards, values, next_values, terminated, dones), 0.5, param)
    # t = 1: 10 + 0.5 * 3 - 2 = 9.5 everywhere. t = 0, env 0: 1 - 1 = 0; env 1: 1 + 0.5 * 4 - 1 = 2;
    # env 2: Monte-Carlo 1 + 0.5 * 11.5 - 1 = 5.75; TD(1): 1 + 0.5 * 2 - 1 = 1;
    # lambda 0.5: 1 + 0.5 * (0.5 * 2 + 0.5 * 11.5) - 1 = 3.375
    running = {"monte_carlo": 5.75, "td_k": 1.0, "td_lambda": 3.375, "gae": 3.375}[kind]
    np.testing.assert_allclose(advantages, [[0.0, 2.0, running], [9.5, 9.5, 9.5]], rtol=1e-6)


@pytest.mark.parametrize("path", COPIES)
def test_copies_check_ranks_and_shapes(path):
    fn, kind = resolve(path)
    args = (0.9,) if kind == "monte_carlo" else (0.9, PARAMS[kind][-1])
    x = jnp.zeros((5,))
    with pytest.raises(AssertionError):
        fn(x, x, x, x, x, *args)
    y = jnp.zeros((5, 2))
    with pytest.raises(AssertionError):
        fn(y, y, jnp.zeros((5, 3)), y, y, *args)


# ----------------------------------------------------------------------------
# Equivalences
# ----------------------------------------------------------------------------
def test_reference_forward_views_agree():
    """The reference's TD(lambda) and GAE are two definitions of one quantity; lambda 1 and 0 are MC
    and TD(0)."""
    data = rollout_data(3)
    for lam in (0.0, 0.3, 0.9, 1.0):
        np.testing.assert_allclose(
            np_reference("td_lambda", *data, 0.95, lam),
            np_reference("gae", *data, 0.95, lam),
            rtol=1e-9,
            atol=1e-9,
        )
    np.testing.assert_allclose(
        np_reference("gae", *data, 0.95, 1.0),
        np_reference("monte_carlo", *data, 0.95, None),
        rtol=1e-9,
        atol=1e-9,
    )
    np.testing.assert_allclose(
        np_reference("gae", *data, 0.95, 0.0),
        np_reference("td_k", *data, 0.95, 1),
        rtol=1e-9,
        atol=1e-9,
    )


def test_script_estimators_agree():
    data = rollout_data(4)
    ac = actor_critic
    for lam in (0.0, 0.5, 0.97):
        np.testing.assert_allclose(
            call(ac.td_lambda, data, 0.97, lam)[0],
            call(ac.gae, data, 0.97, lam)[0],
            rtol=1e-5,
            atol=1e-5,
        )
    np.testing.assert_allclose(
        call(ac.gae, data, 0.97, 1.0)[0],
        call(ac.monte_carlo, data, 0.97, None)[0],
        rtol=1e-5,
        atol=1e-5,
    )
    np.testing.assert_allclose(
        call(ac.gae, data, 0.97, 0.0)[0], call(ac.td_k, data, 0.97, 1)[0], rtol=1e-5, atol=1e-5
    )
    # k at least the rollout's length: the Monte-Carlo return
    np.testing.assert_allclose(
        call(ac.td_k, data, 0.97, 20)[0],
        call(ac.monte_carlo, data, 0.97, None)[0],
        rtol=1e-5,
        atol=1e-5,
    )


def test_reinforce_returns_are_monte_carlo_without_bootstrap():
    rewards, values, next_values, terminated, dones = rollout_data(5)
    # no value function: nothing to bootstrap from, even after a truncation
    zeros = np.zeros_like(values)
    expected = np_reference("monte_carlo", rewards, zeros, zeros, dones, dones, 0.9, None)
    got = jax.jit(reinforce.discounted_returns, static_argnums=2)(rewards, dones, 0.9)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    # by hand: rewards 1, 2, 3 with an end after the second step; gamma 0.5
    got = reinforce.discounted_returns(
        jnp.array([[1.0], [2.0], [3.0]]), jnp.array([[False], [True], [False]]), 0.5
    )
    np.testing.assert_allclose(got[:, 0], [2.0, 2.0, 3.0])


def test_reinforce_baseline_is_the_mean_over_every_device():
    # [devices, T, B]: device means 2.5 and 8.5, overall 5.5
    returns = jnp.arange(12.0).reshape(2, 3, 2)
    weights_fn = jax.vmap(reinforce.returns_weights, (0, None), axis_name=devices.DEVICE_AXIS)
    weights, mean = weights_fn(returns, True)
    np.testing.assert_allclose(mean, [5.5, 5.5])
    np.testing.assert_allclose(weights, returns - 5.5)
    weights, _ = weights_fn(returns, False)
    np.testing.assert_allclose(weights, returns)


# ----------------------------------------------------------------------------
# Statistics on a random-walk chain with a known value function
# ----------------------------------------------------------------------------
N_STATES, GAMMA = 5, 0.9


def chain_values():
    """V of the walk: start in the middle, step left or right with probability 1/2; leaving on the
    right pays 1 (every reward also carries N(0, 1) noise) and ends the episode, as leaving on the
    left."""
    A, c = np.eye(N_STATES), np.zeros(N_STATES)
    for s in range(N_STATES):
        for nxt in (s - 1, s + 1):
            c[s] += 0.5 * (1.0 if nxt == N_STATES else 0.0)
            if 0 <= nxt < N_STATES:
                A[s, nxt] -= 0.5 * GAMMA
    return np.linalg.solve(A, c)


def chain_rollout(seed, T=64, B=800):
    """`(states [T, B], rewards, terminated, complete)`: complete marks steps whose episode ends in
    the rollout."""
    rng = np.random.default_rng(seed)
    state = np.full(B, N_STATES // 2)
    states, rewards, terminated = (np.zeros((T, B), dtype) for dtype in (int, float, bool))
    for t in range(T):
        nxt = state + np.where(rng.random(B) < 0.5, 1, -1)
        states[t] = state
        rewards[t] = (nxt == N_STATES) + rng.normal(size=B)
        terminated[t] = (nxt < 0) | (nxt == N_STATES)
        state = np.where(terminated[t], N_STATES // 2, nxt)
    complete = np.zeros((T, B), bool)
    for t in reversed(range(T)):
        complete[t] = terminated[t] | (complete[t + 1] if t + 1 < T else False)
    return states, rewards, terminated, complete


def per_state(estimates, states, mask):
    """`(mean, variance)` of the estimates of each state, over the masked steps."""
    groups = [estimates[(states == s) & mask] for s in range(N_STATES)]
    assert min(len(g) for g in groups) > 2000
    return np.array([g.mean() for g in groups]), np.array([g.var() for g in groups])


def chain_targets(fn, v_hat, states, rewards, terminated, param):
    next_states = np.roll(states, -1, axis=0)  # the next row's state; unused where the episode ends
    data = (rewards, v_hat[states], v_hat[next_states], terminated, terminated)
    return call(
        fn, tuple(x.astype(np.float32) if x.dtype != bool else x for x in data), GAMMA, param
    )[1]


def test_td_k_bias_falls_with_k():
    """With V off by +1 everywhere, G^(k) is off by about gamma^k P(alive after k steps); MC is
    unbiased."""
    v_true = chain_values()
    states, rewards, terminated, complete = chain_rollout(0)
    v_hat = v_true + 1.0
    bias = {}
    for k in (1, 2, 4, 8, 16):
        mean, _ = per_state(
            chain_targets(actor_critic.td_k, v_hat, states, rewards, terminated, k),
            states,
            complete,
        )
        bias[k] = np.mean(np.abs(mean - v_true))
    mean, _ = per_state(
        chain_targets(actor_critic.monte_carlo, v_hat, states, rewards, terminated, None),
        states,
        complete,
    )
    mc_bias = np.mean(np.abs(mean - v_true))
    ks = sorted(bias)
    assert all(bias[a] > bias[b] for a, b in zip(ks, ks[1:])), bias
    assert bias[1] > 0.6 and bias[16] < 0.1, bias
    assert mc_bias < 0.06, mc_bias  # sampling error alone: about 0.02


def test_variance_rises_with_lambda():
    """With the true V, TD(0) targets carry one step's noise; longer traces add more of it."""
    v_true = chain_values()
    states, rewards, terminated, complete = chain_rollout(1)
    variance = {}
    for lam in (0.0, 0.25, 0.5, 0.75, 1.0):
        mean, var = per_state(
            chain_targets(actor_critic.td_lambda, v_true, states, rewards, terminated, lam),
            states,
            complete,
        )
        # unbiased for every lambda when V is right
        np.testing.assert_allclose(mean, v_true, atol=0.06)
        variance[lam] = var.mean()
    lams = sorted(variance)
    assert all(variance[a] < variance[b] for a, b in zip(lams, lams[1:])), variance
    assert variance[1.0] > 2 * variance[0.0], variance
