"""Train Rejax's DQN on a gymnax environment and print one JSON line of timings.

Runs INSIDE the peer venv (bench/peers/setup_peer.sh), never in the project venv:

    bench/.peer-venv/bin/python bench/peers/rejax_dqn.py --seed 0

Defaults are Rejax's tuned CartPole-v1 DQN (configs/gymnax/cartpole.yaml in its
repository): 10 envs, buffer 50k, 5k steps of random actions before learning,
batch 100, 5 gradient steps per 10 env steps, lr 1e-3, double DQN, Polyak
target 0.98 after every iteration, epsilon 1 -> 0.05 over half the run,
dueling 64x64 swish network (Rejax fixes the widths at 64x64). In-training
evaluation is off by default (a no-op eval callback, one "evaluation period"
covering the whole run), so the compiled program is the training loop alone;
--eval-freq N evaluates greedily every N steps and records when each ended
(solve.py).
Printed keys: import_s, trace_s, compile_s (lower + compile of the jitted train
function), run_s, eval_s (the final greedy evaluation, its compile included), wall_s (from
interpreter start, imports included), sps (total steps / run_s), updates (gradient steps done),
eval_return (mean greedy return, argmax of Q, over --eval-episodes episodes), evaluations
([time.time(), env step, greedy return] of each in-training evaluation), t_start (time.time() at
interpreter start), versions. What this and rejax_ppo.py share is rejax_common.py.
"""

import time

T_START = time.time()  # close to interpreter start; the driver also times the whole process

try:  # run as a script, in the peer venv: this folder is sys.path[0] (see rejax_common)
    import rejax_common
except ModuleNotFoundError:  # imported as bench.peers.rejax_dqn in the project's venv
    from bench.peers import rejax_common


def q_values(algo, params, obs):
    return algo.agent.apply(params, obs)


def parse_args():
    p = rejax_common.parser(__doc__)
    p.add_argument("--num-envs", type=int, default=10)
    p.add_argument("--buffer-size", type=int, default=50_000)
    p.add_argument(
        "--fill-buffer", type=int, default=5_000, help="random-action steps before the first update"
    )
    p.add_argument("--batch-size", type=int, default=100)
    p.add_argument(
        "--num-epochs", type=int, default=5, help="gradient steps after each step of the envs"
    )
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--total-timesteps", type=int, default=100_000)
    p.add_argument("--agent", default="DuelingQNetwork", choices=["QNetwork", "DuelingQNetwork"])
    p.add_argument("--activation", default="swish")
    p.add_argument("--gamma", type=float, default=0.99)
    p.add_argument("--polyak", type=float, default=0.98)
    p.add_argument("--eps-end", type=float, default=0.05, help="epsilon at the end of its decay")
    p.add_argument("--exploration-fraction", type=float, default=0.5)
    return rejax_common.parse(p, max_grad_norm=10.0)


if __name__ == "__main__":
    args = parse_args()
    total = args.total_timesteps // args.num_envs * args.num_envs
    config = rejax_common.config(
        args,
        total,
        as_given="agent buffer_size fill_buffer batch_size polyak eps_end exploration_fraction",
        agent_kwargs={"activation": args.activation},
        eps_start=1.0,
        ddqn=True,
    )
    # an iteration updates iff its starting global step exceeds fill_buffer (Rejax's
    # DQN.train_iteration)
    updates = args.num_epochs * sum(
        1 for i in range(total // args.num_envs) if i * args.num_envs > args.fill_buffer
    )
    rejax_common.run(
        T_START, "dqn", config, args, lambda ts: ts.q_ts.params, q_values, updates=updates
    )
