"""algos/skip_transformer.py: causal masking, depth, the PPO loss, the compiled epoch (real
skipping, one depth for every seed and device), bad input and the CLI (learning:
tests/test_learning.py; that the Transformer beats a memory-less policy on CartPoleNoVel-v1:
bench/suite/learning.py). The context window: tests/test_envs.py.

Sizes are tiny (4 envs x 32 steps, 2 blocks of width 8) so that a compiled epoch is cheap.
"""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gymnax.environments import spaces

from algos import skip_transformer as st
from algos.skip_transformer import Batch, Config, make_trainer
from common import checkpoints, cli, devices, run, skipping
from common.distributions import make_distribution
from helpers import (
    NUM_SEEDS,
    PPO_LOSS_KEYS,
    command,
    count_primitive,
    host,
    np_gae,
    np_ppo_loss,
    run_keys,
    run_outputs,
    run_script,
)


TINY = dict(
    num_envs=4,
    num_steps=32,
    update_passes=2,
    num_minibatches=2,
    total_steps=4 * 32 * 20,
    context_len=3,
    d_model=8,
    n_heads=2,
    d_ff=16,
    n_layers=2,
    skip_fraction=0.5,
    skip_warmup_steps=2,
)
DIST = make_distribution(spaces.Discrete(2))


def tiny(**overrides) -> Config:
    return Config(**{**TINY, "n_devices": 1, **overrides})


# ----------------------------------------------------------------------------
# The network: causal, padding ignored, depth
# ----------------------------------------------------------------------------
def windows(seed, n=5, length=4, valid_from=0):
    rng = np.random.default_rng(seed)
    w = rng.normal(size=(n, length, 3)).astype(np.float32)
    w[:, :, -1] = np.arange(length) >= valid_from
    return jnp.asarray(w)


def init(config, seed=0, obs_dim=2):
    return st.init_network(jax.random.PRNGKey(seed), obs_dim, config, DIST)


def test_changing_a_later_observation_never_changes_an_earlier_output():
    config = tiny(context_len=4)
    params, w = init(config), windows(0)
    features = jax.jit(lambda w: st.torso(params, w, config)[0])  # [N, L, D]
    base = np.asarray(features(w))
    for j in range(4):
        changed = np.asarray(features(w.at[:, j, :2].add(1.0)))
        np.testing.assert_array_equal(changed[:, :j], base[:, :j])  # positions before j: untouched
        # j and after: all depend on it
        assert np.all(np.abs(changed[:, j:] - base[:, j:]).max(-1) > 1e-4)


def test_rows_of_an_earlier_episode_are_ignored():
    config = tiny(context_len=4)
    params, w = init(config), windows(1, valid_from=2)  # rows 0, 1 empty (a reset 2 steps ago)
    net = jax.jit(lambda w: st.network(params, w, DIST, config)[:2])
    garbage = w.at[:, :2, :2].set(
        jnp.asarray(np.random.default_rng(2).normal(size=(5, 2, 2)) * 10, jnp.float32)
    )
    chex.assert_trees_all_close(net(w), net(garbage), rtol=0, atol=1e-6)
    assert not np.allclose(net(w)[1], net(w.at[:, :2, -1].set(1.0))[1])  # the flags matter


# the network compiled, with everything but arrays static
network = jax.jit(st.network, static_argnums=(2, 3, 4), static_argnames=("eval_depth",))


def test_eval_depth_and_train_depth_run_the_first_blocks():
    config = tiny(n_layers=3)
    params, w = init(config), windows(3, length=3)
    full = network(params, w, DIST, config)
    for depth in (1, 2, 3):
        truncated = network({**params, "blocks": params["blocks"][:depth]}, w, DIST, config)
        pruned = network(params, w, DIST, config, eval_depth=depth)
        chex.assert_trees_all_close(pruned[:2], truncated[:2], rtol=1e-5, atol=1e-6)
        if depth < 3:
            assert not np.allclose(pruned[1], full[1])

    def depth(step, rng):
        return int(skipping.layers_run(skipping.n_forward_layers(step, rng, 3, "train", 0.5, 2), 3))

    skipping_key = next(k for k in map(jax.random.PRNGKey, range(50)) if depth(10**6, k) < 3)
    # train mode: the drawn depth
    for step, rng in (
        (0, jax.random.PRNGKey(0)),
        (10**6, skipping_key),
    ):
        inputs, values, next_step = network(params, w, DIST, config, "train", step, rng)
        chex.assert_trees_all_close(
            (inputs, values),
            network(params, w, DIST, config, eval_depth=depth(step, rng))[:2],
            rtol=1e-5,
            atol=1e-6,
        )
        assert int(next_step) == step + 1


