"""The memory plan against a hand count of Qwen2.5-3B under the hf preset."""
import jax
import pytest

from agentjax.core import parallel
from agentjax.models import ModelConfig
from agentjax.train.memory import memory_plan
from agentjax.config.presets import search_config
from agentjax.train.precision import model_precision

GIB = 2 ** 30
V, D, L, H, K, HD, F = 151936, 2048, 36, 16, 2, 128, 11008


def _qwen25_3b(config):
    return ModelConfig(arch="qwen2", vocab_size=V, hidden_size=D, intermediate_size=F,
                       num_layers=L, num_heads=H, num_kv_heads=K, head_dim=HD,
                       tie_embeddings=True, qkv_bias=True, **model_precision(config))


# Parameters by how FSDP shards them: matrices split along `embed`, norms and biases
# (no embed axis) replicated.
EMBED_SHARDED = V * D + L * (D * H * HD + 2 * D * K * HD + H * HD * D + 3 * D * F)
REPLICATED = L * (2 * D + H * HD + 2 * K * HD) + D
PARAMS = EMBED_SHARDED + REPLICATED
# Keys and values of every slot, token, layer and kv head, plus an int32 length per slot.
SLOTS, TOKENS = 256, 4096
KV_ELEMENTS = SLOTS * TOKENS * L * K * HD * 2


def _rows(plan):
    return {row.name.split(" (")[0]: row.bytes for row in plan.rows}


def test_hf_preset_on_one_device():
    config = search_config("grpo", "hf")
    assert (config.rollout.engine_slots, config.rollout.max_tokens) == (SLOTS, TOKENS)
    assert config.algo.kl_coef > 0 and config.rollout.engine_lanes == 1
    assert PARAMS == 3_085_938_688  # Qwen2.5-3B's published 3.09B
    mesh = parallel.make_mesh({"data": 1}, devices=jax.devices()[:1])
    plan = memory_plan(config, _qwen25_3b(config), mesh, device_bytes=141 * GIB)
    assert _rows(plan) == {
        "policy params": 4 * PARAMS, "initial params": 4 * PARAMS,
        "Adam moments": 8 * PARAMS, "KL reference": 4 * PARAMS,
        "engine weights": 2 * PARAMS, "engine weight swap": 2 * PARAMS,
        "KV cache": 2 * KV_ELEMENTS + 4 * SLOTS}
    assert plan.total == 24 * PARAMS + 2 * KV_ELEMENTS + 4 * SLOTS
    assert plan.total / GIB == pytest.approx(105.0, abs=0.05)
    assert plan.fits
    plan.check()
    assert "KV cache" in plan.table() and "141.00 GiB" in plan.table()


def test_ppo_critic_and_lanes():
    config = search_config("ppo", "hf")
    config.rollout.engine_lanes = 2
    config.algo.kl_coef = 0.0
    mesh = parallel.make_mesh({"data": 1}, devices=jax.devices()[:1])
    rows = _rows(memory_plan(config, _qwen25_3b(config), mesh, device_bytes=None))
    assert "KL reference" not in rows
    assert rows["critic + Adam"] == 3 * 4 * (PARAMS + D + 1)
    assert rows["engine weights"] == 2 * 2 * PARAMS
    assert rows["KV cache"] == 2 * KV_ELEMENTS + 4 * SLOTS  # the slots split over lanes


def test_dpo_keeps_its_reference_whatever_the_kl_coefficient():
    config = search_config("grpo", "hf")
    config.stage, config.algo.kl_coef = "dpo", 0.0
    mesh = parallel.make_mesh({"data": 1}, devices=jax.devices()[:1])
    rows = _rows(memory_plan(config, _qwen25_3b(config), mesh, device_bytes=None))
    assert rows["DPO reference"] == 4 * PARAMS and "KL reference" not in rows


def test_async_rollouts_stage_one_more_float32_copy():
    config = search_config("grpo", "hf")
    config.rollout.mode = "async"
    mesh = parallel.make_mesh({"data": 1}, devices=jax.devices()[:1])
    rows = _rows(memory_plan(config, _qwen25_3b(config), mesh, device_bytes=None))
    assert rows["staged weights"] == 4 * PARAMS


def test_fsdp_divides_params_and_data_parallel_divides_the_cache(eight_devices):
    config = search_config("grpo", "hf")
    mesh = parallel.make_mesh({"data": 1, "fsdp": 8, "tensor": 1}, devices=eight_devices)
    rows = _rows(memory_plan(config, _qwen25_3b(config), mesh, device_bytes=None))
    shard = EMBED_SHARDED // 8 + REPLICATED
    assert rows["policy params"] == 4 * shard and rows["Adam moments"] == 8 * shard
    assert rows["engine weights"] == 2 * shard
    assert rows["KV cache"] == (2 * KV_ELEMENTS + 4 * SLOTS) // 8


def test_does_not_fit_names_the_knobs():
    config = search_config("grpo", "hf")
    mesh = parallel.make_mesh({"data": 1}, devices=jax.devices()[:1])
    plan = memory_plan(config, _qwen25_3b(config), mesh, device_bytes=80 * GIB)
    assert not plan.fits
    with pytest.raises(ValueError, match="does not fit") as error:
        plan.check()
    message = str(error.value)
    for knob in ("rollout.engine_slots", "rollout.max_tokens", "mesh.fsdp"):
        assert knob in message
    assert "105.0 GiB per device" in message and "80.0 GiB" in message


def test_unknown_device_memory_is_not_checked():
    config = search_config("grpo", "test")
    mesh = parallel.make_mesh({"data": 1}, devices=jax.devices()[:1])
    plan = memory_plan(config, _qwen25_3b(config), mesh)  # CPU: no bytes_limit
    assert plan.device_bytes is None and plan.fits
    plan.check()
    assert "not checked" in plan.table()
