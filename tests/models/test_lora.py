"""LoRA adapters: the forward against a float64 reference of x W + (alpha/r)(x A) B,
PEFT's init, merged engine weights, PEFT folders against peft's own PeftModel (both
ways), a merged HF export through transformers, bad input."""
import dataclasses
import json

import chex
import jax
import jax.numpy as jnp
import numpy as np
import peft
import pytest
import torch
import transformers
from flax import nnx

from agentjax.models.decoder import Decoder, apply, positions_from_segments
from agentjax.models.hf import load_hf, save_hf
from agentjax.models.lora import LoraConfig, add_adapters, fold_adapters, split_adapters
from agentjax.models.peft import ADAPTER_CONFIG, load_peft, read_peft_config, save_peft
from tests.models.reference_decoder import TINY, numpy_params, random_model, reference_hidden

LORA = LoraConfig(rank=3, alpha=8.0)
ADAPTED = dataclasses.replace(TINY, lora=LORA)
SEGMENTS = np.array([[1, 1, 1, 2, 2, 0], [0, 0, 1, 1, 1, 1]], np.int32)
# x W per projection (models/decoder.py), with A [d_in..., r] and B [r, d_out...].
EQUATIONS = {"q_proj": ("dhk", "dr", "rhk"), "k_proj": ("dhk", "dr", "rhk"),
             "v_proj": ("dhk", "dr", "rhk"), "o_proj": ("hkd", "hkr", "rd"),
             "gate_proj": ("df", "dr", "rf"), "up_proj": ("df", "dr", "rf"),
             "down_proj": ("fd", "fr", "rd")}


def merged64(params: dict, lora: LoraConfig) -> dict:
    """Float64 params with each target's W + (alpha / r) A B, from the formula."""
    merged = {**params, "layers": dict(params["layers"])}
    for name, pair in params["lora"].items():
        w, a, b = EQUATIONS[name]
        ab = np.einsum(f"l{a},l{b}->l{w}", pair["a"], pair["b"])
        merged["layers"][name] = params["layers"][name] + lora.alpha / lora.rank * ab
    return merged


def _inputs():
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, TINY.vocab_size, SEGMENTS.shape),
                         jnp.int32)
    segments = jnp.asarray(SEGMENTS)
    return tokens, positions_from_segments(segments), segments


@pytest.fixture(scope="module")
def adapted():
    """Every parameter random, the adapters' B too (a trained adapter, not a fresh one)."""
    return random_model(lambda: Decoder(ADAPTED, rngs=nnx.Rngs(0)), seed=2)


@pytest.mark.parametrize("jit", [True, False])
def test_forward_matches_float64_reference(adapted, jit):
    tokens, positions, segments = _inputs()
    if jit:
        graphdef, params = nnx.split(adapted)
        hidden, _ = jax.jit(apply, static_argnums=0)(graphdef, params, tokens, positions,
                                                     segments)
    else:
        hidden, _ = adapted(tokens, positions, segments)
    chex.assert_shape(hidden, (*SEGMENTS.shape, TINY.hidden_size))
    params = numpy_params(adapted)
    expected = reference_hidden(TINY, merged64(params, LORA), tokens, positions, segments)
    without = reference_hidden(TINY, params, tokens, positions, segments)
    real = SEGMENTS != 0
    np.testing.assert_allclose(np.asarray(hidden)[real], expected[real], rtol=1e-5, atol=1e-5)
    assert np.abs(expected - without)[real].max() > 0.1  # the adapters matter here


def test_fresh_adapters_are_peft_init_and_change_nothing():
    base = random_model(lambda: Decoder(TINY, rngs=nnx.Rngs(0)), seed=1)
    model = add_adapters(base, LORA, seed=5)
    assert model.layers["q_proj"][...] is base.layers["q_proj"][...]  # shared, not copied
    for name, pair in model.lora.items():
        a, b = np.asarray(pair["a"][...]), np.asarray(pair["b"][...])
        d_in = np.prod(a.shape[1:-1])
        assert a.dtype == np.float32 and b.dtype == np.float32
        assert np.abs(a).max() <= 1 / np.sqrt(d_in) and np.abs(a).max() > 0.5 / np.sqrt(d_in)
        assert not b.any(), name
    np.testing.assert_array_equal(
        model.lora["q_proj"]["a"][...],
        Decoder(ADAPTED, rngs=nnx.Rngs(5)).lora["q_proj"]["a"][...])
    tokens, positions, segments = _inputs()
    np.testing.assert_array_equal(model(tokens, positions, segments)[0],
                                  base(tokens, positions, segments)[0])


