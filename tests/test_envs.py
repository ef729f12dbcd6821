"""common/envs.py's partial-observation wrappers: CartPoleNoVel-v1 (`HiddenEntries`) and the context
window (`ContextWindow`) against gymnax's CartPole stepped alongside with the same keys; `make_env`
builds CartPoleNoVel-v1 for every script and suggests it for a near miss.
"""

import importlib
import os
import subprocess
import sys
import uuid
from pathlib import Path

import gymnax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from common import cli, devices, envs
from helpers import PPO_RUN, script_env

ROOT = Path(__file__).resolve().parent.parent


def corridor_source() -> str:
    """The corridor environment of docs/environments.md, as a user saves it."""
    page = (ROOT / "docs" / "environments.md").read_text()
    return page.split("saved as `corridor.py` in the current\ndirectory:\n\n```python\n", 1)[
        1
    ].split("```", 1)[0]


SCRIPTS = ["ppo_joint", "awr", "actor_critic", "reinforce", "dqn_value", "skip_transformer"]


def test_cartpole_without_velocities_shows_x_and_theta_of_cartpole():
    env, params = envs.make_env("CartPoleNoVel-v1")
    ref, ref_params = gymnax.make("CartPole-v1")
    space, ref_space = env.observation_space(params), ref.observation_space(ref_params)
    assert space.shape == (2,) and space.dtype == ref_space.dtype
    np.testing.assert_array_equal(space.low, ref_space.low[jnp.array([0, 2])])
    np.testing.assert_array_equal(space.high, ref_space.high[jnp.array([0, 2])])
    assert env.action_space(params).n == ref.action_space(ref_params).n
    key = jax.random.PRNGKey(1)
    (obs, state), (ref_obs, ref_state) = env.reset(key, params), ref.reset(key, ref_params)
    np.testing.assert_array_equal(obs, ref_obs[jnp.array([0, 2])])
    for t in range(30):  # always push right: the pole falls, and the episode restarts
        key = jax.random.fold_in(key, t)
        obs, state, reward, terminated, truncated, info = env.step(key, state, 1, params)
        ref_obs, ref_state, ref_reward, ref_term, ref_trunc, ref_info = ref.step(
            key, ref_state, 1, ref_params
        )
        assert (reward, terminated, truncated) == (ref_reward, ref_term, ref_trunc)
        np.testing.assert_array_equal(obs, ref_obs[jnp.array([0, 2])])
        np.testing.assert_array_equal(
            info["final_observation"], ref_info["final_observation"][jnp.array([0, 2])]
        )
        # the same dynamics
        assert all(jax.tree.leaves(jax.tree.map(np.array_equal, state, ref_state))), t


def test_context_window_slides_and_resets_at_episode_ends():
    """The window of CartPoleNoVel-v1 against gymnax's CartPole stepped alongside with the same
    keys."""
    inner, params = envs.make_env("CartPoleNoVel-v1")
    env = envs.ContextWindow(inner, params, 3)
    assert env.raw_obs_shape == (2,) and env.obs_dim == 2 and env.window_shape == (3, 3)
    params = params.replace(max_steps_in_episode=12)  # a time limit that alternating actions reach
    ref = gymnax.make("CartPole-v1")[0]
    key = jax.random.PRNGKey(0)
    window, state = jax.jit(env.reset)(key, params)
    ref_obs, ref_state = ref.reset(key, params)
    np.testing.assert_array_equal(window, [[0, 0, 0], [0, 0, 0], [ref_obs[0], ref_obs[2], 1]])
    step, ref_step = jax.jit(env.step), jax.jit(ref.step)
    ends, t_in_episode = [], 0
    for t in range(40):
        action = 1 if len(ends) == 0 else t % 2  # first episode: always push right and fall
        key = jax.random.fold_in(key, t)
        new_window, state, _, terminated, truncated, info = step(key, state, action, params)
        ref_obs, ref_state, _, ref_term, ref_trunc, ref_info = ref_step(
            key, ref_state, action, params
        )
        assert (terminated, truncated) == (ref_term, ref_trunc)
        final = np.concatenate(
            [window[1:], [[ref_info["final_observation"][0], ref_info["final_observation"][2], 1]]]
        )
        np.testing.assert_array_equal(info["final_observation"], final)
        t_in_episode += 1
        if terminated or truncated:  # cleared: only the reset observation
            ends.append("terminated" if terminated else "truncated")
            np.testing.assert_array_equal(
                new_window, [[0, 0, 0], [0, 0, 0], [ref_obs[0], ref_obs[2], 1]]
            )
            t_in_episode = 0
        else:  # slid: the oldest row out, the newest in
            np.testing.assert_array_equal(new_window, final)
        assert new_window[:, -1].sum() == min(3, t_in_episode + 1)
        window = new_window
    assert "terminated" in ends and "truncated" in ends, ends


