import jax

import agentjax


def test_package_imports_and_fake_devices(eight_devices):
    assert agentjax.__version__
    assert len(eight_devices) == 8
    assert jax.default_backend() == "cpu"
