"""A paged KV cache and ragged paged attention over it, in pure JAX.

    cache = init_paged_cache(config, num_pages=512, page_size=64)
    hidden, cache = weights.forward(tokens, slots, write, cache, items)   # prefill/decode

The cache is a pool of fixed-size pages shared by every sequence (the block-table layout
of vLLM's PagedAttention, arXiv 2309.06180): slot s of a sequence lives at offset
s % page_size of the sequence's page s // page_size. Which pages a sequence holds is
host-side bookkeeping (the engine's page table); a device call gets only index arrays:

- `write` [R, T]: the flat pool index (page * page_size + offset) each new token's key
  and value go to; -1 for padding (never written).
- `slots` [R, T]: each new token's position in its sequence (its RoPE position); -1 for
  padding. A query at slot s attends the keys at slots <= s of its own row.
- `AttentionItems`: the work list. One item is (row, page, first slot of the page): the
  attention of that row's queries over that one page. A row with n cached slots has
  ceil(n / page_size) items, so a call costs the sum of its rows' contexts, not rows x
  the longest context or x max_len (the ragged paged attention of tpu-inference / vLLM).

Each item yields a partial softmax (max, sum, weighted values) and a row's partials are
merged one by one in item order (`paged_attention`). The item list is padded to a
bucketed length; padding items belong to no row. A row's output is bitwise independent
of the other rows and of the padding (tested): the property the engine's deterministic
mode needs.
"""
from __future__ import annotations

import dataclasses

import chex
import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from agentjax.models.attention import MASKED, accumulation_dtype
from agentjax.models.config import ModelConfig

# Logical axes of one layer's pages (for `parallel.tree_shardings`).
_V_AXES = ("cache_pages", "kv_heads", "page", "head_dim")
# How a layer's keys are laid out: "hd_page" [P, K, hd, page] (slots last: a page's score
# product is a plain [G*T, hd] x [hd, page] matmul, the faster form for `paged_attention`
# on CPU) or "page_hd" [P, K, page, hd], as the values are (what the GPU kernel of
# `models/paged_pallas.py` reads).
KEY_LAYOUTS = {"hd_page": ("cache_pages", "kv_heads", "head_dim", "page"),
               "page_hd": _V_AXES}


def _check_key_layout(key_layout: str) -> None:
    if key_layout not in KEY_LAYOUTS:
        raise ValueError(f"key_layout must be one of {sorted(KEY_LAYOUTS)}, got {key_layout!r}")


@struct.dataclass
class PagedKVCache:
    """The page pool: per layer, keys [num_pages, K, hd, page_size] or [num_pages, K,
    page_size, hd] (`key_layout`, see KEY_LAYOUTS) and values [num_pages, K, page_size,
    hd]."""

    k: tuple[jax.Array, ...]
    v: tuple[jax.Array, ...]
    key_layout: str = struct.field(pytree_node=False, default="hd_page")

    @property
    def num_pages(self) -> int:
        return self.v[0].shape[0]

    @property
    def page_size(self) -> int:
        return self.v[0].shape[2]

    @staticmethod
    def logical_axes(num_layers: int, key_layout: str = "hd_page") -> "PagedKVCache":
        return PagedKVCache(k=(KEY_LAYOUTS[key_layout],) * num_layers,
                            v=(_V_AXES,) * num_layers, key_layout=key_layout)

    def copy_pages(self, src: jax.Array, dst: jax.Array) -> "PagedKVCache":
        """Copies pages src[i] -> dst[i] in every layer (copy-on-write of a shared page);
        entries with dst out of range are dropped."""
        copy = lambda x: x.at[dst].set(x[src], mode="drop")
        return self.replace(k=tuple(map(copy, self.k)), v=tuple(map(copy, self.v)))


def init_paged_cache(config: ModelConfig, num_pages: int, page_size: int,
                     dtype=None, key_layout: str = "hd_page") -> PagedKVCache:
    """An empty pool of `num_pages` pages of `page_size` slots (default dtype: the model's
    compute dtype; `key_layout`: KEY_LAYOUTS)."""
    if num_pages <= 0 or page_size <= 0:
        raise ValueError(f"num_pages and page_size must be positive, got {num_pages}, "
                         f"{page_size}")
    _check_key_layout(key_layout)
    dtype = config.dtype if dtype is None else dtype
    kh, hd = config.num_kv_heads, config.head_dim
    v_shape = (num_pages, kh, page_size, hd)
    k_shape = (num_pages, kh, hd, page_size) if key_layout == "hd_page" else v_shape
    return PagedKVCache(
        k=tuple(jnp.zeros(k_shape, dtype) for _ in range(config.num_layers)),
        v=tuple(jnp.zeros(v_shape, dtype) for _ in range(config.num_layers)),
        key_layout=key_layout)


