"""Train Rejax's PPO on a gymnax environment and print one JSON line of timings.

Runs INSIDE the peer venv (bench/setup_peer.sh), never in the project venv:

    bench/.peer-venv/bin/python bench/rejax_ppo.py --seed 0

In-training evaluation is off by default (a no-op eval callback, one "evaluation
period" covering the whole run), so the compiled program is the training loop
alone; --eval-freq N evaluates greedily every N steps and records when each
evaluation ended (bench/solve.py). Printed keys: import_s, trace_s, compile_s
(lower + compile of the jitted train function), run_s, eval_s (the final greedy evaluation,
its compile included), wall_s (from interpreter start, imports
included), sps (total steps / run_s), eval_return (mean greedy return,
argmax of the logits, over --eval-episodes episodes), evaluations ([time.time(), env step, greedy
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
    p.add_argument("--num-envs", type=int, default=5)
    p.add_argument("--num-steps", type=int, default=100)
    p.add_argument("--num-epochs", type=int, default=5, help="update epochs per rollout")
    p.add_argument("--num-minibatches", type=int, default=5)
    p.add_argument("--lr", type=float, default=7.5e-4)
    p.add_argument("--total-timesteps", type=int, default=100_000)
    p.add_argument("--hidden", type=int, nargs="+", default=[64, 64])
    p.add_argument("--activation", default="tanh")
    p.add_argument("--gamma", type=float, default=0.99)
    p.add_argument("--gae-lambda", type=float, default=0.95)
    p.add_argument("--clip-eps", type=float, default=0.2)
    p.add_argument("--ent-coef", type=float, default=0.01)
    p.add_argument("--vf-coef", type=float, default=0.5)
    p.add_argument(
        "--max-grad-norm",
        type=float,
        default=0.5,
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
    logits = lambda obs: algo.actor.apply(params, obs, method=lambda m, x: m._action_dist(x).logits)  # noqa: E731
    reset_key, run_key = jax.random.split(key)
    obs, state = jax.vmap(env.reset, (0, None))(jax.random.split(reset_key, n_episodes), env_params)

    def step(carry, key):
        obs, state, ret, alive = carry
        action = jnp.argmax(logits(obs), axis=-1)
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

    steps_per_iter = args.num_envs * args.num_steps
    total = args.total_timesteps // steps_per_iter * steps_per_iter
    algo = rejax.get_algo("ppo").create(
        env=args.env,
        agent_kwargs={"activation": args.activation, "hidden_layer_sizes": tuple(args.hidden)},
        num_envs=args.num_envs,
        num_steps=args.num_steps,
        num_epochs=args.num_epochs,
        num_minibatches=args.num_minibatches,
        learning_rate=args.lr,
        max_grad_norm=args.max_grad_norm,
        total_timesteps=total,
        eval_freq=args.eval_freq or total,
        skip_initial_evaluation=True,
        gamma=args.gamma,
        gae_lambda=args.gae_lambda,
        clip_eps=args.clip_eps,
        ent_coef=args.ent_coef,
        vf_coef=args.vf_coef,
    )
    # (time.time(), env step, greedy return) of each in-training evaluation, as it ends
    evaluations = []

    def evaluate(algo, ts, rng):
        ret = greedy_return(algo, ts.actor_ts.params, rng, args.eval_episodes)
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

    t0 = time.time()
    eval_return = float(
        jax.jit(greedy_return, static_argnums=(0, 3))(
            algo, ts.actor_ts.params, jax.random.PRNGKey(args.seed + 10_000), args.eval_episodes
        )
    )
    eval_s = time.time() - t0
    print(
        json.dumps(
            {
                "import_s": import_s,
                "trace_s": trace_s,
                "compile_s": compile_s,
                "run_s": run_s,
                "eval_s": eval_s,
                "wall_s": time.time() - T_START,
                "env_steps": int(ts.global_step),
                "sps": total / run_s,
                "eval_return": eval_return,
                "evaluations": sorted(evaluations),
                "t_start": T_START,
                "versions": {k: md.version(k) for k in ("rejax", "jax", "gymnax", "flax", "optax")},
            }
        ),
        flush=True,
    )
