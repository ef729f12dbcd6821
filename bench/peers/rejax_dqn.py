"""Train Rejax's DQN on a gymnax environment and print one JSON line of timings.

Runs INSIDE the peer venv (bench/setup_peer.sh), never in the project venv:

    bench/.peer-venv/bin/python bench/rejax_dqn.py --seed 0

Defaults are Rejax's tuned CartPole-v1 DQN (configs/gymnax/cartpole.yaml in its
repository): 10 envs, buffer 50k, 5k steps of random actions before learning,
batch 100, 5 gradient steps per 10 env steps, lr 1e-3, double DQN, Polyak
target 0.98 after every iteration, epsilon 1 -> 0.05 over half the run,
dueling 64x64 swish network (Rejax fixes the widths at 64x64). In-training
evaluation is off by default (a no-op eval callback, one "evaluation period"
covering the whole run), so the compiled program is the training loop alone;
--eval-freq N evaluates greedily every N steps and records when each ended
(bench/solve.py).
Printed keys: import_s, trace_s, compile_s (lower + compile of the jitted train
function), run_s, wall_s (from interpreter start, imports included), sps
(total steps / run_s), updates (gradient steps done), eval_return (mean greedy
return, argmax of Q, over --eval-episodes episodes), evaluations ([time.time(), env step, greedy
return] of each in-training evaluation), t_start (time.time() at interpreter start), versions.
"""

import time

T_START = time.time()  # close to interpreter start; the driver also times the whole process

import argparse  # noqa: E402
import importlib.metadata as md  # noqa: E402
import json  # noqa: E402


def parse_args():
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument("--env", default="CartPole-v1")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--num-envs", type=int, default=10)
    p.add_argument("--buffer-size", type=int, default=50_000)
    p.add_argument(
        "--fill-buffer", type=int, default=5_000, help="random-action steps before the first update"
    )
    p.add_argument("--batch-size", type=int, default=100)
    p.add_argument(
        "--num-epochs",
        type=int,
        default=5,
        help="gradient steps per iteration (num-envs env steps)",
    )
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--total-timesteps", type=int, default=100_000)
    p.add_argument("--agent", default="DuelingQNetwork", choices=["QNetwork", "DuelingQNetwork"])
    p.add_argument("--activation", default="swish")
    p.add_argument("--gamma", type=float, default=0.99)
    p.add_argument("--polyak", type=float, default=0.98)
    p.add_argument("--eps-end", type=float, default=0.05)
    p.add_argument("--exploration-fraction", type=float, default=0.5)
    p.add_argument(
        "--max-grad-norm",
        type=float,
        default=10.0,
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


def greedy_return(algo, params, key, n_episodes):
    """Mean return of n_episodes greedy episodes (gymnax 0.0.9: step returns 5 values,
    auto-resets)."""
    env, env_params = algo.env, algo.env_params
    reset_key, run_key = jax.random.split(key)
    obs, state = jax.vmap(env.reset, (0, None))(jax.random.split(reset_key, n_episodes), env_params)

    def step(carry, key):
        obs, state, ret, alive = carry
        action = jnp.argmax(algo.agent.apply(params, obs), axis=-1)
        obs, state, reward, done, _ = jax.vmap(env.step, (0, 0, 0, None))(
            jax.random.split(key, n_episodes), state, action, env_params
        )
        ret = ret + reward * alive
        return (obs, state, ret, alive * (1.0 - done.astype(jnp.float32))), None

    carry = (obs, state, jnp.zeros(n_episodes), jnp.ones(n_episodes))
    keys = jax.random.split(run_key, int(env_params.max_steps_in_episode))
    (_, _, ret, _), _ = jax.lax.scan(step, carry, keys)
    return jnp.mean(ret)


if __name__ == "__main__":
    args = parse_args()
    t0 = time.time()
    import jax
    import jax.numpy as jnp
    import rejax

    import_s = time.time() - t0

    total = args.total_timesteps // args.num_envs * args.num_envs
    algo = rejax.get_algo("dqn").create(
        env=args.env,
        agent=args.agent,
        agent_kwargs={"activation": args.activation},
        num_envs=args.num_envs,
        buffer_size=args.buffer_size,
        fill_buffer=args.fill_buffer,
        batch_size=args.batch_size,
        num_epochs=args.num_epochs,
        learning_rate=args.lr,
        max_grad_norm=args.max_grad_norm,
        total_timesteps=total,
        eval_freq=args.eval_freq or total,
        skip_initial_evaluation=True,
        gamma=args.gamma,
        polyak=args.polyak,
        eps_start=1.0,
        eps_end=args.eps_end,
        exploration_fraction=args.exploration_fraction,
        ddqn=True,
    )
    # (time.time(), env step, greedy return) of each in-training evaluation, as it ends
    evaluations = []

    def evaluate(algo, ts, rng):
        ret = greedy_return(algo, ts.q_ts.params, rng, args.eval_episodes)
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
    train = lowered.compile()
    compile_s = time.time() - t0

    t0 = time.time()
    ts, _ = train(key)
    jax.block_until_ready(ts)
    run_s = time.time() - t0

    # an iteration updates iff its starting global step exceeds fill_buffer (Rejax's
    # DQN.train_iteration)
    updates = args.num_epochs * sum(
        1 for i in range(total // args.num_envs) if i * args.num_envs > args.fill_buffer
    )
    eval_return = float(
        jax.jit(greedy_return, static_argnums=(0, 3))(
            algo, ts.q_ts.params, jax.random.PRNGKey(args.seed + 10_000), args.eval_episodes
        )
    )
    print(
        json.dumps(
            {
                "import_s": import_s,
                "trace_s": trace_s,
                "compile_s": compile_s,
                "run_s": run_s,
                "wall_s": time.time() - T_START,
                "env_steps": int(ts.global_step),
                "sps": total / run_s,
                "updates": updates,
                "eval_return": eval_return,
                "evaluations": sorted(evaluations),
                "t_start": T_START,
                "versions": {k: md.version(k) for k in ("rejax", "jax", "gymnax", "flax", "optax")},
            }
        ),
        flush=True,
    )
