"""Test configuration shared by every test module.

Eight fake CPU devices are requested before JAX is imported anywhere so that sharding
tests can build `data/fsdp/tensor` meshes on a laptop; unsharded tests simply run on the
first device. Set AGENTJAX_TEST_DEVICES to change the count.
"""
import os

_flag = "--xla_force_host_platform_device_count"
if _flag not in os.environ.get("XLA_FLAGS", ""):
    count = os.environ.get("AGENTJAX_TEST_DEVICES", "8")
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_flag}={count}".strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402  (must come after XLA_FLAGS)
import pytest  # noqa: E402

jax.config.update("jax_enable_x64", False)


@pytest.fixture
def eight_devices():
    """The 8 fake CPU devices; skips when the process was started with fewer."""
    devices = jax.devices()
    if len(devices) < 8:
        pytest.skip("needs 8 devices (XLA_FLAGS=--xla_force_host_platform_device_count=8)")
    return devices[:8]
