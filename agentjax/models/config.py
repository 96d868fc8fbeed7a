"""ModelConfig: one frozen dataclass for the Llama 3.x / Qwen2 / Qwen3 decoder family.

    with open("ckpt/config.json") as f:
        cfg = ModelConfig.from_hf(json.load(f))                       # HF -> agentjax
    hf_dict = cfg.to_hf()                                             # agentjax -> HF
    cfg = dataclasses.replace(cfg, dtype="bfloat16", remat="full")    # tweak

What the architectures differ in is reduced to flags: `qkv_bias` (Qwen2), `o_bias`
(Llama/Qwen3 `attention_bias`), `qk_norm` (Qwen3), `tie_embeddings`, an explicit
`head_dim`, and `rope` (theta plus optional "linear" or "llama3" frequency scaling).
Both HF spellings of the rope settings are read: top-level `rope_theta` + `rope_scaling`
(transformers 4 checkpoints) and `rope_parameters` (transformers 5). `to_hf` writes
`rope_theta` + `rope_scaling`, which both transformers generations (and SGLang) read.

The config is hashable (it lives in the static part of an NNX graphdef), so dtypes are
stored as names ("float32", "bfloat16") and token-id lists as tuples.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

import jax.numpy as jnp
import numpy as np

from agentjax.config.choices import ARCHS, ATTENTION_IMPLS, REMAT_POLICIES
from agentjax.models.lora import LoraConfig

# HF `model_type` -> (our arch name, HF architectures entry).
_ARCHS = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}

_ROPE_TYPES = ("default", "linear", "llama3")


@dataclasses.dataclass(frozen=True)
class RopeConfig:
    """Rotary embedding settings.

    Attributes:
      theta: base of the inverse frequencies.
      type: "default", "linear" (divide every frequency by `factor`) or "llama3"
        (Llama 3.1 band-wise scaling, below).
      factor: frequency division factor for "linear" / "llama3".
      low_freq_factor, high_freq_factor, original_max_position_embeddings: the
        "llama3" band edges (wavelengths original/low and original/high).
    """

    theta: float = 10000.0
    type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192

    def __post_init__(self):
        if self.type not in _ROPE_TYPES:
            raise ValueError(
                f"unsupported rope type {self.type!r}; supported: {_ROPE_TYPES}")

    def inv_freq(self, head_dim: int) -> np.ndarray:
        """Inverse frequencies [head_dim // 2] (float32), as HF computes them."""
        exponents = np.arange(0, head_dim, 2, dtype=np.float64) / head_dim
        inv_freq = 1.0 / (self.theta ** exponents)
        if self.type == "linear":
            inv_freq = inv_freq / self.factor
        elif self.type == "llama3":
            inv_freq = _llama3_scaling(inv_freq, self)
        return inv_freq.astype(np.float32)


def _llama3_scaling(inv_freq: np.ndarray, rope: RopeConfig) -> np.ndarray:
    """Llama 3.1 scaling: long wavelengths divided by `factor`, short ones kept, the band
    between interpolated linearly in 1/wavelength."""
    old_len = rope.original_max_position_embeddings
    low_freq_wavelen = old_len / rope.low_freq_factor
    high_freq_wavelen = old_len / rope.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = np.where(wavelen > low_freq_wavelen, inv_freq / rope.factor, inv_freq)
    smooth = (old_len / wavelen - rope.low_freq_factor) / (
        rope.high_freq_factor - rope.low_freq_factor)
    smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
    is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return np.where(is_medium, smoothed, scaled)


def _dtype_name(dtype: Any) -> str:
    return jnp.dtype(dtype).name


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Architecture and numerics of one decoder.

    Attributes:
      arch: "llama", "qwen2" or "qwen3" (the HF `model_type`; used by `to_hf`).
      vocab_size, hidden_size, intermediate_size: V, D and the SwiGLU width F.
      num_layers: decoder layers (stacked and scanned, so compile time is flat in it).
      num_heads, num_kv_heads, head_dim: query heads, key/value heads (GQA; must divide
        num_heads) and per-head width (explicit: Qwen3 has head_dim*heads != D).
      rope: rotary embedding settings.
      rms_norm_eps: RMSNorm epsilon.
      qkv_bias: q/k/v projections have biases (Qwen2; Llama/Qwen3 `attention_bias`).
      o_bias: output projection has a bias (Llama/Qwen3 `attention_bias`).
      qk_norm: RMSNorm over head_dim on q and k before RoPE (Qwen3).
      tie_embeddings: the lm-head is the transposed token embedding.
      max_position_embeddings: context length recorded in the HF config.
      bos_token_id, eos_token_id, pad_token_id: recorded for the HF config round trip
        (eos may be a tuple of ids).
      param_dtype: storage dtype of parameters ("float32", "bfloat16").
      dtype: compute dtype of activations and matmuls; norms, softmax and logits are
        always computed in float32.
      remat: rematerialization policy of each layer, one of REMAT_POLICIES.
      attention: implementation of the full-sequence attention, one of ATTENTION_IMPLS
        (models/attention.py).
      attention_block: query / key block length of the blockwise attention.
      lora: low-rank adapters on the projections (models/lora.py), or None. Not part of
        the HF config: adapters are exported as a PEFT folder or merged.
    """

    arch: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope: RopeConfig = RopeConfig()
    rms_norm_eps: float = 1e-6
    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: bool = False
    tie_embeddings: bool = False
    max_position_embeddings: int = 32768
    bos_token_id: int | None = None
    eos_token_id: int | tuple[int, ...] | None = None
    pad_token_id: int | None = None
    param_dtype: str = "float32"
    dtype: str = "float32"
    remat: str = "auto"
    attention: str = "auto"
    attention_block: int = 256
    lora: LoraConfig | None = None

    def __post_init__(self):
        if self.arch not in _ARCHS:
            raise ValueError(f"unsupported arch {self.arch!r}; supported: {ARCHS}")
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers",
                     "num_heads", "num_kv_heads", "head_dim"):
            value = getattr(self, name)
            if not isinstance(value, (int, np.integer)) or value <= 0:
                raise ValueError(f"ModelConfig.{name} must be a positive int, got {value!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads "
                f"({self.num_kv_heads})")
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for RoPE, got {self.head_dim}")
        if self.remat not in REMAT_POLICIES:
            raise ValueError(f"remat must be one of {REMAT_POLICIES}, got {self.remat!r}")
        if self.attention not in ATTENTION_IMPLS:
            raise ValueError(f"attention must be one of {ATTENTION_IMPLS}, "
                             f"got {self.attention!r}")
        if self.attention_block <= 0:
            raise ValueError(f"attention_block must be positive, got {self.attention_block}")
        # Normalise dtypes and id lists so the config stays hashable and comparable.
        object.__setattr__(self, "param_dtype", _dtype_name(self.param_dtype))
        object.__setattr__(self, "dtype", _dtype_name(self.dtype))
        if isinstance(self.eos_token_id, (list, tuple)):
            object.__setattr__(self, "eos_token_id", tuple(int(i) for i in self.eos_token_id))

    @property
    def num_query_groups(self) -> int:
        """Query heads served by each key/value head."""
        return self.num_heads // self.num_kv_heads

    @classmethod
    def from_hf(cls, config: Mapping[str, Any], **overrides: Any) -> "ModelConfig":
        """Builds a config from an HF `config.json` dict.

        Args:
          config: the parsed `config.json` of a Llama 3.x, Qwen2/2.5 or Qwen3 checkpoint.
          **overrides: ModelConfig fields to set on top (e.g. dtype="bfloat16").

        Raises:
          ValueError: unknown `model_type`, a missing key, or a feature this decoder
            does not implement (sliding-window attention, MLP bias, non-SiLU
            activation, an unsupported rope type).
        """
        model_type = config.get("model_type")
        if model_type not in _ARCHS:
            raise ValueError(
                f"unsupported HF model_type {model_type!r} (architectures="
                f"{config.get('architectures')}); supported: {ARCHS}")

        def need(key: str) -> Any:
            if key not in config:
                raise ValueError(f"HF config of model_type {model_type!r} lacks {key!r}")
            return config[key]

        act = config.get("hidden_act", "silu")
        if act != "silu":
            raise ValueError(f"unsupported hidden_act {act!r}; only 'silu' (SwiGLU)")
        if config.get("use_sliding_window", False):
            raise ValueError("sliding-window attention (use_sliding_window=true) is not supported")
        if config.get("mlp_bias", False):
            raise ValueError("mlp_bias=true is not supported")

        num_heads = need("num_attention_heads")
        hidden = need("hidden_size")
        head_dim = config.get("head_dim") or hidden // num_heads
        attention_bias = bool(config.get("attention_bias", False))
        fields = dict(
            arch=model_type,
            vocab_size=need("vocab_size"),
            hidden_size=hidden,
            intermediate_size=need("intermediate_size"),
            num_layers=need("num_hidden_layers"),
            num_heads=num_heads,
            num_kv_heads=config.get("num_key_value_heads") or num_heads,
            head_dim=head_dim,
            rope=_rope_from_hf(config),
            rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
            qkv_bias=True if model_type == "qwen2" else attention_bias,
            o_bias=False if model_type == "qwen2" else attention_bias,
            qk_norm=model_type == "qwen3",
            tie_embeddings=bool(config.get("tie_word_embeddings", False)),
            max_position_embeddings=int(config.get("max_position_embeddings", 32768)),
            bos_token_id=config.get("bos_token_id"),
            eos_token_id=config.get("eos_token_id"),
            pad_token_id=config.get("pad_token_id"),
        )
        dtype = config.get("dtype") or config.get("torch_dtype")
        if dtype in ("float32", "bfloat16", "float16"):
            fields["param_dtype"] = dtype
        fields.update(overrides)
        return cls(**fields)

    def to_hf(self) -> dict[str, Any]:
        """The HF `config.json` dict of this config (transformers 4 and 5 read it)."""
        rope = self.rope
        if rope.type == "default":
            rope_scaling = None
        elif rope.type == "linear":
            rope_scaling = {"rope_type": "linear", "factor": rope.factor}
        else:
            rope_scaling = {
                "rope_type": "llama3", "factor": rope.factor,
                "low_freq_factor": rope.low_freq_factor,
                "high_freq_factor": rope.high_freq_factor,
                "original_max_position_embeddings": rope.original_max_position_embeddings,
            }
        hf: dict[str, Any] = {
            "architectures": [_ARCHS[self.arch]],
            "model_type": self.arch,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": rope.theta,
            "rope_scaling": rope_scaling,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_embeddings,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": (list(self.eos_token_id) if isinstance(self.eos_token_id, tuple)
                             else self.eos_token_id),
            "pad_token_id": self.pad_token_id,
            "torch_dtype": self.param_dtype,
            "use_cache": True,
        }
        if self.arch == "qwen2":
            if self.o_bias or not self.qkv_bias:
                raise ValueError("qwen2 checkpoints have q/k/v biases and no o bias; "
                                 "use arch='llama' for other bias layouts")
            hf["use_sliding_window"] = False
        else:
            if self.qkv_bias != self.o_bias:
                raise ValueError(f"{self.arch} has one attention_bias flag for q/k/v/o; "
                                 f"got qkv_bias={self.qkv_bias}, o_bias={self.o_bias}")
            hf["attention_bias"] = self.qkv_bias
        if self.arch == "llama":
            hf["mlp_bias"] = False
        if self.qk_norm != (self.arch == "qwen3"):
            raise ValueError(f"qk_norm={self.qk_norm} cannot be expressed as arch {self.arch!r}")
        return hf


def _rope_from_hf(config: Mapping[str, Any]) -> RopeConfig:
    """Reads `rope_parameters` (transformers 5) or `rope_theta` + `rope_scaling`."""
    params = dict(config.get("rope_parameters") or {})
    scaling = dict(config.get("rope_scaling") or {})
    merged = {**scaling, **params}
    theta = merged.get("rope_theta", config.get("rope_theta", 10000.0))
    rope_type = merged.get("rope_type", merged.get("type", "default"))
    if rope_type not in _ROPE_TYPES:
        raise ValueError(
            f"unsupported rope scaling type {rope_type!r}; supported: {_ROPE_TYPES}")
    kwargs: dict[str, Any] = {"theta": float(theta), "type": rope_type}
    if rope_type in ("linear", "llama3"):
        kwargs["factor"] = float(merged["factor"])
    if rope_type == "llama3":
        kwargs.update(
            low_freq_factor=float(merged["low_freq_factor"]),
            high_freq_factor=float(merged["high_freq_factor"]),
            original_max_position_embeddings=int(merged["original_max_position_embeddings"]),
        )
    return RopeConfig(**kwargs)