# ----------------------------------------------------------------------------
# Pure math: GAE and the PPO loss against NumPy
# ----------------------------------------------------------------------------
def test_gae_matches_numpy_loop():
    rng = np.random.default_rng(0)
    rewards, values, next_values = (rng.normal(size=(20, 3)).astype(np.float32) for _ in range(3))
    terminated, truncated = rng.random((20, 3)) < 0.15, rng.random((20, 3)) < 0.15
    done = terminated | truncated
    adv, targets = jax.jit(st.gae, static_argnums=(5, 6))(
        rewards, values, next_values, terminated, done, 0.9, 0.8
    )
    np.testing.assert_allclose(
        adv,
        np_gae(rewards, values, next_values, terminated, done, 0.9, 0.8)[0],
        rtol=1e-5,
        atol=1e-5,
    )
    np.testing.assert_allclose(targets, np.asarray(adv) + values, rtol=1e-6)


def test_ppo_loss_matches_numpy_at_the_drawn_depth():
    config = tiny(n_layers=3, clip_eps=0.1, vf_coef=0.7, ent_coef=0.05, normalize_advantages=True)
    params = init(config)
    params["policy"]["w"] = params["policy"]["w"] * 300  # probabilities away from uniform
    rng = np.random.default_rng(4)
    n = 64
    batch = Batch(
        obs=windows(5, n=n, length=3, valid_from=1),
        action=jnp.asarray(rng.integers(0, 2, n)),
        log_prob=jnp.asarray(np.log(0.5) + rng.normal(size=n) * 0.3, jnp.float32),
        advantage=jnp.asarray(rng.normal(size=n) + 0.3, jnp.float32),
        target=jnp.asarray(rng.normal(size=n), jnp.float32),
    )
    step, key = 10**6, jax.random.PRNGKey(1)
    depth = int(skipping.layers_run(skipping.n_forward_layers(step, key, 3, "train", 0.5, 2), 3))
    loss, (metrics, next_step) = jax.jit(st.ppo_loss, static_argnums=(4, 5))(
        params, batch, step, key, DIST, config
    )
    assert int(next_step) == step + 1

    logits, values, _ = network(params, batch.obs, DIST, config, eval_depth=depth)
    expected = np_ppo_loss(logits, values, batch, config)
    assert expected["ppo/clip_fraction"] > 0.2  # the clip is exercised
    np.testing.assert_allclose(loss, expected["loss/joint"], rtol=1e-4)
    for key_, value in expected.items():
        np.testing.assert_allclose(metrics[key_], value, rtol=1e-4, atol=1e-6, err_msg=key_)


# ----------------------------------------------------------------------------
# The compiled epoch
# ----------------------------------------------------------------------------
class Compiled:
    """A trainer with its init and epoch compiled as train() compiles them."""

    def __init__(self, config: Config):
        self.config, self.trainer, self.traces = config, make_trainer(config), 0

        def epoch(state):
            self.traces += 1
            return self.trainer.epoch(state)

        self.epoch = devices.map_epoch(epoch, config.n_devices)

    def init(self, keys):
        # as train() does
        init = devices.map_init(self.trainer.init).lower(keys).compile(run.FAST_COMPILE)
        if self.config.n_devices == 1:
            return init(keys)
        # as the epoch's pmap
        return jax.pmap(lambda state: state, axis_name=devices.DEVICE_AXIS)(init(keys))


@functools.lru_cache(maxsize=None)
def compiled(**overrides) -> Compiled:
    return Compiled(tiny(**overrides))


def drawn_layers(depth_key, first_step: int, config: Config) -> float:
    """Mean blocks run over one epoch's gradient steps, drawn as the epoch draws them."""
    steps = range(first_step, first_step + config.update_passes * config.num_minibatches)
    return np.mean(
        [
            skipping.layers_run(
                skipping.n_forward_layers(
                    s,
                    jax.random.fold_in(depth_key, s),
                    config.n_layers,
                    "train",
                    config.skip_fraction,
                    config.skip_warmup_steps,
                ),
                config.n_layers,
            )
            for s in steps
        ]
    )