def test_next_values_are_the_values_of_the_final_observations_wherever_they_count():
    """On CartPole cut to a 12-step limit (terminations and truncations, the environments out of
    phase), with random actions: next_values equals the value function on every final
    observation, except after a termination, whose discount is 0."""
    env, params = gymnax.make("CartPole-v1")
    params = params.replace(max_steps_in_episode=12)
    n_envs, n_steps = 32, 24
    step = jax.jit(jax.vmap(env.step, (0, 0, 0, None)))
    obs, state = jax.vmap(env.reset, (0, None))(
        jax.random.split(jax.random.PRNGKey(0), n_envs), params
    )
    rows = []
    for t in range(60 + n_steps):  # the first 60 steps put the environments out of phase
        keys = jax.random.split(jax.random.PRNGKey(t + 1), n_envs + 1)
        action = jax.random.randint(keys[0], (n_envs,), 0, 2)
        next_obs, state, _, terminated, truncated, info = step(keys[1:], state, action, params)
        rows.append((obs, info["final_observation"], terminated, truncated & ~terminated))
        obs = next_obs
    obs, final_obs, terminated, truncated = (jnp.stack(x) for x in zip(*rows[60:]))

    def values_of(o):  # any function of one observation
        return jnp.sin(o @ jnp.array([1.0, -2.0, 3.0, 0.5]))

    got = envs.next_values(values_of, values_of(obs), final_obs, truncated, 12)
    np.testing.assert_allclose(
        np.where(terminated, 0, got), np.where(terminated, 0, values_of(final_obs)), rtol=1e-6
    )
    # truncations at the rollout's last step and away from it, and terminations
    assert truncated[-1].any() and truncated[:-1].any() and terminated.any()


def test_next_values_hold_as_many_truncations_as_the_time_limit_allows():
    """T = 11 steps, a 3-step limit: an environment truncated at steps 0, 3, 6 and 9 (the most there
    can be, and then the last step), one at 1, 4, 7 and 10, one never, and one every second step,
    which the limit rules out: NaN, not values it did not compute."""
    n_steps = 11
    truncated = np.zeros((n_steps, 4), bool)
    truncated[[0, 3, 6, 9], 0] = truncated[[1, 4, 7, 10], 1] = truncated[::2, 3] = True
    values = np.arange(n_steps * 4, dtype=np.float32).reshape(n_steps, 4)
    final_obs = -values - 1  # the value function is the identity
    got = envs.next_values(lambda x: x, *map(jnp.asarray, (values, final_obs, truncated)), 3)
    fresh = truncated.copy()
    fresh[-1] = True
    want = np.where(fresh, final_obs, np.concatenate([values[1:], values[-1:]]))
    np.testing.assert_array_equal(got[:, :3], want[:, :3])
    assert np.isnan(got[:, 3]).all()


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_script_trains_and_acts_on_cartpole_without_velocities(script):
    """`--env CartPoleNoVel-v1`: the script's environments show 2 entries, and its network reads
    2."""
    module = importlib.import_module(f"algos.{script}")
    trainer = module.make_trainer(module.Config(env="CartPoleNoVel-v1", n_devices=1))
    env = trainer.env
    windowed = hasattr(env, "window_shape")
    assert (env.raw_obs_shape if windowed else env.observation_space(trainer.env_params).shape) == (
        2,
    )
    obs = jnp.zeros(env.window_shape if windowed else (2,), jnp.float32)
    keys = devices.seed_keys(jax.random.PRNGKey(0), 1, 1)

    def first_action(keys):  # the state of device 0, seed 0, as trained and checkpointed
        policy = jax.tree.map(
            lambda x: x[0, 0], trainer.policy(devices.map_init(trainer.init)(keys))
        )
        return trainer.act(policy, obs, jax.random.PRNGKey(1))

    assert jax.eval_shape(first_action, keys).shape == ()  # one discrete action
    reset_obs, _ = jax.eval_shape(env.reset, jax.random.PRNGKey(0), trainer.env_params)
    assert reset_obs.shape == obs.shape
    # an epoch traces: rollout, targets, update
    state = jax.eval_shape(devices.map_init(trainer.init), keys)
    after, metrics = jax.eval_shape(devices.map_epoch(trainer.epoch, 1, donate=False), state)
    assert jax.tree.structure(after) == jax.tree.structure(state) and "episode/return" in metrics


