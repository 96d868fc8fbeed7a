"""The memory plan against a hand count of Qwen2.5-3B under the hf preset (and of 3B and
7B with LoRA r = 16), and its activation estimate against the scratch XLA assigns to
compiled training steps."""
import dataclasses
import os

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from agentjax.config import default_config
from agentjax.core import parallel
from agentjax.models import Decoder, ModelConfig
from agentjax.models.decoder import layer_param_specs
from agentjax.models.lora import LoraConfig, adapter_param_count
from agentjax.rl.logprobs import token_logprobs
from agentjax.train.memory import CPU_RUNTIME_BYTES, CPU_SCRATCH, host_plan, memory_plan
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
# Keys and values of every page slot (rollout.kv_tokens: 2,048 a slot), layer and kv head.
SLOTS, TOKENS = 256, 4096
KV_ELEMENTS = SLOTS * 2048 * L * K * HD * 2
# One micro-batch of the update: 8 rows (algo.microbatch_size) of 4096 tokens under remat
# "full", bfloat16. Each layer keeps its input; the peak adds the backward of one layer,
# whose forward ("none": 4 [D], q and the attention output, k, v, 4 [F] in bfloat16 and a
# float32 logsumexp per head) is recomputed and differentiated: twice that set. The
# log-prob backward (two float32 [8, 512, V] logits chunks and the float32 [D, V] lm-head
# gradient) is the smaller transient.
MICRO = 8 * TOKENS
LAYER = MICRO * (2 * (4 * D + 2 * H * HD + 2 * K * HD + 4 * F) + 4 * H)
LOGITS = 2 * 8 * 512 * V * 4 + D * V * 4
ACTIVATIONS = L * MICRO * 2 * D + max(2 * LAYER, LOGITS)


def _rows(plan):
    return {row.name.split(" (")[0]: row.bytes for row in plan.rows}


def _hf(algo):
    """The hf preset planned for the GPU it is meant for, on this CPU: the attention
    kernel reads the pool in place (no decode page view)."""
    config = search_config(algo, "hf")
    config.rollout.engine_attention = "pallas_gpu"
    return config


def test_the_pure_jax_attention_plans_its_decode_page_view():
    """Off a GPU ("auto") a decode call copies the pages it reads: the largest decode
    item bucket, at most every slot at max_tokens and at most the pool. The hf preset's
    256 slots x 64 pages (16,384) are twice its pool (rollout.kv_tokens: 2,048 a slot),
    so the engine splits a decode round into calls within the pool's 8,192 pages."""
    config = search_config("grpo", "hf")
    assert config.rollout.engine_attention == "auto"
    mesh = parallel.make_mesh({"data": 1}, devices=jax.devices()[:1])
    plan = memory_plan(config, _qwen25_3b(config), mesh, device_bytes=None)
    rows = _rows(plan)
    assert rows["decode page view"] == KV_ELEMENTS * 2 == rows["KV pages"]
    assert "decode page view (1 x 8192 pages)" in plan.table()
    config.rollout.engine_lanes, config.rollout.engine_slots = 2, 96  # 48 a lane
    rows = _rows(memory_plan(config, _qwen25_3b(config), mesh, device_bytes=None))
    # 48 x 64 = 3,072 pages a lane, the bucket 3 x 2^10, within a lane's pool of 4,096
    assert rows["decode page view"] == 2 * 3072 * 64 * L * K * HD * 2 * 2
    for kernel in ("pallas_gpu", "pallas_tpu"):   # both kernels read the pool in place
        config.rollout.engine_attention = kernel
        assert "decode page view" not in _rows(memory_plan(config, _qwen25_3b(config), mesh,
                                                           device_bytes=None))


def test_hf_preset_on_one_device():
    config = _hf("grpo")
    assert (config.rollout.engine_slots, config.rollout.max_tokens) == (SLOTS, TOKENS)
    assert config.algo.kl_coef > 0 and config.rollout.engine_lanes == 1
    assert PARAMS == 3_085_938_688  # Qwen2.5-3B's published 3.09B
    mesh = parallel.make_mesh({"data": 1}, devices=jax.devices()[:1])
    plan = memory_plan(config, _qwen25_3b(config), mesh, device_bytes=141 * GIB)
    assert 2 * LAYER > LOGITS
    assert _rows(plan) == {
        "policy params": 4 * PARAMS, "initial params": 4 * PARAMS,
        "Adam moments": 8 * PARAMS, "KL reference": 4 * PARAMS,
        "engine weights": 2 * PARAMS, "engine weight swap": 2 * PARAMS,
        "KV pages": 2 * KV_ELEMENTS, "activations": ACTIVATIONS,
        # The running sum of the 10 micro-batches' gradients and the current one's.
        "gradients": 8 * PARAMS}
    assert plan.total == 32 * PARAMS + 2 * KV_ELEMENTS + ACTIVATIONS
    assert plan.total / GIB == pytest.approx(121.4, abs=0.05)  # 139.4 with 256 x 4,096 slots
    assert plan.fits
    plan.check()
    table = plan.table()
    assert "KV pages (8192 x 64 tokens, bfloat16)" in table and "141.00 GiB" in table
    assert "activations (one micro-batch: 32768 tokens, remat full)" in table


