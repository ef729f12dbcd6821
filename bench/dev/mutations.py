"""Mutation check: does the fast suite catch the one-line bugs that matter?

Each mutation replaces one snippet of one file in a copy of the working tree
(tracked and untracked files, as they are now), then runs the fast tests that
should catch it (`-m "not slow" -x`). A mutation is caught when those tests
fail. The table goes to stdout and, when every mutation ran, to bench/dev/MUTATIONS.md.

    python bench/dev/mutations.py                 # every mutation (about 20 minutes on 2 cores)
    python bench/dev/mutations.py --only awr-,dqn-   # names starting with awr- or dqn-
    python bench/dev/mutations.py --list
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

from bench.results import ROOT, commit, machine, write_section

MUTATIONS_MD = ROOT / "bench" / "dev" / "MUTATIONS.md"
# the fast tests, stopping at the first failure
PYTEST = ["-m", "pytest", "-q", "-x", "-m", "not slow", "-p", "no:cacheprovider"]


class Mutation(NamedTuple):
    name: str
    path: str
    old: str  # must occur exactly once in path
    new: str
    tests: tuple[str, ...]  # test files (or node ids) that should fail


MUTATIONS = [
    # Kinds that survived the suite once (issue "Tests that catch the bugs that matter").
    Mutation(
        "ppo-gae-done-as-terminated",
        "algos/ppo_joint.py",
        "rewards, traj.value, next_values, traj.terminated, traj.done, config.gamma, lam",
        "rewards, traj.value, next_values, traj.done, traj.done, config.gamma, lam",
        ("tests/test_wiring.py", "tests/test_ppo_joint.py"),
    ),
    Mutation(
        "ac-truncation-from-reset-obs",
        "algos/actor_critic.py",
        'final_obs=info["final_observation"]',
        "final_obs=obs",
        ("tests/test_wiring.py", "tests/test_actor_critic.py"),
    ),
    Mutation(
        "awr-ignores-q-aggregate",
        "algos/awr.py",
        "next_log_mu,\n                config.q_aggregate,",
        'next_log_mu,\n                "mean",',
        ("tests/test_wiring.py", "tests/test_awr.py"),
    ),
    Mutation(
        "awr-reweight-without-stop-gradient",
        "algos/awr.py",
        "jnp.exp(jax.lax.stop_gradient(log_pi) - log_mu)",
        "jnp.exp(log_pi - log_mu)",
        ("tests/test_awr.py",),
    ),
    Mutation(
        "awr-enumerated-weighted-1/K",
        "algos/awr.py",
        "mask=jnp.exp(log_mu) if enumerate_all else jnp.ones_like(log_mu)",
        "mask=jnp.ones_like(log_mu)",
        ("tests/test_wiring.py", "tests/test_awr.py"),
    ),
    Mutation(
        "ppo-updates-see-raw-obs",
        "algos/ppo_joint.py",
        "obs = envs.normalize_obs(state.obs_stats, traj.obs)  # what the networks saw",
        "obs = traj.obs",
        ("tests/test_wiring.py", "tests/test_normalize_obs.py", "tests/test_ppo_joint.py"),
    ),
    Mutation(
        "skip-without-gradient-pmean",
        "algos/skip_transformer.py",
        "grads = jax.lax.pmean(grads, devices.DEVICE_AXIS)",
        "grads = grads",
        ("tests/test_devices.py", "tests/test_skip_transformer.py"),
    ),
    Mutation(
        "dqn-bootstrap-from-online-net",
        "algos/dqn_value.py",
        "q_next = q_values(target_params, batch.boot_obs)",
        "q_next = q_values(params, batch.boot_obs)",
        ("tests/test_dqn_value.py",),
    ),
    # Our own.
    Mutation(
        "awr-head-key-folded",
        "algos/awr.py",
        '"head": dist.head_init(head_key, config.hidden[-1])',
        '"head": dist.head_init(jax.random.fold_in(policy_key, 1), config.hidden[-1])',
        ("tests/test_init_keys.py",),
    ),
    Mutation(
        "awr-q-scale-over-empty-rows",
        "algos/awr.py",
        "q_scale(next_q, valid, config.q_normalization)",
        "q_scale(next_q, jnp.ones_like(valid), config.q_normalization)",
        ("tests/test_wiring.py", "tests/test_awr.py"),
    ),
    Mutation(
        "awr-reweight-divided-by-K",
        "algos/awr.py",
        "/ jnp.sum(mask, axis=1)",
        "/ mask.shape[1]",
        ("tests/test_awr.py",),
    ),
    Mutation(
        "awr-k-samples-of-2-actions",
        "algos/awr.py",
        "enumerate_all = config.q_value and dist.discrete and K >= dist.n",
        "enumerate_all = config.q_value and dist.discrete and K == dist.n",
        ("tests/test_awr.py",),
    ),
    Mutation(
        "ppo-clip-asymmetric",
        "algos/ppo_joint.py",
        "jnp.clip(ratio, 1 - clip_eps, 1 + clip_eps)",
        "jnp.clip(ratio, 1 - clip_eps, 1 + 2 * clip_eps)",
        ("tests/test_losses.py", "tests/test_ppo_joint.py"),
    ),
    Mutation(
        "ac-ppo-surrogate-max-for-min",
        "algos/actor_critic.py",
        "jnp.minimum(ratio * advantage, clipped * advantage)",
        "jnp.maximum(ratio * advantage, clipped * advantage)",
        ("tests/test_losses.py", "tests/test_actor_critic.py"),
    ),
    Mutation(
        "skip-ppo-clip-asymmetric",
        "algos/skip_transformer.py",
        "jnp.clip(ratio, 1 - config.clip_eps, 1 + config.clip_eps)",
        "jnp.clip(ratio, 1 - config.clip_eps, 1 + 2 * config.clip_eps)",
        ("tests/test_losses.py",),
    ),
    Mutation(
        "ppo-gae-trace-crosses-episodes",
        "algos/ppo_joint.py",
        "trace = gamma * lam * (1.0 - dones.astype(jnp.float32))",
        "trace = gamma * lam * jnp.ones_like(values)",
        ("tests/test_estimators.py", "tests/test_ppo_joint.py"),
    ),
    Mutation(
        "dqn-target-never-synced",
        "algos/dqn_value.py",
        "jnp.where(step % config.sync_freq == 0, p, t)",
        "jnp.where(False, p, t)",
        ("tests/test_dqn_value.py",),
    ),
    Mutation(
        "reinforce-return-crosses-episodes",
        "algos/reinforce.py",
        "discount = gamma * (1.0 - dones.astype(jnp.float32))",
        "discount = gamma * jnp.ones_like(rewards)",
        ("tests/test_wiring.py", "tests/test_reinforce.py"),
    ),
    Mutation(
        "metrics-norm-per-device",
        "common/metrics.py",
        "n = jax.lax.psum(jnp.float32(residual.size), axis_name)",
        "n = jnp.float32(residual.size)",
        ("tests/test_metrics.py", "tests/test_devices.py"),
    ),
    Mutation(
        "obs-stats-not-merged-over-devices",
        "common/envs.py",
        "mean = jax.lax.pmean(jnp.mean(x, 0), axis_name)",
        "mean = jnp.mean(x, 0)",
        ("tests/test_normalize_obs.py",),
    ),
    Mutation(
        "gaussian-std-squared",
        "common/distributions.py",
        "return distrax.MultivariateNormalDiag(mean, jnp.exp(log_std))",
        "return distrax.MultivariateNormalDiag(mean, jnp.exp(2 * log_std))",
        ("tests/test_distributions.py",),
    ),
    # Collectives and run promises (tests/test_devices.py's whole-batch test,
    # tests/test_promises.py).
    Mutation(
        "ppo-gradient-psum",
        "algos/ppo_joint.py",
        "grads = jax.lax.pmean(grads, devices.DEVICE_AXIS)",
        "grads = jax.lax.psum(grads, devices.DEVICE_AXIS)",
        ("tests/test_devices.py",),
    ),
    Mutation(
        "reinforce-baseline-per-device",
        "algos/reinforce.py",
        "return_mean = jax.lax.pmean(jnp.mean(returns), devices.DEVICE_AXIS)",
        "return_mean = jnp.mean(returns)",
        ("tests/test_devices.py",),
    ),
    Mutation(
        "awr-advantage-mean-per-device",
        "algos/awr.py",
        "mean = jax.lax.pmean(masked_mean(advantages, valid), devices.DEVICE_AXIS)",
        "mean = masked_mean(advantages, valid)",
        ("tests/test_devices.py",),
    ),
    Mutation(
        "dqn-update-bootstraps-from-online-net",
        "algos/dqn_value.py",
        "(params, target_params, batch, config)",
        "(params, params, batch, config)",
        ("tests/test_dqn_value.py",),
    ),
    Mutation(
        "divergence-checks-the-policy-loss-only",
        "common/run.py",
        'if k.startswith("loss/") and not math.isfinite(v)',
        'if k == "loss/policy" and not math.isfinite(v)',
        ("tests/test_promises.py",),
    ),
    # Reward normalization, the compact DQN replay and the conv torso.
    Mutation(
        "reward-return-crosses-episodes",
        "common/envs.py",
        "return jnp.where(done, 0.0, ret), ret",
        "return ret, ret",
        ("tests/test_wiring.py", "tests/test_normalize_obs.py"),
    ),
    Mutation(
        "reward-scale-not-applied",
        "algos/ppo_joint.py",
        "rewards = traj.reward / envs.reward_scale(state.reward_stats)",
        "rewards = traj.reward",
        ("tests/test_wiring.py",),
    ),
    Mutation(
        "reward-scale-without-floor",
        "common/envs.py",
        "jnp.maximum(jnp.sqrt(stats.stats.var), 1.0)",
        "jnp.sqrt(stats.stats.var)",
        ("tests/test_wiring.py", "tests/test_normalize_obs.py"),
    ),
    Mutation(
        "dqn-truncated-row-bootstraps-from-next-row",
        "algos/dqn_value.py",
        "expand(slot >= 0),\n        replay.final[jnp.maximum(slot, 0), env],",
        "expand(slot < -1),\n        replay.final[jnp.maximum(slot, 0), env],",
        ("tests/test_dqn_value.py",),
    ),
    Mutation(
        "next-values-one-slot-short",
        "common/envs.py",
        "n_slots = (n_steps - 1) // int(max(1, min(step_limit, n_steps))) + 2",
        "n_slots = (n_steps - 1) // int(max(1, min(step_limit, n_steps))) + 1",
        ("tests/test_envs.py",),
    ),
    Mutation(
        "next-values-truncation-from-the-next-row",
        "algos/ppo_joint.py",
        "truncated = traj.done & ~traj.terminated",
        "truncated = traj.done & False",
        ("tests/test_wiring.py", "tests/test_ppo_joint.py"),
    ),
    Mutation(
        "conv-torso-auto-picks-mlp-for-images",
        "common/nets.py",
        'return torso == "conv" or (torso == "auto" and image)',
        'return torso == "conv"',
        ("tests/test_nets.py",),
    ),
    Mutation(
        "sweep-members-seed-major",
        "common/sweep.py",
        "jnp.repeat(\n                jnp.asarray([m.get(name, getattr(config, name)) for m in "
        "members]",
        "jnp.tile(\n                jnp.asarray([m.get(name, getattr(config, name)) for m in "
        "members]",
        ("tests/test_promises.py",),
    ),
]


def copy_tree(dest: Path) -> None:
    """The working tree as it is (tracked and untracked, not ignored files) into dest."""
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    for name in files:
        if (ROOT / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dest / name)


def run_one(mutation: Mutation, timeout: float) -> tuple[str, float, str]:
    """(verdict, seconds, the first failing test) for one mutation on a fresh copy of the tree."""
    with tempfile.TemporaryDirectory(prefix="jtrax-mutant-") as tmp:
        tree = Path(tmp)
        copy_tree(tree)
        path = tree / mutation.path
        text = path.read_text()
        if text.count(mutation.old) != 1:
            return f"not applied ({text.count(mutation.old)} matches)", 0.0, ""
        path.write_text(text.replace(mutation.old, mutation.new))
        tests = [t for t in mutation.tests if (tree / t.split("::")[0]).exists()]
        t0 = time.time()
        try:
            proc = subprocess.run(
                [sys.executable, *PYTEST, *tests],
                cwd=tree,
                capture_output=True,
                text=True,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired:
            return "timeout", time.time() - t0, ""
        failed = next(
            (line.split()[1] for line in proc.stdout.splitlines() if line.startswith("FAILED ")), ""
        )
        verdict = (
            "caught"
            if proc.returncode == 1
            else "SURVIVED"
            if proc.returncode == 0
            else f"error {proc.returncode}"
        )
        return verdict, time.time() - t0, failed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--only",
        default="",
        help="run the mutations whose name starts with one of these (comma-separated)",
    )
    parser.add_argument("--list", action="store_true", help="list the mutations and exit")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per mutation's tests")
    args = parser.parse_args()
    chosen = [m for m in MUTATIONS if m.name.startswith(tuple(args.only.split(",")))]
    if args.list:
        for m in chosen:
            print(f"{m.name:40s} {m.path}: {m.old!r} -> {m.new!r}")
        return
    rows = []
    for m in chosen:
        verdict, seconds, failed = run_one(m, args.timeout)
        rows.append(f"| {m.name} | `{m.path}` | {verdict} | {seconds:.0f} | {failed or '-'} |")
        print(rows[-1], flush=True)
    caught = sum("| caught |" in r for r in rows)
    body = (
        f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} at commit {commit('algos', 'common', 'tests')} "
        f"on {machine()}, with `python bench/dev/mutations.py{' --only ' + args.only if args.only else ''}`: "
        f'**{caught} of {len(rows)} caught** by the fast tests (`-m "not slow" -x`) named for each.\n\n'
        "| mutation | file | verdict | seconds | first failing test |\n| --- | --- | --- | --- | "
        "--- |\n" + "\n".join(rows)
    )
    print(f"\n{caught} of {len(rows)} caught")
    if not args.only:
        write_section("## Mutation check", body, MUTATIONS_MD)


if __name__ == "__main__":
    main()
