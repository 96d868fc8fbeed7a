"""The policy decoder: one Flax NNX module for the Llama 3.x / Qwen2 / Qwen3 family.

    model = Decoder(config, rngs=nnx.Rngs(0))              # or hf.load_hf(path)
    hidden, _ = model(tokens, positions, segment_ids)      # [B, T, D]
    logits = model.logits(hidden)                          # [B, T, V] float32
    w = model.lm_head_weight()                             # [D, V] for rl.logprobs

Inputs (all [B, T] int32):
  tokens: token ids.
  positions: RoPE positions (`positions_from_segments` for packed / left-padded
    batches, `cache.cache_positions` to continue cached rows).
  segment_ids: 0 marks padding; tokens with equal nonzero ids attend to each other
    causally (by array order) and never to other segments. One id per row with left
    padding, several per row for packing.
With a `KVCache` (see cache.py) the same call prefills, decodes one token, or appends a
chunk to rows at different lengths, and returns the updated cache.

Inference engines use `model.layerwise_weights()` instead: the same computation with the
layers unrolled over per-layer weights and a paged KV cache (`models/paged.py`; on CPU,
each layer's slice of a stacked array inside a scan is a copy, which on a single-token
step costs about as much as the layer's matmuls):

    weights = model.layerwise_weights()                    # under jit: a copy per layer
    hidden, pages = weights.forward(tokens, slots, write, pages, items)
    logits = weights.logits(hidden)

Pure-functional idiom for jit / optax / sharding — the trainer keeps `params` (an
`nnx.State` pytree of Params) in its TrainState and the graphdef as static data:

    graphdef, params = nnx.split(model)
    @jax.jit
    def loss_fn(params, batch):
        model = nnx.merge(graphdef, params)        # free: happens at trace time
        hidden, _ = model(batch.tokens, batch.positions, batch.segment_ids)
        return token_logprobs(hidden, model.lm_head_weight(), ...)
    # or: hidden, cache = apply(graphdef, params, tokens, positions, segment_ids, cache)

Parameters live stacked over layers (leading axis `layers`) and the layers run under
`jax.lax.scan`, so compile time does not grow with depth; each layer is rematerialized
per `config.remat`. Every Param carries `logical_axes` metadata (core/parallel.py). Norms,
softmax and logits are float32 whatever `config.dtype` is. Without a cache, attention is
`attention.segment_attention` (`config.attention`: dense for short sequences, blockwise or
a kernel with memory linear in T for long ones); with one, the dense `attention` over the
cache slots. RoPE and norms live here, shared by the training forward and the engine's
cached decode.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import chex
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx, struct

from agentjax.models.attention import (ATTENTION_RESIDUALS, accumulation_dtype, attention,
                                       cache_mask, segment_attention)
from agentjax.models import lora
from agentjax.models.cache import KVCache, write_slots
from agentjax.models.config import ModelConfig
from agentjax.models.paged import (AttentionItems, PagedKVCache, ViewItems, paged_attention,
                                   view_attention, write_pages)
from agentjax.models.paged_pallas import BlockTables, over_kv_heads, paged_attention_pallas
from agentjax.models.paged_pallas_tpu import paged_attention_tpu
from agentjax.core.parallel import LogicalSharding, constrain

_INIT_STD = 0.02  # HF `initializer_range` default for these families


def layer_param_specs(config: ModelConfig) -> dict[str, tuple[tuple[int, ...], tuple, str]]:
    """Per stacked layer parameter: (shape, logical axes, init) with init in
    {"normal", "ones", "zeros"}. The leading axis is the layer axis."""
    c = config
    L, D, H, K, hd, F = (c.num_layers, c.hidden_size, c.num_heads, c.num_kv_heads,
                         c.head_dim, c.intermediate_size)
    specs = {
        "attn_norm": ((L, D), ("layers", None), "ones"),
        "q_proj": ((L, D, H, hd), ("layers", "embed", "heads", "head_dim"), "normal"),
        "k_proj": ((L, D, K, hd), ("layers", "embed", "kv_heads", "head_dim"), "normal"),
        "v_proj": ((L, D, K, hd), ("layers", "embed", "kv_heads", "head_dim"), "normal"),
        "o_proj": ((L, H, hd, D), ("layers", "heads", "head_dim", "embed"), "normal"),
        "mlp_norm": ((L, D), ("layers", None), "ones"),
        "gate_proj": ((L, D, F), ("layers", "embed", "mlp"), "normal"),
        "up_proj": ((L, D, F), ("layers", "embed", "mlp"), "normal"),
        "down_proj": ((L, F, D), ("layers", "mlp", "embed"), "normal"),
    }
    if c.qkv_bias:
        specs["q_bias"] = ((L, H, hd), ("layers", "heads", "head_dim"), "zeros")
        specs["k_bias"] = ((L, K, hd), ("layers", "kv_heads", "head_dim"), "zeros")
        specs["v_bias"] = ((L, K, hd), ("layers", "kv_heads", "head_dim"), "zeros")
    if c.o_bias:
        specs["o_bias"] = ((L, D), ("layers", None), "zeros")
    if c.qk_norm:
        specs["q_norm"] = ((L, hd), ("layers", None), "ones")
        specs["k_norm"] = ((L, hd), ("layers", None), "ones")
    return specs


def _init(kind: str, key: jax.Array, shape: tuple[int, ...], dtype: str) -> jax.Array:
    if kind == "normal":
        return (_INIT_STD * jax.random.normal(key, shape, jnp.float32)).astype(dtype)
    return (jnp.ones if kind == "ones" else jnp.zeros)(shape, dtype)


# "auto" remat recomputes the layers of sequences at least this long
# ("full_save_attention"): below it the saved activations are small and recomputing them
# would cost a third more time.
AUTO_REMAT_TOKENS = 4096


def resolve_remat(name: str, seq_len: int) -> str:
    """The remat name `name` means for sequences of `seq_len` tokens ("auto" resolved)."""
    if name == "auto":
        return "none" if seq_len < AUTO_REMAT_TOKENS else "full_save_attention"
    return name


def remat_policy(name: str, seq_len: int):
    """The `jax.checkpoint` policy of a `ModelConfig.remat` name for sequences of
    `seq_len` tokens (None: no remat).

    "full" saves nothing (recompute the whole layer); "full_save_attention" saves only
    the blockwise attention's output and log-sum-exp, O(T x heads x head_dim) a layer (the
    layer is recomputed from its input, but the backward does not run the attention's
    forward loop again: a 8k-token step took half the time); "dots" saves every matmul
    output,
    "dots_no_batch" saves weight matmuls but recomputes attention scores; "auto" is
    "none" below AUTO_REMAT_TOKENS and "full_save_attention" from there.
    """
    name = resolve_remat(name, seq_len)
    policies = jax.checkpoint_policies
    return {
        "none": None,
        "full": policies.nothing_saveable,
        "full_save_attention": policies.save_only_these_names(ATTENTION_RESIDUALS),
        "dots": policies.checkpoint_dots,
        "dots_no_batch": policies.dots_with_no_batch_dims_saveable,
    }[name]


def over_leading_axes(param: jax.Array, x: jax.Array) -> jax.Array:
    """`param` (a norm weight or bias over x's trailing axes) with x's leading axes added
    as size 1, so that it broadcasts against x without implicit rank promotion."""
    return param.reshape((1,) * (x.ndim - param.ndim) + param.shape)


def rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    """x / rms(x) * weight over the last axis, in (at least) float32; returns x's dtype."""
    acc = accumulation_dtype(x.dtype)
    xa = x.astype(acc)
    normed = xa * jax.lax.rsqrt(jnp.mean(xa * xa, axis=-1, keepdims=True) + eps)
    return (over_leading_axes(weight.astype(acc), normed) * normed).astype(x.dtype)


def rope_tables(positions: jax.Array, inv_freq: np.ndarray) -> tuple[jax.Array, jax.Array]:
    """cos, sin [B, T, head_dim] of the HF half-split rotary embedding, in inv_freq's
    dtype (float32 as HF computes it)."""
    # positions [..., 1] x inv_freq [1..., head_dim / 2], the broadcast written out.
    inv_freq = jnp.asarray(inv_freq).reshape((1,) * positions.ndim + inv_freq.shape)
    freqs = positions.astype(inv_freq.dtype)[..., None] * inv_freq
    angles = jnp.concatenate([freqs, freqs], axis=-1)
    return jnp.cos(angles), jnp.sin(angles)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """Rotates x [B, T, heads, head_dim] by the tables [B, T, head_dim]."""
    half = x.shape[-1] // 2
    xa = x.astype(accumulation_dtype(x.dtype))
    rotated = jnp.concatenate([-xa[..., half:], xa[..., :half]], axis=-1)
    out = xa * cos[:, :, None, :] + rotated * sin[:, :, None, :]
    return out.astype(x.dtype)


def positions_from_segments(segment_ids: jax.Array) -> jax.Array:
    """RoPE positions for a packed or padded batch: each token's index within its
    (contiguous) segment; padding gets 0.

    Args:
      segment_ids: [B, T] int32, 0 = padding.
    """
    chex.assert_rank(segment_ids, 2)
    t = jnp.arange(segment_ids.shape[1], dtype=jnp.int32)[None, :]
    starts = jnp.concatenate(
        [jnp.ones_like(segment_ids[:, :1], bool), segment_ids[:, 1:] != segment_ids[:, :-1]],
        axis=1)
    segment_start = jax.lax.cummax(jnp.where(starts, t, 0), axis=1)
    return jnp.where(segment_ids != 0, t - segment_start, 0).astype(jnp.int32)


class Decoder(nnx.Module):
    """Llama / Qwen2 / Qwen3 decoder-only transformer (see the module docstring).

    Attributes:
      config: the ModelConfig (static).
      activation_sharding: LogicalSharding used to constrain activations, or None (set
        by `parallel.shard_model` / `parallel.create_sharded`).
      embed: [V, D] token embedding.
      layers: stacked per-layer parameters (names in `layer_param_specs`).
      final_norm: [D] final RMSNorm weight.
      lm_head: [D, V] output projection (absent when embeddings are tied).
      lora: with `config.lora`, the adapters of the targeted projections
        (models/lora.py: target -> {"a", "b"}, stacked over layers, float32).
    """

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        """Random init (normal(0, 0.02) matrices, unit norms, zero biases; adapters
        as PEFT initializes them, drawn after every base weight).

        Args:
          config: architecture and dtypes.
          rngs: random streams; `rngs.params()` seeds every parameter.
        """
        self.config = config
        self.activation_sharding: LogicalSharding | None = None
        dtype = config.param_dtype
        v, d = config.vocab_size, config.hidden_size
        self.embed = nnx.Param(_init("normal", rngs.params(), (v, d), dtype),
                               logical_axes=("vocab", "embed"))
        self.layers = nnx.Dict({
            name: nnx.Param(_init(kind, rngs.params(), shape, dtype), logical_axes=axes)
            for name, (shape, axes, kind) in layer_param_specs(config).items()
        })
        self.final_norm = nnx.Param(jnp.ones((d,), dtype), logical_axes=(None,))
        if not config.tie_embeddings:
            self.lm_head = nnx.Param(_init("normal", rngs.params(), (d, v), dtype),
                                     logical_axes=("embed", "vocab"))
        if config.lora is not None:
            self.lora = lora.make_adapters(layer_param_specs(config), config.lora, rngs)

    def adapters(self) -> dict[str, dict[str, jax.Array]] | None:
        """The stacked adapter arrays (target -> {"a", "b"}), None without LoRA."""
        if self.config.lora is None:
            return None
        return {name: {which: p[...] for which, p in pair.items()}
                for name, pair in self.lora.items()}

    def lm_head_weight(self) -> jax.Array:
        """[D, V] output projection in the compute dtype (the transposed embedding when
        tied) — what `logits` multiplies by."""
        w = self.embed[...].T if self.config.tie_embeddings else self.lm_head[...]
        return w.astype(self.config.dtype)

    def logits(self, hidden: jax.Array) -> jax.Array:
        """[B, T, V] float32 logits of final hidden states [B, T, D]."""
        return _logits(hidden, self.lm_head_weight(), self.activation_sharding)

    def merged_layers(self) -> dict[str, jax.Array]:
        """The stacked layer weights in the compute dtype, each adapted projection
        merged: W + (alpha / r) A B in float32, cast once (`lora.merged_weight`)."""
        cfg = self.config
        stacked = {name: p[...].astype(cfg.dtype) for name, p in self.layers.items()}
        for name, pair in (self.adapters() or {}).items():
            merge = jax.vmap(lora.merged_weight, in_axes=(0, 0, 0, None, None))
            stacked[name] = merge(self.layers[name][...], pair["a"], pair["b"],
                                  cfg.lora.scale, cfg.dtype)
        return stacked

    def layerwise_weights(self) -> "LayerwiseWeights":
        """The weights for `LayerwiseWeights.forward`: one dict per layer, matrices and
        embedding in the compute dtype (as the layers cast them), adapters merged into
        their projections (`merged_layers`: the engine samples the adapted policy at the
        base model's cost; its config has no `lora`). Under jit this is a copy,
        independent of the module's buffers."""
        cfg = self.config
        stacked = self.merged_layers()
        return LayerwiseWeights(
            config=dataclasses.replace(cfg, lora=None),
            activation_sharding=self.activation_sharding,
            embed=self.embed[...].astype(cfg.dtype), final_norm=self.final_norm[...],
            lm_head=None if cfg.tie_embeddings else self.lm_head_weight(),
            layers=tuple({name: w[i] for name, w in stacked.items()}
                         for i in range(cfg.num_layers)))

    def __call__(self, tokens: jax.Array, positions: jax.Array, segment_ids: jax.Array,
                 cache: KVCache | None = None) -> tuple[jax.Array, KVCache | None]:
        """Runs the decoder.

        Args:
          tokens: [B, T] int32 token ids.
          positions: [B, T] int32 RoPE positions.
          segment_ids: [B, T] int32, 0 = padding (see module docstring).
          cache: optional KVCache with `batch == B`; the chunk's real tokens are appended
            at each row's offset.

        Returns:
          (hidden [B, T, D] in the compute dtype after the final norm, updated cache or
          None).
        """
        chex.assert_rank([tokens, positions, segment_ids], 2)
        chex.assert_equal_shape([tokens, positions, segment_ids])
        chex.assert_type([tokens, positions, segment_ids], int)
        cfg = self.config
        shard = self.activation_sharding
        _check_concrete_inputs(tokens, cfg.vocab_size, segment_ids, cache)

        x = _embed(cfg, self.embed[...], tokens, shard)
        cos, sin = rope_tables(positions, cfg.rope.inv_freq(cfg.head_dim))
        params = {name: p[...] for name, p in self.layers.items()}
        adapters = self.adapters()

        if cache is None:
            mask = scatter_slots = new_lengths = kv_carry = None
        else:
            chex.assert_shape(cache.lengths, (tokens.shape[0],))
            mask, scatter_slots, new_lengths = _cache_write_plan(cache, segment_ids)
            kv_carry = (cache.k, cache.v)

        def layer(carry, xs):
            x, kv = carry
            p, layer_adapters, index = xs

            def attend(q, k, v):
                if kv is None:
                    return segment_attention(q, k, v, segment_ids, impl=cfg.attention,
                                             block=cfg.attention_block), None
                new_kv, layer_k, layer_v = _write_and_read_cache(kv, index, k, v,
                                                                 scatter_slots)
                return attention(q, layer_k, layer_v, mask), new_kv

            return _layer(cfg, p, x, cos, sin, attend, shard, layer_adapters), None

        policy = remat_policy(cfg.remat, tokens.shape[1])
        if policy is not None:
            layer = jax.checkpoint(layer, policy=policy, prevent_cse=False)
        layer_index = jnp.arange(cfg.num_layers, dtype=jnp.int32)
        (x, kv_carry), _ = jax.lax.scan(layer, (x, kv_carry),
                                        (params, adapters, layer_index))

        hidden = rms_norm(x, self.final_norm[...], cfg.rms_norm_eps)
        if cache is None:
            return hidden, None
        return hidden, KVCache(k=kv_carry[0], v=kv_carry[1], lengths=new_lengths)


@struct.dataclass
class LayerwiseWeights:
    """A Decoder's weights for inference with the layers unrolled (`Decoder.
    layerwise_weights()`): each layer reads its own buffers, never a slice of a stacked
    array. `forward` computes what `Decoder.__call__` with a cache does.

    Attributes:
      config: the model's ModelConfig (static).
      activation_sharding: the model's LogicalSharding or None (static).
      embed: [V, D] token embedding in the compute dtype.
      final_norm: [D] final RMSNorm weight (param dtype).
      lm_head: [D, V] output projection in the compute dtype; None when tied to embed.
      layers: per layer, a dict of its weights (names of `layer_param_specs`, without the
        layer axis) in the compute dtype.
    """

    config: ModelConfig = struct.field(pytree_node=False)
    activation_sharding: LogicalSharding | None = struct.field(pytree_node=False)
    embed: jax.Array
    final_norm: jax.Array
    lm_head: jax.Array | None
    layers: tuple[dict[str, jax.Array], ...]

    def logits(self, hidden: jax.Array) -> jax.Array:
        """[B, T, V] float32 logits of final hidden states [B, T, D]."""
        w = self.embed.T if self.lm_head is None else self.lm_head
        return _logits(hidden, w, self.activation_sharding)

    def forward(self, tokens: jax.Array, slots: jax.Array, write: jax.Array,
                cache: PagedKVCache, items: AttentionItems | ViewItems | BlockTables
                ) -> tuple[jax.Array, PagedKVCache]:
        """Writes a chunk of new tokens into the page pool and runs the decoder over it
        (`models/paged.py`: the index arrays and the work list).

        Args:
          tokens: [R, T] int32 token ids.
          slots: [R, T] int32 position of each token in its sequence (its RoPE position);
            -1 for padding.
          write: [R, T] int32 flat pool index of each token's key / value; -1 for padding.
          cache: the page pool.
          items: the attention work list of the call: `AttentionItems` for the pure-JAX
            attention over the pool, `ViewItems` when `cache` is a view of the call's
            pages (`paged.gather_view`, decode), `BlockTables` for the GPU and TPU
            kernels (`models/paged_pallas*.py`; keys in the "page_hd" layout).

        Returns:
          (hidden [R, T, D] in the compute dtype after the final norm, updated pool).
        """
        chex.assert_rank([tokens, slots, write], 2)
        chex.assert_equal_shape([tokens, slots, write])
        chex.assert_type([tokens, slots, write], int)
        if len(cache.k) != len(self.layers):
            raise ValueError(f"cache has {len(cache.k)} layers, the model {len(self.layers)}")
        cfg, shard = self.config, self.activation_sharding
        _check_concrete_inputs(tokens, cfg.vocab_size, slots, None)

        x = _embed(cfg, self.embed, tokens, shard)
        cos, sin = rope_tables(jnp.maximum(slots, 0), cfg.rope.inv_freq(cfg.head_dim))
        keys, values = [], []
        for p, k_pool, v_pool in zip(self.layers, cache.k, cache.v):
            def attend(q, k, v, k_pool=k_pool, v_pool=v_pool):
                k_pool, v_pool = write_pages(k_pool, v_pool, k, v, write, cache.key_layout)
                if isinstance(items, BlockTables):
                    kernel = (paged_attention_tpu if items.kernel == "pallas_tpu"
                              else paged_attention_pallas)
                    out = over_kv_heads(kernel, items)(q, k_pool, v_pool, slots, items)
                elif isinstance(items, ViewItems):
                    out = view_attention(q, k_pool, v_pool, slots, items, cache.key_layout)
                else:
                    out = paged_attention(q, k_pool, v_pool, slots, items, cache.key_layout)
                return out, (k_pool, v_pool)

            x, (k_pool, v_pool) = _layer(cfg, p, x, cos, sin, attend, shard)
            keys.append(k_pool)
            values.append(v_pool)
        hidden = rms_norm(x, self.final_norm, cfg.rms_norm_eps)
        return hidden, cache.replace(k=tuple(keys), v=tuple(values))


def _embed(cfg: ModelConfig, embed: jax.Array, tokens: jax.Array,
           shard: LogicalSharding | None) -> jax.Array:
    x = jnp.take(embed, tokens, axis=0).astype(cfg.dtype)
    return constrain(x, ("batch", "seq", "act_embed"), shard)


def _logits(hidden: jax.Array, w: jax.Array, shard: LogicalSharding | None) -> jax.Array:
    chex.assert_rank(hidden, 3)
    logits = jnp.einsum("btd,dv->btv", hidden, w, preferred_element_type=jnp.float32)
    return constrain(logits, ("batch", "seq", "vocab"), shard)


def _layer(cfg: ModelConfig, p: dict[str, jax.Array], x: jax.Array, cos: jax.Array,
           sin: jax.Array, attend, shard: LogicalSharding | None,
           adapters: dict[str, dict[str, jax.Array]] | None = None):
    """One pre-norm transformer layer. `attend(q, k, v)` -> (attention output [B,T,H,hd],
    cache state) stores the new keys/values where the caller keeps them. `adapters`:
    this layer's LoRA pairs (target -> {"a", "b"}), added to their projections.
    Returns (x, cache state)."""
    p = {name: w.astype(cfg.dtype) for name, w in p.items()}
    proj = _Projections(cfg, p, adapters)
    q, k, v = _qkv(cfg, p, rms_norm(x, p["attn_norm"], cfg.rms_norm_eps), cos, sin, proj)
    q = constrain(q, ("batch", "seq", "heads", "head_dim"), shard)
    out, kv = attend(q, k, v)
    attn = proj("bthk,hkd->btd", "o_proj", out)
    if cfg.o_bias:
        attn = attn + over_leading_axes(p["o_bias"], attn)
    x = constrain(x + attn, ("batch", "seq", "act_embed"), shard)
    x = x + _mlp(p, rms_norm(x, p["mlp_norm"], cfg.rms_norm_eps), shard, proj)
    return constrain(x, ("batch", "seq", "act_embed"), shard), kv


class _Projections:
    """`proj(equation, name, x)`: x times projection `name` of one layer, plus its
    adapter's (alpha / r) (x A) B when it has one (in the compute dtype)."""

    def __init__(self, cfg: ModelConfig, p: dict[str, jax.Array],
                 adapters: dict[str, dict[str, jax.Array]] | None):
        self.p, self.dtype = p, cfg.dtype
        self.adapters = adapters or {}
        self.scale = cfg.lora.scale if cfg.lora is not None else 0.0

    def __call__(self, equation: str, name: str, x: jax.Array) -> jax.Array:
        y = jnp.einsum(equation, x, self.p[name])
        if name not in self.adapters:
            return y
        a, b = (self.adapters[name][which].astype(self.dtype) for which in ("a", "b"))
        return y + lora.delta(name, x, a, b, self.scale)


def _cache_write_plan(cache: KVCache, segment_ids: jax.Array):
    """(attention mask [B, T, max_len], slot of each new token with padding redirected
    out of bounds so the scatter drops it, new lengths) of appending a chunk."""
    slots, new_lengths = write_slots(cache.lengths, segment_ids)
    scatter_slots = jnp.where(slots < 0, cache.max_len, slots)
    return cache_mask(slots, cache.max_len), scatter_slots, new_lengths


def _qkv(cfg: ModelConfig, p: dict[str, jax.Array], h: jax.Array, cos: jax.Array,
         sin: jax.Array, proj: "_Projections") -> tuple[jax.Array, jax.Array, jax.Array]:
    """Projected q [B,T,H,hd], k, v [B,T,K,hd] with biases, q/k norm and RoPE."""
    q, k, v = (proj("btd,dhk->bthk", name, h) for name in ("q_proj", "k_proj", "v_proj"))
    if cfg.qkv_bias:
        q, k, v = (q + over_leading_axes(p["q_bias"], q), k + over_leading_axes(p["k_bias"], k),
                   v + over_leading_axes(p["v_bias"], v))
    if cfg.qk_norm:
        q = rms_norm(q, p["q_norm"], cfg.rms_norm_eps)
        k = rms_norm(k, p["k_norm"], cfg.rms_norm_eps)
    return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v


def _mlp(p: dict[str, jax.Array], h: jax.Array, shard: LogicalSharding | None,
         proj: "_Projections") -> jax.Array:
    gate = proj("btd,df->btf", "gate_proj", h)
    up = proj("btd,df->btf", "up_proj", h)
    act = constrain(jax.nn.silu(gate) * up, ("batch", "seq", "mlp"), shard)
    return proj("btf,fd->btd", "down_proj", act)


def _write_and_read_cache(kv: tuple[jax.Array, jax.Array], index: jax.Array, k: jax.Array,
                          v: jax.Array, slots: jax.Array):
    """Scatters this layer's new k/v [B,T,K,hd] into the stacked [L,B,K,S,hd] cache at
    `slots` [B,T] (out-of-range slots are dropped) and returns the cache plus this
    layer's full keys / values [B, K, S, hd] in the compute dtype."""
    cache_k, cache_v = kv
    rows = jnp.arange(k.shape[0])[:, None]
    # Indices split by a slice: the update is indexed [B, T, K, hd], k's own layout.
    cache_k = cache_k.at[index, rows, :, slots].set(k.astype(cache_k.dtype), mode="drop")
    cache_v = cache_v.at[index, rows, :, slots].set(v.astype(cache_v.dtype), mode="drop")
    layer_k = jax.lax.dynamic_index_in_dim(cache_k, index, keepdims=False).astype(k.dtype)
    layer_v = jax.lax.dynamic_index_in_dim(cache_v, index, keepdims=False).astype(v.dtype)
    return (cache_k, cache_v), layer_k, layer_v


def _is_concrete_local(x) -> bool:
    """True for values readable on this host without tracing or cross-host gathers."""
    if isinstance(x, jax.core.Tracer):
        return False
    return not isinstance(x, jax.Array) or x.is_fully_addressable


def _check_concrete_inputs(tokens: jax.Array, vocab_size: int, segment_ids: jax.Array,
                           cache: KVCache | None) -> None:
    """Value checks for eager calls (under jit the values are unknown and this is a
    no-op): token ids in range and no cache overflow."""
    if not all(_is_concrete_local(x) for x in (tokens, segment_ids)):
        return
    tokens_np = np.asarray(tokens)
    if tokens_np.size and (tokens_np.min() < 0 or tokens_np.max() >= vocab_size):
        raise ValueError(f"tokens must be in [0, {vocab_size}), got range "
                         f"[{tokens_np.min()}, {tokens_np.max()}]")
    if cache is None or not _is_concrete_local(cache.lengths):
        return
    needed = np.asarray(cache.lengths) + (np.asarray(segment_ids) != 0).sum(axis=1)
    if needed.max(initial=0) > cache.max_len:
        raise ValueError(f"KV cache overflow: rows need {needed.tolist()} slots, "
                         f"max_len is {cache.max_len}")


def apply(graphdef: nnx.GraphDef, params: Any, tokens: jax.Array, positions: jax.Array,
          segment_ids: jax.Array, cache: KVCache | None = None):
    """Functional forward: `nnx.merge(graphdef, params)(tokens, positions, segment_ids,
    cache)`; returns (hidden [B, T, D], cache)."""
    return nnx.merge(graphdef, params)(tokens, positions, segment_ids, cache)
