"""The life of a run, in order: `train` and its phases, and `main`, the command line of every
script.

A script defines a frozen `Config` (a subclass of `cli.RunConfig`) and a
`make_trainer(config) -> Trainer`; `main(Config, make_trainer, ...)` does the rest:

1. `prepare`: hosts, devices, the trainer (`sweep.build`), the state's shapes
   and their memory, before any compile, so that a bad flag fails at once;
2. the run directory (`outputs.open_run_dir`) or the run to resume (`checkpoints.resume`);
3. `compile_programs`: init, the epochs in chunks (`loop`) and the greedy evaluation;
4. `run_epochs`: records (`outputs.Logger`), evaluations, checkpoints, divergence, Ctrl-C;
5. `summarize`: the final evaluation, `summary.json`.

What a run writes in its directory is listed in `common/outputs.py`. On several
hosts (`--coordinator`, see `devices.init_distributed`) every host runs the same
programs in the same order; only the chief (process 0) writes, and a checkpoint
holds every host's devices.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, NamedTuple

import jax
import numpy as np

from common import checkpoints, cli, devices, envs, executables, loop, outputs, sweep

# XLA options for programs that run once or rarely (init, an MLP's evaluation): a quicker compile.
# XLA:CPU's older per-operation emitters compile such a program in about half the CPU time of the
# fusion emitters, and on 2 cores that CPU comes out of the epochs' compile beside it; the epochs
# keep the defaults, whose code trains faster.
FAST_COMPILE = {"xla_backend_optimization_level": 0, "xla_cpu_use_fusion_emitters": False}


# ----------------------------------------------------------------------------
# What a script provides, and what a run returns
# ----------------------------------------------------------------------------
class Trainer(NamedTuple):
    """An algorithm, as pure functions of one (device, seed) slice of the runner state.

    `init(key) -> state` and `epoch(state) -> (state, metrics)` run under
    `devices.map_epoch` (the trainer `sweep.build` makes of them takes the
    hyperparameter values as a second argument); `epoch` must average gradients over
    `devices.DEVICE_AXIS`. `act(policy, obs, key)` is the greedy action for one
    observation; `policy(state)` picks what `act` needs out of the state (an
    `envs.Policy`: the policy's parameters and observation statistics). An `env`
    that observes through a window of past observations (`envs.ContextWindow`)
    has `observe(window, obs, first) -> window`, `window_shape`
    and `raw_obs_shape`, so that `checkpoints.load_agent` can keep windows for a caller.
    `rollout(state)`, where a script has it, returns what `epoch(state)` computes before
    its (policy's) update -- the rollout and its targets; in awr also the critic's update,
    which comes first -- from the same code, so that tests can check the epoch's wiring; it
    runs under `devices.map_epoch` as `epoch` does.
    """

    init: Callable
    epoch: Callable
    act: Callable
    policy: Callable
    env: Any
    env_params: Any
    steps_per_epoch: int  # environment steps of one seed in one epoch, all devices
    num_epochs: int  # every `loss/*` metric must stay finite
    rollout: Callable | None = None


class Result(NamedTuple):
    """What `train` returns."""

    run_dir: Path  # where the run wrote (or, with --eval-only, the run it evaluated)
    summary: dict  # as in summary.json


class Setup(NamedTuple):
    """What `prepare` finds out before anything compiles."""

    config: Any
    script: str
    run_dir: Path
    host: devices.Host
    hosts: int  # processes of the run
    trainer: Trainer
    seed: np.uint32  # `--seed` as the programs take it (`sweep.seed_input`)
    values: dict  # the hyperparameter values init and the epochs map over: [n_devices, runs] each
    # init (`sweep.trace_init`) traced for `seed` and `values`, or compiled where `stored` holds it
    init: Any
    template: Any  # the runner state's shapes (this host's part)
    stored_as: str | None  # the key of the run's programs in `executables` (None: not kept)
    stored: dict | None  # the run's programs as an earlier run built them (None: a miss)
    programs_s: float  # seconds spent on the programs here: loading them, or tracing init


class Programs(NamedTuple):
    init: Callable  # (seed, values) -> state
    # (state, values, n) -> (state, metrics [n_devices, runs, k]), n <= k; None: --eval-only
    epochs: Callable | None
    # (state, epoch) -> the greedy return of every run [runs], on the episodes of `epoch`
    evaluate: Callable
    k: int  # epochs per call (`loop.epochs_per_call`)


class Progress(NamedTuple):
    state: Any
    epoch: int
    record: dict  # the last epoch's
    returns: np.ndarray | None  # the last evaluation's
    train_time: float  # seconds in the epochs' calls
    # time.time() at the evaluation that reached --target-return; None: not reached
    reached: float | None
    # (epoch, mean return) of the newest epoch in which episodes ended
    episodes: tuple[int, float] | None


# ----------------------------------------------------------------------------
# The run
# ----------------------------------------------------------------------------
def train(
    config, make_trainer: Callable, script: str = "run", max_epochs: int | None = None
) -> Result:
    """Trains (or, with --eval-only, evaluates); returns the run directory and the summary.

    `max_epochs` stops early after that many epochs of this call (as Ctrl-C
    would), leaving a checkpoint to --resume from. The chief holds the run
    directory's lock (`outputs.open_run_dir`) from before the compile to the return.
    """
    wall_start = time.time()
    with contextlib.ExitStack() as held:  # the run directory's lock, released however the run ends
        setup = prepare(config, make_trainer, script)
        config = setup.config
        if setup.host.is_chief and not config.eval_only:
            held.enter_context(outputs.open_run_dir(setup.run_dir, config))
        start_epoch, state = 0, None
        if config.resume:
            start_epoch, state = checkpoints.resume(setup.run_dir, setup.template, setup.hosts)
            done = finished(setup, start_epoch)
            if done is not None:
                return Result(run_dir=setup.run_dir, summary=done)
        t0 = time.time()
        # before anything is written: a program too large is refused
        programs = compile_programs(setup)
        start_outputs(setup, start_epoch)
        state = state if state is not None else programs.init(setup.seed, setup.values)
        compile_time = setup.programs_s + time.time() - t0
        if config.eval_only:
            returns = programs.evaluate(state, start_epoch)
            return Result(
                run_dir=setup.run_dir,
                summary={
                    "eval_return": float(returns.mean()),
                    "eval_return_per_seed": returns.tolist(),
                },
            )

        logger = outputs.Logger(config, setup.run_dir, setup.host.is_chief, wall_start)
        logger.start(
            setup.script,
            setup.trainer,
            setup.host.n_devices * setup.hosts,
            compile_time,
            loaded=setup.stored is not None,
        )
        last_epoch = setup.trainer.num_epochs
        if max_epochs is not None:
            last_epoch = min(last_epoch, start_epoch + max_epochs)
        progress = run_epochs(setup, programs, logger, state, start_epoch, last_epoch)
        summary = summarize(setup, programs, progress, start_epoch, compile_time, wall_start)
        if setup.host.is_chief:
            outputs.write_json(setup.run_dir / "summary.json", summary, setup.run_dir)
            logger.close(summary)
        return Result(run_dir=setup.run_dir, summary=summary)


def prepare(config, make_trainer: Callable, script: str) -> Setup:
    """Hosts and devices, the run directory's path, the trainer and the state's shapes (before any
    compile)."""
    devices.init_distributed(
        config.coordinator, config.num_processes, config.process_id, config.coordinator_timeout
    )
    if config.compile_cache:
        enable_compile_cache()
    host = devices.init_host_and_devices(config.n_devices or None, config.seed)
    hosts = jax.process_count()
    config = config.resolved()  # defaults that depend on the environment's spaces
    # The flags describe the whole run: its environments and batches split over every host's
    # devices.
    run_dir = Path(
        config.resume
        or config.out_dir
        or f"runs/{script}-{config.env}-seed{config.seed}-{time.strftime('%Y%m%d-%H%M%S')}"
    )
    trainer, values = sweep.build(
        dataclasses.replace(config, n_devices=host.n_devices * hosts), make_trainer, host.n_devices
    )
    seed = sweep.seed_input(host.seed)
    # programs an earlier run built load whole; else init is traced once, here, for its output
    # shapes
    t0 = time.time()
    stored_as = (
        executables.key(config, make_trainer, host.n_devices) if config.compile_cache else None
    )
    stored = executables.load(stored_as)
    init = (
        stored["init"]
        if stored
        else sweep.trace_init(trainer, seed, values, config, host.n_devices)
    )
    programs_s = time.time() - t0
    check_memory(init.out_info, config, host.n_devices, trainer, hosts)
    return Setup(
        config=config,
        script=script,
        run_dir=run_dir,
        host=host,
        hosts=hosts,
        trainer=trainer,
        seed=seed,
        values=values,
        init=init,
        template=init.out_info,
        stored_as=stored_as,
        stored=stored,
        programs_s=programs_s,
    )


def check_memory(template, config, n_devices: int, trainer: Trainer, hosts: int) -> None:
    """Refuses a runner state, or an epoch's rollout, larger than the memory that must hold it,
    naming the flags that size it."""
    leaves = jax.tree_util.tree_leaves_with_path(template)
    need = sum(x.size * np.dtype(x.dtype).itemsize for _, x in leaves)
    have = memory_here(n_devices) * n_devices
    if need > have:
        path, biggest = max(leaves, key=lambda leaf: leaf[1].size)
        sizes = set(biggest.shape[2:])  # [n_devices, runs, ...]
        values = {
            f.name: getattr(config, f.name)
            for f in dataclasses.fields(config)
            if f.name not in cli.RUN_CONTROL
        }
        flags = [
            cli.flag_name(k)
            for k, v in values.items()
            if not isinstance(v, (bool, str, float))
            and set(v if isinstance(v, tuple) else (v,)) & sizes - {0, 1}
        ]
        sized_by = " and ".join(flags) or "the network and buffer flags"
        raise cli.ConfigError(
            f"the runner state needs {need / 2**30:,.1f} GiB, more than the {have / 2**30:,.1f} "
            f"GiB of memory here; its largest array, {jax.tree_util.keystr(path)} "
            f"{tuple(biggest.shape)}, is sized by {sized_by}: make it smaller"
        )
    # An epoch holds its rollout at once: at least each transition's observation, next observation
    # and a few scalars (action, reward, ends, value, log-probability, advantage, target), 4 bytes
    # each.
    obs_shape = (
        getattr(trainer.env, "window_shape", None)
        or trainer.env.observation_space(trainer.env_params).shape
    )
    obs_size = math.prod(obs_shape)
    transitions = trainer.steps_per_epoch * sweep.n_runs(config) // hosts
    rollout = transitions * (2 * obs_size + 8) * 4
    cli.require(
        need + rollout <= have,
        f"an epoch's rollout needs at least {rollout / 2**30:,.1f} GiB ({transitions:,} "
        f"transitions of --num-envs {config.num_envs} x --num-steps {config.num_steps} x "
        f"{sweep.n_runs(config)} runs, observations of {obs_size:,} numbers), more than the "
        f"{have / 2**30:,.1f} GiB of memory here: lower --num-envs or --num-steps",
    )


def memory_here(n_devices: int) -> int:
    """Bytes one device may hold: an accelerator's limit, or on a CPU its share of the host's
    memory."""
    limit = (jax.local_devices()[0].memory_stats() or {}).get("bytes_limit", 0)
    return limit or os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // n_devices


def check_program_memory(compiled, n_devices: int, what: str, fix: str) -> None:
    """Refuses a compiled program that needs more memory than a device holds, before it runs (an
    out-of-memory error in the middle of a run would lose the epochs since its last checkpoint)."""
    stats = compiled.memory_analysis()
    if stats is None:  # a backend that does not tell
        return
    need = (
        stats.temp_size_in_bytes
        + stats.argument_size_in_bytes
        + stats.output_size_in_bytes
        - stats.alias_size_in_bytes
    )
    have = memory_here(n_devices)
    cli.require(
        need <= have,
        f"{what} needs {need / 2**30:,.1f} GiB per device, more than the {have / 2**30:,.1f} "
        f"GiB here: {fix}",
    )


def finished(setup: Setup, epoch: int) -> dict | None:
    """The summary of a run that --resume finds finished (nothing to train), else None."""
    summary = setup.run_dir / "summary.json"
    if epoch != setup.trainer.num_epochs or setup.config.eval_only or not summary.is_file():
        return None
    print(
        f"{setup.run_dir} finished at epoch {epoch}: nothing to train, its summary.json stays; "
        f"--eval-only --resume {setup.run_dir} evaluates it again",
        flush=True,
    )
    try:
        return json.loads(summary.read_text())
    except ValueError as error:
        raise cli.ConfigError(
            f"{summary} is not JSON ({error}); delete it, and --resume {setup.run_dir} "
            f"writes it again"
        ) from None


def start_outputs(setup: Setup, epoch: int) -> None:
    """A new run's config.json; a resumed run's metrics past its checkpoint dropped, its changed
    flags recorded."""
    config, run_dir, chief = setup.config, setup.run_dir, setup.host.is_chief
    if not config.resume:
        if chief:
            outputs.write_json(run_dir / "config.json", dataclasses.asdict(config), run_dir)
        return
    if chief and not config.eval_only:
        outputs.trim_metrics(run_dir / "metrics.jsonl", epoch)
        outputs.record_changes(run_dir, config, epoch)
    print(f"resumed {run_dir} at epoch {epoch}", flush=True)


def compile_programs(setup: Setup) -> Programs:
    """The run's programs: those an earlier run built and `executables` kept, or compiled here (and
    kept)."""
    trainer, config, n_devices = setup.trainer, setup.config, setup.host.n_devices
    k = loop.epochs_per_call(trainer.steps_per_epoch, trainer.num_epochs)
    if setup.stored:
        init, epochs, evaluate_runs = (setup.stored[name] for name in executables.PROGRAMS)
        epochs = None if config.eval_only else epochs
    else:
        with executables.compiled_afresh(setup.stored_as):
            init, epochs, evaluate_runs = build_programs(setup, k)
        if epochs is not None:
            executables.save(
                setup.stored_as, dict(init=init, epochs=epochs, evaluate=evaluate_runs)
            )
    # jax 0.10 cannot run a pmap over hosts compiled ahead of time: it compiles at first call
    if epochs is not None and setup.hosts == 1:
        check_program_memory(
            epochs,
            n_devices,
            f"an epoch of {config.num_envs} environments x {config.num_steps} "
            f"steps x {sweep.n_runs(config)} runs",
            "lower --num-envs or --num-steps",
        )
    check_program_memory(
        evaluate_runs,
        1,
        f"the evaluation of --eval-episodes {config.eval_episodes} x {sweep.n_runs(config)} runs",
        "lower --eval-episodes",
    )

    def evaluate(state, epoch):
        return np.asarray(evaluate_runs(first_device(trainer, state), setup.seed, np.int32(epoch)))

    return Programs(init=init, epochs=epochs, evaluate=evaluate, k=k)


def build_programs(setup: Setup, k: int) -> tuple:
    """Compiles init, the epochs (`k` a call) and the greedy evaluation. Init and evaluation compile
    on a second thread, while this one compiles the epochs; init runs once, so it compiles
    unoptimised, with the quicker emitters (`FAST_COMPILE`).

    Evaluation compiles optimized for image observations, where each step runs a conv torso that is
    many times slower unoptimized (on MinAtar the evaluations took as long as training), and
    unoptimized for the others: an MLP's evaluation takes a fraction of a second either way, and the
    optimized compile would lengthen the run's start."""
    trainer, config, n_devices = setup.trainer, setup.config, setup.host.n_devices
    env = trainer.env  # a ContextWindow (skip_transformer) observes windows of its raw observations
    raw_shape = (
        env.raw_obs_shape
        if hasattr(env, "raw_obs_shape")
        else env.observation_space(trainer.env_params).shape
    )
    images = len(raw_shape) >= 3
    act = devices.over_runs(
        lambda params, key: envs.evaluate(
            trainer.env, trainer.env_params, trainer.act, params, key, config.eval_episodes
        ),
        (0, 0),
    )

    # of every run, on the episodes of `epoch` (a named function names its program in profiles)
    def greedy_returns(params, seed, epoch):
        _, eval_key = sweep.run_keys(seed, config, n_devices)
        key = jax.random.fold_in(eval_key, epoch)
        return act(devices.unreplicate(params), sweep.eval_keys(key, config))

    evaluate_seeds = jax.jit(greedy_returns)

    # The second thread starts once the epochs are lowered: tracing and lowering hold Python's lock,
    # so its own would delay the epochs' compile, the longest. It only compiles: running a program
    # beside a compile once hung in XLA:CPU.
    epochs_lowered = threading.Event()

    def compile_init_and_eval():
        epochs_lowered.wait()
        params = jax.tree.map(
            lambda x: jax.ShapeDtypeStruct((1, *x.shape[1:]), x.dtype),
            jax.eval_shape(trainer.policy, setup.template),
        )
        evaluation = evaluate_seeds.lower(params, setup.seed, np.int32(0))
        init = setup.init.lower().compile(FAST_COMPILE)
        return init, evaluation.compile() if images else evaluation.compile(FAST_COMPILE)

    with ThreadPoolExecutor(1) as pool:
        side = pool.submit(compile_init_and_eval)
        epochs = (
            None
            if config.eval_only
            else devices.map_epoch(
                loop.chunk_epochs(trainer.epoch, k), n_devices, n_shared=1, n_mapped=2
            )
        )
        # jax 0.10 cannot run a pmap over hosts compiled ahead of time: it compiles at first call
        if epochs is not None and setup.hosts == 1:
            try:
                with sweep.inputs_stay_traced(config):
                    lowered = epochs.lower(setup.template, setup.values, 1)
            # a count past 32 bits, e.g. the learning-rate schedule's gradient steps
            except OverflowError:
                raise cli.ConfigError(
                    f"--total-steps {config.total_steps:,} makes a count of this run (its "
                    f"gradient steps: epochs x gradient steps per epoch) larger than 32-bit "
                    f"integers hold (2,147,483,647): lower --total-steps or the gradient "
                    f"steps per epoch"
                ) from None
            finally:
                epochs_lowered.set()
            epochs = lowered.compile()
        epochs_lowered.set()  # --eval-only, or several hosts: no epochs lowered here
        init, evaluate_runs = side.result()
    return init, epochs, evaluate_runs


def first_device(trainer: Trainer, state):
    """What `act` reads of every run (seed and member), as held by device 0: its shard of the
    device axis, `[1, runs, ...]` (taken as it lies: slicing would compile a program per leaf)."""

    def shard(x):  # a checkpoint's leaves (--eval-only) are numpy arrays
        return x.addressable_data(0) if isinstance(x, jax.Array) else x[:1]

    return jax.tree.map(shard, trainer.policy(state))


def run_epochs(
    setup: Setup,
    programs: Programs,
    logger: outputs.Logger,
    state,
    start_epoch: int,
    last_epoch: int,
) -> Progress:
    """The epochs up to `last_epoch`, in calls that end at each evaluation, checkpoint and the end.

    Each epoch's record is checked (a non-finite loss stops the run) and logged; a checkpoint is
    saved every --checkpoint-every epochs, at the end, and where the run stops early. Ctrl-C or
    SIGTERM stops after the running call, with a checkpoint."""
    config, trainer = setup.config, setup.trainer
    epoch, train_time, returns, record, reached, episodes = start_epoch, 0.0, None, {}, None, None
    with loop.StopOnInterrupt() as interrupt:
        while epoch < last_epoch and reached is None and not devices.any_host(interrupt.requested):
            # Run up to the next evaluation, checkpoint or end, at most k epochs.
            n = min(
                programs.k,
                last_epoch - epoch,
                config.checkpoint_every - epoch % config.checkpoint_every,
            )
            if config.eval_every:
                n = min(n, config.eval_every - epoch % config.eval_every)
            tick = time.time()
            state, metrics = programs.epochs(state, setup.values, n)
            records = loop.records(metrics, n)
            chunk_time, time_before = time.time() - tick, train_time
            train_time += chunk_time
            for j, record in enumerate(records):
                epoch += 1
                check_losses(setup, record, epoch)
                if record.get("episode/count", 0) > 0:
                    episodes = (epoch, record["episode/return"])
                steps_done = (epoch - start_epoch) * trainer.steps_per_epoch * sweep.n_runs(config)
                record = {
                    "epoch": epoch,
                    "env_steps": epoch * trainer.steps_per_epoch,
                    "sps": steps_done / (time_before + chunk_time * (j + 1) / n),
                    **record,
                }
                final = epoch == trainer.num_epochs
                if final or (config.eval_every and epoch % config.eval_every == 0):
                    returns = programs.evaluate(state, epoch)
                    record["eval/return"] = float(returns.mean())
                    record["eval/return_per_seed"] = returns.tolist()
                    if config.target_return is not None and returns.min() >= config.target_return:
                        reached = time.time()
                logger.log(record, force_print=final or "eval/return" in record)
            if reached is not None and setup.host.is_chief:
                print(
                    f"every seed reached --target-return {config.target_return:g} at epoch {epoch}",
                    flush=True,
                )
            if epoch == trainer.num_epochs or epoch % config.checkpoint_every == 0:
                save_checkpoint(setup, state, epoch)
    if devices.any_host(interrupt.requested):
        if epoch > start_epoch:
            save_checkpoint(setup, state, epoch)
            if setup.host.is_chief:
                print(
                    f"interrupted: saved epoch {epoch}; continue with --resume {setup.run_dir}",
                    flush=True,
                )
        raise SystemExit(interrupt.exit_code or 130)
    if epoch > start_epoch and epoch < trainer.num_epochs:
        save_checkpoint(setup, state, epoch)
    return Progress(
        state=state,
        epoch=epoch,
        record=record,
        returns=returns,
        train_time=train_time,
        reached=reached,
        episodes=episodes,
    )


def check_losses(setup: Setup, record: dict, epoch: int) -> None:
    """Any non-finite loss term stops the run (a NaN value loss reaches the policy loss only epochs
    later)."""
    diverged = [
        f"{k} is {v}" for k, v in record.items() if k.startswith("loss/") and not math.isfinite(v)
    ]
    episode_return = record.get("episode/return", 0.0)
    if diverged and record.get("episode/count", 0) > 0 and not math.isfinite(episode_return):
        # the episodes' returns sum the environment's raw rewards: no learning rate makes them
        # non-finite
        raise SystemExit(
            f"error: {', '.join(diverged)} at epoch {epoch}, and so is the return of the episodes "
            f"that ended (episode/return is {episode_return}): --env {setup.config.env} returned a "
            f"non-finite reward. Fix the environment; a lower --lr would not help"
        )
    if diverged:
        raise divergence(setup, f"{', '.join(diverged)} at epoch {epoch}: training diverged.")


def save_checkpoint(setup: Setup, state, epoch: int) -> None:
    """Every host takes part in the gather; the chief writes a finite state only."""
    whole = jax.device_get(devices.gather(state))
    bad = checkpoints.non_finite(whole)
    if bad:
        raise divergence(
            setup,
            f"the state at epoch {epoch} is not finite ({len(bad)} leaves, e.g. {bad[0]}): "
            f"training diverged; it was not saved.",
        )
    if setup.host.is_chief:
        directory = setup.run_dir / "checkpoints"
        with outputs.writing(directory / f"epoch_{epoch:06d}.npz", setup.run_dir):
            checkpoints.save(directory, whole, epoch, setup.config.keep_checkpoints)


def divergence(setup: Setup, what: str) -> SystemExit:
    """The end of a diverged run: what diverged, and how to go on from the last good checkpoint."""
    last = checkpoints.latest(setup.run_dir / "checkpoints")
    largest = 0.0
    # an unreadable checkpoint: the advice names it all the same
    with contextlib.suppress(cli.ConfigError):
        _, state = checkpoints.resume(setup.run_dir, setup.template, setup.hosts)
        params = jax.tree.leaves(setup.trainer.policy(state).params)
        largest = max(float(np.abs(np.asarray(x)).max(initial=0.0)) for x in params)
    advice = checkpoints.divergence_advice(setup.config, last, setup.run_dir, largest)
    return SystemExit(f"{what} {advice}")


def summarize(
    setup: Setup,
    programs: Programs,
    progress: Progress,
    start_epoch: int,
    compile_time: float,
    wall_start: float,
) -> dict:
    """The run's summary (summary.json), with the greedy return at its last epoch."""
    config, steps_per_epoch, epoch = setup.config, setup.trainer.steps_per_epoch, progress.epoch
    # no evaluation at the last epoch
    stale = progress.returns is None or "eval/return" not in progress.record
    returns = programs.evaluate(progress.state, epoch) if stale else progress.returns
    summary = {
        "eval_return": float(returns.mean()),
        "eval_return_per_seed": returns.tolist(),
        # the training episodes that ended in the newest epoch that had any (long episodes skip
        # epochs)
        "episode_return": progress.episodes[1] if progress.episodes else None,
        "episode_return_epoch": progress.episodes[0] if progress.episodes else None,
        "epoch": epoch,
        "env_steps": epoch * steps_per_epoch,
        "wall_time_s": time.time() - wall_start,
        "compile_time_s": compile_time,
        "programs_loaded": setup.stored is not None,
        "train_time_s": progress.train_time,
        "sps": (epoch - start_epoch)
        * steps_per_epoch
        * sweep.n_runs(config)
        / max(progress.train_time, 1e-9),
        # the whole run's rate by the wall clock: compile, evaluations and checkpoints included
        "wall_sps": (epoch - start_epoch)
        * steps_per_epoch
        * sweep.n_runs(config)
        / (time.time() - wall_start),
    }
    if progress.episodes is None:
        summary["episode_return_note"] = (
            f"no training episode ended in epochs {start_epoch + 1} to {epoch}"
        )
    if config.target_return is not None:
        summary["target_return"] = {
            "return": config.target_return,
            "reached": progress.reached is not None,
            **(
                {
                    "epoch": epoch,
                    "env_steps": epoch * steps_per_epoch,
                    "seconds": progress.reached - wall_start,
                }
                if progress.reached
                else {}
            ),
        }
    if config.sweep:  # member-major: the seeds of member 0, then of member 1, ...
        summary["sweep"] = [
            {**values, "eval_return": float(np.mean(r)), "eval_return_per_seed": r.tolist()}
            for values, r in zip(cli.sweep_members(config), returns.reshape(-1, config.num_seeds))
        ]
    return summary


# ----------------------------------------------------------------------------
# The command line
# ----------------------------------------------------------------------------
def main(config_cls, make_trainer: Callable, script: str, description: str, argv=None) -> dict:
    """A script's command line: its flags, then `launch`; returns the summary."""
    return launch(cli.parse_config(config_cls, argv, description), make_trainer, script).summary


def launch(config, make_trainer: Callable, script: str) -> Result:
    """`train` for the command line: a user's mistake (a `cli.ConfigError`) ends in one line,
    `error: ...`; any other exception keeps its traceback. Prints the final greedy return."""
    try:
        result = train(config, make_trainer, script)
    except cli.ConfigError as error:
        raise SystemExit(f"error: {error}") from None
    print(
        f"eval return {result.summary['eval_return']:.2f} (greedy, {config.eval_episodes} "
        "episodes)",
        flush=True,
    )
    return result


def enable_compile_cache() -> None:
    """JAX's persistent compilation cache in a user cache directory."""
    root = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    jax.config.update("jax_compilation_cache_dir", str(root / "jtrax" / "jax"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