@pytest.mark.parametrize("env_id", ["CartPoleNoVel", "cartpolenovel-v2", "CartPoleNoVel-v0"])
def test_an_unknown_id_suggests_cartpole_without_velocities(env_id):
    with pytest.raises(cli.ConfigError) as info:
        envs.make_env(env_id)
    message = str(info.value)
    assert message.startswith(f"--env {env_id!r} is not a gymnax environment or CartPoleNoVel-v1.")
    assert "Did you mean CartPoleNoVel-v1" in message and message.endswith(", CartPoleNoVel-v1")


def test_gymnax_rendering_modules_load_at_their_first_use():
    """make_env imports gymnax without seaborn and matplotlib (its renderers'); their first use
    imports them, in any order, and they work as if imported plainly."""
    code = """
import importlib.util, sys
from common import envs
envs.make_env('CartPole-v1')
loaded = [m for m in sys.modules if m.split('.')[0] in ('matplotlib', 'seaborn', 'scipy', 'PIL')]
assert all(type(sys.modules[m]).__name__ == 'Deferred' for m in loaded), loaded
assert importlib.util.find_spec('matplotlib.pyplot').name == 'matplotlib.pyplot'
from gymnax.environments.misc import pong
assert len(pong.sns.color_palette('cubehelix', 3)) == 3  # seaborn, then matplotlib under it
assert type(sys.modules['seaborn']).__name__ == 'module'
assert pong.colors.ListedColormap is sys.modules['matplotlib.colors'].ListedColormap
import matplotlib.pyplot as plt
figure, axes = plt.subplots()
axes.plot([0, 1])
figure.canvas.draw()
assert pong.plt.figure is sys.modules['matplotlib.pyplot'].figure
"""
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )
    assert out.returncode == 0, out.stderr


@pytest.mark.slow  # a whole run in a new process: CI runs it, the fast suite does not
def test_own_environment_from_the_docs_trains_and_a_misfit_is_one_line(tmp_path):
    """docs/environments.md's corridor.py, saved in the working directory, learns with `--env
    corridor:Corridor`."""
    code = corridor_source()
    (tmp_path / "corridor.py").write_text(code)
    env = script_env()

    def ppo(*flags):
        return subprocess.run(
            [
                sys.executable,
                str(ROOT / "algos" / "ppo_joint.py"),
                "--out-dir",
                str(tmp_path / f"run{len(flags)}"),
                *flags,
            ],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )

    out = ppo(
        "--env",
        "corridor:Corridor",
        "--total-steps",
        "20000",
        "--num-envs",
        "4",
        "--num-steps",
        "32",
        "--n-devices",
        "1",
    )
    assert out.returncode == 0, out.stderr
    assert "eval return 1.00" in out.stdout
    for target, message in (
        ("corridor:EnvParams", "lacks reset, step"),
        ("corridor:Nope", "has no class"),
        ("no_such_module:Env", "cannot import no_such_module"),
    ):
        out = ppo("--env", target)
        assert out.returncode != 0 and message in out.stderr and "Traceback" not in out.stderr, (
            out.stderr
        )
        assert len(out.stderr.strip().splitlines()) == 1, out.stderr


