"""Softmax attention: over a cache (decode), and over whole sequences in memory linear in T.

    out = segment_attention(q, k, v, segment_ids, impl="auto", block=256)   # training
    out = attention(q, k, v, mask)                  # dense, any [B, T, S] mask (cache)

`segment_attention` is every full-sequence pass (the update, the log-prob passes of
prepare, the reference and the critic): query t attends key s <= t of its own nonzero
segment (packed rows keep their episodes apart, padding is segment 0). Implementations:

  dense      the [B, K, G, T, S] scores in float32 (fastest for short sequences; memory
             grows with T^2: 8k tokens of a 4-layer model needed 21 GB on CPU).
  blockwise  online softmax over key blocks (FlashAttention, arXiv 2205.14135, and its
             backward of FlashAttention-2, arXiv 2307.08691) in pure JAX: a custom VJP
             recomputes each block's probabilities from the saved log-sum-exp, so neither
             pass holds more than one [B, K, G, block, block] tile. Causality and
             segments skip every tile they mask whole. The reference the kernels are
             tested against; the CPU default from DENSE_MAX_TOKENS.
  cudnn      `jax.nn.dot_product_attention(implementation="cudnn")` (cuDNN flash
             attention): GPU, bfloat16 / float16, head_dim <= 128 and a multiple of 8. It
             knows causal masks and per-row lengths, not segments, so a batch whose rows
             are not one segment each (packed, or left-padded) takes the blockwise path,
             decided at run time.
  splash     the Pallas TPU splash attention
             (`jax.experimental.pallas.ops.tpu.splash_attention`) with segment ids.

"auto" is dense up to DENSE_MAX_TOKENS, then cudnn on GPU where it applies, splash on
TPU, blockwise elsewhere.
"""
from __future__ import annotations


import chex
import jax
import jax.numpy as jnp
import numpy as np
from jax.ad_checkpoint import checkpoint_name

MASKED = -1e30   # finite, so fully masked (padding) query rows give no NaN

# The name of the blockwise forward's output and log-sum-exp, which the backward reads.
ATTENTION_RESIDUALS = "attention_residuals"

# "auto" attends densely up to this many tokens, where the T x T scores are small. At
# 1,024 tokens the blockwise step was already 2.2x faster on CPU (0.77 s against 1.69 s,
# scripts/bench/long_context.py --attention blockwise).
DENSE_MAX_TOKENS = 512


def accumulation_dtype(dtype) -> jnp.dtype:
    """float32, or wider when the compute dtype is wider (float64 checks)."""
    return jnp.promote_types(dtype, jnp.float32)


def segment_mask(segment_ids: jax.Array) -> jax.Array:
    """[B, T, T] bool: query t sees key s <= t of the same nonzero segment."""
    t = segment_ids.shape[1]
    same = segment_ids[:, :, None] == segment_ids[:, None, :]
    real = (segment_ids != 0)[:, :, None]
    causal = jnp.tril(jnp.ones((t, t), bool))[None]
    return same & real & causal


def cache_mask(slots: jax.Array, max_len: int) -> jax.Array:
    """[B, T, max_len] bool: a new token at slot s sees cache slots <= s (padding,
    slot -1, sees nothing)."""
    return jnp.arange(max_len)[None, None, :] <= slots[:, :, None]


def attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array) -> jax.Array:
    """Grouped-query softmax attention.

    Args:
      q: [B, T, H, hd] queries.
      k, v: [B, K, S, hd] keys / values (the cache layout, so a decode step reads the
        cache without transposing it), H a multiple of K (query head h reads kv head
        h // (H // K), as HF's repeat_kv).
      mask: [B, T, S] bool, True where query t may attend key s.

    Returns:
      [B, T, H, hd] in q's dtype; scores and softmax are float32.
    """
    b, t, h, hd = q.shape
    q = _grouped_queries(q, k.shape[1])
    scores = jnp.einsum("btkgd,bksd->bkgts", q, k,
                        preferred_element_type=accumulation_dtype(q.dtype))
    probs = _masked_softmax(scores, mask).astype(v.dtype)
    out = jnp.einsum("bkgts,bksd->btkgd", probs, v)
    return out.reshape(b, t, h, hd)