LOSS_KEYS = (*PPO_LOSS_KEYS, "skip/layers_run", "skip/warmup")


def test_epoch_every_seed_runs_the_depths_of_the_first_seed():
    c = compiled()
    state = c.init(run_keys(0))
    # each seed has its own key...
    assert not np.array_equal(state.depth_key[0, 0], state.depth_key[0, 1])
    per_epoch = c.config.update_passes * c.config.num_minibatches
    layers, params = [], host(state.params)
    for e in range(3):
        depth_key = host(state.depth_key)  # the epoch donates (deletes) its input state
        new_state, metrics = c.epoch(state)
        metrics = host(metrics)
        for key in LOSS_KEYS + ("episode/return", "episode/length"):
            chex.assert_shape(metrics[key], (1, NUM_SEEDS))
            assert np.all(np.isfinite(metrics[key])), key
        assert np.all(metrics["episode/count"] > 0)
        # ...but both run the depths drawn from the first seed's key, step by step
        want = drawn_layers(depth_key[0, 0], e * per_epoch, c.config)
        np.testing.assert_allclose(metrics["skip/layers_run"], want, rtol=1e-6)
        layers.append(want)
        # warmup over 2 gradient steps: over after the first epoch's 4
        np.testing.assert_allclose(metrics["skip/warmup"], 0.0)
        assert np.all(np.asarray(new_state.skip_step) == (e + 1) * per_epoch)
        np.testing.assert_array_equal(new_state.depth_key, depth_key)
        for leaf_new, leaf_old in zip(
            jax.tree.leaves(host(new_state.params)), jax.tree.leaves(params)
        ):
            assert not np.array_equal(leaf_new, leaf_old)
        state, params = new_state, host(new_state.params)
    assert min(layers) < c.config.n_layers, layers  # blocks were skipped (after the 2 warmup steps)
    assert c.traces == 1


@pytest.mark.parametrize("skip_fraction, conds", [(0.5, 2 * TINY["n_layers"]), (0.0, 0)])
def test_epoch_skips_blocks_behind_an_unbatched_cond(skip_fraction, conds):
    """Under the seed and device vmaps, one cond per block in the update's forward and backward
    pass.

    A batched predicate would have turned them into selects that run every block.
    """
    trainer = make_trainer(tiny(skip_fraction=skip_fraction))
    state = jax.eval_shape(devices.map_init(trainer.init), run_keys(0))
    jaxpr = jax.make_jaxpr(jax.vmap(jax.vmap(trainer.epoch), axis_name=devices.DEVICE_AXIS))(state)
    assert count_primitive(jaxpr.jaxpr, "cond") == conds


@pytest.mark.slow
def test_two_devices_draw_the_depths_of_one_device():
    one, two = compiled(), compiled(n_devices=2)
    s1, s2 = one.init(run_keys(0)), two.init(run_keys(0, n_devices=2))
    # not folded with the device index
    np.testing.assert_array_equal(s2.depth_key[0], s2.depth_key[1])
    assert not np.array_equal(s2.key[0], s2.key[1])
    for _ in range(3):
        s1, m1 = one.epoch(s1)
        s2, m2 = two.epoch(s2)
        # devices drawing other depths would average to other numbers than one device alone
        np.testing.assert_array_equal(
            host(m2)["skip/layers_run"][0], host(m1)["skip/layers_run"][0]
        )
    assert two.traces == 1
    first, second = (jax.tree.map(lambda x, i=i: x[i], host(s2)) for i in range(2))
    chex.assert_trees_all_equal(first.params, second.params)
    assert not np.array_equal(first.obs, second.obs)


# ----------------------------------------------------------------------------
# Bad input: clear errors before anything compiles
# ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "overrides, match",
    [
        (dict(skip_fraction=1.0), r"--skip-fraction 1.0: use a value in \[0, 1\)"),
        (dict(skip_fraction=-0.5), r"--skip-fraction -0.5"),
        (dict(eval_depth=3), r"--eval-depth 3: use 1 to --n-layers 2, or 0"),
        (dict(context_len=0), r"--context-len must be at least 1"),
        (dict(d_model=10, n_heads=4), r"--d-model 10 is not divisible by --n-heads 4"),
        (dict(skip_warmup_steps=-1), r"--skip-warmup-steps -1"),
        (dict(n_layers=0), r"--n-layers must be at least 1"),
    ],
)
def test_bad_input_rejected_by_config(overrides, match):
    with pytest.raises(ValueError, match=match):
        tiny(**overrides)