def test_engine_weights_are_merged_in_float32_and_cast_once(adapted):
    bf16 = random_model(lambda: Decoder(dataclasses.replace(
        ADAPTED, param_dtype="bfloat16", dtype="bfloat16"), rngs=nnx.Rngs(0)), seed=2)
    for model, tol in ((adapted, 1e-6), (bf16, 0.0)):
        weights = jax.jit(lambda m: m.layerwise_weights())(model)
        assert weights.config.lora is None and "lora" not in weights.layers[0]
        params = numpy_params(model)
        merged = merged64(params, LORA)["layers"]
        for name in LORA.projections:
            got = np.stack([np.asarray(layer[name], np.float64) for layer in weights.layers])
            if tol:
                np.testing.assert_allclose(got, merged[name], rtol=tol, atol=tol)
            else:  # one rounding of the float32 sum, never a bfloat16 sum
                once = np.asarray(jnp.asarray(merged[name], jnp.float32).astype(jnp.bfloat16),
                                  np.float64)
                assert np.mean(got == once) > 0.99, name
    folded = fold_adapters(adapted)
    assert folded.config.lora is None
    np.testing.assert_allclose(np.asarray(folded.layers["down_proj"][...], np.float64),
                               merged64(numpy_params(adapted), LORA)["layers"]["down_proj"],
                               rtol=1e-6, atol=1e-6)


def test_bad_config_names_the_field():
    with pytest.raises(ValueError, match=r"model.lora.targets.*\['qkv'\]"):
        LoraConfig(rank=4, targets=("q", "qkv"))
    with pytest.raises(ValueError, match="model.lora.rank must be a positive"):
        LoraConfig(rank=0)
    # k_proj of TINY is [64, 2 x 24]: rank 49 has no room.
    with pytest.raises(ValueError, match=r"model.lora.rank=49 exceeds.*48 of k_proj"):
        nnx.eval_shape(lambda: Decoder(dataclasses.replace(TINY, lora=LoraConfig(rank=49)),
                                       rngs=nnx.Rngs(0)))


# ------------------------------------------------------------------ PEFT, both ways

_HF = dict(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
           num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
TOKENS = np.random.default_rng(1).integers(0, _HF["vocab_size"], (2, 7))


@pytest.fixture(scope="module")
def hf_base(tmp_path_factory):
    """A random-init tiny Qwen2 saved with transformers (every weight random)."""
    path = tmp_path_factory.mktemp("qwen2")
    torch.manual_seed(0)
    model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**_HF)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.randn_like(p) * 0.2 + (1.0 if "norm" in name else 0.0))
    model.save_pretrained(path)
    return path


def _torch_model(path):
    return transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def _torch_logits(model) -> np.ndarray:
    with torch.no_grad():
        return model(input_ids=torch.tensor(TOKENS)).logits.numpy()


def _our_logits(model) -> np.ndarray:
    segments = jnp.ones(TOKENS.shape, jnp.int32)
    hidden, _ = model(jnp.asarray(TOKENS, jnp.int32), positions_from_segments(segments),
                      segments)
    return np.asarray(model.logits(hidden))


def _trained(model):
    """The adapters of `model` with random B (a fresh adapter would test nothing)."""
    rng = np.random.default_rng(3)
    for pair in model.lora.values():
        pair["b"][...] = jnp.asarray(rng.normal(0, 0.3, pair["b"].shape), jnp.float32)
    return model


