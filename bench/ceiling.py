"""Throughput ceiling: a bare jitted gymnax rollout with a 64x64 tanh MLP policy, no update.

    .venv/bin/python bench/ceiling.py --num-envs 5

N environments stepped with vmap, the policy sampling an action from its
logits each step, lax.scan over --num-steps steps in one compiled call. Prints
one JSON line: compile_s and the median steady env steps/s over --reps calls.
"""
import argparse
import json
import statistics
import time

import gymnax
import jax
import jax.numpy as jnp


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--env", default="CartPole-v1")
    p.add_argument("--num-envs", type=int, default=5)
    p.add_argument("--num-steps", type=int, default=20_000, help="steps per environment per timed call")
    p.add_argument("--hidden", type=int, nargs="+", default=[64, 64])
    p.add_argument("--reps", type=int, default=5, help="timed calls after compilation (median reported)")
    return p.parse_args()


def main():
    args = parse_args()
    env, env_params = gymnax.make(args.env)
    obs_dim = env.observation_space(env_params).shape[0]
    n_actions = env.action_space(env_params).n
    sizes = [obs_dim, *args.hidden, n_actions]
    keys = jax.random.split(jax.random.PRNGKey(0), len(sizes))
    params = [(jax.random.normal(k, (a, b)) / jnp.sqrt(a), jnp.zeros(b))
              for k, a, b in zip(keys, sizes[:-1], sizes[1:])]

    def logits(obs):  # [N, obs_dim] -> [N, n_actions]
        x = obs
        for w, b in params[:-1]:
            x = jnp.tanh(x @ w + b)
        w, b = params[-1]
        return x @ w + b

    step_envs = jax.vmap(env.step, (0, 0, 0, None))

    @jax.jit
    def rollout(key):
        obs, state = jax.vmap(env.reset, (0, None))(jax.random.split(key, args.num_envs), env_params)

        def step(carry, key):
            obs, state, total = carry
            act_key, step_key = jax.random.split(key)
            action = jax.random.categorical(act_key, logits(obs))
            obs, state, reward, _, _, _ = step_envs(jax.random.split(step_key, args.num_envs), state,
                                                    action, env_params)
            return (obs, state, total + reward.sum()), None

        (_, _, total), _ = jax.lax.scan(step, (obs, state, 0.0), jax.random.split(key, args.num_steps))
        return total

    t0 = time.time()
    compiled = rollout.lower(jax.random.PRNGKey(0)).compile()
    compile_s = time.time() - t0
    times = []
    for rep in range(args.reps):
        t0 = time.time()
        jax.block_until_ready(compiled(jax.random.PRNGKey(rep)))
        times.append(time.time() - t0)
    steps = args.num_envs * args.num_steps
    print(json.dumps({"num_envs": args.num_envs, "steps_per_call": steps, "compile_s": compile_s,
                      "sps": steps / statistics.median(times), "sps_all": [steps / t for t in times]}))


if __name__ == "__main__":
    main()
