"""GGUF files (llama.cpp, Ollama, LM Studio) -> HF checkpoint folders agentjax trains from.

    config = import_gguf("SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2/")
    model, config = load_hf("smollm2/"); tokenizer = load_tokenizer("smollm2/")

The folder holds float32 `model.safetensors` (sharded above 4 GiB, as `save_hf` writes),
config.json, generation_config.json, tokenizer.json and tokenizer_config.json with the
chat template: transformers loads it as well. No torch is imported. What comes from where:

  - reading the file and dequantizing its blocks: the `gguf` package (llama.cpp's
    gguf-py): `GGUFReader` (a memory map) and `gguf.quants.dequantize` -> float32 numpy,
    one tensor at a time. The weights are those of the quantized model (a Q4 file gives
    Q4's rounded weights in float32, not the original checkpoint's).
  - tensor names: llama.cpp's (`blk.N.attn_q.weight`, ...) renamed to HF's here
    (`_LAYER_NAMES`). llama.cpp's converter permutes the rows of Llama's attn_q/attn_k
    (and their biases) for its interleaved rotary layout; `_unpermute_rows` undoes it as
    transformers' GGUF loader does (`LlamaTensorProcessor`). Qwen2/Qwen3 are not permuted.
  - config.json: from the metadata (`{arch}.block_count`, `.attention.head_count_kv`,
    `.rope.freq_base`, ...) and the tensors (head_dim from attn_q's rows, vocabulary from
    token_embd, tied embeddings when output.weight is absent, q/k/v biases when present),
    written by `ModelConfig.to_hf`. Llama 3.1+ files keep their rope scaling only as a
    table of frequency divisors (`rope_freqs.weight`); `_rope` recognizes Llama 3's
    scaling in it (transformers' GGUF loading ignores the table).
  - tokenizer: transformers' own GGUF converter (`convert_gguf_tokenizer`, which needs no
    torch), fed from the metadata `GGUFReader` read; special tokens, `add_bos_token` and
    the chat template (`tokenizer.chat_template`) as transformers' GGUF loading sets them.
    Saved by `hf.save_hf`'s tokenizer writer (transformers 4 and 5 both load it).
  - generation_config.json: bos / pad from the metadata; eos: every id that ends a turn
    (the file's eos, eot and eom ids and the template's end-of-turn token).

Every type of SUPPORTED_TYPES is tested against transformers' GGUF loading (the same
tensors bit for bit; the K-quants as random blocks, since gguf-py cannot quantize to
them), and SmolLM2's Q4_1 file (tests/models/test_gguf.py).
"""
from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path
from typing import Any, Iterator, Mapping

import gguf
import jinja2
import numpy as np
from gguf import GGMLQuantizationType as Q
from transformers import PreTrainedTokenizerFast
from transformers.integrations.gguf.gguf_tokenizer_mapping import (GGUF_TOKENIZER_MAPPING,
                                                                   convert_gguf_tokenizer)

from agentjax.core import atomic
from agentjax.models.config import ModelConfig, RopeConfig
from agentjax.models.hf import (CONFIG_FILE, GENERATION_CONFIG_FILE, _save_tokenizer,
                                hf_tensor_shapes, write_safetensors)
from agentjax.models.tokenizer import stop_token_ids

log = logging.getLogger(__name__)

SUPPORTED_ARCHS = ("llama", "qwen2", "qwen3")
# Types whose import the tests check against transformers' GGUF loading. gguf's dequantize
# reads more (the IQ types); they are refused until checked.
SUPPORTED_TYPES = (Q.F32, Q.F16, Q.BF16, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0,
                   Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K)

_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
# blk.{i}.<key> -> model.layers.{i}.<value>
_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.bias": "self_attn.o_proj.bias",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
# Llama 3.1+ files: the rope scaling as a table (`_rope`), not a weight.
ROPE_FREQS = "rope_freqs.weight"
# Turn-ending ids a file may state besides its eos.
_STOP_KEYS = ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
              "tokenizer.ggml.eom_token_id")


def read_metadata(reader: gguf.GGUFReader) -> dict[str, Any]:
    """The file's key/value metadata as Python values (strings, numbers, lists)."""
    return {name: field.contents() for name, field in reader.fields.items()
            if not name.startswith("GGUF.")}


