"""algos/actor_critic.py: losses, value scaling, shared layers, the compiled epoch, devices, CLI
(learning: tests/test_learning.py).

The estimators are tested in tests/test_estimators.py. Sizes are tiny
(CartPole-v1, 4 envs x 32 steps); compiled programs are shared through a
module-level cache and the session's persistent compilation cache.
"""

import dataclasses
import functools
from pathlib import Path

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gymnax.environments import spaces

from algos import actor_critic
from algos.actor_critic import Batch, Config, make_trainer, policy_loss, value_loss
from common import checkpoints, devices, nets, run, sweep
from common.distributions import make_distribution
from helpers import NUM_SEEDS, host, quick_compile, random_batch, run_keys, run_outputs, run_script


TINY = dict(
    num_envs=4,
    num_steps=32,
    policy_batch_size=64,
    value_batch_size=32,
    policy_steps=3,
    value_steps=2,
    total_steps=4 * 32 * 20,
    loss="ppo",
)
# value_lr so small that Adam's steps vanish in float32: the value net changes only by the layer
# copy
FROZEN_VALUE = dict(
    value_lr=1e-30, n_shared_layers=1, scale_value_targets=True, advantage="td-k", td_k=1
)


def tiny(**overrides) -> Config:
    return Config(**{**TINY, "n_devices": 1, **overrides})


@functools.lru_cache(maxsize=None)
def compiled(**overrides):
    """`(config, trainer, init, epoch)` of the tiny config with `overrides`
    (`helpers.quick_compile`)."""
    config = tiny(**overrides)
    return (config, *quick_compile(make_trainer, config, run_keys(0, n_devices=config.n_devices)))


# ----------------------------------------------------------------------------
# Losses against NumPy
# ----------------------------------------------------------------------------
def np_mlp(layers, x):
    for layer in layers:
        x = np.tanh(x @ np.asarray(layer["w"], np.float64) + np.asarray(layer["b"], np.float64))
    return x


def init_params(seed, dist, hidden=(64, 64)):
    k1, k2, k3, k4 = jax.random.split(jax.random.PRNGKey(seed), 4)
    policy = {
        "torso": nets.torso_init(jax.random.split(k1, len(hidden)), 4, hidden),
        "head": dist.head_init(k2, hidden[-1]),
    }
    policy["head"]["w"] = policy["head"]["w"] * 100  # probabilities well away from uniform
    value = {
        "torso": nets.torso_init(jax.random.split(k3, len(hidden)), 4, hidden),
        "head": nets.dense_init(k4, hidden[-1], 1, 1.0),
    }
    return policy, value


@pytest.mark.parametrize("loss", ["a2c", "ppo"])
@pytest.mark.parametrize("normalize", [False, True])
def test_policy_loss_matches_numpy(loss, normalize):
    dist = make_distribution(spaces.Discrete(2))
    config = tiny(loss=loss, normalize_advantages=normalize, clip_eps=0.1, ent_coef=0.05)
    params, _ = init_params(0, dist)
    batch = random_batch(Batch, 0, 64, target_scale=20)
    total, metrics = jax.jit(policy_loss, static_argnums=(2, 3))(params, batch, dist, config)

    obs = np.asarray(batch.obs, np.float64)
    logits = np_mlp(params["torso"], obs) @ np.asarray(params["head"]["w"]) + np.asarray(
        params["head"]["b"]
    )
    log_pi = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    log_prob = log_pi[np.arange(64), np.asarray(batch.action)]
    adv = np.asarray(batch.advantage, np.float64)
    if normalize:
        adv = (adv - adv.mean()) / (adv.std() + 1e-8)
    ratio = np.exp(log_prob - np.asarray(batch.log_prob))
    assert (np.abs(ratio - 1) > 0.1).mean() > 0.2  # the clip is exercised
    if loss == "a2c":
        surrogate = -np.mean(adv * log_prob)
    else:
        surrogate = -np.mean(np.minimum(ratio * adv, np.clip(ratio, 0.9, 1.1) * adv))
    entropy = np.mean(-(np.exp(log_pi) * log_pi).sum(-1))
    expected = {
        "loss/policy": surrogate,
        "policy/entropy": entropy,
        "policy/log_prob_mean": log_prob.mean(),
        "policy/outside_box": 0.0,  # a categorical has no box
        f"{loss}/approx_kl": np.mean(ratio - 1 - np.log(ratio)),
    }
    if loss == "ppo":
        expected["ppo/clip_fraction"] = np.mean(np.abs(ratio - 1) > 0.1)
    assert set(metrics) == set(expected)
    np.testing.assert_allclose(total, surrogate - 0.05 * entropy, rtol=1e-4)
    for key, value in expected.items():
        np.testing.assert_allclose(metrics[key], value, rtol=1e-4, atol=1e-6, err_msg=key)


