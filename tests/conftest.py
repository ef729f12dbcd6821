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


@pytest.fixture(scope="session")
def jax_compile_cache(tmp_path_factory):
    """JAX's persistent compilation cache in a temporary directory for this session.

    Tests that compile the same program several times (e.g. several `train()`
    calls with one config) load it from here instead of recompiling it. The
    cache is reset first because JAX decides once per process whether to use
    one; the previous settings come back at the end of the session.
    """
    import jax
    from jax.experimental.compilation_cache import compilation_cache

    names = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs",
             "jax_persistent_cache_min_entry_size_bytes")
    before = {name: getattr(jax.config, name) for name in names}
    compilation_cache.reset_cache()
    jax.config.update("jax_compilation_cache_dir", str(tmp_path_factory.mktemp("jax_cache")))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    yield
    for name, value in before.items():
        jax.config.update(name, value)
    compilation_cache.reset_cache()
