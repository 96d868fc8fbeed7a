"""HF interop: logits equal transformers' torch models (left padding), save_hf round
trip through transformers, sharded checkpoints, tiny checkpoint builder, exports whose
tokenizer files transformers 4 reads, bad input."""
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import nnx
from safetensors.numpy import load_file, save_file
from tokenizers import Tokenizer

from agentjax.models.decoder import Decoder, positions_from_segments
from agentjax.models.hf import INDEX_FILE, SINGLE_FILE, load_hf, make_tiny_hf, save_hf
from agentjax.models.tokenizer import build_tokenizer, load_tokenizer, prompt_ids
from agentjax.engine.jax.engine import JaxEngine
from tests.models.qwen_tokenizers import qwen_tokenizer_folder

_TINY_HF = dict(vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2)
_HF_MODELS = {
    "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM,
              dict(tie_word_embeddings=True)),
    # head_dim 32 != hidden/heads: Qwen3's explicit head_dim.
    "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM, dict(head_dim=32)),
    "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM, dict(
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 16,
                      "rope_theta": 500000.0})),
}
B, T = 3, 12
LENGTHS = np.array([12, 7, 3])
MASK = (np.arange(T)[None] >= T - LENGTHS[:, None]).astype(np.int64)   # left padding
TOKENS = np.random.default_rng(0).integers(0, _TINY_HF["vocab_size"], (B, T))


def _torch_checkpoint(arch: str, path) -> torch.nn.Module:
    """A transformers model with every parameter random (not HF's zero biases / unit
    norms), saved with save_pretrained."""
    config_cls, model_cls, extra = _HF_MODELS[arch]
    torch.manual_seed(0)
    model = model_cls(config_cls(**_TINY_HF, **extra)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.randn_like(p) * 0.2 + (1.0 if "norm" in name else 0.0))
    model.save_pretrained(path)
    return model


def _torch_logits(model, tokens=TOKENS, mask=MASK) -> np.ndarray:
    positions = np.clip(np.cumsum(mask, 1) - 1, 0, None)
    with torch.no_grad():
        return model(input_ids=torch.tensor(tokens), attention_mask=torch.tensor(mask),
                     position_ids=torch.tensor(positions)).logits.numpy()


def _our_logits(model: Decoder, tokens=TOKENS, mask=MASK) -> np.ndarray:
    segments = jnp.asarray(mask, jnp.int32)
    hidden, _ = model(jnp.asarray(tokens, jnp.int32), positions_from_segments(segments), segments)
    return np.asarray(model.logits(hidden))