MISFITS = """

class Sized(Corridor):
    def __init__(self, size):
        super().__init__()


def failing():
    raise ValueError("no data here")


def dict_params():
    return Corridor(), {"max_steps_in_episode": 20}


class NoParams(Corridor):
    def step_env(self, key, state, action):
        return super().step_env(key, state, action, None)


class WrongShape(Corridor):
    def observation_space(self, params):
        return spaces.Box(0.0, 1.0, (3,), jnp.float32)
"""


@pytest.mark.parametrize(
    "name, source, message",
    [
        (
            "Corridor",
            "raise RuntimeError('boom')",
            "importing {module} raised RuntimeError: boom; fix the module",
        ),
        ("Corridor", "def broken(:\n", "importing {module} raised SyntaxError"),
        ("Sized", None, "Sized() raised TypeError"),
        (
            "failing",
            None,
            "failing() raised ValueError: no data here; give a class that takes no arguments",
        ),
        (
            "dict_params",
            None,
            "lacks params.max_steps_in_episode (params must be an object with that attribute",
        ),
        ("NoParams", None, "reset and step of NoParams fail when traced (TypeError"),
        (
            "WrongShape",
            None,
            "step returns observations of shape (5,), but observation_space declares (3,)",
        ),
    ],
)
def test_a_custom_environment_that_does_not_fit_is_one_line(
    tmp_path, monkeypatch, name, source, message
):
    """Whatever a user's module does wrong (fails to import, needs arguments, raises, steps without
    params, observes a shape other than its space's), `make_env` answers one line naming the fix, no
    traceback."""
    corridor = corridor_source()
    module = (
        f"misfit_{uuid.uuid4().hex[:8]}"  # a module name of its own: Python keeps imported modules
    )
    (tmp_path / f"{module}.py").write_text(corridor + MISFITS if source is None else source)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(cli.ConfigError) as info:
        envs.make_env(f"{module}:{name}")
    text = str(info.value)
    assert message.format(module=module) in text and "\n" not in text, text


@pytest.mark.parametrize("env_id", [":Corridor", "corridor:", ":"])
def test_a_custom_id_without_module_or_name_is_one_line(env_id):
    with pytest.raises(cli.ConfigError, match="give package.module:name"):
        envs.make_env(env_id)


def two_epochs(env: str, out_dir):
    """ppo_joint's Config for 2 tiny epochs on `env` into `out_dir`, evaluated only at the end."""
    from algos import ppo_joint

    return ppo_joint.Config(
        **dict(
            PPO_RUN,
            env=env,
            update_passes=1,
            total_steps=4 * 16 * 2,
            eval_every=0,
            eval_episodes=2,
            out_dir=str(out_dir),
        )
    )


def test_a_non_finite_reward_is_blamed_on_the_environment_not_the_learning_rate(
    tmp_path, monkeypatch
):
    """An environment whose reward is NaN makes the losses NaN: the run says so, not "lower
    --lr"."""
    from algos import ppo_joint
    from common import run

    corridor = corridor_source()
    module = f"nan_reward_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(
        corridor
        + """

class NanReward(Corridor):
    def step_env(self, key, state, action, params):
        obs, state, reward, done, info = super().step_env(key, state, action, params)
        return obs, state, jnp.where(state.time == 3, jnp.nan, reward), done | (state.time >= 5), info
"""
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    config = two_epochs(f"{module}:NanReward", tmp_path / "run")
    with pytest.raises(SystemExit) as info:
        run.train(config, ppo_joint.make_trainer)
    message = str(info.value.code)
    assert (
        "episode/return is nan" in message
        and f"--env {module}:NanReward returned a non-finite reward" in message
    )
    assert "a lower --lr would not help" in message and "\n" not in message