@pytest.mark.parametrize("scale", [1.0, 100.0])
def test_value_loss_matches_numpy(scale):
    _, params = init_params(1, make_distribution(spaces.Discrete(2)))
    batch = random_batch(Batch, 1, 64, target_scale=20)
    loss, metrics = jax.jit(value_loss, static_argnums=(2, 3))(params, batch, tiny(), scale)
    raw = (
        np_mlp(params["torso"], np.asarray(batch.obs, np.float64))
        @ np.asarray(params["head"]["w"])[:, 0]
    )
    expected = np.mean(
        (raw + float(params["head"]["b"][0]) - np.asarray(batch.target) / scale) ** 2
    )
    np.testing.assert_allclose(loss, expected, rtol=1e-5)
    np.testing.assert_allclose(metrics["loss/value"], expected, rtol=1e-5)


@pytest.mark.parametrize(
    "advantage, fn, param",
    [
        ("monte-carlo", actor_critic.monte_carlo, ()),
        ("td-k", actor_critic.td_k, (5,)),
        ("td-lambda", actor_critic.td_lambda, (0.7,)),
        ("gae", actor_critic.gae, (0.7,)),
    ],
)
def test_flag_picks_the_estimator(advantage, fn, param):
    rng = np.random.default_rng(0)
    data = [jnp.asarray(rng.normal(size=(8, 3)), jnp.float32) for _ in range(3)]
    ends = [jnp.asarray(rng.random((8, 3)) < 0.2)] * 2
    got = actor_critic.estimator(tiny(advantage=advantage, td_k=5, gae_lambda=0.7, gamma=0.9))(
        *data, *ends
    )
    chex.assert_trees_all_close(got, fn(*data, *ends, 0.9, *param))


def test_share_layers():
    policy = {"torso": ["p0", "p1", "p2"], "head": "ph"}
    value = {"torso": ["v0", "v1", "v2"], "head": "vh"}
    assert actor_critic.share_layers(policy, value, 0) == value
    assert actor_critic.share_layers(policy, value, 2) == {
        "torso": ["p0", "p1", "v2"],
        "head": "vh",
    }
    assert actor_critic.share_layers(policy, value, 3) == {
        "torso": ["p0", "p1", "p2"],
        "head": "vh",
    }


# ----------------------------------------------------------------------------
# The epoch
# ----------------------------------------------------------------------------
KEYS = (
    "loss/policy",
    "loss/value",
    "policy/entropy",
    "policy/log_prob_mean",
    "policy/outside_box",
    "policy/preferred_move",
    "ppo/approx_kl",
    "ppo/clip_fraction",
    "optim/policy_grad_norm",
    "optim/value_grad_norm",
    "value/advantage_mean",
    "value/advantage_norm",
    "value/explained_variance",
    "episode/return",
    "episode/length",
    "episode/count",
)


def test_epoch_trains_both_networks():
    config, trainer, init, epoch = compiled()
    state = init(run_keys(0))
    new_state, metrics = host(epoch(state))
    assert set(metrics) == set(KEYS)
    for key, value in metrics.items():
        chex.assert_shape(value, (1, NUM_SEEDS))
        assert np.all(np.isfinite(value)), key
    assert np.all(metrics["episode/count"] > 0)
    # reward 1 per step
    np.testing.assert_allclose(metrics["episode/return"], metrics["episode/length"])
    # every parameter of both networks moved; each optimizer counted its own number of steps
    for before, after in (
        (state.policy_params, new_state.policy_params),
        (state.value_params, new_state.value_params),
    ):
        for x, y in zip(jax.tree.leaves(host(before)), jax.tree.leaves(after)):
            assert not np.array_equal(x, y)
    for opt_state, steps in (
        (new_state.policy_opt_state, config.n_policy_steps),
        (new_state.value_opt_state, config.value_steps),
    ):
        counts = [x for x in jax.tree.leaves(opt_state) if x.dtype == np.int32]
        assert counts and all(np.all(x == steps) for x in counts)
    # the same keys give the same epoch; another seed another one
    again, _ = host(epoch(state))
    chex.assert_trees_all_equal(again, new_state)
    seed0, seed1 = (jax.tree.map(lambda x, i=i: x[:, i], new_state) for i in range(2))
    assert not np.array_equal(seed0.obs, seed1.obs)
    assert not np.array_equal(
        seed0.policy_params["torso"][0]["w"], seed1.policy_params["torso"][0]["w"]
    )


