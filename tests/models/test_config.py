"""ModelConfig <-> HF config dicts, rope scaling against a float64 reference, errors."""
import dataclasses
import math

import numpy as np
import pytest

from agentjax.models.config import ModelConfig, RopeConfig

QWEN25_3B = {  # the fields of Qwen2.5-3B-Instruct's config.json (transformers 4 era)
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_act": "silu",
    "hidden_size": 2048, "intermediate_size": 11008, "num_attention_heads": 16,
    "num_hidden_layers": 36, "num_key_value_heads": 2, "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0, "rope_scaling": None, "tie_word_embeddings": True,
    "vocab_size": 151936, "max_position_embeddings": 32768, "use_sliding_window": False,
    "sliding_window": 32768, "max_window_layers": 70, "bos_token_id": 151643,
    "eos_token_id": 151645, "torch_dtype": "bfloat16",
}
LLAMA31_8B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
    "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
    "num_hidden_layers": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0, "attention_bias": False, "mlp_bias": False,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "tie_word_embeddings": False, "vocab_size": 128256, "max_position_embeddings": 131072,
    "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009], "torch_dtype": "bfloat16",
}
QWEN3_STYLE_V5 = {  # transformers 5 spelling: rope_parameters, dtype
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 1024,
    "head_dim": 128, "intermediate_size": 3072, "num_attention_heads": 16,
    "num_hidden_layers": 28, "num_key_value_heads": 8, "rms_norm_eps": 1e-6,
    "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"},
    "attention_bias": False, "tie_word_embeddings": True, "vocab_size": 151936,
    "dtype": "bfloat16",
}


def test_qwen2_fields():
    cfg = ModelConfig.from_hf(QWEN25_3B)
    assert (cfg.arch, cfg.head_dim, cfg.num_kv_heads, cfg.num_query_groups) == ("qwen2", 128, 2, 8)
    assert cfg.qkv_bias and not cfg.o_bias and not cfg.qk_norm and cfg.tie_embeddings
    assert cfg.rope == RopeConfig(theta=1e6) and cfg.param_dtype == "bfloat16"
    assert cfg.dtype == "float32"


def test_qwen3_explicit_head_dim_and_v5_rope_spelling():
    cfg = ModelConfig.from_hf(QWEN3_STYLE_V5)
    assert cfg.head_dim == 128 != cfg.hidden_size // cfg.num_heads
    assert cfg.qk_norm and not cfg.qkv_bias and cfg.rope.theta == 1e6
    assert cfg.param_dtype == "bfloat16"


def test_both_rope_spellings_give_the_same_config():
    v4 = ModelConfig.from_hf(LLAMA31_8B)
    v5_dict = {k: v for k, v in LLAMA31_8B.items() if k not in ("rope_theta", "rope_scaling")}
    v5_dict["rope_parameters"] = {**LLAMA31_8B["rope_scaling"], "rope_theta": 500000.0}
    assert ModelConfig.from_hf(v5_dict) == v4
    assert v4.rope.type == "llama3" and v4.eos_token_id == (128001, 128008, 128009)


@pytest.mark.parametrize("hf", [QWEN25_3B, LLAMA31_8B, QWEN3_STYLE_V5])
def test_to_hf_round_trip(hf):
    cfg = ModelConfig.from_hf(hf)
    assert ModelConfig.from_hf(cfg.to_hf()) == cfg
    assert cfg.to_hf()["architectures"] == hf["architectures"]


def _llama3_reference(theta, dim, factor, low, high, old_len):
    """Llama 3.1 rope scaling from its definition, one frequency at a time."""
    out = []
    for i in range(0, dim, 2):
        freq = 1.0 / theta ** (i / dim)
        wavelen = 2 * math.pi / freq
        if wavelen < old_len / high:        # high frequency: unchanged
            out.append(freq)
        elif wavelen > old_len / low:       # low frequency: divided by factor
            out.append(freq / factor)
        else:                               # in between: interpolate
            smooth = (old_len / wavelen - low) / (high - low)
            out.append((1 - smooth) * freq / factor + smooth * freq)
    return np.array(out)


def test_llama3_inv_freq_matches_reference():
    rope = ModelConfig.from_hf(LLAMA31_8B).rope
    expected = _llama3_reference(500000.0, 128, 8.0, 1.0, 4.0, 8192)
    np.testing.assert_allclose(rope.inv_freq(128), expected, rtol=1e-6)
    # all three bands occur at this head_dim
    base = RopeConfig(theta=500000.0).inv_freq(128)
    ratio = base / rope.inv_freq(128)
    assert np.isclose(ratio, 1).any() and np.isclose(ratio, 8).any()
    assert ((ratio > 1.01) & (ratio < 7.99)).any()
    linear = RopeConfig(theta=10000.0, type="linear", factor=4.0).inv_freq(16)
    np.testing.assert_allclose(linear, RopeConfig().inv_freq(16) / 4, rtol=1e-6)


@pytest.mark.parametrize("change, message", [
    ({"model_type": "mistral"}, "unsupported HF model_type 'mistral'"),
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"use_sliding_window": True}, "sliding-window"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "unsupported rope scaling type 'yarn'"),
    ({"num_key_value_heads": 3}, "multiple of num_kv_heads"),
])
def test_unsupported_configs_raise(change, message):
    with pytest.raises(ValueError, match=message):
        ModelConfig.from_hf({**QWEN25_3B, **change})


def test_missing_key_and_bad_fields():
    hf = dict(QWEN25_3B)
    del hf["intermediate_size"]
    with pytest.raises(ValueError, match="lacks 'intermediate_size'"):
        ModelConfig.from_hf(hf)
    cfg = ModelConfig.from_hf(QWEN25_3B)
    with pytest.raises(ValueError, match="remat"):
        dataclasses.replace(cfg, remat="sometimes")
    with pytest.raises(ValueError, match="num_layers"):
        dataclasses.replace(cfg, num_layers=0)
    with pytest.raises(ValueError, match="qwen2 checkpoints"):
        dataclasses.replace(cfg, qkv_bias=False).to_hf()
    assert hash(cfg) == hash(ModelConfig.from_hf(QWEN25_3B))