def test_peft_export_loads_in_peft_and_the_merged_export_in_transformers(hf_base, tmp_path):
    lora = LoraConfig(rank=4, alpha=32.0, targets=("q", "v", "o", "gate", "up", "down", "k"))
    model = _trained(add_adapters(load_hf(hf_base)[0], lora, seed=0))
    save_peft(model, tmp_path / "adapter", base_model=str(hf_base))
    config = json.loads((tmp_path / "adapter" / ADAPTER_CONFIG).read_text())
    assert config["target_modules"] == ["q_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                        "down_proj", "k_proj"]
    assert (config["peft_type"], config["task_type"], config["r"], config["lora_alpha"],
            config["bias"], config["use_dora"]) == ("LORA", "CAUSAL_LM", 4, 32.0, "none", False)
    ours = _our_logits(model)
    adapted = peft.PeftModel.from_pretrained(_torch_model(hf_base), tmp_path / "adapter").eval()
    np.testing.assert_allclose(_torch_logits(adapted), ours, rtol=1e-4, atol=1e-4)
    assert np.abs(ours - _torch_logits(_torch_model(hf_base))).max() > 0.1

    folded = fold_adapters(model)
    save_hf(folded, folded.config, tmp_path / "merged")
    np.testing.assert_allclose(_torch_logits(_torch_model(tmp_path / "merged")), ours,
                               rtol=1e-4, atol=1e-4)


def test_peft_saved_adapter_imports_by_name(hf_base, tmp_path):
    """k and v have equal shapes here: only names can tell their tensors apart."""
    torch.manual_seed(1)
    config = peft.LoraConfig(r=2, lora_alpha=5, target_modules=["k_proj", "v_proj", "down_proj"],
                             task_type="CAUSAL_LM", init_lora_weights=False)
    torch_adapted = peft.get_peft_model(_torch_model(hf_base), config).eval()
    torch_adapted.save_pretrained(tmp_path / "adapter")
    lora, base = read_peft_config(tmp_path / "adapter")
    assert lora == LoraConfig(rank=2, alpha=5.0, targets=("k", "v", "down"))
    model = load_peft(add_adapters(load_hf(hf_base)[0], lora, seed=0), tmp_path / "adapter")
    np.testing.assert_allclose(_our_logits(model), _torch_logits(torch_adapted),
                               rtol=1e-4, atol=1e-4)
    save_peft(model, tmp_path / "again", base_model=base)  # and out again, unchanged
    reloaded = load_peft(add_adapters(load_hf(hf_base)[0], lora, seed=1), tmp_path / "again")
    for a, b in zip(jax.tree.leaves(split_adapters(nnx.state(model))[0]),
                    jax.tree.leaves(split_adapters(nnx.state(reloaded))[0])):
        np.testing.assert_array_equal(a, b)


def _edit(folder, **changes):
    file = folder / ADAPTER_CONFIG
    file.write_text(json.dumps({**json.loads(file.read_text()), **changes}))


def test_bad_peft_files_are_named(hf_base, tmp_path):
    lora = LoraConfig(rank=2, targets=("q", "k"))
    model = add_adapters(load_hf(hf_base)[0], lora, seed=0)
    for change, message in ((dict(use_dora=True), "use_dora=True"),
                            (dict(modules_to_save=["lm_head"]), "modules_to_save"),
                            (dict(bias="all"), "bias='all'"),
                            (dict(target_modules="all-linear"), "explicit list"),
                            (dict(target_modules=["q_proj", "qkv_proj"]), "qkv_proj")):
        save_peft(model, tmp_path / "bad", base_model="x")
        _edit(tmp_path / "bad", **change)
        with pytest.raises(ValueError, match=f"model.lora.adapter_path.*{message}"):
            read_peft_config(tmp_path / "bad")
    # An adapter of a wider model: the shapes say so, naming the tensor.
    wide = LoraConfig(rank=2, targets=("q", "k"))
    other = add_adapters(Decoder(dataclasses.replace(model.config, lora=None, hidden_size=64,
                                                     head_dim=16), rngs=nnx.Rngs(0)),
                         wide, seed=0)
    save_peft(other, tmp_path / "wide", base_model="x")
    with pytest.raises(ValueError, match=r"q_proj.lora_A.weight has shape \[2, 64\]"):
        load_peft(model, tmp_path / "wide")
    # An adapter of a deeper model: tensors the model has no layer for.
    deep = add_adapters(Decoder(dataclasses.replace(model.config, lora=None, num_layers=3),
                                rngs=nnx.Rngs(0)), lora, seed=0)
    save_peft(deep, tmp_path / "deep", base_model="x")
    with pytest.raises(ValueError, match=r"tensors the model .*layers.2"):
        load_peft(model, tmp_path / "deep")