@pytest.mark.parametrize(
    "overrides, match",
    [
        (dict(env="CartPoleNoVel-v2"), r"--env 'CartPoleNoVel-v2'"),
        (dict(num_steps=8, num_minibatches=3), r"--num-minibatches 3 .* 4 envs x 8 steps = 32"),
    ],
)
def test_bad_input_rejected_by_make_trainer(overrides, match):
    with pytest.raises(ValueError, match=match):
        make_trainer(tiny(**overrides))


# ----------------------------------------------------------------------------
# The command line, from another directory
# ----------------------------------------------------------------------------
CLI_TINY = [
    "--num-envs",
    "4",
    "--num-steps",
    "32",
    "--total-steps",
    "1280",
    "--update-passes",
    "2",
    "--num-minibatches",
    "2",
    "--context-len",
    "3",
    "--d-model",
    "8",
    "--d-ff",
    "16",
    "--n-layers",
    "2",
    "--skip-warmup-steps",
    "4",
    "--eval-episodes",
    "4",
]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--skip-fraction", "1"], "--skip-fraction 1.0: use a value in [0, 1)"),
        (["--eval-depth", "5"], "--eval-depth 5: use 1 to --n-layers 2"),
    ],
)
def test_bad_flags_fail_before_compiling(tmp_path, args, message):
    out = command("skip_transformer", *CLI_TINY, *args, "--out-dir", tmp_path / "run", cwd=tmp_path)
    assert out.returncode != 0 and message in out.stderr
    assert "compiled in" not in out.stdout and not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "total_steps, grad_steps", [(20_000, 304), (32_767, 496), (32_768, None), (200_000, None)]
)
def test_main_warns_when_the_warmup_leaves_skip_fraction_no_effect(
    total_steps, grad_steps, monkeypatch, capsys
):
    """Defaults: no block is skipped in the first 1000 / 2 = 500 gradient steps (16 per epoch of
    1,024 environment steps), so a run of fewer than 32 epochs is the same for every
    --skip-fraction."""

    def train(config, *_):
        raise SystemExit("stopped before training")

    monkeypatch.setattr(run, "train", train)
    with pytest.raises(SystemExit, match="stopped before training"):
        st.main(["--total-steps", str(total_steps)])
    err = capsys.readouterr().err
    if grad_steps is None:
        assert "warning" not in err
    else:
        assert (
            f"warning: --skip-fraction 0.4 changes nothing in this run: its {grad_steps} gradient "
            "steps all come before step 500 (--skip-warmup-steps / --n-layers), and until then "
            "the warmup runs every block; train for at least 32,768 environment steps, or lower "
            "--skip-warmup-steps"
        ) in err, err


