"""Test setup: XLA flags (before jax is imported) and the tree under test on the path."""

import faulthandler
import os
import sys

# Two CPU devices for the multi-device tests. XLA:CPU's older per-operation code emitters compile
# the tests' programs in about half the time of its fusion emitters, and code generation in one
# piece is faster than split over threads when two test processes share the cores
# (bench/RESULTS.md); the scripts a test starts get the same flags (helpers.script_env).
for _flag in [
    "--xla_force_host_platform_device_count=2",
    "--xla_cpu_use_fusion_emitters=false",
    "--xla_cpu_parallel_codegen_split_count=1",
]:
    if _flag.split("=")[0] not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _flag).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

# The tree under test, not the one pip installed (a copy of the tree, as bench/dev/mutations.py
# makes, tests itself): first on this process's path and on that of every script a test starts.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))

import pytest  # noqa: E402

TEST_LIMIT_S = 600  # the slowest test takes about 3 minutes on a loaded 2-core CPU


@pytest.fixture(autouse=True)
def fail_a_hung_test():
    """A test still running after `TEST_LIMIT_S` prints every thread's stack and ends the run
    (exit status 1), so a deadlock fails CI in minutes instead of stalling it."""
    faulthandler.dump_traceback_later(TEST_LIMIT_S, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


@pytest.fixture(autouse=True)
def compile_without_optimizations(request, monkeypatch):
    """Tests compile with XLA's optimizations off, in this process and in the scripts they start:
    their programs run a few steps, so compiling takes nearly all their time, and unoptimized
    compiles take about half as long. The learning tests (marked `learning`) train for many
    epochs and keep the optimizations. Every other test compiles the same way, so a run that a
    test compares against bit for bit (a module fixture) was compiled as the test's own."""
    import jax

    fast = request.node.get_closest_marker("learning") is None
    monkeypatch.setenv("JAX_DISABLE_MOST_OPTIMIZATIONS", "1" if fast else "0")
    jax.config.update("jax_disable_most_optimizations", fast)
    yield


@pytest.fixture(scope="session", autouse=True)
def session_compile_cache(tmp_path_factory):
    """One JAX compilation cache for the whole session, in a temporary `$XDG_CACHE_HOME`: the test
    process and the scripts it starts (which read the same variable, `run.enable_compile_cache`)
    compile a program once and load it wherever it comes again, as in the runs of one config that a
    resume test makes. Programs that compile in under half a second are not written. The user's own
    cache is never touched."""
    import jax
    from jax.experimental.compilation_cache import compilation_cache

    from common import run

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):  # pytest -n: the workers of one run share one cache
        root = root.parent
    (root / "xdg_cache").mkdir(exist_ok=True)
    os.environ["XDG_CACHE_HOME"] = str(root / "xdg_cache")
    compilation_cache.reset_cache()  # JAX decides once per process where its cache is
    run.enable_compile_cache()
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
    yield


@pytest.fixture(scope="module", autouse=True)
def release_compiled_programs():
    """Drops JAX's in-memory caches of compiled programs after each test file: every live XLA:CPU
    program holds memory maps, and one process running the whole suite neared Linux's per-process
    limit (vm.max_map_count, 65530 by default), ending in a segfault."""
    yield
    import jax

    jax.clear_caches()
