"""HF checkpoints in and out: local folders with `config.json` + safetensors.

    model, config = load_hf("ckpt/", dtype=jnp.bfloat16, mesh=mesh, rules=rules)
    save_hf(model, config, "export/", tokenizer=tok)   # transformers / SGLang load it
    config = make_tiny_hf("tiny/", arch="qwen2", tokenizer=tok)   # random tiny model

`load_hf` reads `model.safetensors` or a sharded `model.safetensors.index.json`, and
adds the eos ids of `generation_config.json` to the config's (an instruct model stops on
each of them: Qwen2.5-Instruct lists <|im_end|> and <|endoftext|>). It
validates every tensor's name and shape from the safetensors headers before reading any
data, then builds each parameter with `jax.make_array_from_callback`: each device shard
is filled from the file layer by layer, so the host holds at most one device shard of
one parameter plus the layer tensor being read — never a copy of the whole model.

`make_tiny_hf` writes the config with `ModelConfig.to_hf` and random agentjax weights
through `save_hf`; the tests load the result with transformers' torch models, which is
what proves the format. (torch is never imported by the library.)

HF <-> agentjax layouts (per layer, agentjax stacks a leading layer axis):
  q/k/v_proj.weight [H*hd, D] <-> [D, H, hd]    o_proj.weight [D, H*hd] <-> [H, hd, D]
  gate/up_proj.weight [F, D] <-> [D, F]          down_proj.weight [D, F] <-> [F, D]
  lm_head.weight [V, D] <-> [D, V]               biases / norms / embed_tokens: as is
Import and export share these per-architecture tensor maps (`_tensor_maps`).
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import shutil
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.experimental import multihost_utils
from jax.sharding import Mesh, SingleDeviceSharding
from safetensors import safe_open
from safetensors.numpy import save_file
from tokenizers import Tokenizer

from agentjax.core import atomic
from agentjax.models.config import ModelConfig
from agentjax.models.decoder import Decoder
from agentjax.core.parallel import LogicalSharding, Rules, param_shardings, resolve_rules

CONFIG_FILE = "config.json"
GENERATION_CONFIG_FILE = "generation_config.json"
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
# A checkpoint folder's tokenizer and generation files, both transformers generations'
# (4: vocab/merges/special_tokens_map and the template inside tokenizer_config.json;
# 5: chat_template.jinja), copied as they are into exports.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt",
                   "special_tokens_map.json", "added_tokens.json", "chat_template.jinja",
                   "chat_template.json", GENERATION_CONFIG_FILE)
# Tensors some checkpoints carry that the model recomputes.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


@dataclasses.dataclass(frozen=True)
class _TensorMap:
    """How one agentjax parameter maps to HF tensor(s).

    Attributes:
      path: the parameter's key path in the Decoder state, e.g. ("layers", "q_proj").
      hf_name: HF tensor name; "{i}" is the layer index for stacked parameters.
      hf_shape: shape of one HF tensor.
      to_model: one HF tensor -> one (per-layer) agentjax array.
      to_hf: the inverse.
    """

    path: tuple[str, ...]
    hf_name: str
    hf_shape: tuple[int, ...]
    to_model: Callable[[np.ndarray], np.ndarray]
    to_hf: Callable[[np.ndarray], np.ndarray]

    @property
    def stacked(self) -> bool:
        return "{i}" in self.hf_name


def _identity(x: np.ndarray) -> np.ndarray:
    return x


def _tensor_maps(cfg: ModelConfig) -> list[_TensorMap]:
    D, F, V, hd = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size, cfg.head_dim
    H, K = cfg.num_heads, cfg.num_kv_heads
    T = lambda x: x.T  # noqa: E731

    def proj(heads: int) -> tuple[Callable, Callable]:
        return (lambda w: w.T.reshape(D, heads, hd), lambda w: w.reshape(D, heads * hd).T)

    def bias(heads: int) -> tuple[Callable, Callable]:
        return (lambda b: b.reshape(heads, hd), lambda b: b.reshape(heads * hd))

    attn, layer = "model.layers.{i}.self_attn.", "model.layers.{i}."
    maps = [
        _TensorMap(("embed",), "model.embed_tokens.weight", (V, D), _identity, _identity),
        _TensorMap(("final_norm",), "model.norm.weight", (D,), _identity, _identity),
        _TensorMap(("layers", "attn_norm"), layer + "input_layernorm.weight", (D,),
                   _identity, _identity),
        _TensorMap(("layers", "mlp_norm"), layer + "post_attention_layernorm.weight", (D,),
                   _identity, _identity),
        _TensorMap(("layers", "q_proj"), attn + "q_proj.weight", (H * hd, D), *proj(H)),
        _TensorMap(("layers", "k_proj"), attn + "k_proj.weight", (K * hd, D), *proj(K)),
        _TensorMap(("layers", "v_proj"), attn + "v_proj.weight", (K * hd, D), *proj(K)),
        _TensorMap(("layers", "o_proj"), attn + "o_proj.weight", (D, H * hd),
                   lambda w: w.T.reshape(H, hd, D), lambda w: w.reshape(H * hd, D).T),
        _TensorMap(("layers", "gate_proj"), layer + "mlp.gate_proj.weight", (F, D), T, T),
        _TensorMap(("layers", "up_proj"), layer + "mlp.up_proj.weight", (F, D), T, T),
        _TensorMap(("layers", "down_proj"), layer + "mlp.down_proj.weight", (D, F), T, T),
    ]
    if cfg.qkv_bias:
        maps += [
            _TensorMap(("layers", "q_bias"), attn + "q_proj.bias", (H * hd,), *bias(H)),
            _TensorMap(("layers", "k_bias"), attn + "k_proj.bias", (K * hd,), *bias(K)),
            _TensorMap(("layers", "v_bias"), attn + "v_proj.bias", (K * hd,), *bias(K)),
        ]
    if cfg.o_bias:
        maps.append(_TensorMap(("layers", "o_bias"), attn + "o_proj.bias", (D,),
                               _identity, _identity))
    if cfg.qk_norm:
        maps += [
            _TensorMap(("layers", "q_norm"), attn + "q_norm.weight", (hd,), _identity, _identity),
            _TensorMap(("layers", "k_norm"), attn + "k_norm.weight", (hd,), _identity, _identity),
        ]
    if not cfg.tie_embeddings:
        maps.append(_TensorMap(("lm_head",), "lm_head.weight", (V, D), T, T))
    return maps


def _hf_names(tmap: _TensorMap, num_layers: int) -> list[str]:
    if tmap.stacked:
        return [tmap.hf_name.format(i=i) for i in range(num_layers)]
    return [tmap.hf_name]


def hf_tensor_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """HF tensor name -> shape, for every tensor of a checkpoint of `cfg`."""
    return {name: tmap.hf_shape for tmap in _tensor_maps(cfg)
            for name in _hf_names(tmap, cfg.num_layers)}


def _read_header(file: Path) -> dict[str, Any]:
    """The JSON header of a safetensors file (names, dtypes, shapes)."""
    try:
        with open(file, "rb") as f:
            size = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(size))
    except (OSError, ValueError) as e:
        raise ValueError(f"{file}: not a readable safetensors file ({e})") from e
    header.pop("__metadata__", None)
    return header


def _checkpoint_index(path: Path) -> dict[str, tuple[Path, tuple[int, ...]]]:
    """HF tensor name -> (file, shape) for a single-file or sharded checkpoint."""
    index_file, single_file = path / INDEX_FILE, path / SINGLE_FILE
    if index_file.exists():
        weight_map = json.loads(index_file.read_text()).get("weight_map")
        if not isinstance(weight_map, dict):
            raise ValueError(f"{index_file}: no 'weight_map' object")
        files = sorted(set(weight_map.values()))
    elif single_file.exists():
        files = [SINGLE_FILE]
    else:
        raise FileNotFoundError(f"{path}: neither {SINGLE_FILE} nor {INDEX_FILE} found")
    index: dict[str, tuple[Path, tuple[int, ...]]] = {}
    for name in files:
        file = path / name
        if not file.exists():
            raise FileNotFoundError(f"{file}: shard listed in {INDEX_FILE} is missing")
        for tensor, info in _read_header(file).items():
            index[tensor] = (file, tuple(info["shape"]))
    return index


def _validate(index: Mapping[str, tuple[Path, tuple[int, ...]]], maps: list[_TensorMap],
              cfg: ModelConfig, path: Path, strict: bool) -> None:
    """Every expected tensor present with the expected shape; nothing unexplained."""
    expected = set()
    for tmap in maps:
        for name in _hf_names(tmap, cfg.num_layers):
            expected.add(name)
            if name not in index:
                raise ValueError(f"{path}: tensor {name!r} is missing from the checkpoint "
                                 f"(config says arch={cfg.arch}, layers={cfg.num_layers})")
            file, shape = index[name]
            if shape != tmap.hf_shape:
                raise ValueError(f"{file}: tensor {name!r} has shape {list(shape)}, "
                                 f"expected {list(tmap.hf_shape)} from {path / CONFIG_FILE}")
    if cfg.tie_embeddings:
        expected.add("lm_head.weight")  # tied checkpoints may still store it
    unexpected = sorted(n for n in index if n not in expected
                        and not n.endswith(_IGNORED_SUFFIXES))
    if unexpected and strict:
        raise ValueError(f"{path}: unexpected tensors {unexpected[:8]}"
                         f"{' ...' if len(unexpected) > 8 else ''}; the checkpoint has "
                         "weights this architecture does not use (pass strict=False to "
                         "ignore them)")


def _set_path(tree: Any, path: tuple[str, ...], value: Any) -> None:
    node = tree
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = node[path[-1]].replace(value)


def _get_path(tree: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        tree = tree[key]
    return tree


def load_hf(path: str | os.PathLike, *, dtype: Any = jnp.float32, mesh: Mesh | None = None,
            rules: Mapping[str, Any] | Rules | None = None, strict: bool = True,
            **config_overrides: Any) -> tuple[Decoder, ModelConfig]:
    """Loads a local HF Llama 3.x / Qwen2 / Qwen3 checkpoint.

    Args:
      path: folder with config.json and model.safetensors or a sharded index.
      dtype: parameter dtype (and compute dtype, unless overridden).
      mesh: place each tensor directly into its sharding on this mesh (None: first
        device).
      rules: logical-axis rules for the mesh (None: parallel.DEFAULT_RULES).
      strict: raise on checkpoint tensors the architecture does not use.
      **config_overrides: ModelConfig fields to override (dtype, remat, ...).

    Returns:
      (Decoder, ModelConfig). With a mesh the model also constrains its activations.

    Raises:
      FileNotFoundError: config.json / weights / a listed shard is missing (named).
      ValueError: unsupported architecture, missing or unexpected tensor, tensor with
        the wrong shape (each named with its file), unreadable generation_config.json.
    """
    path = Path(path)
    config_file = path / CONFIG_FILE
    if not config_file.exists():
        raise FileNotFoundError(f"{config_file} not found")
    hf_config = json.loads(config_file.read_text())
    config_eos = _eos_list(hf_config.get("eos_token_id"))
    eos = config_eos + [i for i in _generation_eos(path) if i not in config_eos]
    overrides = {"param_dtype": dtype, "dtype": dtype,
                 "eos_token_id": None if not eos else eos[0] if len(eos) == 1 else tuple(eos),
                 **config_overrides}
    cfg = ModelConfig.from_hf(hf_config, **overrides)
    index = _checkpoint_index(path)
    maps = _tensor_maps(cfg)
    _validate(index, maps, cfg, path, strict)

    graphdef, state = nnx.split(nnx.eval_shape(lambda: Decoder(cfg, rngs=nnx.Rngs(0))))
    if mesh is None:
        shardings = jax.tree.map(lambda _: SingleDeviceSharding(jax.devices()[0]), state)
    else:
        rules = resolve_rules(rules)
        shardings = param_shardings(state, mesh, rules)
    with contextlib.ExitStack() as stack:
        handles: dict[Path, Any] = {}

        def read(name: str) -> np.ndarray:
            file = index[name][0]
            if file not in handles:
                handles[file] = stack.enter_context(safe_open(file, framework="numpy"))
            return handles[file].get_tensor(name)

        for tmap in maps:
            abstract = _get_path(state, tmap.path).get_value()
            sharding = _get_path(shardings, tmap.path).get_value()
            _set_path(state, tmap.path, _build_array(tmap, abstract, sharding, read, cfg))
    model = nnx.merge(graphdef, state)
    if mesh is not None:
        model.activation_sharding = LogicalSharding(mesh, rules)
    return model, cfg


def _eos_list(eos: Any) -> list[int]:
    """An HF eos field (None, an id or a list of ids) as a list."""
    if eos is None:
        return []
    return [int(i) for i in eos] if isinstance(eos, (list, tuple)) else [int(eos)]


def _generation_eos(path: Path) -> list[int]:
    """The eos ids of `path`/generation_config.json ([] without the file)."""
    file = path / GENERATION_CONFIG_FILE
    if not file.exists():
        return []
    try:
        return _eos_list(json.loads(file.read_text()).get("eos_token_id"))
    except (ValueError, TypeError, AttributeError) as e:
        raise ValueError(f"{file}: eos_token_id must be an id or a list of ids ({e})") from e


def _build_array(tmap: _TensorMap, abstract: jax.ShapeDtypeStruct, sharding: jax.sharding.Sharding,
                 read: Callable[[str], np.ndarray], cfg: ModelConfig) -> jax.Array:
    """One parameter, each addressable shard filled from the checkpoint."""
    shape, dtype = abstract.shape, abstract.dtype

    def shard(index: tuple[slice, ...]) -> np.ndarray:
        if not tmap.stacked:
            return tmap.to_model(read(tmap.hf_name))[index].astype(dtype)
        layers = range(cfg.num_layers)[index[0]]
        return np.stack([tmap.to_model(read(tmap.hf_name.format(i=i)))[index[1:]].astype(dtype)
                         for i in layers])

    return jax.make_array_from_callback(shape, sharding, shard)


def host_value(x: jax.Array) -> np.ndarray:
    """A (possibly sharded, possibly multi-host) array gathered to host memory."""
    if not x.is_fully_addressable:
        x = multihost_utils.process_allgather(x, tiled=True)
    return np.asarray(jax.device_get(x))


def _hf_tensors(model: Decoder, cfg: ModelConfig, dtype: Any) -> Iterator[tuple[str, np.ndarray]]:
    """(HF name, array) pairs, one stacked parameter on the host at a time."""
    state = nnx.state(model)
    for tmap in _tensor_maps(cfg):
        value = host_value(_get_path(state, tmap.path).get_value())
        if tmap.stacked:
            for i in range(cfg.num_layers):
                yield tmap.hf_name.format(i=i), np.ascontiguousarray(tmap.to_hf(value[i]).astype(dtype))
        else:
            yield tmap.hf_name, np.ascontiguousarray(tmap.to_hf(value).astype(dtype))


def save_hf(model: Decoder, config: ModelConfig, path: str | os.PathLike, *,
            dtype: Any = None, tokenizer: Any = None,
            max_shard_bytes: int = 4 * 2**30,
            extra_files: Mapping[str, str] | None = None) -> None:
    """Writes config.json + safetensors that transformers (and SGLang) load.

    Args:
      model: the policy Decoder (sharded or not; gathered one parameter at a time).
      config: its ModelConfig.
      path: output folder, replaced as a whole (atomically: see agentjax.core.atomic).
      dtype: dtype of the written tensors (default: config.param_dtype).
      tokenizer: optional HF tokenizer saved alongside (`_save_tokenizer`): the files of
        the folder it was loaded from, else `save_pretrained` made loadable by
        transformers 4 too; plus a generation_config.json.
      max_shard_bytes: above this total size the weights are split into
        model-0000k-of-0000n.safetensors files plus model.safetensors.index.json.
      extra_files: file name -> text, written into the folder with the rest (e.g. a
        record of what wrote it).
    """
    if not isinstance(model, Decoder):
        raise TypeError(f"save_hf expects a Decoder, got {type(model).__name__} "
                        "(pass ActorCritic.policy for the policy)")
    dtype = jnp.dtype(config.param_dtype if dtype is None else dtype)
    sizes = {name: math.prod(shape) * dtype.itemsize
             for name, shape in hf_tensor_shapes(config).items()}
    # Every process joins the gathers; process 0 writes, into a folder that replaces
    # `path` only once complete (a killed export leaves the previous one or none).
    is_writer = jax.process_index() == 0
    with atomic.folder(path) if is_writer else contextlib.nullcontext() as out:
        write_safetensors(out, _hf_tensors(model, config, dtype), sizes, max_shard_bytes,
                          write=is_writer)
        if not is_writer:
            return
        out = Path(out)
        hf_config = config.to_hf()
        hf_config["torch_dtype"] = dtype.name
        (out / CONFIG_FILE).write_text(json.dumps(hf_config, indent=2))
        if tokenizer is not None:
            _save_tokenizer(tokenizer, config, out)
        for name, text in (extra_files or {}).items():
            (out / name).write_text(text)


def write_safetensors(path: str | os.PathLike, tensors: Iterable[tuple[str, np.ndarray]],
                      sizes: Mapping[str, int], max_shard_bytes: int, *,
                      write: bool = True) -> None:
    """Writes named arrays as `model.safetensors`, or as model-0000k-of-0000n.safetensors
    files plus `model.safetensors.index.json` when their total passes max_shard_bytes.

    Args:
      path: an existing folder.
      tensors: (HF name, array) pairs, each name of `sizes` once, in any order; a shard
        is written (and dropped) as soon as its last tensor arrives, so a caller that
        yields them in `sizes`' order holds one shard in memory at a time.
      sizes: name -> bytes of every tensor, in checkpoint order (`_plan_shards`).
      max_shard_bytes: the most bytes of one file (a bigger tensor gets a file of its
        own).
      write: False consumes `tensors` without writing (the processes other than the
        writer join the gathers `tensors` does).
    """
    shards = _plan_shards(sizes, max_shard_bytes)
    shard_of = {name: k for k, names in enumerate(shards) for name in names}
    pending: dict[int, dict[str, np.ndarray]] = {}
    files = [SINGLE_FILE] if len(shards) == 1 else [
        f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors" for k in range(len(shards))]
    for name, array in tensors:
        k = shard_of[name]
        pending.setdefault(k, {})[name] = array
        if len(pending[k]) == len(shards[k]):
            shard = pending.pop(k)
            if write:
                file = os.path.join(path, files[k])
                save_file(shard, file, metadata={"format": "pt"})
                # safetensors creates 0600 files; inference servers often run as
                # another user on the shared checkpoint folder.
                os.chmod(file, 0o644)
    if pending:
        raise ValueError(f"tensors {sorted(n for s in pending.values() for n in s)[:8]} "
                         "came without the rest of their shard")
    if write and len(shards) > 1:
        index = {"metadata": {"total_size": sum(sizes.values())},
                 "weight_map": {name: files[k] for name, k in shard_of.items()}}
        Path(path, INDEX_FILE).write_text(json.dumps(index, indent=2))


def _tokenizer_source(tokenizer: Any) -> Path | None:
    """The local folder `tokenizer` was loaded from, if its tokenizer.json still has
    the tokenizer's exact vocabulary (added tokens included)."""
    source = Path(tokenizer.name_or_path or "")
    file = source / "tokenizer.json"
    if not tokenizer.name_or_path or not file.is_file():
        return None
    on_disk = Tokenizer.from_file(str(file)).get_vocab(with_added_tokens=True)
    return source if on_disk == tokenizer.get_vocab() else None