@pytest.mark.slow
def test_cli_two_seeds_on_two_devices_writes_outputs_and_returns_by_depth(tmp_path):
    out_dir = tmp_path / "run"
    out = run_script(
        "skip_transformer",
        *CLI_TINY,
        "--num-seeds",
        "2",
        "--n-devices",
        "2",
        "--eval-every",
        "5",
        "--out-dir",
        out_dir,
        cwd=tmp_path,
        n_devices=2,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert (
        "on 2 cpu device(s)" in out.stdout
        and "greedy return by depth (blocks run): 1: " in out.stdout
    )
    config, lines, summary = run_outputs(out_dir)
    assert (
        config["n_layers"] == 2 and config["env"] == "CartPoleNoVel-v1" and config["num_seeds"] == 2
    )
    assert len(lines) == 10 and summary["env_steps"] == 1280
    assert (
        all(1.0 <= r["skip/layers_run"] <= 2.0 for r in lines) and lines[-1]["skip/warmup"] == 0.0
    )
    assert "eval/return" in lines[4] and "eval/return" in lines[-1]
    by_depth = summary["eval_return_by_depth"]
    assert sorted(by_depth) == ["1", "2"]
    assert all(len(v) == 2 for v in summary["eval_return_by_depth_per_seed"].values())
    # full depth, same episodes as the run's own final evaluation
    np.testing.assert_allclose(
        summary["eval_return_by_depth_per_seed"]["2"], summary["eval_return_per_seed"]
    )
    np.testing.assert_allclose(
        by_depth["1"], np.mean(summary["eval_return_by_depth_per_seed"]["1"])
    )


# ----------------------------------------------------------------------------
# A saved agent: checkpoints.load_agent keeps each environment's window
# ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def saved_run(tmp_path_factory):
    """A 2-seed run trained through main, as a user starts one. At --lr 1e-3 its agent still drops
    the pole within 12 steps now and then, so the test below sees episodes end both ways."""
    out_dir = tmp_path_factory.mktemp("saved") / "run"
    flags = [*CLI_TINY, "--lr", "1e-3", "--num-seeds", "2", "--n-devices", "1"]
    st.main([*flags, "--out-dir", str(out_dir)])
    return out_dir


@pytest.mark.slow  # about 40 s on 2 loaded cores, most of it compiling the run
def test_load_agent_keeps_each_environments_window_as_training_does(saved_run):
    """The loaded agent, fed CartPoleNoVel-v1's observations and the episode starts, holds the
    windows that the training rollout's ContextWindow builds from the same episodes and acts as
    the training code's policy on them: every seed at once, each seed alone, one environment or a
    batch."""
    config = cli.load_config(Config, saved_run)
    trainer = make_trainer(config)
    template = jax.eval_shape(devices.map_init(trainer.init), run_keys(0))
    state, _ = checkpoints.load(checkpoints.latest(saved_run / "checkpoints"), template)
    params = trainer.policy(devices.unreplicate(state))  # [seeds, ...]
    # truncations too
    env, env_params = (
        trainer.env,
        trainer.env_params.replace(max_steps_in_episode=12),
    )
    n = 3
    load = functools.partial(checkpoints.load_agent, saved_run, Config, make_trainer)
    every_seed, each_seed, one_env = load(), [load(seed=s) for s in range(NUM_SEEDS)], load(seed=1)
    never_cleared = load(seed=0)  # told of no episode start
    # [seeds, N]
    policy = jax.jit(jax.vmap(jax.vmap(trainer.act, (None, 0, None)), (0, None, None)))
    reset, step = (
        jax.jit(jax.vmap(env.reset, (0, None))),
        jax.jit(jax.vmap(env.step, (0, 0, 0, None))),
    )
    inner_reset, inner_step = (
        jax.jit(jax.vmap(env.env.reset, (0, None))),
        jax.jit(jax.vmap(env.env.step, (0, 0, 0, None))),
    )
    key = jax.random.PRNGKey(5)
    # the training rollout's windows
    windows, window_state = reset(jax.random.split(key, n), env_params)
    obs, inner_state = inner_reset(jax.random.split(key, n), env_params)  # the same episodes, raw
    first, ends, actions, differ = np.ones(n, bool), [], [], 0
    for t in range(40):
        want = np.asarray(policy(params, windows, key))
        np.testing.assert_array_equal(every_seed(obs, first=first), want)
        np.testing.assert_array_equal(every_seed.windows, windows)
        for s in range(NUM_SEEDS):
            np.testing.assert_array_equal(each_seed[s](obs, first=first), want[s])
        np.testing.assert_array_equal(one_env(obs[0], first=first[0]), want[1, 0])
        np.testing.assert_array_equal(one_env.windows, windows[0])
        never_cleared(obs)
        differ += not np.array_equal(never_cleared.windows, windows)
        actions.append(want[0])
        step_keys = jax.random.split(jax.random.fold_in(key, t), n)
        windows, window_state, _, terminated, truncated, _ = step(
            step_keys, window_state, want[0], env_params
        )
        obs, inner_state, *_ = inner_step(step_keys, inner_state, want[0], env_params)
        first = np.asarray(terminated | truncated)
        ends += ["terminated"] * int(terminated.sum()) + ["truncated"] * int(truncated.sum())
    assert "terminated" in ends and "truncated" in ends, ends
    assert len(np.unique(actions)) == 2  # the actions did depend on the windows
    assert differ > 0  # without the episode starts, the windows mix episodes
    with pytest.raises(ValueError, match=r"call reset\(\) first"):
        one_env(obs)  # a batch after one environment
    one_env.reset()
    chex.assert_shape(one_env(obs, first=True), (n,))
