"""Test configuration shared by every test module.

Eight fake CPU devices are requested before JAX is imported anywhere so that sharding
tests can build `data/fsdp/tensor` meshes on a laptop; unsharded tests simply run on the
first device. Set AGENTJAX_TEST_DEVICES to change the count. XLA compiles without
LLVM's costly passes, and a persistent compilation cache is shared by all tests and the
subprocesses they start.
"""
import os
import tempfile

_flag = "--xla_force_host_platform_device_count"
if _flag not in os.environ.get("XLA_FLAGS", ""):
    count = os.environ.get("AGENTJAX_TEST_DEVICES", "8")
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_flag}={count}".strip()
# The tests check what programs compute on tiny shapes, not how fast: LLVM's optimizing
# passes cost more compile time than they save there (the attention tests took 30% less
# time without them). The subprocesses the tests start inherit these flags.
for _fast_compile in ("--xla_backend_optimization_level=0",
                      "--xla_llvm_disable_expensive_passes=true"):
    if _fast_compile.split("=")[0] not in os.environ["XLA_FLAGS"]:
        os.environ["XLA_FLAGS"] += f" {_fast_compile}"
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Compiled programs are shared between tests, xdist workers and the subprocesses that
# end-to-end tests start: identical computations compile once per CI run.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR",
                      os.path.join(tempfile.gettempdir(), "agentjax-test-xla-cache"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")

import jax  # noqa: E402  (must come after XLA_FLAGS)
import pytest  # noqa: E402

jax.config.update("jax_enable_x64", False)
# Implicit rank promotion ([B] + [B, T] broadcasting to [B, B, T]...) hides shape bugs; every
# broadcast in the library and the tests is written out.
jax.config.update("jax_numpy_rank_promotion", "raise")


@pytest.fixture
def eight_devices():
    """The 8 fake CPU devices; skips when the process was started with fewer."""
    devices = jax.devices()
    if len(devices) < 8:
        pytest.skip("needs 8 devices (XLA_FLAGS=--xla_force_host_platform_device_count=8)")
    return devices[:8]

pytest_plugins = ["tests.engine_fixtures"]  # the shared tiny engine of the engine / agents / sglang tests


@pytest.fixture(scope="session")
def finished_run(tmp_path_factory):
    """tests.train.runs.FinishedRuns shared by every xdist worker of this session: a
    worker's base temp is a folder of the session's."""
    from tests.train.runs import FinishedRuns
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent
    return FinishedRuns(root / "finished-runs")


def pytest_collection_modifyitems(items):
    """Modules with end-to-end (`slow`) tests run first, each kept whole (its module
    fixtures set up once): with -n 2 the many short tests then fill in around the long
    runs, instead of one worker finishing a long run alone at the end."""
    has_slow = {item.module for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.module not in has_slow)
