"""JaxEngine(attention="pallas_gpu" / "pallas_tpu"): the kernel paths (Pallas's
interpreters on CPU) give the full forwards' tokens and log-probs, keep deterministic
mode's bitwise batch invariance, and bad settings are refused."""
import sys

import jax
import numpy as np
import pytest
from flax import nnx

from agentjax.engine.protocol import GenerateRequest, SamplingParams
from agentjax.engine.jax.engine import JaxEngine, resolve_attention
from agentjax.models.paged_pallas import missing_backend
from tests.engine.jax.test_engine import _check_against_full_forward, _prompts
from tests.engine_fixtures import ENGINE_KWARGS
from tests.engine.jax.test_engine_deterministic import (DETERMINISTIC_KWARGS,
                                                        _alone_then_crowded)


@pytest.fixture(scope="module", params=["pallas_gpu", "pallas_tpu"])
def pallas_engine(request, tiny_model, tokenizer):
    if request.param == "pallas_gpu" and missing_backend() is not None:
        pytest.skip(f"the kernel cannot run: {missing_backend()}")
    engine = JaxEngine.from_model(tiny_model, tokenizer=tokenizer, attention=request.param,
                                  **DETERMINISTIC_KWARGS)
    # One program per rows and chunk width (block tables, no item counts): prefill at
    # 2 rows x {8, 32}, decode at 4 rows.
    assert engine.warmup() == 3
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def paged_engine(engine, tiny_model, tokenizer):
    """The shared engine where "auto" picked the pure-JAX path (CPU); on a GPU, where it
    picked the kernel, a pure-JAX one of the same shapes."""
    if engine.attention == "paged":
        yield engine
        return
    paged = JaxEngine.from_model(tiny_model, tokenizer=tokenizer, attention="paged",
                                 **ENGINE_KWARGS)
    yield paged
    paged.close()


def test_outputs_match_full_forwards_and_the_paged_engine(pallas_engine, paged_engine,
                                                          tiny_model, tokenizer):
    assert pallas_engine.attention.startswith("pallas") and paged_engine.attention == "paged"
    # Pallas's TPU interpreter takes ~10x the GPU one's time a decode step on CPU (it
    # simulates every DMA): 4 new tokens there still cross a decode round after prefill
    # in every row; the GPU kernel's interpreter decodes 12.
    new_tokens = 4 if pallas_engine.attention == "pallas_tpu" and jax.default_backend() != "tpu" else 12
    requests = [GenerateRequest(p, SamplingParams(temperature=t, max_new_tokens=new_tokens,
                                                  seed=3))
                for p, t in zip(_prompts(tokenizer), (0.0, 1.0, 0.7))]
    ours = pallas_engine.generate_sync(requests)
    theirs = paged_engine.generate_sync(requests)
    for request, [completion], [paged] in zip(requests, ours, theirs):
        _check_against_full_forward(tiny_model, request, completion)
        assert completion.output_ids == paged.output_ids


def test_deterministic_mode_is_bitwise_batch_invariant(pallas_engine, tokenizer):
    if pallas_engine.attention == "pallas_tpu" and missing_backend() is None:
        # The engine's invariance rests on the kernel's rows being bitwise independent
        # of each other, tested for the TPU kernel in tests/models
        # (test_a_row_is_bitwise_independent_of_the_other_rows); the rest is the engine's
        # own, run here on the GPU kernel's interpreter in a tenth of the TPU one's time.
        pytest.skip("run on the GPU kernel")
    alone, crowded = _alone_then_crowded(pallas_engine, tokenizer, crowd_seed=0)
    assert pallas_engine.stats["max_decode_batch"] >= 4
    assert alone == crowded


def test_kv_heads_sharded_over_a_mesh_run_on_their_devices(pallas_engine, tiny_model,
                                                           tokenizer, eight_devices):
    """Tensor parallelism: the pool's kv heads are split over "tensor", and each device's
    kernel takes its own heads (`over_kv_heads`), with the outputs of one device."""
    from agentjax.core.parallel import make_mesh, shard_params

    if pallas_engine.attention == "pallas_tpu" and missing_backend() is None:
        # The wiring is the kernels' own (kernel_mesh, over_kv_heads, tested per kernel
        # in tests/models); the GPU kernel's interpreter runs it in a tenth of the time.
        pytest.skip("run on the GPU kernel")
    mesh = make_mesh({"data": 1, "fsdp": 4, "tensor": 2}, devices=eight_devices)
    graphdef, params = nnx.split(tiny_model)
    request = GenerateRequest(_prompts(tokenizer)[1], SamplingParams(temperature=1.0, seed=3,
                                                                     max_new_tokens=6))
    [[reference]] = pallas_engine.generate_sync([request])
    with JaxEngine(graphdef, shard_params(params, mesh), tokenizer=tokenizer,
                   attention=pallas_engine.attention, **DETERMINISTIC_KWARGS) as sharded:
        assert sharded._device.kernel_mesh == {"mesh": mesh, "kv_head_axis": "tensor"}
        [[out]] = sharded.generate_sync([request])
    assert out.output_ids == reference.output_ids
    np.testing.assert_allclose(out.logprobs, reference.logprobs, atol=1e-4)
    assert pallas_engine._device.kernel_mesh == {}


def test_bad_settings_are_refused(tiny_model, tokenizer):
    with pytest.raises(ValueError, match="attention must be"):
        JaxEngine.from_model(tiny_model, tokenizer=tokenizer, attention="flash")
    with pytest.raises(ValueError, match="power of two >= 16"):
        JaxEngine.from_model(tiny_model, tokenizer=tokenizer, attention="pallas_gpu",
                             page_size=8)
    with pytest.raises(ValueError, match="multiple of 16"):
        JaxEngine.from_model(tiny_model, tokenizer=tokenizer, attention="pallas_tpu",
                             page_size=24)
    # "auto" picks the kernel only on a GPU (no program is compiled before a request).
    auto = JaxEngine.from_model(tiny_model, tokenizer=tokenizer, **ENGINE_KWARGS)
    assert auto.attention == ("pallas_gpu" if jax.default_backend() == "gpu" else "paged")
    auto.close()


def test_a_jax_without_the_triton_backend_falls_back_or_says_why(monkeypatch):
    """The Pallas Triton backend is deprecated: once a jax drops it, "auto" on a GPU runs
    the pure-JAX path with a warning, and asking for the kernel names the reason."""
    monkeypatch.setitem(sys.modules, "jax.experimental.pallas.triton", None)  # import fails
    with pytest.warns(UserWarning, match="no Pallas Triton backend"):
        assert resolve_attention("auto", "gpu", 64) == "paged"
    with pytest.raises(ValueError, match="'pallas_gpu': this jax has no Pallas Triton"):
        resolve_attention("pallas_gpu", "gpu", 64)
    assert resolve_attention("auto", "tpu", 64) == resolve_attention("paged", "gpu", 64) == "paged"
    # The TPU kernel runs where asked for, not yet under "auto" (no TPU has timed it).
    assert resolve_attention("pallas_tpu", "tpu", 64) == "pallas_tpu"
    monkeypatch.undo()
    assert resolve_attention("auto", "gpu", 64) == "pallas_gpu"


def test_auto_on_a_gpu_runs_pure_jax_for_pages_the_kernel_cannot_take():
    with pytest.warns(UserWarning, match="page_size must be a power of two >= 16, not 48"):
        assert resolve_attention("auto", "gpu", 48) == "paged"
    with pytest.raises(ValueError, match="'pallas_gpu': its page_size must be a power of two"):
        resolve_attention("pallas_gpu", "gpu", 48)