def test_shared_layers_are_copied_at_each_epoch_start():
    _, _, init, epoch = compiled(**FROZEN_VALUE)
    s0 = init(run_keys(0))
    s1 = epoch(s0)[0]
    s2 = host(epoch(s1)[0])
    s0, s1 = host(s0), host(s1)
    torso = lambda s, net, i: getattr(s, f"{net}_params")["torso"][i]  # noqa: E731
    # shared from the start
    chex.assert_trees_all_equal(torso(s0, "value", 0), torso(s0, "policy", 0))
    # the policy learns
    assert not np.array_equal(torso(s1, "policy", 0)["w"], torso(s0, "policy", 0)["w"])
    # after each epoch the value net holds the policy's first layer as it was at that epoch's start
    # (up to the 1e-30 steps of the value's own Adam)
    same = functools.partial(chex.assert_trees_all_close, rtol=0, atol=1e-20)
    same(torso(s1, "value", 0), torso(s0, "policy", 0))
    same(torso(s2, "value", 0), torso(s1, "policy", 0))
    # and its own second layer, different from the policy's
    same(torso(s2, "value", 1), torso(s0, "value", 1))
    assert not np.array_equal(torso(s0, "value", 1)["w"], torso(s0, "policy", 1)["w"])


def test_scaled_value_targets_read_the_output_times_one_over_one_minus_gamma():
    """A constant raw value output c means V = c / (1 - gamma) = 50 c; TD(1) advantages on CartPole
    (reward 1, as the rewards stay with --no-normalize-reward) are 1 - (1 - gamma) V on running
    steps and 1 - V on terminating ones."""
    config, _, init, epoch = compiled(**FROZEN_VALUE, normalize_reward=False)
    state = init(run_keys(1))
    c = 0.4
    head = state.value_params["head"]
    head = {"w": jnp.zeros_like(head["w"]), "b": jnp.full_like(head["b"], c)}
    state = state._replace(value_params={**state.value_params, "head": head})
    metrics = host(epoch(state)[1])
    value = c / (1 - config.gamma)
    # no time limit in 32 steps
    terminated = metrics["episode/count"] / (config.num_envs * config.num_steps)
    expected = 1 - value * ((1 - config.gamma) + config.gamma * terminated)
    np.testing.assert_allclose(metrics["value/advantage_mean"], expected, rtol=1e-4)
    # the raw output regresses on the targets times 1 - gamma: (1 + gamma V)(1 - gamma) = 0.406 on
    # running steps, 0.01 on terminating ones (about 5%): loss about 0.05 * 0.39^2; unscaled targets
    # 1.396 give ~1
    assert np.all((metrics["loss/value"] > 1e-4) & (metrics["loss/value"] < 0.05)), metrics[
        "loss/value"
    ]