@pytest.fixture(scope="module", params=sorted(_HF_MODELS))
def checkpoint(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    return request.param, path, _torch_checkpoint(request.param, path)


def test_logits_match_transformers_with_left_padding(checkpoint, tmp_path):
    arch, path, torch_model = checkpoint
    model, cfg = load_hf(path)
    assert cfg.arch == arch
    expected = _torch_logits(torch_model)
    real = MASK.astype(bool)
    np.testing.assert_allclose(_our_logits(model)[real], expected[real], rtol=1e-4, atol=1e-4)

    # save_hf (sharded) -> transformers from_pretrained gives the same logits again.
    out = tmp_path / "export"
    save_hf(model, cfg, out, max_shard_bytes=100_000)
    assert (out / INDEX_FILE).exists() and not (out / SINGLE_FILE).exists()
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    assert type(reloaded) is type(torch_model)
    np.testing.assert_allclose(_torch_logits(reloaded)[real], expected[real], rtol=1e-5, atol=1e-5)
    # ... and load_hf of the sharded export restores identical parameters.
    again, again_cfg = load_hf(out)
    assert again_cfg == cfg
    for a, b in zip(jax.tree.leaves(nnx.state(model)), jax.tree.leaves(nnx.state(again))):
        np.testing.assert_array_equal(a, b)


def test_make_tiny_hf_loads_in_transformers(tmp_path):
    tokenizer = build_tokenizer(["the cat sat on the mat", "search the docs"], vocab_size=300)
    cfg = make_tiny_hf(tmp_path, arch="qwen2", tokenizer=tokenizer, seed=3)
    assert cfg.vocab_size == len(tokenizer) and cfg.eos_token_id == tokenizer.eos_token_id
    torch_model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert isinstance(torch_model, transformers.Qwen2ForCausalLM)
    assert transformers.PreTrainedTokenizerFast.from_pretrained(tmp_path).encode("cat") == \
        tokenizer.encode("cat")
    model, loaded_cfg = load_hf(tmp_path)
    assert loaded_cfg == cfg
    tokens = np.random.default_rng(1).integers(0, cfg.vocab_size, (B, T))
    np.testing.assert_allclose(_our_logits(model, tokens, np.ones_like(MASK)),
                               _torch_logits(torch_model, tokens, np.ones_like(MASK)),
                               rtol=1e-4, atol=1e-4)


def test_bfloat16_save_and_load(tmp_path):
    cfg = make_tiny_hf(tmp_path / "f32", arch="llama", vocab_size=64, num_layers=1)
    model, _ = load_hf(tmp_path / "f32")
    save_hf(model, cfg, tmp_path / "bf16", dtype=jnp.bfloat16)
    assert json.loads((tmp_path / "bf16" / "config.json").read_text())["torch_dtype"] == "bfloat16"
    loaded, loaded_cfg = load_hf(tmp_path / "bf16", dtype=jnp.bfloat16)
    assert loaded_cfg.param_dtype == "bfloat16"
    for a, b in zip(jax.tree.leaves(nnx.state(model)), jax.tree.leaves(nnx.state(loaded))):
        assert b.dtype == jnp.bfloat16
        np.testing.assert_array_equal(np.asarray(a).astype(jnp.bfloat16), b)


def test_an_interrupted_save_leaves_the_previous_export(tmp_path):
    """A kill in the middle of save_hf (here: while the tokenizer is written, after
    config.json and the weights) must not leave a folder that looks complete."""
    cfg = make_tiny_hf(tmp_path / "src", arch="llama", vocab_size=64, num_layers=1)
    model, _ = load_hf(tmp_path / "src")

    class KilledWhileSaving:
        name_or_path = ""  # not loaded from a folder: saved with save_pretrained

        def save_pretrained(self, path):
            raise KeyboardInterrupt

    export = tmp_path / "export"
    with pytest.raises(KeyboardInterrupt):
        save_hf(model, cfg, export, tokenizer=KilledWhileSaving())
    assert not export.exists()
    save_hf(model, cfg, export)
    with pytest.raises(KeyboardInterrupt):
        save_hf(model, cfg, export, tokenizer=KilledWhileSaving())
    assert sorted(os.listdir(export)) == ["config.json", SINGLE_FILE]  # the complete one
    load_hf(export)


@pytest.fixture
def small_checkpoint(tmp_path):
    make_tiny_hf(tmp_path, arch="llama", vocab_size=64, num_layers=1)
    return tmp_path


def _edit_config(path, **changes):
    config = json.loads((path / "config.json").read_text())
    config.update(changes)
    (path / "config.json").write_text(json.dumps(config))


def test_missing_files_are_named(small_checkpoint, tmp_path_factory):
    path = small_checkpoint
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_hf(tmp_path_factory.mktemp("empty"))
    tensors = load_file(path / SINGLE_FILE)
    (path / SINGLE_FILE).unlink()
    with pytest.raises(FileNotFoundError, match="neither model.safetensors nor"):
        load_hf(path)
    index = {"weight_map": {name: "model-00001-of-00002.safetensors" for name in tensors}}
    (path / INDEX_FILE).write_text(json.dumps(index))
    with pytest.raises(FileNotFoundError, match="model-00001-of-00002.safetensors"):
        load_hf(path)


def test_bad_checkpoints_name_the_tensor(small_checkpoint):
    path = small_checkpoint
    _edit_config(path, model_type="mistral", architectures=["MistralForCausalLM"])
    with pytest.raises(ValueError, match="unsupported HF model_type 'mistral'"):
        load_hf(path)
    _edit_config(path, model_type="llama", architectures=["LlamaForCausalLM"])

    tensors = load_file(path / SINGLE_FILE)
    name = "model.layers.0.mlp.up_proj.weight"
    bad = dict(tensors, **{name: np.zeros((7, 64), np.float32)})
    save_file(bad, path / SINGLE_FILE)
    with pytest.raises(ValueError, match=rf"model.safetensors: tensor '{name}' has shape \[7, 64\]"):
        load_hf(path)

    missing = {k: v for k, v in tensors.items() if k != name}
    save_file(missing, path / SINGLE_FILE)
    with pytest.raises(ValueError, match=rf"tensor '{name}' is missing"):
        load_hf(path)

    extra = dict(tensors, **{"score.weight": np.zeros((1, 64), np.float32)})
    save_file(extra, path / SINGLE_FILE)
    with pytest.raises(ValueError, match="unexpected tensors \\['score.weight'\\]"):
        load_hf(path)
    model, _ = load_hf(path, strict=False)
    assert isinstance(model, Decoder)


# ------------------------------------------------------------ exports servers can load

# Tokenizer classes transformers 4.57 (what SGLang / vLLM images pin) can instantiate
# from a tokenizer.json; transformers 5 writes "TokenizersBackend", which it lacks.
_TRANSFORMERS4_CLASSES = ("PreTrainedTokenizerFast", "Qwen2Tokenizer", "Qwen2TokenizerFast")


def _assert_transformers4_fields(folder):
    """The tokenizer_config.json fields transformers 4.57 reads describe the vocabulary
    of tokenizer.json, in the types transformers 4 expects."""
    fields = json.loads((folder / "tokenizer_config.json").read_text())
    assert fields["tokenizer_class"] in _TRANSFORMERS4_CLASSES
    # transformers 4 iterates extra_special_tokens as a dict of named tokens.
    assert isinstance(fields.get("extra_special_tokens", {}), dict)
    backend = Tokenizer.from_file(str(folder / "tokenizer.json"))
    added = {token.content: (i, token.special)
             for i, token in backend.get_added_tokens_decoder().items()}
    declared = fields["added_tokens_decoder"]
    assert {entry["content"]: (int(i), entry["special"]) for i, entry in declared.items()} \
        == added
    for entry in declared.values():
        assert set(entry) == {"content", "lstrip", "normalized", "rstrip", "single_word",
                              "special"}
    vocab = backend.get_vocab(with_added_tokens=True)
    for key in ("eos_token", "pad_token"):
        assert fields[key] in vocab
    for token in fields.get("additional_special_tokens", []):
        assert added[token][1]
    assert fields.get("chat_template") or (folder / "chat_template.jinja").exists()


@pytest.mark.parametrize("family,variant", [("qwen2.5", "instruct"), ("qwen3", "base")])
def test_export_keeps_the_source_tokenizer_and_generation_config(tmp_path, family, variant):
    source = qwen_tokenizer_folder(tmp_path / "hub", family, variant, "hub")
    tokenizer = load_tokenizer(source)
    make_tiny_hf(tmp_path / "model", tokenizer=tokenizer, num_layers=1)
    model, cfg = load_hf(tmp_path / "model")
    save_hf(model, cfg, tmp_path / "export", tokenizer=load_tokenizer(tmp_path / "model"))
    # Saving into the folder the tokenizer was loaded from keeps its files.
    save_hf(model, cfg, tmp_path / "model", tokenizer=load_tokenizer(tmp_path / "model"))
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt",
                 "generation_config.json"):
        for folder in ("model", "export"):
            assert (tmp_path / folder / name).read_bytes() == (source / name).read_bytes()
    _assert_transformers4_fields(tmp_path / "export")

    # generation_config.json's eos list joins config.json's eos, and the engine stops
    # on every one of them plus the template's end of turn.
    im_end, endoftext = (tokenizer.convert_tokens_to_ids(t)
                         for t in ("<|im_end|>", "<|endoftext|>"))
    assert cfg.eos_token_id == ((im_end, endoftext) if variant == "instruct" else endoftext)
    engine = JaxEngine.from_model(model, tokenizer=tokenizer, max_slots=1, max_len=8)
    engine.close()
    assert set(engine.eos_token_ids) == {im_end, endoftext}


def test_export_of_a_built_tokenizer_loads_with_transformers4_fields(tmp_path):
    tokenizer = build_tokenizer(["the cat sat on the mat", "search the docs"], vocab_size=300)
    make_tiny_hf(tmp_path, tokenizer=tokenizer, num_layers=1)
    _assert_transformers4_fields(tmp_path)
    generation = json.loads((tmp_path / "generation_config.json").read_text())
    assert generation["eos_token_id"] == [tokenizer.eos_token_id]
    reloaded = load_tokenizer(tmp_path)
    messages = [{"role": "user", "content": "the cat sat <search>"}]
    assert prompt_ids(reloaded, messages) == prompt_ids(tokenizer, messages)
    assert (reloaded.eos_token, reloaded.pad_token) == (tokenizer.eos_token, tokenizer.pad_token)
    assert reloaded.get_vocab() == tokenizer.get_vocab()


def test_unreadable_generation_config_is_named(small_checkpoint):
    (small_checkpoint / "generation_config.json").write_text(json.dumps({"eos_token_id": "x"}))
    with pytest.raises(ValueError, match="generation_config.json: eos_token_id"):
        load_hf(small_checkpoint)