def _save_tokenizer(tokenizer: Any, config: ModelConfig, path: Path) -> None:
    """Writes the tokenizer files of an export.

    Inference servers (SGLang, vLLM) often pin transformers 4, which cannot load what
    transformers 5's `save_pretrained` writes (`tokenizer_class` "TokenizersBackend",
    `extra_special_tokens` as a list). A tokenizer loaded from a folder therefore gets
    that folder's files copied as they are (tokenizer, chat template and
    generation_config.json, e.g. the Hub's eos list and sampling defaults); any other
    tokenizer is saved with `save_pretrained` and its tokenizer_config.json rewritten
    with the fields transformers 4 reads. Without a source generation_config.json one
    is written whose eos list holds every id that ends a turn (`stop_token_ids`).
    """
    # Imported here: agentjax.models does not import transformers (see its __init__).
    from agentjax.models.tokenizer import stop_token_ids

    # `path` is a fresh folder (save_hf writes through atomic.folder), so copying from
    # the source works even when the export replaces the folder the tokenizer came from.
    source = _tokenizer_source(tokenizer)
    if source is not None:
        for name in TOKENIZER_FILES:
            if (source / name).is_file():
                shutil.copyfile(source / name, path / name)
                os.chmod(path / name, 0o644)
    else:
        tokenizer.save_pretrained(str(path))
        _write_transformers4_fields(tokenizer, path / "tokenizer_config.json")
    if not (path / GENERATION_CONFIG_FILE).exists():
        generation = {"bos_token_id": config.bos_token_id,
                      "eos_token_id": list(stop_token_ids(
                          tokenizer, _eos_list(config.eos_token_id))),
                      "pad_token_id": config.pad_token_id}
        (path / GENERATION_CONFIG_FILE).write_text(json.dumps(generation, indent=2))