# ----------------------------------------------------------------------------
# Several devices
# ----------------------------------------------------------------------------
@pytest.mark.parametrize("loss_name", ["policy", "value"])
def test_pmean_of_half_batch_gradients_equals_full_batch_gradient(loss_name):
    dist = make_distribution(spaces.Discrete(2))
    policy, value = init_params(2, dist)
    params = policy if loss_name == "policy" else value
    loss = (
        functools.partial(policy_loss, dist=dist, config=tiny())
        if loss_name == "policy"
        else functools.partial(value_loss, config=tiny(), value_scale=10.0)
    )
    batch = random_batch(Batch, 2, 64, target_scale=20)

    def grad(params_and_batch):  # one (device, seed) slice, as the epoch's fit() averages it
        params, batch = params_and_batch
        return jax.lax.pmean(jax.grad(loss, has_aux=True)(params, batch)[0], devices.DEVICE_AXIS)

    # [devices, seeds, ...]
    replicated = jax.tree.map(lambda x: jnp.broadcast_to(x, (2, 1) + x.shape), params)
    halves = jax.tree.map(lambda x: x.reshape((2, 1, 32) + x.shape[1:]), batch)
    grads = host(
        devices.map_epoch(grad, 2, donate=False)
        .lower((replicated, halves))
        .compile(run.FAST_COMPILE)((replicated, halves))
    )
    full = host(jax.grad(loss, has_aux=True)(params, batch)[0])
    for device in range(2):
        chex.assert_trees_all_close(
            jax.tree.map(lambda x, d=device: x[d, 0], grads), full, rtol=1e-5, atol=1e-6
        )
    half = host(jax.grad(loss, has_aux=True)(params, jax.tree.map(lambda x: x[:32], batch))[0])
    assert not np.allclose(half["torso"][0]["w"], full["torso"][0]["w"], rtol=1e-3)


def test_two_device_pendulum_epoch_keeps_devices_in_sync():
    """Continuous actions, the a2c loss and TD(lambda), on two devices."""
    _, _, init, epoch = compiled(
        env="Pendulum-v1", num_steps=16, loss="a2c", advantage="td-lambda", n_devices=2
    )
    state = init(run_keys(0, n_devices=2))
    chex.assert_shape(state.obs, (2, NUM_SEEDS, 2, 3))  # the 4 envs split over 2 devices
    new_state, metrics = host(epoch(state))
    # Gaussian entropy of a 1-d action, std 1 at initialisation: 0.5 log(2 pi e) = 1.419
    np.testing.assert_allclose(metrics["policy/entropy"], 1.419, atol=0.05)
    assert "a2c/approx_kl" in metrics and "ppo/clip_fraction" not in metrics
    assert not np.array_equal(
        host(state.policy_params)["head"]["log_std"], new_state.policy_params["head"]["log_std"]
    )
    new_state, metrics = host(epoch(new_state))
    first, second = (jax.tree.map(lambda x, i=i: x[i], new_state) for i in range(2))
    for name in ("policy_params", "value_params", "policy_opt_state", "value_opt_state"):
        chex.assert_trees_all_equal(getattr(first, name), getattr(second, name))
    assert not np.array_equal(first.obs, second.obs)  # devices explore differently
    chex.assert_trees_all_equal(*(jax.tree.map(lambda x, i=i: x[i], metrics) for i in range(2)))
    for key in KEYS:
        if not key.startswith(("episode/", "ppo/")):  # no Pendulum episode ends in 32 steps
            assert np.all(np.isfinite(metrics[key])), key


# ----------------------------------------------------------------------------
# Bad input
# ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "overrides, match",
    [
        (dict(loss="sac"), r"--loss 'sac': use one of a2c, ppo"),
        (
            dict(advantage="td-0"),
            r"--advantage 'td-0': use one of monte-carlo, td-k, td-lambda, gae",
        ),
        (
            dict(n_shared_layers=3),
            r"--n-shared-layers 3: the networks have 2 hidden layers .*use 0 to 2",
        ),
        (dict(td_k=0), "--td-k must be at least 1"),
        (dict(value_steps=0), "--value-steps must be at least 1"),
        (
            dict(policy_lr=-1e-3),
            "--policy-lr -0.001, --value-lr 0.0025: use positive learning rates",
        ),
        (dict(gae_lambda=1.5), "--gae-lambda 1.5"),
        (dict(scale_value_targets=True, gamma=1.0), "--scale-value-targets .* below 1"),
        (dict(hidden=()), "--hidden"),
    ],
)
def test_bad_config_is_rejected(overrides, match):
    with pytest.raises(ValueError, match=match):
        Config(**{**TINY, **overrides})


