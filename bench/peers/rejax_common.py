"""What rejax_ppo.py and rejax_dqn.py share: their common flags, Rejax's config made from them, the
greedy evaluation, the timed training and the JSON line they print.

The Rejax drivers run in the peer venv (bench/.peer-venv, made by setup_peer.sh), where this project
is not installed, so `bench.peers` cannot be imported there. They import this file as the plain
module `rejax_common`, found because their own folder is sys.path[0]: Python puts it there when a
driver runs as a script, and phases.py, which runs them under its timers, lives in this folder too.
(Imported as bench.peers.rejax_ppo in the project's venv, they fall back to `from bench.peers import
rejax_common`.) Hence this module imports only the standard library at its top, jax where it is
used (after the driver has timed `import jax, rejax`), and nothing of the project.
"""

import argparse
import importlib.metadata as md
import json
import time


def parser(doc: str) -> argparse.ArgumentParser:
    """The driver's flags, starting with --env and --seed; finish them with `parse`."""
    p = argparse.ArgumentParser(
        description=doc.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument("--env", default="CartPole-v1")
    p.add_argument("--seed", type=int, default=0)
    return p


def parse(p: argparse.ArgumentParser, max_grad_norm: float) -> argparse.Namespace:
    """Adds --max-grad-norm (default max_grad_norm) and the evaluation flags; parses."""
    p.add_argument(
        "--max-grad-norm",
        type=float,
        default=max_grad_norm,
        help="passed to Rejax, which clips each gradient ELEMENT to this value (optax.clip)",
    )
    p.add_argument("--eval-episodes", type=int, default=32)
    p.add_argument(
        "--eval-freq",
        type=int,
        default=0,
        help="greedy evaluations in training every this many env steps, each timed (0: none)",
    )
    return p.parse_args()


def config(args: argparse.Namespace, total: int, as_given: str, **settings) -> dict:
    """Rejax's config for a run of total env steps: --env, --max-grad-norm and the flags both
    drivers have (--lr as learning_rate, --num-envs, --num-epochs, --gamma), the flags named in
    as_given (space-separated; Rejax takes them under their own names), in-training evaluation
    every --eval-freq steps (0: one evaluation period, the whole run, and none before it), and
    settings."""
    return {
        "env": args.env,
        "max_grad_norm": args.max_grad_norm,
        "learning_rate": args.lr,
        "num_envs": args.num_envs,
        "num_epochs": args.num_epochs,
        "gamma": args.gamma,
        **{name: getattr(args, name) for name in as_given.split()},
        "total_timesteps": total,
        "eval_freq": args.eval_freq or total,
        "skip_initial_evaluation": True,
        **settings,
    }


def run(t_start: float, algorithm: str, config: dict, args, params_of, scores, **extra) -> None:
    """Imports Rejax (timed), creates its algorithm with config, trains and evaluates it (`train`)
    and prints the JSON line (`report`, with extra)."""
    rejax, import_s = import_rejax()
    algo = rejax.get_algo(algorithm).create(**config)
    ts, measured = train(algo, args, params_of, scores)
    report(t_start, import_s, ts, config["total_timesteps"], measured, **extra)


def import_rejax():
    """(the rejax module, seconds that `import jax, rejax` took)."""
    t0 = time.time()
    import jax  # noqa: F401
    import rejax

    return rejax, time.time() - t0


def greedy_return(algo, params, key, n_episodes, scores):
    """Mean return of n_episodes greedy episodes, argmax of scores(algo, params, obs) (gymnax 0.0.9:
    step returns 5 values, auto-resets)."""
    import jax
    import jax.numpy as jnp

    env, env_params = algo.env, algo.env_params
    reset_key, run_key = jax.random.split(key)
    obs, state = jax.vmap(env.reset, (0, None))(jax.random.split(reset_key, n_episodes), env_params)

    def step(carry, key):
        obs, state, ret, alive = carry
        action = jnp.argmax(scores(algo, params, obs), axis=-1)
        obs, state, reward, done, _ = jax.vmap(env.step, (0, 0, 0, None))(
            jax.random.split(key, n_episodes), state, action, env_params
        )
        ret = ret + reward * alive
        return (obs, state, ret, alive * (1.0 - done.astype(jnp.float32))), None

    carry = (obs, state, jnp.zeros(n_episodes), jnp.ones(n_episodes))
    keys = jax.random.split(run_key, int(env_params.max_steps_in_episode))
    (_, _, ret, _), _ = jax.lax.scan(step, carry, keys)
    return jnp.mean(ret)


def train(algo, args, params_of, scores):
    """Trains algo (created with eval_freq args.eval_freq, or the whole run when 0) and evaluates it
    greedily after; returns (the final train state, the timings and returns to print).

    In-training evaluation is a no-op unless --eval-freq is given, so the compiled program is the
    training loop alone; with it, each evaluation records ([time.time(), env step, greedy return])
    as it ends. params_of(train state) gives the parameters that scores reads."""
    import jax

    evaluations = []

    def evaluate(algo, ts, rng):
        ret = greedy_return(algo, params_of(ts), rng, args.eval_episodes, scores)
        jax.debug.callback(
            lambda step, r: evaluations.append((time.time(), int(step), float(r))),
            ts.global_step,
            ret,
        )
        return ret

    algo = algo.replace(eval_callback=evaluate if args.eval_freq else lambda algo, ts, rng: ())
    key = jax.random.PRNGKey(args.seed)

    t0 = time.time()
    lowered = jax.jit(algo.train).lower(key)
    trace_s = time.time() - t0
    compiled = lowered.compile()
    compile_s = time.time() - t0

    t0 = time.time()
    ts, _ = compiled(key)
    jax.block_until_ready(ts)
    run_s = time.time() - t0

    t0 = time.time()
    eval_return = float(
        jax.jit(greedy_return, static_argnums=(0, 3, 4))(
            algo, params_of(ts), jax.random.PRNGKey(args.seed + 10_000), args.eval_episodes, scores
        )
    )
    eval_s = time.time() - t0
    timings = {"trace_s": trace_s, "compile_s": compile_s, "run_s": run_s, "eval_s": eval_s}
    return ts, {**timings, "eval_return": eval_return, "evaluations": sorted(evaluations)}


def report(t_start: float, import_s: float, ts, total: int, measured: dict, **extra) -> None:
    """Prints the one JSON line the drivers read: import_s, measured (from `train`), wall_s (from
    t_start, the interpreter's start), env_steps, sps (total steps / run_s), extra, t_start and
    the peer's versions."""
    line = {
        "import_s": import_s,
        **measured,
        "wall_s": time.time() - t_start,
        "env_steps": int(ts.global_step),
        "sps": total / measured["run_s"],
        **extra,
        "t_start": t_start,
        "versions": {k: md.version(k) for k in ("rejax", "jax", "gymnax", "flax", "optax")},
    }
    print(json.dumps(line), flush=True)