def _write_transformers4_fields(tokenizer: Any, config_file: Path) -> None:
    """Rewrites a transformers-5 tokenizer_config.json with the fields transformers 4
    reads: a class both generations have, `added_tokens_decoder`, the special-token list
    under its transformers-4 name and the chat template inline."""
    fields = json.loads(config_file.read_text())
    extra = fields.pop("extra_special_tokens", None)
    if isinstance(extra, list):  # transformers 4 expects a dict of named tokens here
        fields["additional_special_tokens"] = extra
    elif extra:
        fields["extra_special_tokens"] = extra
    for load_time_only in ("backend", "is_local", "local_files_only"):
        fields.pop(load_time_only, None)
    fields["tokenizer_class"] = "PreTrainedTokenizerFast"
    fields["added_tokens_decoder"] = {
        str(i): {"content": t.content, "lstrip": t.lstrip, "normalized": t.normalized,
                 "rstrip": t.rstrip, "single_word": t.single_word, "special": t.special}
        for i, t in sorted(tokenizer.added_tokens_decoder.items())}
    if tokenizer.chat_template:
        fields["chat_template"] = tokenizer.chat_template
    config_file.write_text(json.dumps(fields, indent=2, ensure_ascii=False))


def _plan_shards(sizes: Mapping[str, int], max_shard_bytes: int) -> list[list[str]]:
    """Consecutive tensors grouped into files of at most max_shard_bytes (a bigger
    single tensor gets a file of its own)."""
    shards: list[list[str]] = [[]]
    total = 0
    for name, size in sizes.items():
        if shards[-1] and total + size > max_shard_bytes:
            shards.append([])
            total = 0
        shards[-1].append(name)
        total += size
    return shards