def test_ppo_critic_and_lanes():
    config = _hf("ppo")
    config.rollout.engine_lanes = 2
    config.algo.kl_coef = 0.0
    mesh = parallel.make_mesh({"data": 1}, devices=jax.devices()[:1])
    rows = _rows(memory_plan(config, _qwen25_3b(config), mesh, device_bytes=None))
    assert "KL reference" not in rows
    assert rows["critic + Adam"] == 3 * 4 * (PARAMS + D + 1)
    assert rows["engine weights"] == 2 * 2 * PARAMS
    assert rows["KV pages"] == 2 * KV_ELEMENTS  # the pages split over lanes


def test_dpo_keeps_its_reference_whatever_the_kl_coefficient():
    config = _hf("grpo")
    config.stage, config.algo.kl_coef = "dpo", 0.0
    mesh = parallel.make_mesh({"data": 1}, devices=jax.devices()[:1])
    rows = _rows(memory_plan(config, _qwen25_3b(config), mesh, device_bytes=None))
    assert rows["DPO reference"] == 4 * PARAMS and "KL reference" not in rows


def test_async_rollouts_stage_one_more_float32_copy():
    config = _hf("grpo")
    config.rollout.mode = "async"
    mesh = parallel.make_mesh({"data": 1}, devices=jax.devices()[:1])
    rows = _rows(memory_plan(config, _qwen25_3b(config), mesh, device_bytes=None))
    assert rows["staged weights"] == 4 * PARAMS


def test_fsdp_divides_params_not_the_page_pool(eight_devices):
    config = _hf("grpo")
    mesh = parallel.make_mesh({"data": 1, "fsdp": 8, "tensor": 1}, devices=eight_devices)
    rows = _rows(memory_plan(config, _qwen25_3b(config), mesh, device_bytes=None))
    shard = EMBED_SHARDED // 8 + REPLICATED
    assert rows["policy params"] == 4 * shard and rows["Adam moments"] == 8 * shard
    assert rows["engine weights"] == 2 * shard
    # Any row may read any page: the pool is whole on every data / fsdp device (the
    # tensor axis divides its kv heads).
    assert rows["KV pages"] == 2 * KV_ELEMENTS
    # A micro-batch's rows over data x fsdp, the lm-head gradient's hidden axis over fsdp.
    assert rows["activations"] == ACTIVATIONS // 8 and rows["gradients"] == 8 * shard


def test_does_not_fit_names_the_knobs():
    config = _hf("grpo")
    mesh = parallel.make_mesh({"data": 1}, devices=jax.devices()[:1])
    plan = memory_plan(config, _qwen25_3b(config), mesh, device_bytes=80 * GIB)
    assert not plan.fits
    with pytest.raises(ValueError, match="does not fit") as error:
        plan.check()
    message = str(error.value)
    for knob in ("rollout.engine_slots", "rollout.max_tokens", "mesh.fsdp"):
        assert knob in message
    assert "121.4 GiB per device" in message and "80.0 GiB" in message


def test_unknown_device_memory_is_not_checked():
    config = search_config("grpo", "test")
    mesh = parallel.make_mesh({"data": 1}, devices=jax.devices()[:1])
    plan = memory_plan(config, _qwen25_3b(config), mesh)  # CPU: no bytes_limit
    assert plan.device_bytes is None and plan.fits
    plan.check()
    assert "not checked" in plan.table()


def test_a_micro_batch_that_cannot_fit_stops_the_run_naming_its_knobs():
    config = _hf("grpo")
    config.algo.microbatch_size = 0  # the whole minibatch of 80 rows at once
    mesh = parallel.make_mesh({"data": 1}, devices=jax.devices()[:1])
    plan = memory_plan(config, _qwen25_3b(config), mesh, device_bytes=141 * GIB)
    with pytest.raises(ValueError, match="does not fit") as error:
        plan.check()
    assert ("activations (one micro-batch: 327680 tokens, remat full) "
            f"{_rows(plan)['activations'] / GIB:.1f} GiB: lower algo.microbatch_size (or "
            "set algo.micro_tokens);") in str(error.value)
    # The gradients of the one micro-batch are not summed: a single float32 copy.
    assert _rows(plan)["gradients"] == 4 * PARAMS
    config.model.remat = "none"
    plan = memory_plan(config, _qwen25_3b(config), mesh, device_bytes=141 * GIB)
    with pytest.raises(ValueError, match=r"remat none\) [\d.]+ GiB: lower "
                                         r"algo.microbatch_size .*, model.remat='full'"):
        plan.check()