def hf_name(gguf_name: str) -> str | None:
    """The HF name of a llama.cpp tensor name (None: not a tensor of these families)."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    parts = gguf_name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in _LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}"
    return None


def model_config(metadata: Mapping[str, Any], tensors: Mapping[str, tuple[int, ...]],
                 rope_freqs: np.ndarray | None = None,
                 source: str = "the GGUF file") -> ModelConfig:
    """The ModelConfig a GGUF file describes.

    Args:
      metadata: `read_metadata`'s dict.
      tensors: GGUF tensor name -> shape in HF (row-major) order.
      rope_freqs: the file's `rope_freqs.weight`, if it has one (Llama 3.1+).
      source: named in errors.

    Raises:
      ValueError: an architecture other than SUPPORTED_ARCHS, a missing key, a rope
        scaling or layout this decoder does not implement.
    """
    arch = metadata.get("general.architecture")
    if arch not in SUPPORTED_ARCHS:
        raise ValueError(f"{source}: architecture {arch!r} is not supported; supported: "
                         f"{', '.join(SUPPORTED_ARCHS)} (llama.cpp's names for the Llama, "
                         "Qwen2/2.5 and Qwen3 families)")

    def need(key: str) -> Any:
        if f"{arch}.{key}" not in metadata:
            raise ValueError(f"{source}: metadata key {arch}.{key!r} is missing")
        return metadata[f"{arch}.{key}"]

    # (A sliding window in the metadata is left out as llama.cpp's llama/qwen2/qwen3
    # graphs leave it out: they attend to the whole context.)
    if metadata.get(f"{arch}.expert_count"):
        raise ValueError(f"{source}: {arch}.expert_count is set: mixture-of-experts models "
                         "(Mixtral is stored as 'llama') are not supported")
    for name in ("token_embd.weight", "blk.0.attn_q.weight"):
        if name not in tensors:
            raise ValueError(f"{source}: tensor {name!r} is missing")
    num_heads = int(need("attention.head_count"))
    head_dim, rest = divmod(tensors["blk.0.attn_q.weight"][0], num_heads)
    key_length = metadata.get(f"{arch}.attention.key_length", head_dim)
    if rest or key_length != head_dim:
        raise ValueError(f"{source}: attn_q has {tensors['blk.0.attn_q.weight'][0]} rows, "
                         f"not {num_heads} heads x {arch}.attention.key_length={key_length}")
    attention_bias = "blk.0.attn_q.bias" in tensors
    eos = metadata.get("tokenizer.ggml.eos_token_id")
    return ModelConfig(
        arch=arch,
        vocab_size=tensors["token_embd.weight"][0],
        hidden_size=int(need("embedding_length")),
        intermediate_size=int(need("feed_forward_length")),
        num_layers=int(need("block_count")),
        num_heads=num_heads,
        num_kv_heads=int(metadata.get(f"{arch}.attention.head_count_kv", num_heads)),
        head_dim=head_dim,
        rope=_rope(metadata, arch, head_dim, rope_freqs, source),
        rms_norm_eps=float(need("attention.layer_norm_rms_epsilon")),
        qkv_bias=arch == "qwen2" or attention_bias,
        o_bias=arch != "qwen2" and "blk.0.attn_output.bias" in tensors,
        qk_norm=arch == "qwen3",
        tie_embeddings="output.weight" not in tensors,
        max_position_embeddings=int(need("context_length")),
        bos_token_id=metadata.get("tokenizer.ggml.bos_token_id"),
        eos_token_id=eos,
        pad_token_id=metadata.get("tokenizer.ggml.padding_token_id"),
    )


# llama.cpp's converter keeps Llama 3.1+ rope scaling only as a tensor of per-frequency
# divisors (`rope_freqs`), computed from HF's `rope_scaling`; these band edges are those
# of every Llama 3.x release.
_LLAMA3_BANDS = dict(low_freq_factor=1.0, high_freq_factor=4.0,
                     original_max_position_embeddings=8192)


def _rope(metadata: Mapping[str, Any], arch: str, head_dim: int,
          rope_freqs: np.ndarray | None, source: str) -> RopeConfig:
    """The rotary settings: the metadata's theta and linear scaling, or Llama 3's scaling
    recognized from `rope_freqs` (its divisors recomputed and compared)."""
    theta = float(metadata.get(f"{arch}.rope.freq_base", 10000.0))
    scaling = metadata.get(f"{arch}.rope.scaling.type", "none")
    if rope_freqs is not None:
        rope = RopeConfig(theta=theta, type="llama3", factor=float(np.max(rope_freqs)),
                          **_LLAMA3_BANDS)
        scaled = RopeConfig(theta=theta).inv_freq(head_dim) / rope_freqs.reshape(-1)
        if rope_freqs.size != head_dim // 2 or not np.allclose(
                scaled, rope.inv_freq(head_dim), rtol=1e-5, atol=0):
            raise ValueError(f"{source}: rope_freqs.weight is not Llama 3's rope scaling "
                             f"(factor {rope.factor}, band edges {_LLAMA3_BANDS}); other "
                             "frequency tables are not supported")
        return rope
    if scaling == "none":
        return RopeConfig(theta=theta)
    if scaling == "linear" and f"{arch}.rope.scaling.factor" in metadata:
        return RopeConfig(theta=theta, type="linear",
                          factor=float(metadata[f"{arch}.rope.scaling.factor"]))
    raise ValueError(f"{source}: rope scaling {scaling!r} (factor "
                     f"{metadata.get(f'{arch}.rope.scaling.factor')}) is not supported; "
                     "supported: none, linear with a factor, Llama 3's (a rope_freqs tensor)")


def _unpermute_rows(w: np.ndarray, heads: int) -> np.ndarray:
    """Undoes llama.cpp's Llama q/k permutation (convert_hf_to_gguf.py's `permute`): it
    reorders each head's rows from [half0, half1] to interleaved pairs; this is the
    inverse (transformers' `LlamaTensorProcessor._reverse_permute_weights`)."""
    half = w.shape[0] // heads // 2
    return w.reshape(heads, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _check_types(reader: gguf.GGUFReader, source: str) -> None:
    bad = {t.name: t.tensor_type.name for t in reader.tensors
           if t.tensor_type not in SUPPORTED_TYPES}
    if bad:
        shown = ", ".join(f"{n} ({q})" for n, q in list(bad.items())[:4])
        raise ValueError(f"{source}: {len(bad)} tensors of an unsupported quantization type: "
                         f"{shown}{' ...' if len(bad) > 4 else ''}; supported: "
                         f"{', '.join(t.name for t in SUPPORTED_TYPES)}")


def _hf_shapes(reader: gguf.GGUFReader) -> dict[str, tuple[int, ...]]:
    """GGUF tensor name -> shape in HF order (GGUF lists dimensions fastest first), of
    every weight (not the rope table)."""
    return {t.name: tuple(int(d) for d in reversed(t.shape)) for t in reader.tensors
            if t.name != ROPE_FREQS}


def _rope_freqs(reader: gguf.GGUFReader) -> np.ndarray | None:
    for tensor in reader.tensors:
        if tensor.name == ROPE_FREQS:
            return gguf.quants.dequantize(tensor.data, tensor.tensor_type)
    return None


def _validate(shapes: Mapping[str, tuple[int, ...]], cfg: ModelConfig, source: str) -> None:
    """Every tensor known, every tensor the config needs present with its shape."""
    unknown = [n for n in shapes if hf_name(n) is None]
    if unknown:
        raise ValueError(f"{source}: tensors {unknown[:8]} are not part of a {cfg.arch} "
                         "model this importer knows")
    found = {hf_name(n): (n, shape) for n, shape in shapes.items()}
    expected = hf_tensor_shapes(cfg)
    for name, shape in expected.items():
        if name not in found:
            raise ValueError(f"{source}: no tensor for {name} (a {cfg.arch} model with "
                             f"{cfg.num_layers} layers)")
        if found[name][1] != shape:
            raise ValueError(f"{source}: tensor {found[name][0]} has shape "
                             f"{list(found[name][1])}, expected {list(shape)}")
    extra = sorted(found[n][0] for n in found if n not in expected)
    if extra:
        raise ValueError(f"{source}: tensors {extra[:8]} have no place in the {cfg.arch} "
                         "layout the metadata describes")


def hf_tensors(reader: gguf.GGUFReader, cfg: ModelConfig) -> Iterator[tuple[str, np.ndarray]]:
    """(HF name, float32 array in HF layout) of every tensor, in file order, one
    dequantized tensor at a time."""
    for tensor in reader.tensors:
        if tensor.name == ROPE_FREQS:
            continue
        name = hf_name(tensor.name)
        shape = tuple(int(d) for d in reversed(tensor.shape))
        w = gguf.quants.dequantize(tensor.data, tensor.tensor_type).reshape(shape)
        if cfg.arch == "llama" and ".self_attn.q_proj." in name:
            w = _unpermute_rows(w, cfg.num_heads)
        elif cfg.arch == "llama" and ".self_attn.k_proj." in name:
            w = _unpermute_rows(w, cfg.num_kv_heads)
        yield name, np.ascontiguousarray(w, dtype=np.float32)


def gguf_tokenizer(metadata: Mapping[str, Any],
                   source: str = "the GGUF file") -> PreTrainedTokenizerFast:
    """The HF fast tokenizer a GGUF file describes, as transformers builds it from the
    file (`AutoTokenizer.from_pretrained(folder, gguf_file=...)`), chat template included.

    Raises:
      ValueError: no vocabulary in the file, or a tokenizer model transformers cannot
        convert (its message names the supported ones).
    """
    if "tokenizer.ggml.tokens" not in metadata:
        raise ValueError(f"{source}: no tokenizer in the metadata (tokenizer.ggml.tokens)")
    # Grouped and defaulted as transformers' `get_gguf_tokenizer` does (that function
    # reads the file with a reader that imports torch).
    tokenizer_dict, tokenizer_config = (
        {name: metadata[f"tokenizer.{key}"] for key, name in renames.items()
         if f"tokenizer.{key}" in metadata}
        for renames in (GGUF_TOKENIZER_MAPPING["tokenizer"],
                        GGUF_TOKENIZER_MAPPING["tokenizer_config"]))
    if tokenizer_dict.get("tokenizer_type") == "llama":
        # sentencepiece files without the flag: llama.cpp adds bos.
        tokenizer_config.setdefault("add_bos_token", True)
    tokens = tokenizer_dict["tokens"]
    for name, key in (("bos_token", "bos_token_id"), ("eos_token", "eos_token_id"),
                      ("unk_token", "unknown_token_id"), ("pad_token", "padding_token_id")):
        token_id = metadata.get(f"tokenizer.ggml.{key}")
        tokenizer_config[name] = tokens[token_id] if token_id is not None else None
    backend, _ = convert_gguf_tokenizer(metadata["general.architecture"], tokenizer_dict)
    return PreTrainedTokenizerFast(tokenizer_object=backend, **tokenizer_config)


def _stop_ids(tokenizer: PreTrainedTokenizerFast, metadata: Mapping[str, Any],
              source: str) -> list[int]:
    """generation_config.json's eos list: the file's eos / eot / eom ids and the chat
    template's end-of-turn token; the file's ids alone (with a warning) when the template
    cannot be read for one (the weights are imported regardless)."""
    file_stops = [int(metadata[k]) for k in _STOP_KEYS if k in metadata]
    try:
        return list(stop_token_ids(tokenizer, file_stops))
    except (ValueError, jinja2.TemplateError) as e:
        log.warning("%s: no end-of-turn token from the chat template (%s); "
                    "generation_config.json lists the file's eos ids %s", source, e, file_stops)
        return sorted(set(file_stops))


def import_gguf(gguf_path: str | os.PathLike, out: str | os.PathLike, *,
                max_shard_bytes: int = 4 * 2**30) -> ModelConfig:
    """Writes the HF folder of a GGUF file (module docstring), replacing `out` atomically.

    Everything is checked (architecture, quantization types, tensor names and shapes)
    before anything is written.

    Args:
      gguf_path: a .gguf file of the Llama, Qwen2 or Qwen3 family.
      out: the folder to write (replaced as a whole; see agentjax.core.atomic).
      max_shard_bytes: above this the float32 weights are split into several files.

    Returns:
      The ModelConfig written.

    Raises:
      FileNotFoundError: no such file.
      ValueError: not a GGUF file, an unsupported architecture or quantization type (the
        supported ones named), a tensor missing or of the wrong shape.
    """
    gguf_path = Path(gguf_path)
    if not gguf_path.is_file():
        raise FileNotFoundError(f"{gguf_path} not found")
    source = str(gguf_path)
    try:
        reader = gguf.GGUFReader(gguf_path)
    except ValueError as e:  # the reader's own errors: magic, version, truncation
        raise ValueError(f"{source}: not a readable GGUF file ({e})") from e
    metadata = read_metadata(reader)
    if metadata.get("split.count", 1) > 1:
        raise ValueError(f"{source}: one part of a split GGUF model (split.count="
                         f"{metadata['split.count']}); merge the parts first with llama.cpp's "
                         "`llama-gguf-split --merge FIRST_PART OUT.gguf`")
    shapes = _hf_shapes(reader)
    cfg = model_config(metadata, shapes, _rope_freqs(reader), source)
    _check_types(reader, source)
    _validate(shapes, cfg, source)
    tokenizer = gguf_tokenizer(metadata, source)
    cfg.to_hf()  # raises on a bias layout config.json cannot state, before writing

    sizes = {hf_name(n): math.prod(shape) * 4 for n, shape in shapes.items()}
    with atomic.folder(out) as folder:
        write_safetensors(folder, hf_tensors(reader, cfg), sizes, max_shard_bytes)
        folder = Path(folder)
        hf_config = cfg.to_hf()
        hf_config["torch_dtype"] = "float32"
        (folder / CONFIG_FILE).write_text(json.dumps(hf_config, indent=2))
        generation = {"bos_token_id": cfg.bos_token_id,
                      "eos_token_id": _stop_ids(tokenizer, metadata, source),
                      "pad_token_id": cfg.pad_token_id}
        (folder / GENERATION_CONFIG_FILE).write_text(json.dumps(generation, indent=2))
        _save_tokenizer(tokenizer, cfg, folder)
    return cfg