def _grouped_queries(q: jax.Array, kv_heads: int) -> jax.Array:
    """Scaled queries [B, T, K, G, hd] grouped by the kv head they read."""
    b, t, h, hd = q.shape
    return q.reshape(b, t, kv_heads, h // kv_heads, hd) * jnp.asarray(hd ** -0.5, q.dtype)


def _masked_softmax(scores: jax.Array, mask: jax.Array) -> jax.Array:
    """Softmax over the slots of scores [B, K, G, T, S] where mask [B, T, S] allows."""
    return jax.nn.softmax(jnp.where(mask[:, None, None], scores, MASKED), axis=-1)


# --------------------------------------------------------------------------------------
# Full sequences: the dispatch.


def choose_impl(impl: str, *, seq_len: int, dtype, head_dim: int,
                backend: str | None = None) -> str:
    """The implementation `segment_attention` runs for `impl` (ATTENTION_IMPLS).

    "auto": dense up to DENSE_MAX_TOKENS; above, cudnn on a GPU when `cudnn_supports`,
    splash on a TPU, blockwise otherwise. An explicit kernel the backend cannot run is a
    ValueError (a silent fallback would hide that the kernel asked for never ran).
    """
    backend = backend or jax.default_backend()
    if impl == "auto":
        if seq_len <= DENSE_MAX_TOKENS:
            return "dense"
        if backend == "gpu" and cudnn_supports(dtype, head_dim):
            return "cudnn"
        return "splash" if backend == "tpu" else "blockwise"
    if impl == "cudnn" and not (backend == "gpu" and cudnn_supports(dtype, head_dim)):
        raise ValueError(
            f"model.attention='cudnn' needs a GPU, a bfloat16 / float16 model.dtype and "
            f"head_dim <= 128 divisible by 8; this is {backend} with {jnp.dtype(dtype)} "
            f"and head_dim {head_dim}: use 'auto' or 'blockwise'")
    if impl == "splash" and backend != "tpu":
        raise ValueError(f"model.attention='splash' is a TPU kernel; this is {backend}: "
                         "use 'auto' or 'blockwise'")
    return impl


def cudnn_supports(dtype, head_dim: int) -> bool:
    """The static constraints of cuDNN's fused attention in JAX."""
    return (jnp.dtype(dtype) in (jnp.bfloat16, jnp.float16)
            and head_dim <= 128 and head_dim % 8 == 0)


def segment_attention(q: jax.Array, k: jax.Array, v: jax.Array, segment_ids: jax.Array, *,
                      impl: str = "auto", block: int = 256,
                      backend: str | None = None) -> jax.Array:
    """Causal grouped-query attention within segments, for whole sequences.

    Args:
      q: [B, T, H, hd] queries.
      k, v: [B, T, K, hd] keys / values (as the projections make them), H a multiple of K.
      segment_ids: [B, T] int, 0 = padding; equal nonzero ids attend causally by array
        order, never across ids.
      impl: one of ATTENTION_IMPLS (module docstring).
      block: query / key block length of the blockwise path (T is padded to a multiple
        of it inside).
      backend: the platform to choose for (default: jax's default backend).

    Returns:
      [B, T, H, hd] in q's dtype. Padding query rows are 0 (blockwise, splash, cudnn)
      or the mean of the values (dense): nothing reads them.
    """
    chex.assert_rank([q, k, v], 4)
    chex.assert_rank(segment_ids, 2)
    chex.assert_equal_shape([k, v])
    chex.assert_equal_shape_prefix([q, k, segment_ids], 2)
    b, t, h, hd = q.shape
    if h % k.shape[2]:
        raise ValueError(f"query heads ({h}) must be a multiple of kv heads ({k.shape[2]})")
    impl = choose_impl(impl, seq_len=t, dtype=q.dtype, head_dim=hd, backend=backend)
    if impl == "dense":
        return attention(q, k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3),
                         segment_mask(segment_ids))
    if impl == "cudnn":
        return _cudnn_or_blockwise(q, k, v, segment_ids, block)
    if impl == "splash":
        return splash_attention(q, k, v, segment_ids, block=block)
    return blockwise_attention(q, k, v, segment_ids, block=block)