def test_token_micro_batches_and_the_remat_policy_of_their_length():
    config = _hf("grpo")
    config.model.remat, config.algo.microbatch_size = "auto", 0
    config.algo.micro_tokens = 32768
    mesh = parallel.make_mesh({"data": 1}, devices=jax.devices()[:1])
    rows = {row.name: row for row in memory_plan(config, _qwen25_3b(config), mesh,
                                                 device_bytes=None).rows}
    # rollout.max_tokens=4096 is where "auto" turns to recomputing each layer.
    assert rows["activations (one micro-batch: 32768 tokens, remat auto: full_save_attention)"].knobs == \
        "lower algo.micro_tokens"
    assert "gradients (float32, summed over micro-batches)" in rows
    # Chunks of 4096 positions: the logits of the log-prob backward are the peak.
    config.model.logprob_chunk = 4096
    [row] = [row for row in memory_plan(config, _qwen25_3b(config), mesh,
                                        device_bytes=None).rows
             if row.name.startswith("activations")]
    assert row.knobs == "lower algo.micro_tokens, lower model.logprob_chunk"
    config.rollout.max_tokens = 2048
    names = [row.name for row in memory_plan(config, _qwen25_3b(config), mesh,
                                             device_bytes=None).rows]
    assert "activations (one micro-batch: 32768 tokens, remat auto: none)" in names


# The tiny decoder of the comparisons with XLA: float32 (XLA:CPU computes bfloat16
# elementwise work in float32 and keeps those copies, 1.5-2.9x the plan), two layers so
# that "none" and "full" differ, a vocabulary small enough that a log-prob chunk is not
# the peak.
TINY = ModelConfig(arch="qwen2", vocab_size=512, hidden_size=64, intermediate_size=256,
                   num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16, qkv_bias=True,
                   tie_embeddings=True)
ROWS, CHUNK = 2, 128
# XLA's temp bytes / the plan's activations, measured at T = 256 and 512: 1.42-1.46 under
# "none" (XLA:CPU keeps every elementwise result unfused: 6 [T, F] buffers a layer where
# the plan counts 4, 9 [T, D] for 4), 0.98-1.00 under "full" (each layer's input, then
# one layer recomputed and differentiated), 1.17-1.21 under "none" with the dense
# attention's T x T scores.
AGREEMENT = (0.9, 1.6)


@pytest.fixture
def blockwise():
    """TINY with the blockwise attention, in blocks small enough that a tile's scratch
    (rows x heads x block^2 float32, not counted per token) stays small beside the
    activations."""
    return dataclasses.replace(TINY, attention="blockwise", attention_block=32)


def _compiled_scratch(model_config: ModelConfig, seq: int) -> int:
    """Temp bytes XLA:CPU assigns to a forward-backward of ROWS x `seq` tokens: the
    decoder, chunked log-probs of the targets, gradients of every param (the step's
    outputs, so the scratch is the activations)."""
    graphdef, params = nnx.split(nnx.eval_shape(lambda: Decoder(model_config,
                                                               rngs=nnx.Rngs(0))))

    def loss(params, tokens, positions, segment_ids):
        model = nnx.merge(graphdef, params)
        hidden, _ = model(tokens, positions, segment_ids)
        logp, _ = token_logprobs(hidden, model.lm_head_weight(), tokens, chunk_size=CHUNK)
        return -(logp * segment_ids).sum()

    ints = jax.ShapeDtypeStruct((ROWS, seq), jnp.int32)
    # Optimization level 0 halves the compile time; the buffers it assigns are the same.
    compiled = jax.jit(jax.value_and_grad(loss)).lower(params, ints, ints, ints).compile(
        {"xla_backend_optimization_level": 0})
    return compiled.memory_analysis().temp_size_in_bytes


def _planned(model_config: ModelConfig, seq: int) -> int:
    """The plan's activations of that step: one micro-batch of ROWS rows of `seq`."""
    config = default_config()
    config.rollout.prompts_per_step, config.rollout.group_size = ROWS, 1
    config.rollout.max_tokens, config.model.logprob_chunk = seq, CHUNK
    mesh = parallel.make_mesh({"data": 1}, devices=jax.devices()[:1])
    return _rows(memory_plan(config, model_config, mesh))["activations"]