@pytest.mark.parametrize("loss, lr", [("a2c", 4e-3), ("ppo", 2.5e-3)])
def test_policy_lr_0_is_the_loss_default_in_the_config_the_advice_and_a_sweep(loss, lr):
    """`--policy-lr 0` is the rate --loss picks, held by the config (so config.json records it),
    lowered by the divergence advice and fed to the programs by `--sweep`."""
    config = Config(loss=loss, n_devices=1)
    assert config.policy_lr == lr
    advice = checkpoints.divergence_advice(config, None, Path("run"))
    assert f"--policy-lr {lr / 10:.3g} --value-lr 0.00025" in advice
    swept = dataclasses.replace(config, sweep=("policy_lr=0,1e-3",))
    values = sweep.build(swept, make_trainer, 1)[1]
    np.testing.assert_allclose(values["policy_lr"][0], [lr, 1e-3], rtol=1e-6)


def test_ppo_defaults_take_several_minibatch_steps_and_differ_from_a2c():
    """With one policy step on the whole rollout the ratio is 1 and PPO's gradient is A2C's. a2c
    rolls out 32 steps an epoch, ppo 128."""
    assert (Config().num_steps, Config(loss="ppo").num_steps) == (32, 128)
    assert Config(num_steps=64).num_steps == 64
    assert (Config().n_policy_steps, Config().policy_batch) == (1, 256)
    assert (Config(loss="ppo").n_policy_steps, Config(loss="ppo").policy_batch) == (16, 256)
    assert Config(loss="ppo", policy_steps=4, policy_batch_size=512).n_policy_steps == 4
    with pytest.raises(ValueError, match="--loss ppo --policy-steps 1 is A2C"):
        Config(loss="ppo", policy_steps=1)
    policies = {}
    # the defaults, apart from the loss, and the rollout of ppo: one epoch from the same state
    for loss in ("a2c", "ppo"):
        trainer = make_trainer(Config(loss=loss, num_steps=128, n_devices=1))
        keys = devices.seed_keys(jax.random.PRNGKey(0), 1, 1)
        state = devices.map_init(trainer.init)(keys)
        state, _ = devices.map_epoch(trainer.epoch, 1)(state)
        policies[loss] = host(state.policy_params)
        counts = [x for x in jax.tree.leaves(host(state.policy_opt_state)) if x.dtype == np.int32]
        assert all(np.all(x == {"a2c": 1, "ppo": 16}[loss]) for x in counts)
    assert any(
        not np.allclose(a, p, atol=1e-6)
        for a, p in zip(jax.tree.leaves(policies["a2c"]), jax.tree.leaves(policies["ppo"]))
    )


@pytest.mark.parametrize(
    "overrides, match",
    [
        (
            dict(policy_batch_size=129 * 4),
            r"--policy-batch-size 516: .* at most 4 envs x 32 steps = 128",
        ),
        (
            dict(value_batch_size=33, n_devices=2),
            r"--value-batch-size 33: use a multiple of --n-devices 2",
        ),
        (dict(std="network"), r"--std network.*discrete"),
    ],
)
def test_bad_input_rejected_before_compiling(overrides, match, tmp_path):
    with pytest.raises(ValueError, match=match):
        run.train(tiny(**overrides, out_dir=str(tmp_path / "run")), make_trainer)
    assert not (tmp_path / "run").exists()


# ----------------------------------------------------------------------------
# The command line
# ----------------------------------------------------------------------------
@pytest.mark.slow  # about 15-40 s: import, then a full compile in a fresh process
def test_cli_two_devices_two_seeds_writes_outputs(tmp_path):
    out_dir = tmp_path / "run"
    out = run_script(
        "actor_critic",
        "--num-envs",
        4,
        "--num-steps",
        32,
        "--policy-batch-size",
        64,
        "--value-batch-size",
        64,
        "--total-steps",
        384,
        "--num-seeds",
        2,
        "--n-devices",
        2,
        "--eval-episodes",
        2,
        "--advantage",
        "td-k",
        "--n-shared-layers",
        2,
        "--out-dir",
        out_dir,
        cwd=tmp_path,
        n_devices=2,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "eval return" in out.stdout and "2 seed(s) on 2 cpu device(s)" in out.stdout
    config, lines, summary = run_outputs(out_dir)
    assert config["advantage"] == "td-k" and config["n_shared_layers"] == 2
    assert len(lines) == 3 and summary["env_steps"] == 384 and config["num_seeds"] == 2
    assert "loss/value" in lines[-1] and "a2c/approx_kl" in lines[-1] and "eval/return" in lines[-1]