def one_segment_per_row(segment_ids: jax.Array) -> jax.Array:
    """Scalar bool: every row is one segment from position 0, then padding (what
    cuDNN's causal mask with per-row lengths expresses)."""
    lengths = (segment_ids != 0).sum(axis=1)
    t = jnp.arange(segment_ids.shape[1])[None, :]
    return jnp.all(((segment_ids != 0) == (t < lengths[:, None]))
                   & ((segment_ids == 0) | (segment_ids == segment_ids[:, :1])))


def _cudnn_or_blockwise(q, k, v, segment_ids, block):
    """cuDNN flash attention when `one_segment_per_row`; blockwise otherwise (decided at
    run time: the same program serves rollout batches and packed ones)."""
    lengths = (segment_ids != 0).sum(axis=1).astype(jnp.int32)
    real = (segment_ids != 0)[:, :, None, None]

    def cudnn(q, k, v):
        out = jax.nn.dot_product_attention(
            q, k, v, is_causal=True, query_seq_lengths=lengths,
            key_value_seq_lengths=lengths, implementation="cudnn")
        return jnp.where(real, out, 0).astype(q.dtype)

    return jax.lax.cond(one_segment_per_row(segment_ids), cudnn,
                        lambda q, k, v: blockwise_attention(q, k, v, segment_ids, block=block),
                        q, k, v)


def splash_attention(q: jax.Array, k: jax.Array, v: jax.Array, segment_ids: jax.Array, *,
                     block: int = 256, interpret: bool = False) -> jax.Array:
    """`segment_attention` by the Pallas TPU splash kernel (interpret=True runs it
    anywhere, slowly: how CPU tests check it).

    One multi-query kernel per (row, kv head) over that head's G query heads; segment
    ids carry packing and padding (padding, id 0, only attends to padding).
    """
    from jax.experimental.pallas.ops.tpu.splash_attention import (
        splash_attention_kernel as kernel_lib, splash_attention_mask as mask_lib)

    b, t, h, hd = q.shape
    kv_heads = k.shape[2]
    groups = h // kv_heads
    block = min(block, _round_up(t, 128))
    padded = _round_up(t, block)
    q, k, v, segment_ids = _pad_time(padded, q, k, v, segment_ids)
    sizes = kernel_lib.BlockSizes(
        block_q=block, block_kv=block, block_kv_compute=block, block_q_dkv=block,
        block_kv_dkv=block, block_kv_dkv_compute=block, block_q_dq=block, block_kv_dq=block)
    mask = mask_lib.MultiHeadMask([mask_lib.CausalMask((padded, padded))] * groups)
    kernel = kernel_lib.make_splash_mha(mask, block_sizes=sizes, is_mqa=True, head_shards=1,
                                        q_seq_shards=1, interpret=interpret)
    scaled = (q * jnp.asarray(hd ** -0.5, q.dtype)).reshape(b, padded, kv_heads, groups, hd)
    # [B, K, G, T, hd] queries against [B, K, T, hd] keys: vmap rows, then kv heads.
    qs, ks, vs = scaled.transpose(0, 2, 3, 1, 4), k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)

    def row(q_row, k_row, v_row, ids):
        segments = kernel_lib.SegmentIds(q=ids, kv=ids)
        return jax.vmap(lambda qh, kh, vh: kernel(qh, kh, vh, segment_ids=segments))(
            q_row, k_row, v_row)

    out = jax.vmap(row)(qs, ks, vs, segment_ids)                         # [B, K, G, T, hd]
    out = out.transpose(0, 3, 1, 2, 4).reshape(b, padded, h, hd)
    return jnp.where((segment_ids != 0)[:, :, None, None], out, 0)[:, :t].astype(q.dtype)


# --------------------------------------------------------------------------------------
# Blockwise attention in pure JAX.


