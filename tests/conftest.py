"""Test setup: two forced CPU devices (before jax is imported) and the repo on sys.path."""
import faulthandler
import os
import sys

_FLAG = "--xla_force_host_platform_device_count=2"
if _FLAG not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _FLAG).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import pytest  # noqa: E402

TEST_LIMIT_S = 600  # the slowest test takes about 3 minutes on a loaded 2-core CPU


@pytest.fixture(autouse=True)
def fail_a_hung_test():
    """A test still running after `TEST_LIMIT_S` prints every thread's stack and ends the run
    (exit status 1), so a deadlock fails CI in minutes instead of stalling it."""
    faulthandler.dump_traceback_later(TEST_LIMIT_S, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


@pytest.fixture(scope="session", autouse=True)
def no_persistent_compile_cache():
    """The test process compiles without JAX's persistent compilation cache.

    With it, jaxlib 0.10 twice killed the whole run with a segmentation fault inside
    `executable.serialize()` (writing a cache entry, late in the suite, at a different
    test each time). Tests of the cache itself run scripts in subprocesses with a
    cache directory of their own (tests/test_compile_cache.py).
    """
    import jax

    jax.config.update("jax_enable_compilation_cache", False)
    yield


@pytest.fixture(scope="module", autouse=True)
def release_compiled_programs():
    """Drops JAX's in-memory caches of compiled programs after each test file: every live XLA:CPU
    program holds memory maps, and one process running the whole suite neared Linux's per-process
    limit (vm.max_map_count, 65530 by default), ending in a segfault."""
    yield
    import jax

    jax.clear_caches()