@pytest.mark.parametrize("remat", ["none", "full", "full_save_attention"])
def test_activations_agree_with_compiled_steps_and_grow_linearly(remat, blockwise):
    model_config = dataclasses.replace(blockwise, remat=remat)
    compiled = [_compiled_scratch(model_config, seq) for seq in (256, 512)]
    planned = [_planned(model_config, seq) for seq in (256, 512)]
    for ours, xla in zip(planned, compiled):
        assert AGREEMENT[0] <= xla / ours <= AGREEMENT[1]
    assert planned[1] == 2 * planned[0]
    # Twice the tokens, twice the scratch (the dense attention's T x T scores make it
    # 3.1x under "none", 3.6x under "full"), less buffers of the params' size that do
    # not grow (gradient accumulators).
    assert 1.8 <= compiled[1] / compiled[0] <= 2.0


def test_dense_attention_activations_count_the_scores():
    model_config = dataclasses.replace(TINY, remat="none", attention="dense")
    ratio = _compiled_scratch(model_config, 512) / _planned(model_config, 512)
    assert AGREEMENT[0] <= ratio <= AGREEMENT[1]
    # The scores dominate at this length: with a blockwise attention the plan is 3.8x
    # smaller.
    assert _planned(model_config, 512) > 3 * _planned(
        dataclasses.replace(model_config, attention="blockwise"), 512)


# Qwen2.5-7B (untied lm-head): its published 7.62B parameters.
V7, D7, L7, H7, K7, F7 = 152064, 3584, 28, 28, 4, 18944
PARAMS_7B = (2 * V7 * D7 + L7 * (D7 * H7 * HD + 2 * D7 * K7 * HD + H7 * HD * D7 + 3 * D7 * F7)
             + L7 * (2 * D7 + H7 * HD + 2 * K7 * HD) + D7)
RANK = 16
# r x (d_in + d_out) per adapted projection and layer: q and o [3584 <-> 3584], k and v
# [3584 -> 512], gate, up and down [3584 <-> 18944].
LORA_7B = L7 * RANK * (2 * (D7 + H7 * HD) + 2 * (D7 + K7 * HD) + 3 * (D7 + F7))


def _lora_model(config, V, D, L, H, K, F, tied):
    config.model.lora.rank = RANK
    return ModelConfig(arch="qwen2", vocab_size=V, hidden_size=D, intermediate_size=F,
                       num_layers=L, num_heads=H, num_kv_heads=K, head_dim=HD,
                       tie_embeddings=tied, qkv_bias=True, lora=LoraConfig(rank=RANK),
                       **model_precision(config))


def test_lora_qwen25_7b_on_one_h200():
    assert PARAMS_7B == 7_615_616_512 and LORA_7B == 40_370_176
    config = _hf("grpo")
    model_config = _lora_model(config, V7, D7, L7, H7, K7, F7, tied=False)
    assert model_config.param_dtype == "bfloat16"  # the frozen base, in the compute dtype
    assert adapter_param_count(layer_param_specs(model_config), model_config.lora) == LORA_7B
    mesh = parallel.make_mesh({"data": 1}, devices=jax.devices()[:1])
    plan = memory_plan(config, model_config, mesh, device_bytes=141 * GIB)
    # Under remat "full" a layer keeps its input; its recomputed backward also holds
    # x A [r] of each of the 7 projections (bfloat16).
    micro = 8 * TOKENS
    layer = micro * (2 * (4 * D7 + 2 * H7 * HD + 2 * K7 * HD + 4 * F7 + 7 * RANK) + 4 * H7)
    logits = 2 * 8 * 512 * V7 * 4 + D7 * V7 * 4
    assert 2 * layer > logits
    kv = SLOTS * 2048 * L7 * K7 * HD * 2  # rollout.kv_tokens of the hf preset
    assert _rows(plan) == {
        "frozen base": 2 * PARAMS_7B, "adapters": 4 * LORA_7B, "initial adapters": 4 * LORA_7B,
        "Adam moments": 8 * LORA_7B, "KL reference": 0,
        "engine weights": 2 * PARAMS_7B, "engine weight swap": 2 * PARAMS_7B,
        "KV pages": 2 * kv, "activations": L7 * micro * 2 * D7 + 2 * layer,
        "gradients": 8 * LORA_7B}
    assert plan.total / GIB == pytest.approx(89.6, abs=0.05) and plan.fits
    assert "KL reference (the base, adapters off)" in plan.table()