def blockwise_attention(q: jax.Array, k: jax.Array, v: jax.Array, segment_ids: jax.Array,
                        *, block: int = 256) -> jax.Array:
    """`segment_attention` by blocks (module docstring): memory O(T x heads x hd).

    Args: as `segment_attention`; T is padded to a multiple of `block` (padding is
    segment 0, so it changes nothing) and the result cut back.
    """
    chex.assert_rank([q, k, v], 4)
    chex.assert_rank(segment_ids, 2)
    b, t, h, hd = q.shape
    kv_heads = k.shape[2]
    block = min(block, t)
    padded = _round_up(t, block)
    q, k, v, segment_ids = _pad_time(padded, q, k, v, segment_ids)
    blocks = padded // block
    # Queries [n, B, K, G, block, hd] (the queries of a kv head's group are one matrix's
    # rows); keys / values [n, B, K, block, hd]; segment ids [n, B, block].
    q_blocks = _grouped_queries(q, kv_heads).reshape(
        b, blocks, block, kv_heads, h // kv_heads, hd).transpose(1, 0, 3, 4, 2, 5)
    k_blocks, v_blocks = (x.reshape(b, blocks, block, kv_heads, hd).transpose(1, 0, 3, 2, 4)
                          for x in (k, v))
    segment_blocks = segment_ids.reshape(b, blocks, block).transpose(1, 0, 2)
    out = _flash(q_blocks, k_blocks, v_blocks, segment_blocks, _tile_kinds(segment_blocks))
    out = out.transpose(1, 0, 4, 2, 3, 5).reshape(b, padded, h, hd)
    return out[:, :t].astype(q.dtype)


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def _pad_time(length: int, q, k, v, segment_ids):
    """Pads the time axis (1) of all four to `length`; padding is segment 0."""
    extra = length - q.shape[1]
    if not extra:
        return q, k, v, segment_ids

    def pad(x):
        return jnp.pad(x, [(0, 0), (0, extra)] + [(0, 0)] * (x.ndim - 2))

    return pad(q), pad(k), pad(v), pad(segment_ids)


# What a tile (query block i, key block j) needs: nothing (masked whole), the mask, or
# no mask (every query sees every key: an earlier block of the same single segment).
SKIP, MASKED_TILE, FULL_TILE = 0, 1, 2


def _tile_kinds(segment_blocks: jax.Array) -> jax.Array:
    """[n, n] int32 of SKIP / MASKED_TILE / FULL_TILE over (query block, key block).

    SKIP above the diagonal (causal) and where the blocks' ranges of nonzero segment ids
    are disjoint in every row (packed episodes, padding); FULL_TILE below the diagonal
    where, in every row, both blocks hold one and the same segment and no padding.
    Computed once, so the loops read a replicated table.
    """
    n = segment_blocks.shape[0]
    real = segment_blocks != 0
    big = jnp.iinfo(segment_blocks.dtype).max
    low = jnp.where(real, segment_blocks, big).min(axis=-1)              # [n, B]
    high = jnp.where(real, segment_blocks, 0).max(axis=-1)
    overlap = (low[:, None] <= high[None, :]) & (low[None, :] <= high[:, None])   # [n, n, B]
    single = real.all(axis=-1) & (low == high)                           # [n, B]
    same = single[:, None] & single[None, :] & (low[:, None] == low[None, :])
    below = jnp.tril(jnp.ones((n, n), bool), -1)
    attends = jnp.tril(jnp.ones((n, n), bool)) & overlap.any(axis=-1)
    return jnp.where(below & same.all(axis=-1), FULL_TILE,
                     jnp.where(attends, MASKED_TILE, SKIP)).astype(jnp.int32)


def _tile_mask(segment_blocks: jax.Array, i: jax.Array, j: jax.Array) -> jax.Array:
    """[B, 1, 1, block, block] bool of tile (query block i, key block j): same nonzero
    segment and key position <= query position."""
    q_ids, k_ids = segment_blocks[i], segment_blocks[j]
    block = q_ids.shape[-1]
    offsets = jnp.arange(block)
    causal = (i * block + offsets)[:, None] >= (j * block + offsets)[None, :]
    mask = (q_ids[:, :, None] == k_ids[:, None, :]) & (q_ids != 0)[:, :, None] & causal[None]
    return mask[:, None, None]


def _tile_scores(q_i, k_t_j, mask):
    """Scores [B, K, G, block, block] of one tile (keys transposed, [B, K, hd, block]) in
    the accumulation dtype, MASKED where the mask (None: all allowed) forbids."""
    scores = jnp.einsum("bkgqd,bkds->bkgqs", q_i, k_t_j,
                        preferred_element_type=accumulation_dtype(q_i.dtype))
    return scores if mask is None else jnp.where(mask, scores, MASKED)


def _only_allowed(probs, mask):
    """probs with 0 where the mask (None: all allowed) forbids."""
    return probs if mask is None else jnp.where(mask, probs, 0.0)


def _by_tile_kind(kind: jax.Array, tile, skipped, mask):
    """tile(mask) on a MASKED_TILE, tile(None) on a FULL_TILE (the elementwise selects
    would cost a third of the tile), `skipped` on a SKIP; `mask()` builds the tile's
    `_tile_mask`."""
    return jax.lax.switch(kind, [lambda: skipped, lambda: tile(mask()), lambda: tile(None)])


def _key_blocks_upto(i: jax.Array, body, carry):
    """carry = body(j, carry) over the key blocks j <= i (the causal ones)."""
    return jax.lax.fori_loop(0, i + 1, body, carry)


def _forward(q_blocks, k_blocks, v_blocks, segment_blocks, kinds):
    """(out [n, B, K, G, block, hd] in q's dtype, log-sum-exp [n, B, K, G, block] in the
    accumulation dtype; MASKED's magnitude on rows that see nothing)."""
    acc_dtype = accumulation_dtype(q_blocks.dtype)
    stats_shape = q_blocks.shape[1:-1]
    k_t_blocks = k_blocks.swapaxes(-1, -2)

    def query_block(i):
        q_i = q_blocks[i]

        def step(j, mask, carry):
            running_max, total, acc = carry
            scores = _tile_scores(q_i, k_t_blocks[j], mask)
            new_max = jnp.maximum(running_max, scores.max(axis=-1))
            probs = _only_allowed(jnp.exp(scores - new_max[..., None]), mask)
            rescale = jnp.exp(running_max - new_max)
            total = total * rescale + probs.sum(axis=-1)
            acc = acc * rescale[..., None] + jnp.einsum(
                "bkgqs,bksd->bkgqd", probs.astype(v_blocks.dtype), v_blocks[j],
                preferred_element_type=acc_dtype)
            return new_max, total, acc

        def body(j, carry):
            return _by_tile_kind(kinds[i, j], lambda mask: step(j, mask, carry), carry,
                                 lambda: _tile_mask(segment_blocks, i, j))

        init = (jnp.full(stats_shape, MASKED, acc_dtype), jnp.zeros(stats_shape, acc_dtype),
                jnp.zeros(q_i.shape, acc_dtype))
        running_max, total, acc = _key_blocks_upto(i, body, init)
        seen = total > 0
        out = jnp.where(seen[..., None], acc / jnp.where(seen, total, 1.0)[..., None], 0.0)
        lse = jnp.where(seen, running_max + jnp.log(jnp.where(seen, total, 1.0)), -MASKED)
        return out.astype(q_blocks.dtype), lse

    return jax.lax.map(query_block, jnp.arange(q_blocks.shape[0]))


@jax.custom_vjp
def _flash(q_blocks, k_blocks, v_blocks, segment_blocks, kinds):
    return _forward(q_blocks, k_blocks, v_blocks, segment_blocks, kinds)[0]


def _flash_forward(q_blocks, k_blocks, v_blocks, segment_blocks, kinds):
    out, lse = _forward(q_blocks, k_blocks, v_blocks, segment_blocks, kinds)
    # Named so that a remat policy can keep them (models/decoder.py: remat_policy) and
    # the backward need not run the forward's loop again.
    out, lse = (checkpoint_name(x, ATTENTION_RESIDUALS) for x in (out, lse))
    return out, (q_blocks, k_blocks, v_blocks, segment_blocks, kinds, out, lse)


def _flash_backward(residuals, d_out):
    """FlashAttention-2's backward: per tile, probabilities from the saved log-sum-exp,
    then dV += P^T dO, dP = dO V^T, dS = P (dP - rowsum(dO * O)), dQ += dS K, dK += dS^T Q.

    Keys and values also enter transposed ([.., hd, block]) and dK, dV accumulate
    transposed: every product then has its contracted axis last on one side, which
    XLA:CPU ran 1.5-2x faster than the transposed-operand forms.
    """
    q_blocks, k_blocks, v_blocks, segment_blocks, kinds, out, lse = residuals
    acc_dtype = accumulation_dtype(q_blocks.dtype)
    d_out = d_out.astype(q_blocks.dtype)
    delta = jnp.sum(d_out.astype(acc_dtype) * out.astype(acc_dtype), axis=-1)
    k_t_blocks, v_t_blocks = k_blocks.swapaxes(-1, -2), v_blocks.swapaxes(-1, -2)

    def query_block(carry, i):
        q_i, d_out_i, lse_i, delta_i = q_blocks[i], d_out[i], lse[i], delta[i]

        def tile_grads(j, mask):
            """(dQ_i, dK_j^T, dV_j^T) of tile (i, j)."""
            probs = _only_allowed(
                jnp.exp(_tile_scores(q_i, k_t_blocks[j], mask) - lse_i[..., None]), mask)
            dv_t_j = jnp.einsum("bkgqd,bkgqs->bkds", d_out_i, probs.astype(d_out_i.dtype),
                                preferred_element_type=acc_dtype)
            d_probs = jnp.einsum("bkgqd,bkds->bkgqs", d_out_i, v_t_blocks[j],
                                 preferred_element_type=acc_dtype)
            d_scores = (probs * (d_probs - delta_i[..., None])).astype(q_i.dtype)
            dq_i = jnp.einsum("bkgqs,bksd->bkgqd", d_scores, k_blocks[j],
                              preferred_element_type=acc_dtype)
            dk_t_j = jnp.einsum("bkgqd,bkgqs->bkds", q_i, d_scores,
                                preferred_element_type=acc_dtype)
            return dq_i, dk_t_j, dv_t_j

        zeros = (jnp.zeros(q_i.shape, acc_dtype),
                 jnp.zeros(k_t_blocks.shape[1:], acc_dtype),
                 jnp.zeros(k_t_blocks.shape[1:], acc_dtype))

        def body(j, carry):
            # The accumulators stay outside the switch, so that XLA updates them in
            # place rather than copying both [T, K, hd] arrays through every tile.
            dq_i, dk_t, dv_t = carry
            tile_dq, tile_dk_t, tile_dv_t = _by_tile_kind(
                kinds[i, j], lambda mask: tile_grads(j, mask), zeros,
                lambda: _tile_mask(segment_blocks, i, j))
            return dq_i + tile_dq, dk_t.at[j].add(tile_dk_t), dv_t.at[j].add(tile_dv_t)

        dk_t, dv_t = carry
        dq_i, dk_t, dv_t = _key_blocks_upto(i, body, (zeros[0], dk_t, dv_t))
        return (dk_t, dv_t), dq_i

    zeros = jnp.zeros(k_t_blocks.shape, acc_dtype)
    (dk_t, dv_t), dq = jax.lax.scan(query_block, (zeros, zeros),
                                    jnp.arange(q_blocks.shape[0]))
    return (dq.astype(q_blocks.dtype), dk_t.swapaxes(-1, -2).astype(k_blocks.dtype),
            dv_t.swapaxes(-1, -2).astype(v_blocks.dtype),
            np.zeros(segment_blocks.shape, jax.dtypes.float0),
            np.zeros(kinds.shape, jax.dtypes.float0))


_flash.defvjp(_flash_forward, _flash_backward)
