"""The devices a run's mesh spans (config key `devices`)."""
import jax
import pytest

from agentjax.config import ConfigError, presets
from agentjax.train.runtime import Runtime


def _mesh(tmp_path, **mesh):
    config = presets.search_config("grpo", "test")
    config.rollout.prompts_per_step = 4  # 8 rows: they divide over 8 devices
    for key, value in mesh.items():
        (config if key == "devices" else config.mesh)[key] = value
    return Runtime.start(config, str(tmp_path), tracked=False).mesh


def test_the_mesh_spans_every_device_by_default_or_the_first_n(tmp_path, eight_devices):
    assert list(_mesh(tmp_path).devices.flat) == eight_devices
    assert dict(_mesh(tmp_path, devices=1).shape) == {"data": 1, "fsdp": 1, "tensor": 1}
    mesh = _mesh(tmp_path, devices=4, fsdp=2)
    assert dict(mesh.shape) == {"data": 2, "fsdp": 2, "tensor": 1}
    assert list(mesh.devices.flat) == eight_devices[:4]


def test_more_devices_than_the_process_has_is_an_error(tmp_path):
    count = jax.device_count()
    with pytest.raises(ConfigError, match=rf"^config key 'devices' is {count + 1}; this "
                                          rf"process has only {count} cpu device\(s\)$"):
        _mesh(tmp_path, devices=count + 1)
