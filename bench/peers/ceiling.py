"""Throughput ceilings: a bare jitted gymnax rollout with a 64x64 tanh MLP policy, no update; or
the same rollout plus a PPO update's forward and backward passes at its batch shapes.

    .venv/bin/python bench/peers/ceiling.py --num-envs 5
    .venv/bin/python bench/peers/ceiling.py --num-envs 1024 --rollout 128 --update-epochs 4 \
        --num-minibatches 4
    .venv/bin/python bench/peers/ceiling.py --env SpaceInvaders-MinAtar --torso conv --num-envs 32 \
        --update-epochs 4   # ppo_joint's epoch on MinAtar, 4 seeds of 8 envs, as one network

The torso is the scripts' own (common/nets.py: `--torso mlp` on the flattened
observation, or `--torso conv`, the 3x3 convolution first), with one dense
layer for the logits and a value on top.

N environments stepped with vmap, the policy sampling an action from its
logits each step, lax.scan over --num-steps steps in one compiled call. With
--update-epochs E: every --rollout steps, the rollout's observations are
shuffled and cut into --num-minibatches minibatches, and each of E passes
computes, on each minibatch, the gradient of a loss of the policy logits and
a value head on the same torso, and takes a plain SGD step: the passes of
ppo_joint's update with nothing else (no advantages, no clipping, no
optimiser state, no metrics). Prints one JSON line: compile_s and the median
steady env steps/s over --reps calls. ppo.py and scale.py run it.
"""

import argparse
import json
import statistics
import time

import gymnax
import jax
import jax.numpy as jnp

from common import nets


def parse_args():
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument("--env", default="CartPole-v1")
    p.add_argument("--num-envs", type=int, default=5)
    p.add_argument(
        "--num-steps", type=int, default=20_000, help="steps per environment per timed call"
    )
    p.add_argument("--hidden", type=int, nargs="+", default=[64, 64])
    p.add_argument("--torso", choices=["mlp", "conv"], default="mlp")
    p.add_argument(
        "--reps", type=int, default=5, help="timed calls after compilation (median reported)"
    )
    p.add_argument("--rollout", type=int, default=128, help="steps per environment between updates")
    p.add_argument(
        "--update-epochs", type=int, default=0, help="passes over each rollout (0: no update)"
    )
    p.add_argument("--num-minibatches", type=int, default=4)
    return p.parse_args()


def init_network(key, obs_shape: tuple, hidden: list, torso: str, n_out: int) -> dict:
    """The scripts' torso (common/nets.py, tanh) with one dense layer of `n_out` outputs on top."""
    keys = jax.random.split(key, len(hidden) + 1)
    return {
        "torso": nets.torso_init(keys[:-1], obs_shape, tuple(hidden), torso == "conv"),
        "head": nets.dense_init(keys[-1], hidden[-1], n_out, 0.01),
    }


def network(params: dict, obs: jax.Array) -> jax.Array:  # [N, *obs_shape] -> [N, n_out]
    x = jax.vmap(nets.torso, (None, 0, None))(params["torso"], obs, "tanh")
    return x @ params["head"]["w"] + params["head"]["b"]


def main():
    args = parse_args()
    env, env_params = gymnax.make(args.env)
    obs_shape = tuple(env.observation_space(env_params).shape)
    n_actions = env.action_space(env_params).n
    # the logits and a value
    params = init_network(jax.random.PRNGKey(0), obs_shape, args.hidden, args.torso, n_actions + 1)

    def loss(params, obs, action):
        out = network(params, obs)
        log_pi = jnp.take_along_axis(jax.nn.log_softmax(out[:, :-1]), action[:, None], 1)
        return -jnp.mean(log_pi) + jnp.mean(out[:, -1] ** 2)

    def update(params, key, obs, action):  # [T, N, ...] -> E passes of minibatch gradient steps
        obs, action = obs.reshape(-1, *obs_shape), action.reshape(-1)
        m = args.num_minibatches

        def minibatch(params, batch):
            grads = jax.grad(loss)(params, *batch)
            return jax.tree.map(lambda p, g: p - 1e-3 * g, params, grads), None

        def epoch(params, key):
            order = jax.random.permutation(key, obs.shape[0])
            batches = (obs[order].reshape(m, -1, *obs_shape), action[order].reshape(m, -1))
            return jax.lax.scan(minibatch, params, batches)[0], None

        return jax.lax.scan(epoch, params, jax.random.split(key, args.update_epochs))[0]

    step_envs = jax.vmap(env.step, (0, 0, 0, None))

    @jax.jit
    def rollout(key):
        obs, state = jax.vmap(env.reset, (0, None))(
            jax.random.split(key, args.num_envs), env_params
        )

        def step(carry, key):
            obs, state, total, params = carry
            act_key, step_key = jax.random.split(key)
            action = jax.random.categorical(act_key, network(params, obs)[:, :-1])
            next_obs, state, reward, _, _, _ = step_envs(
                jax.random.split(step_key, args.num_envs), state, action, env_params
            )
            return (next_obs, state, total + reward.sum(), params), (obs, action)

        def iteration(carry, key):  # --rollout steps, then the update's passes
            carry, (obs, action) = jax.lax.scan(step, carry, jax.random.split(key, args.rollout))
            if args.update_epochs:
                carry = (*carry[:3], update(carry[3], key, obs, action))
            return carry, None

        carry = (obs, state, 0.0, params)
        carry, _ = jax.lax.scan(
            iteration, carry, jax.random.split(key, args.num_steps // args.rollout)
        )
        return carry[2]

    t0 = time.time()
    compiled = rollout.lower(jax.random.PRNGKey(0)).compile()
    compile_s = time.time() - t0
    times = []
    for rep in range(args.reps):
        t0 = time.time()
        jax.block_until_ready(compiled(jax.random.PRNGKey(rep)))
        times.append(time.time() - t0)
    steps = args.num_envs * (args.num_steps // args.rollout * args.rollout)
    print(
        json.dumps(
            {
                "num_envs": args.num_envs,
                "torso": args.torso,
                "update_epochs": args.update_epochs,
                "steps_per_call": steps,
                "compile_s": compile_s,
                "sps": steps / statistics.median(times),
                "sps_all": [steps / t for t in times],
            }
        )
    )


if __name__ == "__main__":
    main()