def page_bytes(config: ModelConfig, page_size: int, dtype=None) -> int:
    """Bytes of one page over every layer (keys and values)."""
    itemsize = jnp.dtype(config.dtype if dtype is None else dtype).itemsize
    return 2 * config.num_layers * config.num_kv_heads * config.head_dim * page_size * itemsize


@struct.dataclass
class AttentionItems:
    """The work list of one call (module docstring), each [W] int32.

    row: the program row the item belongs to (padding items: the row count, no row).
    page: the pool page it reads (padding items: any page; they are masked).
    first_slot: the sequence position of the page's first slot.
    """

    row: jax.Array
    page: jax.Array
    first_slot: jax.Array


@dataclasses.dataclass(frozen=True)
class HostItems:
    """An `AttentionItems` built on the host (numpy), before it is sent."""

    row: np.ndarray
    page: np.ndarray
    first_slot: np.ndarray


# Items per tile of `paged_attention`: a tile holds consecutive pages of one row.
ITEM_TILE = 4
# First slot of a padding item: past any query, so it is fully masked.
_NEVER = 2 ** 30


def build_items(pages: list[list[int]], spans: list[int], rows: int, page_size: int,
                size: int) -> HostItems:
    """The work list of a call whose program row r attends slots [0, spans[r]) held in
    pages[r] (padding rows: span 0), padded to `size` items.

    Each row's items fill whole tiles of ITEM_TILE (the last padded with masked items),
    so page j of a row always sits at position j % ITEM_TILE of a tile of its own,
    whatever the other rows hold. Raises ValueError when the rows need more than `size`
    items (the caller picks size from `items_needed`)."""
    row, page, first = [], [], []
    for r, (held, span) in enumerate(zip(pages, spans)):
        n = -(-span // page_size)
        if n > len(held):
            raise ValueError(f"row {r} attends {span} slots but holds {len(held)} pages")
        pad = -n % ITEM_TILE
        row += [r] * (n + pad)
        page += held[:n] + [0] * pad
        first += [j * page_size for j in range(n)] + [_NEVER] * pad
    if len(row) > size:
        raise ValueError(f"{len(row)} attention items do not fit {size}")
    pad = size - len(row)
    return HostItems(row=np.asarray(row + [rows] * pad, np.int32),
                     page=np.asarray(page + [0] * pad, np.int32),
                     first_slot=np.asarray(first + [_NEVER] * pad, np.int32))


def items_needed(spans: list[int], page_size: int) -> int:
    """Attention items of rows attending `spans` slots (whole tiles per row)."""
    return sum(-(-(-(-s // page_size)) // ITEM_TILE) * ITEM_TILE for s in spans)


def write_pages(k_pool: jax.Array, v_pool: jax.Array, k: jax.Array, v: jax.Array,
                write: jax.Array, key_layout: str = "hd_page") -> tuple[jax.Array, jax.Array]:
    """Scatters new keys / values [R, T, K, hd] into one layer's pages at the flat
    indices `write` [R, T] (-1: dropped)."""
    chex.assert_rank([k, v, write], [4, 4, 2])
    _check_key_layout(key_layout)
    page_size = v_pool.shape[2]
    page = jnp.where(write < 0, v_pool.shape[0], write // page_size)
    offset = write % page_size
    # Indices split by slices: each update is indexed [R, T, K, hd], k's own layout.
    if key_layout == "hd_page":
        k_pool = k_pool.at[page, :, :, offset].set(k.astype(k_pool.dtype), mode="drop")
    else:
        k_pool = k_pool.at[page, :, offset].set(k.astype(k_pool.dtype), mode="drop")
    v_pool = v_pool.at[page, :, offset].set(v.astype(v_pool.dtype), mode="drop")
    return k_pool, v_pool


def merge_partials(acc, part):
    """Two partial softmaxes (max [...], sum [...], weighted values [..., hd]) over
    disjoint keys merged into one (the online softmax of FlashAttention)."""
    (acc_max, acc_sum, acc_out), (top, total, out) = acc, part
    new = jnp.maximum(acc_max, top)
    keep, take = jnp.exp(acc_max - new), jnp.exp(top - new)
    return new, acc_sum * keep + total * take, acc_out * keep[..., None] + out * take[..., None]


def paged_attention(q: jax.Array, k_pool: jax.Array, v_pool: jax.Array, slots: jax.Array,
                    items: AttentionItems, key_layout: str = "hd_page") -> jax.Array:
    """Grouped-query causal attention of new queries over their rows' pages.

    A loop over tiles of ITEM_TILE items, each tile consecutive pages of one row
    (`build_items`): it computes its items' partial softmax (max, sum, weighted values
    over one page), then merges them one by one, in page order, into the row's running
    accumulators (the online softmax of FlashAttention, over fixed-size KV blocks
    reduced in a fixed order). Page j of a row is always item j % ITEM_TILE of a tile of
    its own, so every operation it passes through is the same code whatever else is in
    flight: the result does not depend on the item count, the other rows or where the
    row's tiles sit in the list. (One batched matmul over all items, merged by
    `segment_sum`, differed in the last bit between item counts on XLA:CPU; so did
    tiles shared by several rows.)

    Args:
      q: [R, T, H, hd] queries of the new tokens.
      k_pool: [P, K, hd, page] keys of one layer (the new tokens already written);
        [P, K, page, hd] when key_layout is "page_hd".
      v_pool: [P, K, page, hd] values.
      slots: [R, T] int32 position of each query in its row (-1: padding query).
      items: the work list (a multiple of ITEM_TILE long) covering every slot <= the
        row's largest query slot.

    Returns:
      [R, T, H, hd] in q's dtype (zeros for padding queries); softmax in float32.
    """
    chex.assert_rank([q, k_pool, v_pool, slots], [4, 4, 4, 2])
    chex.assert_rank([items.row, items.page, items.first_slot], 1)
    _check_key_layout(key_layout)
    r, t, h, hd = q.shape
    kh, page_size = v_pool.shape[1], v_pool.shape[2]
    score_spec = "nkgtd,nkds->nkgts" if key_layout == "hd_page" else "nkgtd,nksd->nkgts"
    count = items.row.shape[0]
    if count % ITEM_TILE:
        raise ValueError(f"{count} attention items: not a multiple of {ITEM_TILE}")
    acc = accumulation_dtype(q.dtype)
    q = q.reshape(r, t, kh, h // kh, hd) * jnp.asarray(hd ** -0.5, q.dtype)
    # One more row for the padding items (row index r); dropped at the end.
    q = jnp.concatenate([q.transpose(0, 2, 3, 1, 4), jnp.zeros_like(q[:1]).transpose(
        0, 2, 3, 1, 4)])                                                    # [R+1, K, G, T, hd]
    slots = jnp.concatenate([slots, jnp.full_like(slots[:1], -1)])          # [R+1, T]
    offsets = jnp.arange(page_size, dtype=jnp.int32)

    def partials(rows, pages, first):
        """(max [n, K, G, T], sum, weighted values [n, K, G, T, hd]) of n items."""
        keys = jnp.take(k_pool, pages, axis=0).astype(q.dtype)       # [n, K, hd | p, p | hd]
        values = jnp.take(v_pool, pages, axis=0).astype(q.dtype)           # [n, K, p, hd]
        scores = jnp.einsum(score_spec, q[rows], keys, preferred_element_type=acc)
        visible = (first[:, None] + offsets[None])[:, None, :] <= slots[rows][:, :, None]
        visible = visible[:, None, None]                                    # [n,1,1,T,p]
        scores = jnp.where(visible, scores, MASKED)
        top = jnp.max(scores, axis=-1)
        probs = jnp.where(visible, jnp.exp(scores - top[..., None]), 0.0)
        out = jnp.einsum("nkgts,nksd->nkgtd", probs.astype(q.dtype), values,
                         preferred_element_type=acc)
        return top, jnp.sum(probs, axis=-1), out

    def merge_tile(index, carry):
        rows, pages, first = (jax.lax.dynamic_slice_in_dim(x, index * ITEM_TILE, ITEM_TILE)
                              for x in (items.row, items.page, items.first_slot))
        top, total, out = partials(rows, pages, first)
        row_max, row_sum, row_out = carry
        for i in range(ITEM_TILE):  # in item order: a row's merges never reorder
            row = rows[i]
            new, merged_sum, merged_out = merge_partials(
                (row_max[row], row_sum[row], row_out[row]), (top[i], total[i], out[i]))
            row_max = row_max.at[row].set(new)
            row_sum = row_sum.at[row].set(merged_sum)
            row_out = row_out.at[row].set(merged_out)
        return row_max, row_sum, row_out

    shape = (r + 1, kh, h // kh, t)
    init = (jnp.full(shape, MASKED, acc), jnp.zeros(shape, acc), jnp.zeros(shape + (hd,), acc))
    # A trip count read from the data, not the shape: XLA keeps the loop a loop (a
    # one-tile loop it would inline, and fuse otherwise, changing the last bit).
    tiles = jnp.sum(items.row >= 0) // ITEM_TILE
    _, row_sum, row_out = jax.lax.fori_loop(0, tiles, merge_tile, init)
    out = row_out[:r] / jnp.where(row_sum[:r] > 0, row_sum[:r], 1.0)[..., None]
    return out.transpose(0, 3, 1, 2, 4).reshape(r, t, h, hd).astype(q.dtype)