def test_lora_qwen25_3b_fits_one_80gb_gpu_with_a_critic():
    config = _hf("ppo")
    model_config = _lora_model(config, V, D, L, H, K, F, tied=True)
    trainable = L * RANK * (2 * (D + H * HD) + 2 * (D + K * HD) + 3 * (D + F))
    mesh = parallel.make_mesh({"data": 1}, devices=jax.devices()[:1])
    plan = memory_plan(config, model_config, mesh, device_bytes=80 * GIB)
    rows = _rows(plan)
    assert rows["frozen base"] == 2 * PARAMS and rows["adapters"] == 4 * trainable
    # The critic: its own adapters and value head, and their Adam moments; the trunk
    # is the policy's frozen base.
    assert rows["critic + Adam"] == 3 * 4 * (trainable + D + 1)
    assert plan.fits, plan.table()


def test_on_the_host_the_plan_adds_the_process_and_checks_the_host_memory():
    config = search_config("grpo", "test")
    mesh = parallel.make_mesh({"data": 1}, devices=jax.devices()[:1])
    plan = memory_plan(config, _qwen25_3b(config), mesh)
    host = host_plan(plan)
    assert host.rows[:len(plan.rows)] == plan.rows
    resident = _rows(host)["this process so far"]
    assert 0 < resident < 64 * GIB  # this pytest process, measured
    assert _rows(host)["XLA:CPU scratch"] == round(CPU_SCRATCH * _rows(plan)["activations"])
    assert _rows(host)["XLA:CPU runtime and compiled programs"] == CPU_RUNTIME_BYTES
    assert host.device_bytes == os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert "host (CPU) memory" in host.table()
    # 8 CPU devices of one process hold 8 times the per-device rows in one memory.
    eight = host_plan(plan, devices=8)
    assert _rows(eight)["KV pages"] == 8 * _rows(plan)["KV pages"]
    # A host too small stops the run, naming the rows and their knobs.
    with pytest.raises(ValueError, match=r"one host \(CPU\) has 1.0 GiB") as error:
        host_plan(plan, host_bytes=GIB).check()
    assert "activations (an SFT / pretraining batch" in str(error.value)
    assert "lower sft.batch_size" in str(error.value)


def test_an_sft_batch_larger_than_the_rl_micro_batch_is_the_planned_peak():
    config = _hf("grpo")  # micro-batches of 8 x 4096 tokens
    mesh = parallel.make_mesh({"data": 1}, devices=jax.devices()[:1])
    config.sft.steps, config.sft.batch_size = 10, 16  # 16 x 4096 tokens, trained whole
    rows = {row.name: row for row in memory_plan(config, _qwen25_3b(config), mesh,
                                                 device_bytes=None).rows}
    row = rows["activations (an SFT / pretraining batch: 65536 tokens, remat full)"]
    assert row.knobs == "lower sft.batch_size and pretrain.batch_size"
    config.sft.batch_size = 4  # smaller than the RL micro-batch: that stays the peak
    names = [row.name for row in memory_plan(config, _qwen25_3b(config), mesh,
                                             device_bytes=None).rows]
    assert "activations (one micro-batch: 32768 tokens, remat full)" in names
    config.stage = "sft"  # no RL update follows: its micro-batch is not planned
    names = [row.name for row in memory_plan(config, _qwen25_3b(config), mesh,
                                             device_bytes=None).rows]
    assert "activations (an SFT / pretraining batch: 16384 tokens, remat full)" in names


def test_the_accelerator_sized_python_recipe_stops_on_a_24_gb_host():
    """configs/grpo_python.py:hf with SmolLM2-135M on a 24 GB CPU host (killed by the
    kernel before the host was planned) stops naming its largest rows' knobs;
    configs/real_python.py fits."""
    from configs import grpo_python, real_python
    from tests.train.test_real_recipe import SMOLLM2

    mesh = parallel.make_mesh({"data": 1}, devices=jax.devices()[:1])
    for recipe, fits in ((grpo_python, False), (real_python, True)):
        config = recipe.get_config("hf" if recipe is grpo_python else "cpu")
        model_config = ModelConfig.from_hf(SMOLLM2, **model_precision(config))
        plan = host_plan(memory_plan(config, model_config, mesh), host_bytes=24 * 10 ** 9)
        assert plan.fits == fits, plan.table()
    with pytest.raises(ValueError, match="does not fit") as error:
        host_plan(memory_plan(grpo_python.get_config("hf"), ModelConfig.from_hf(
            SMOLLM2, **model_precision(grpo_python.get_config("hf"))), mesh),
            host_bytes=24 * 10 ** 9).check()
    assert "rollout.engine_slots" in str(error.value)
