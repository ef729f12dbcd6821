"""Where a process's seconds go: runs a script under timers and writes one JSON object of phases.

    python bench/peers/phases.py OUT.json --import jax,common.run -- algos/ppo_joint.py --seed 0 ...
    bench/.peer-venv/bin/python bench/peers/phases.py OUT.json --import jax,rejax -- \
        bench/peers/rejax_ppo.py ...

Phases, in seconds: `import` (the modules named, imported before the script
runs), `devices` (jax.devices(): the backend set up), and `script` (the
script from its first line to its end). `programs` holds, per compiled
function, what jax.monitoring reports: trace (Python to jaxpr), lower (jaxpr
to MLIR) and compile (XLA, or a persistent-cache hit); programs compiled on
two threads at once overlap in time. For our scripts (common.run is
imported) also the wall time of `prepare` (and `prepare_programs`, its part spent
on the programs: loading those an earlier run stored, or tracing init), `compile_programs`,
every `evaluate` and `save_checkpoint` call. `t0` and `t_end` (time.time()) let a
driver that timed the whole process find the interpreter's start-up.

ppo.py runs both of its sides under it: ours in the project venv, the Rejax
driver in the peer venv, which finds rejax_common.py because this file's
folder, which holds both, is sys.path[0].
"""

import time

T0 = time.time()

import argparse  # noqa: E402
import collections  # noqa: E402
import functools  # noqa: E402
import importlib  # noqa: E402
import json  # noqa: E402
import runpy  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

EVENTS = {
    "/jax/core/compile/jaxpr_trace_duration": "trace",
    "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower",
    "/jax/core/compile/backend_compile_duration": "compile",
}


def timed(phases: dict, name: str, fn):
    """fn, adding the seconds of each call to phases[name]."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        start = time.time()
        try:
            return fn(*args, **kwargs)
        finally:
            phases[name] = phases.get(name, 0.0) + time.time() - start

    return wrapper


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument(
        "--import", dest="modules", default="jax", help="comma-separated modules to import first"
    )
    p.add_argument("script")
    p.add_argument("args", nargs=argparse.REMAINDER)
    args = p.parse_args()
    phases: dict = {"t0": T0}
    start = time.time()
    for name in args.modules.split(","):
        importlib.import_module(name)
    phases["import"] = time.time() - start
    import jax
    from jax import monitoring

    start = time.time()
    jax.devices()
    phases["devices"] = time.time() - start
    programs = collections.defaultdict(lambda: collections.defaultdict(float))

    def listen(event, duration, **kwargs):
        if event in EVENTS:
            programs[kwargs.get("fun_name", "?")][EVENTS[event]] += duration

    monitoring.register_event_duration_secs_listener(listen)
    if "common.run" in sys.modules:
        run = sys.modules["common.run"]
        run.prepare = timed(phases, "prepare", run.prepare)
        # prepare's share of the programs (summary.json's compile_time_s counts it): the stored
        # programs' key and load, or init traced
        run.executables.key = timed(phases, "prepare_programs", run.executables.key)
        run.executables.load = timed(phases, "prepare_programs", run.executables.load)
        run.sweep.trace_init = timed(phases, "prepare_programs", run.sweep.trace_init)
        run.save_checkpoint = timed(phases, "checkpoint", run.save_checkpoint)
        compile_programs = run.compile_programs

        def compile_and_time_evaluations(setup):
            programs_ = compile_programs(setup)
            return programs_._replace(evaluate=timed(phases, "evaluate", programs_.evaluate))

        run.compile_programs = timed(phases, "compile_programs", compile_and_time_evaluations)
    sys.argv = [args.script, *args.args]
    start = time.time()
    try:
        runpy.run_path(args.script, run_name="__main__")
    finally:
        phases.update(script=time.time() - start, programs=programs, t_end=time.time())
        Path(args.out).write_text(json.dumps(phases))


if __name__ == "__main__":
    main()