def test_a_discrete_observation_is_one_hot_in_reset_step_and_final_observation():
    """FrozenLake observes its cell's index: the scripts see it one-hot, chosen by the space, not
    the name."""
    from gymnax.environments import spaces

    env, params = envs.make_env("FrozenLake-misc")
    raw, raw_params = gymnax.make("FrozenLake-misc")
    n = raw.observation_space(raw_params).n
    assert isinstance(env.observation_space(params), spaces.Box) and env.observation_space(
        params
    ).shape == (n,)
    key = jax.random.PRNGKey(1)
    obs, state = env.reset(key, params)
    raw_obs, raw_state = raw.reset(key, raw_params)
    np.testing.assert_array_equal(obs, jax.nn.one_hot(raw_obs, n))
    for t in range(30):  # through an episode end: the final observation is encoded too
        key, step_key = jax.random.split(key)
        action = jnp.int32(t % 4)
        obs, state, reward, terminated, truncated, info = env.step(step_key, state, action, params)
        raw_obs, raw_state, raw_reward, *_, raw_info = raw.step(
            step_key, raw_state, action, raw_params
        )
        np.testing.assert_array_equal(obs, jax.nn.one_hot(raw_obs, n))
        np.testing.assert_array_equal(
            info["final_observation"], jax.nn.one_hot(raw_info["final_observation"], n)
        )
        assert obs.dtype == jnp.float32 and reward == raw_reward


DICT_OBSERVED = """

class DictObserved(Corridor):
    def observation_space(self, params):
        return spaces.Dict({"position": spaces.Box(0.0, 1.0, (self.length,), jnp.float32)})
"""


def test_an_observation_space_the_scripts_do_not_read_is_one_line(tmp_path, monkeypatch):
    corridor = corridor_source()
    module = f"dict_observed_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(corridor + DICT_OBSERVED)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(
        cli.ConfigError,
        match=f"--env {module}:DictObserved: its observation space is a Dict; the "
        f"scripts read Box observations",
    ):
        envs.make_env(f"{module}:DictObserved")


def test_a_saved_agent_of_a_discrete_observation_acts_on_the_index(tmp_path):
    """load_agent's `act` takes FrozenLake's observations as gymnax gives them (the index) and
    encodes them as training did."""
    from algos import ppo_joint
    from common import checkpoints, run

    config = two_epochs("FrozenLake-misc", tmp_path / "run")
    run.train(config, ppo_joint.make_trainer)
    act = checkpoints.load_agent(tmp_path / "run", ppo_joint.Config, ppo_joint.make_trainer)
    one, batch = act(jnp.int32(5)), act(jnp.arange(16, dtype=jnp.int32))
    assert one.shape == () and batch.shape == (16,) and batch[5] == one


def full_length_returns(env, env_params, act, params, key, n_episodes):
    """Each episode's return to its first end, stepping all of them for the whole time limit (the
    plain loop `envs.evaluate` shortens by stopping once every episode has ended), with evaluate's
    keys."""
    reset_key, run_key = jax.random.split(key)
    obs, state = jax.vmap(env.reset, (0, None))(jax.random.split(reset_key, n_episodes), env_params)
    ret, alive = np.zeros(n_episodes), np.ones(n_episodes)
    step = jax.jit(jax.vmap(env.step, (0, 0, 0, None)))
    for step_key in jax.random.split(run_key, int(env_params.max_steps_in_episode)):
        act_key, env_key = jax.random.split(step_key)
        action = jax.vmap(act, (None, 0, 0))(params, obs, jax.random.split(act_key, n_episodes))
        obs, state, reward, terminated, truncated, _ = step(
            jax.random.split(env_key, n_episodes), state, action, env_params
        )
        ret += np.asarray(reward) * alive
        alive *= 1 - np.asarray(terminated | truncated)
    return ret


# episodes that end at different steps; all at the limit
@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_evaluate_is_the_mean_return_of_each_episode_to_its_end(env_id):
    env, env_params = envs.make_env(env_id)
    env_params = env_params.replace(max_steps_in_episode=60)
    space = env.action_space(env_params)

    def act(params, obs, key):  # a fixed linear policy
        if hasattr(space, "n"):
            return (obs @ params > 0).astype(jnp.int32)
        return jnp.clip(obs @ params, space.low, space.high)[None]

    params = jnp.asarray([0.5, -1.0, 2.0, 0.3] if hasattr(space, "n") else [0.5, -1.0, 0.2])
    key = jax.random.PRNGKey(4)
    got = jax.jit(lambda p, k: envs.evaluate(env, env_params, act, p, k, 8))(params, key)
    want = full_length_returns(env, env_params, act, params, key, 8)
    np.testing.assert_allclose(got, want.mean(), rtol=1e-5)
