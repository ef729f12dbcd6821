"""The gymnax suite: every script's defaults, with only --env (and the task's budget) given, on each
task.

    python bench/suite/suite.py                              # every cell: hours on 2 cores
    python bench/suite/suite.py --tasks Acrobot-v1 --scripts ppo_joint,awr
    python bench/suite/suite.py --report                     # rewrite docs/results.md only
    python bench/suite/suite.py --from-run RUN_DIR COMMIT    # a cell of a run made by hand

Each cell (a script with its flags, on a task) is one process training
`--seeds` seeds in one program (`--num-seeds`) for the task's budget of env
steps, with a greedy evaluation (32 episodes) about every tenth of it. A
cell's figures (mean and per-seed greedy return at the end and at each evaluation, env steps,
wall seconds, the commit) go to bench/suite/cells.json, which keeps the cells of earlier parts;
docs/results.md is written from all of them, with each task's anchor (gymnax's PPO table and its
budget), and a learning-curve PNG per task in docs/results/ (the greedy return of every cell,
labelled with its command, and the task's goal as a dashed line; common/plot.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.results import commit
from common import cli, envs, plot

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "bench" / "suite"
CELLS = OUT / "cells.json"
REPORT = ROOT / "docs" / "results.md"
FIGURES = ROOT / "docs" / "results"  # a PNG per task
# task: (budget in env steps, anchor: gymnax's PPO return at that budget, the goal for every seed)
TASKS = {
    "CartPole-v1": (150_000, 500.0, 475.0),
    "Acrobot-v1": (500_000, -80.0, -100.0),
    # gymnax's -118 was reached at 240k; the policy-gradient scripts reach it on every seed at 500k
    # (at 250k 13 to 15 seeds of 16: docs/decisions.md)
    "MountainCar-v0": (500_000, -118.0, -118.0),
    "Catch-bsuite": (100_000, 1.0, 1.0),
    # the goal: the optimum, 1 less the cost of the moves right
    "DeepSea-bsuite": (150_000, 0.0, 0.99),
    "MemoryChain-bsuite": (150_000, 0.1, 0.1),
    # no anchor: CartPole-v1 without its velocities
    "CartPoleNoVel-v1": (200_000, float("nan"), 475.0),
    # continuous actions; the anchors are gymnax's at 1M steps
    "Pendulum-v1": (300_000, -130.0, -200.0),
    "MountainCarContinuous-v0": (300_000, 92.0, 90.0),
    # image observations [10, 10, C]; gymnax's PPO at 10M steps
    "Breakout-MinAtar": (10_000_000, 28.0, 28.0),
    "SpaceInvaders-MinAtar": (10_000_000, 131.0, 131.0),
    "Asterix-MinAtar": (10_000_000, 15.0, 15.0),
    "Freeway-MinAtar": (10_000_000, 58.0, 58.0),
    # no anchor in gymnax's table; the goal is the MinAtar paper's DQN figure (Young & Tian)
    "Seaquest-MinAtar": (10_000_000, float("nan"), 20.0),
    # gymnax's other environments: one row (ppo_joint) each; gymnax's table gives an anchor for
    # some, from PPO or from an evolution strategy (ES): MetaMaze, PointRobot and the two bandits
    # are meta-learning tasks
    "UmbrellaChain-bsuite": (150_000, 1.0, 1.0),
    "DiscountingChain-bsuite": (150_000, 1.1, 1.1),
    "SimpleBandit-bsuite": (100_000, float("nan"), float("nan")),
    "FourRooms-misc": (500_000, 1.0, 1.0),
    "FrozenLake-misc": (200_000, float("nan"), float("nan")),
    "MetaMaze-misc": (500_000, 32.0, 32.0),  # ES
    "PointRobot-misc": (500_000, 10.0, 10.0),  # ES
    "BernoulliBandit-misc": (200_000, 90.0, 90.0),  # ES
    "GaussianBandit-misc": (200_000, 0.0, 0.0),  # ES
    "Reacher-misc": (500_000, float("nan"), float("nan")),
    "Swimmer-misc": (500_000, float("nan"), float("nan")),
    "Pong-misc": (500_000, float("nan"), float("nan")),
}
CONTINUOUS = ("Pendulum-v1", "MountainCarContinuous-v0")  # Box actions: no dqn_value rows
# tasks that need memory: skip_transformer's rows
MEMORY = (
    "MemoryChain-bsuite",
    "CartPoleNoVel-v1",
)
ONLY_MEMORY = ("CartPoleNoVel-v1",)  # and only its rows
# rows: ppo_joint, awr and dqn_value only
MINATAR = (
    "Breakout-MinAtar",
    "SpaceInvaders-MinAtar",
    "Asterix-MinAtar",
    "Freeway-MinAtar",
    "Seaquest-MinAtar",
)
MINATAR_ROWS = ("ppo_joint", "awr", "dqn_value")
ONE_ROW = tuple(list(TASKS)[list(TASKS).index("UmbrellaChain-bsuite") :])  # ppo_joint's row only
SEEDS = 8  # per cell, unless --seeds says otherwise
RANDOM = OUT / "random.json"  # task: the mean return of uniformly random actions
SCRIPTS = {  # row name: script and flags
    "ppo_joint": ["ppo_joint"],
    "awr": ["awr"],
    "awr --q-value --n-samples 2": ["awr", "--q-value", "--n-samples", "2"],
    "awr --q-value --n-samples 4": ["awr", "--q-value", "--n-samples", "4"],
    "actor_critic": ["actor_critic"],
    "actor_critic --loss ppo": ["actor_critic", "--loss", "ppo"],
    "reinforce --baseline": ["reinforce", "--baseline"],
    "dqn_value": ["dqn_value"],
    "skip_transformer": ["skip_transformer"],
}


def cells_of(tasks: list[str], scripts: list[str]) -> list[tuple[str, str]]:
    """(task, row) pairs: skip_transformer on the tasks that need memory, the others on all but
    ONLY_MEMORY (dqn_value on discrete actions only; MinAtar: MINATAR_ROWS)."""
    return [
        (task, row)
        for task in tasks
        for row in scripts
        if (task in MEMORY if row == "skip_transformer" else task not in ONLY_MEMORY)
        and not (row == "dqn_value" and task in CONTINUOUS)
        and (task not in MINATAR or row in MINATAR_ROWS)
        and (task not in ONE_ROW or row == "ppo_joint")
    ]


def random_return(task: str, episodes: int = 256) -> float:
    """The mean return of uniformly random actions over `episodes` episodes, each to its end or time
    limit."""
    import jax
    import jax.numpy as jnp

    env, params = envs.build_env(task)
    space = env.action_space(params)

    def episode(key):
        obs, state = env.reset(key, params)

        def step(carry, key):
            state, total, ended = carry
            act_key, step_key = jax.random.split(key)
            _, state, reward, terminated, truncated, _ = env.step(
                step_key, state, space.sample(act_key), params
            )
            done = jnp.logical_or(terminated, truncated)
            return (state, total + jnp.where(ended, 0.0, reward), jnp.logical_or(ended, done)), None

        keys = jax.random.split(key, int(params.max_steps_in_episode))
        (_, total, _), _ = jax.lax.scan(step, (state, jnp.float32(0.0), jnp.bool_(False)), keys)
        return total

    return float(
        jax.jit(jax.vmap(episode))(jax.random.split(jax.random.PRNGKey(0), episodes)).mean()
    )


def eval_every(script: str, budget: int) -> int:
    """Epochs between evaluations: about a tenth of the budget, from the script's defaults."""
    config = importlib.import_module(f"algos.{script}").Config()
    return max(1, budget // (10 * config.num_envs * config.num_steps))


def command(task: str, row: str, seeds: int, budget: int = 0) -> list[str]:
    """The arguments of a cell's run: the row's script and flags, the task, its budget, the seeds
    and the evaluations (the run directory is added by `run_cell`)."""
    budget = budget or TASKS[task][0]
    script, *flags = SCRIPTS[row]
    return [
        f"algos/{script}.py",
        *flags,
        "--env",
        task,
        "--total-steps",
        str(budget),
        "--num-seeds",
        str(seeds),
        "--eval-every",
        str(eval_every(script, budget)),
    ]


def run_cell(
    task: str, row: str, seeds: int, scratch: Path, timeout: float, budget: int = 0
) -> dict:
    out = scratch / f"{task}-{row.replace(' ', '_')}"
    args = command(task, row, seeds, budget)
    at = commit("algos", "common")  # the code the run starts with
    start = time.time()
    proc = subprocess.run(
        [sys.executable, *args, "--out-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    wall = time.time() - start
    if proc.returncode:
        return {
            "error": (proc.stdout + proc.stderr).strip().splitlines()[-1],
            "command": " ".join(args),
        }
    return read_cell(out, args, wall, at)


def read_cell(out: Path, args: list[str], wall: float, at: str) -> dict:
    """A cell's figures from its run directory `out`, made by `args` in `wall` seconds at commit
    `at`."""
    summary = json.loads((out / "summary.json").read_text())
    steps, returns = plot.load_curve(out, "eval/return")
    per_seed = summary["eval_return_per_seed"]
    # the behaviour policy's return (sampled actions; dqn_value's epsilon-greedy), as gymnax's
    # anchors evaluate: each seed's training episodes over the last 5% of epochs
    _, training = plot.load_curve(out, "episode/return")
    last = training[-max(1, len(training) // 20) :]
    behaviour = [float(np.mean(x[~np.isnan(x)])) if (~np.isnan(x)).any() else None for x in last.T]
    return {
        "mean": summary["eval_return"],
        "worst": min(per_seed),
        "per_seed": per_seed,
        "behaviour_per_seed": behaviour,
        # skip_transformer: every depth's greedy return
        "by_depth": summary.get("eval_return_by_depth_per_seed"),
        "env_steps": summary["env_steps"],
        "wall_s": wall,
        # every seed's env steps per second of training (compiles and evaluations left out)
        "sps": summary["sps"],
        "commit": at,
        "command": "python " + " ".join(args),
        # the greedy return of each seed at each evaluation, for the task's PNG
        "curve": {"env_steps": steps.tolist(), "per_seed": returns.tolist()},
    }


def cell_of_run(out: Path, at: str) -> tuple[str, dict]:
    """`(key, cell)` of a finished run made by hand at commit `at`: its config.json must be the
    config a row's command gives at its task's budget (the run's seeds; any run-control flag and
    directory), so that the cell is that command's run. Its wall time is the run's own, from its
    start to its summary; a resumed run is refused (its last process's time is not the run's)."""
    saved = json.loads((out / "config.json").read_text())
    task, seeds = saved["env"], saved["num_seeds"]
    for row in SCRIPTS:
        if (task, row) not in cells_of([task], [row]):
            continue
        args = command(task, row, seeds)
        script = importlib.import_module(f"algos.{Path(args[0]).stem}")
        config = cli.parse_config(script.Config, args[1:]).resolved()
        expected = json.loads(json.dumps(dataclasses.asdict(config)))
        differ = [
            k
            for k in expected
            if k not in (*cli.RUN_CONTROL, "out_dir") and saved.get(k) != expected[k]
        ]
        if differ:
            continue
        summary = json.loads((out / "summary.json").read_text())
        # a resumed run's process trained only the steps after its checkpoint
        trained = summary["sps"] * summary["train_time_s"]
        if trained < 0.99 * summary["env_steps"] * seeds:
            sys.exit(f"--from-run {out}: the run was resumed; its wall time is not one run's")
        return f"{task} | {row}", read_cell(out, args, summary["wall_time_s"], at)
    sys.exit(f"--from-run {out}: its config.json is no row's command at {task}'s budget")


def met(cell: dict, goal: float) -> bool:
    """Every seed at or above the goal; 1e-4 below it counts (float32 returns: DeepSea's 0.99 is
    0.98999983)."""
    return "error" not in cell and cell["worst"] >= goal - 1e-4


def anchor(task: str) -> str:
    return f"{TASKS[task][1]:g}" if TASKS[task][1] == TASKS[task][1] else "none"  # nan: no anchor


def goal(task: str) -> str:
    return f"{TASKS[task][2]:g}" if TASKS[task][2] == TASKS[task][2] else "none"  # nan: no goal


def entry(cell: dict | None, task: str) -> str:
    """A cell's mean / worst seed (with its budget where it ran short of the task's), bold where it
    met the goal."""
    if cell is None:
        return ""
    if "error" in cell:
        return "error"
    text = f"{cell['mean']:.3g} / {cell['worst']:.3g}" + (
        f" at {cell['env_steps'] / 1e6:.2g}M" if cell["env_steps"] < 0.9 * TASKS[task][0] else ""
    )
    if len(cell["per_seed"]) != SEEDS:
        text += f" ({len(cell['per_seed'])} seeds)"
    return f"**{text}**" if met(cell, TASKS[task][2]) else text


def one_row_table(cells: dict, randoms: dict) -> list[str]:
    """The tasks with ppo_joint's row only (ONE_ROW), a line each."""
    tasks = [t for t in ONE_ROW if f"{t} | ppo_joint" in cells]
    if not tasks:
        return []
    lines = [
        "| task | budget | anchor; goal, every seed | uniformly random actions | ppo_joint |",
        "|---|---:|---:|---:|---:|",
    ]
    for t in tasks:
        random = f"{randoms[t]:.3g}" if t in randoms else ""
        lines.append(
            f"| {t} | {TASKS[t][0]:,} | {anchor(t)}; {goal(t)} | {random} | "
            f"{entry(cells[f'{t} | ppo_joint'], t)} |"
        )
    return lines + [
        "",
        "gymnax's anchors for MetaMaze, PointRobot and the two bandits come from an evolution "
        "strategy, and those four are meta-learning tasks (an agent that remembers what it "
        "found earlier in the episode); the MLP policies here see one observation at a time.",
    ]


def matrix(cells: dict) -> list[str]:
    """Every cell of the tasks with several rows in one table: mean and worst seed, the goal met in
    bold."""
    tasks = [
        t for t in TASKS if t not in ONE_ROW and any(key.startswith(f"{t} | ") for key in cells)
    ]
    lines = [
        "| script | " + " | ".join(tasks) + " |",
        "|---|" + "---:|" * len(tasks),
        "| anchor; goal, every seed | "
        + " | ".join(f"{anchor(t)}; {goal(t)}" for t in tasks)
        + " |",
    ]
    for row in SCRIPTS:
        if any(f"{t} | {row}" in cells for t in tasks):
            lines.append(
                f"| {row} | "
                + " | ".join(entry(cells.get(f"{t} | {row}"), t) for t in tasks)
                + " |"
            )
    return lines + [
        "",
        "Each entry: mean / worst of the seeds' greedy returns (at N M: after N million steps, "
        "short of the task's budget); bold: every seed at or above the goal.",
    ]


def table(cells: dict, tasks: list[str], rows: list[str]) -> list[str]:
    """A task per line, with its budget, anchor and goal, and a column per row (mean / worst seed,
    bold where every seed met the goal); only the tasks where one of `rows` has a cell."""
    tasks = [t for t in tasks if any(f"{t} | {row}" in cells for row in rows)]
    lines = [
        "| task (budget) | anchor; goal | " + " | ".join(rows) + " |",
        "| --- | ---: |" + " ---: |" * len(rows),
    ]
    for t in tasks:
        budget = f"{TASKS[t][0] / 1e6:g}M" if TASKS[t][0] >= 1e6 else f"{TASKS[t][0] // 1000}k"
        lines.append(
            f"| {t} ({budget}) | {anchor(t)}; {goal(t)} | "
            + " | ".join(entry(cells.get(f"{t} | {row}"), t) for row in rows)
            + " |"
        )
    return lines


# Tables written into other pages between two markers (the page keeps the rest): the README's
# headline rows, and each algorithm page's own rows.
BEGIN, END = "<!-- suite table: bench/suite/suite.py writes it -->", "<!-- end of suite table -->"
HEADLINE = (
    ["CartPole-v1", "Acrobot-v1", "MountainCar-v0", "DeepSea-bsuite", "Pendulum-v1"]
    + ["Breakout-MinAtar", "SpaceInvaders-MinAtar", "Asterix-MinAtar", "Freeway-MinAtar"]
    + ["Seaquest-MinAtar"],
    ["ppo_joint", "awr", "awr --q-value --n-samples 4", "dqn_value"],
)


def write_tables(cells: dict) -> None:
    """Rewrites the tables between BEGIN and END in README.md and docs/algorithms/<script>.md."""
    pages = {ROOT / "README.md": table(cells, *HEADLINE)}
    for script in dict.fromkeys(flags[0] for flags in SCRIPTS.values()):
        rows = [row for row, flags in SCRIPTS.items() if flags[0] == script]
        pages[ROOT / "docs" / "algorithms" / f"{script}.md"] = table(cells, list(TASKS), rows)
    for page, lines in pages.items():
        text = page.read_text()
        if BEGIN in text and END in text:
            head, rest = text.split(BEGIN, 1)
            page.write_text(
                head + BEGIN + "\n" + "\n".join(lines) + "\n" + END + rest.split(END, 1)[1]
            )


def report(cells: dict, randoms: dict) -> str:
    lines = [
        "# The gymnax suite",
        "",
        "Written by `python bench/suite/suite.py` from bench/suite/cells.json: each cell one process, the "
        "script's defaults with only `--env` and the budget (`--total-steps`) given, "
        "`--num-seeds` seeds in one program, greedy return over 32 episodes at the end. Anchor: "
        "gymnax's PPO table at that budget (Pendulum and MountainCarContinuous: at 1M steps); "
        "goal: every seed at or above it (DeepSea: its optimum, 0.99; Acrobot: -100; Pendulum: "
        "-200). In each task's table, behaviour policy: each seed's training episodes over the last "
        "5% of epochs (sampled actions; dqn_value's epsilon-greedy), the policy gymnax's anchors "
        "evaluate; SPS: every seed's env steps per second of training (compiles and evaluations "
        "left out).",
        "",
    ]
    judged = [
        (cell, TASKS[key.split(" | ")[0]][2])
        for key, cell in cells.items()
        if key.split(" | ")[0] in TASKS and goal(key.split(" | ")[0]) != "none"
    ]
    lines += [
        f"{sum(met(cell, target) for cell, target in judged)} of {len(judged)} cells with a goal "
        "meet it on every seed.",
        "",
        *matrix(cells),
        "",
        *one_row_table(cells, randoms),
        "",
    ]
    for task, (budget, _, target) in TASKS.items():
        rows = [(row, cells[f"{task} | {row}"]) for row in SCRIPTS if f"{task} | {row}" in cells]
        if not rows:
            continue
        random = randoms.get(task)
        lines += [
            f"## {task} (budget {budget:,} steps; anchor {anchor(task)}; goal, every seed: "
            f"{goal(task)})",
            "",
            *([f"![{task}](results/{task}.png)", ""] if (FIGURES / f"{task}.png").exists() else []),
            *(
                [f"Uniformly random actions: {random:.3g} (mean of 256 episodes).", ""]
                if random is not None
                else []
            ),
            *(
                [
                    "Every script's network here starts with the convolution, the default for "
                    "image observations ([environments.md](environments.md#image-observations-minatar)).",
                    "",
                ]
                if envs.starts_with_conv(task, "auto")
                else []
            ),
            "| script | mean | worst seed | every seed >= goal | per seed | behaviour policy | "
            "env steps | wall s | SPS | commit |",
            "|---|---:|---:|---|---|---:|---:|---:|---:|---|",
        ]
        for row, c in rows:
            if "error" in c:
                lines.append(f"| {row} | error: {c['error']} | | | | | | | | |")
                continue
            seeds = ", ".join(f"{x:.3g}" for x in c["per_seed"])
            # figures that cells measured before they were kept lack
            sps = f"{c['sps']:,.0f}" if "sps" in c else ""
            sampled = [x for x in c.get("behaviour_per_seed") or [] if x is not None]
            behaviour = f"{sum(sampled) / len(sampled):.3g} / {min(sampled):.3g}" if sampled else ""
            lines.append(
                f"| {row} | {c['mean']:.3g} | {c['worst']:.3g} | {'yes' if met(c, target) else 'no'} "
                f"| {seeds} | {behaviour} | {c['env_steps']:,} | {c['wall_s']:.0f} | {sps} "
                f"| {c['commit']} |"
            )
        for row, c in rows:
            for depth, per_seed in sorted((c.get("by_depth") or {}).items()):
                lines.append(
                    f"\n{row}, greedy return with {depth} block(s) run: mean "
                    f"{sum(per_seed) / len(per_seed):.3g}, worst {min(per_seed):.3g} "
                    f"({', '.join(f'{x:.3g}' for x in per_seed)})"
                )
        lines.append("")
    return "\n".join(lines)


def draw(cells: dict) -> None:
    """A PNG per task whose cells hold a curve: each row's greedy return, labelled as the row's
    command, and the task's goal."""
    FIGURES.mkdir(parents=True, exist_ok=True)
    for task in TASKS:
        curves = {
            row: (cell["curve"]["env_steps"], cell["curve"]["per_seed"])
            for row in SCRIPTS
            if "curve" in (cell := cells.get(f"{task} | {row}", {}))
        }
        if curves:
            goal = TASKS[task][2] if TASKS[task][2] == TASKS[task][2] else None  # nan: no goal
            plot.draw(curves, "greedy return", FIGURES / f"{task}.png", goal, title=task)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", default=",".join(TASKS))
    p.add_argument(
        "--scripts", default=",".join(SCRIPTS), help="row names, comma-separated (see SCRIPTS)"
    )
    p.add_argument("--seeds", type=int, default=SEEDS)
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds per cell")
    p.add_argument(
        "--budget",
        type=int,
        default=0,
        help="env steps per cell in place of the task's (0: the "
        "task's); the cell records the steps it ran",
    )
    p.add_argument(
        "--from-run",
        nargs="+",
        default=[],
        metavar="DIR COMMIT",
        help="cells from finished runs made by hand, each a run directory and the commit that ran "
        "it, whose config.json is a row's command at its task's budget (checked), in place of "
        "running them",
    )
    p.add_argument(
        "--report",
        action="store_true",
        help="only rewrite docs/results.md, the PNGs and the tables of README.md and docs/algorithms/",
    )
    args = p.parse_args()
    tasks, scripts = args.tasks.split(","), args.scripts.split(",")
    unknown = [t for t in tasks if t not in TASKS] + [s for s in scripts if s not in SCRIPTS]
    if unknown:
        sys.exit(
            f"unknown task or row: {', '.join(unknown)}; tasks: {', '.join(TASKS)}; rows: {', '.join(SCRIPTS)}"
        )
    if len(args.from_run) % 2:
        p.error("--from-run takes pairs: DIR COMMIT [DIR COMMIT ...]")
    OUT.mkdir(parents=True, exist_ok=True)
    cells = json.loads(CELLS.read_text()) if CELLS.exists() else {}
    if args.from_run:
        for out, at in zip(args.from_run[::2], args.from_run[1::2]):
            key, cells[key] = cell_of_run(Path(out), f"`{at}`")
        CELLS.write_text(json.dumps(cells, indent=1, sort_keys=True))
    elif not args.report:
        with tempfile.TemporaryDirectory(prefix="jtrax-suite-") as tmp:
            for task, row in cells_of(tasks, scripts):
                cell = run_cell(task, row, args.seeds, Path(tmp), args.timeout, args.budget)
                cells[f"{task} | {row}"] = cell
                CELLS.write_text(json.dumps(cells, indent=1, sort_keys=True))
                print(
                    f"{task:<20} {row:<30} "
                    + (
                        cell.get("error")
                        or f"mean {cell['mean']:.3g} worst "
                        f"{cell['worst']:.3g} in {cell['wall_s']:.0f} s"
                    ),
                    flush=True,
                )
    randoms = json.loads(RANDOM.read_text()) if RANDOM.exists() else {}
    for task in {key.split(" | ")[0] for key in cells} - set(randoms):
        randoms[task] = random_return(task)
    RANDOM.write_text(json.dumps(randoms, indent=1, sort_keys=True))
    draw(cells)
    REPORT.write_text(report(cells, randoms) + "\n")
    write_tables(cells)


if __name__ == "__main__":
    main()