_TINY_DEFAULTS = dict(hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                      num_kv_heads=2, head_dim=16, max_position_embeddings=4096)


def make_tiny_hf(path: str | os.PathLike, *, arch: str = "qwen2", tokenizer: Any = None,
                 seed: int = 0, **config_overrides: Any) -> ModelConfig:
    """Writes a small random-init HF checkpoint (plus tokenizer) for tests / CPU runs.

    Args:
      path: output folder.
      arch: "qwen2" (q/k/v bias, tied embeddings), "qwen3" (q/k norm, tied) or "llama"
        (untied).
      tokenizer: HF tokenizer to save with it; sets vocab size and bos/eos/pad ids.
      seed: init seed.
      **config_overrides: ModelConfig fields (hidden_size, num_layers, rope, ...).

    Returns:
      The ModelConfig written.
    """
    fields: dict[str, Any] = dict(_TINY_DEFAULTS, arch=arch, vocab_size=512,
                                  tie_embeddings=arch != "llama",
                                  qkv_bias=arch == "qwen2", qk_norm=arch == "qwen3")
    if tokenizer is not None:
        fields.update(vocab_size=len(tokenizer), eos_token_id=tokenizer.eos_token_id,
                      pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id)
    fields.update(config_overrides)
    cfg = ModelConfig(**fields)
    save_hf(Decoder(cfg, rngs=nnx.Rngs(seed)), cfg, path, tokenizer=tokenizer)
    return cfg
