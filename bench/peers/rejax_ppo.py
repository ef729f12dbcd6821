"""Train Rejax's PPO on a gymnax environment and print one JSON line of timings.

Runs INSIDE the peer venv (bench/peers/setup_peer.sh), never in the project venv:

    bench/.peer-venv/bin/python bench/peers/rejax_ppo.py --seed 0

In-training evaluation is off by default (a no-op eval callback, one "evaluation
period" covering the whole run), so the compiled program is the training loop
alone; --eval-freq N evaluates greedily every N steps and records when each
evaluation ended (solve.py). Printed keys: import_s, trace_s, compile_s
(lower + compile of the jitted train function), run_s, eval_s (the final greedy evaluation,
its compile included), wall_s (from interpreter start, imports
included), sps (total steps / run_s), eval_return (mean greedy return,
argmax of the logits, over --eval-episodes episodes), evaluations ([time.time(), env step, greedy
return] of each in-training evaluation), t_start (time.time() at interpreter start), versions.
What this and rejax_dqn.py share is rejax_common.py.
"""

import time

T_START = time.time()  # close to interpreter start; the driver also times the whole process

try:  # run as a script, in the peer venv: this folder is sys.path[0] (see rejax_common)
    import rejax_common
except ModuleNotFoundError:  # imported as bench.peers.rejax_ppo in the project's venv
    from bench.peers import rejax_common


def logits(algo, params, obs):
    return algo.actor.apply(params, obs, method=lambda m, x: m._action_dist(x).logits)


def parse_args():
    p = rejax_common.parser(__doc__)
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
    return rejax_common.parse(p, max_grad_norm=0.5)


if __name__ == "__main__":
    args = parse_args()
    steps_per_iter = args.num_envs * args.num_steps
    total = args.total_timesteps // steps_per_iter * steps_per_iter
    config = rejax_common.config(
        args,
        total,
        as_given="num_steps num_minibatches gae_lambda clip_eps ent_coef vf_coef",
        agent_kwargs={"activation": args.activation, "hidden_layer_sizes": tuple(args.hidden)},
    )
    rejax_common.run(T_START, "ppo", config, args, lambda ts: ts.actor_ts.params, logits)
