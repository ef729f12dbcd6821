"""The ceiling of dqn_value's speed set by its gradient steps alone: env steps per second if an epoch
were nothing but its updates.

    .venv/bin/python bench/peers/dqn_ceiling.py --env SpaceInvaders-MinAtar --torso conv
    .venv/bin/python bench/peers/dqn_ceiling.py --env SpaceInvaders-MinAtar --torso mlp

dqn_value's defaults take --update-steps 50 gradient steps of --batch-size 100
transitions per epoch of 10 envs x 10 steps (100 env steps per seed). Each
step here is what the script's step computes on the network, with nothing
else: Q of the batch's observations (online network, forward and backward)
and of its n-step successors (target network, forward), a squared TD error,
a plain SGD step. --num-seeds networks train at once (vmap), as the script
runs its seeds. Random observations of the environment's shape, drawn once,
stand in for the replay. Prints one JSON line: the median seconds of one epoch's updates
over --reps calls, and the env steps per second (all seeds) they allow.
"""

import argparse
import json
import statistics
import time

import jax
import jax.numpy as jnp

from bench.peers.ceiling import init_network, network
from common import envs


def parse_args():
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument("--env", default="SpaceInvaders-MinAtar")
    p.add_argument("--torso", choices=["mlp", "conv"], default="conv")
    p.add_argument("--hidden", type=int, nargs="+", default=[128, 128])
    p.add_argument("--num-seeds", type=int, default=4)
    p.add_argument("--update-steps", type=int, default=50, help="gradient steps per epoch")
    p.add_argument("--batch-size", type=int, default=100)
    p.add_argument("--env-steps", type=int, default=100, help="env steps per seed per epoch")
    p.add_argument("--replay", type=int, default=10_000, help="observations to draw batches from")
    p.add_argument("--epochs", type=int, default=20, help="epochs of updates per timed call")
    p.add_argument("--reps", type=int, default=5, help="timed calls after compilation (median)")
    return p.parse_args()


def main():
    args = parse_args()
    env, env_params = envs.make_env(args.env)
    obs_shape = tuple(env.observation_space(env_params).shape)
    n_actions = env.action_space(env_params).n

    def loss(params, target, obs, next_obs, action):
        q = jnp.take_along_axis(network(params, obs), action[:, None], 1)[:, 0]
        y = jax.lax.stop_gradient(network(target, next_obs).max(1))
        return jnp.mean((q - y) ** 2)

    # the replay: random observations, drawn once
    replay = jax.random.uniform(jax.random.PRNGKey(1), (args.replay, *obs_shape)) > 0.9

    def updates(params, key):  # one seed: --epochs x --update-steps gradient steps
        target = params

        def step(params, key):
            index_key, next_key, action_key = jax.random.split(key, 3)
            rows = jax.random.randint(index_key, (args.batch_size,), 0, args.replay)
            next_rows = jax.random.randint(next_key, (args.batch_size,), 0, args.replay)
            action = jax.random.randint(action_key, (args.batch_size,), 0, n_actions)
            grads = jax.grad(loss)(params, target, replay[rows], replay[next_rows], action)
            return jax.tree.map(lambda p, g: p - 1e-4 * g, params, grads), None

        steps = jax.random.split(key, args.epochs * args.update_steps)
        return jax.lax.scan(step, params, steps)[0]

    keys = jax.random.split(jax.random.PRNGKey(0), args.num_seeds)
    params = jax.vmap(lambda key: init_network(key, obs_shape, args.hidden, args.torso, n_actions))(
        keys
    )
    run = jax.jit(jax.vmap(updates))
    t0 = time.time()
    compiled = run.lower(params, keys).compile()
    compile_s = time.time() - t0
    times = []
    for rep in range(args.reps):
        t0 = time.time()
        jax.block_until_ready(
            compiled(params, jax.random.split(jax.random.PRNGKey(rep + 1), args.num_seeds))
        )
        times.append(time.time() - t0)
    epoch_s = statistics.median(times) / args.epochs
    print(
        json.dumps(
            {
                "env": args.env,
                "torso": args.torso,
                "num_seeds": args.num_seeds,
                "compile_s": compile_s,
                "epoch_updates_s": epoch_s,
                "sps_ceiling": args.num_seeds * args.env_steps / epoch_s,
            }
        )
    )


if __name__ == "__main__":
    main()
