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
merged in a fixed order. The item list is padded to a bucketed length; padding items
belong to no row. A row's output is bitwise independent of the other rows and of the
padding (tested): the property the engine's deterministic mode needs.

Two attentions read the work list:
- `paged_attention` (prefill chunks): a loop over tiles of a row's pages, each merged
  into its row's accumulators in page order, so memory stays one tile's scores.
- `view_attention` (decode): a decode call first gathers the pages its rows hold into a
  view (`gather_view`, one copy per call instead of one per step), every step attends
  over the view with one batched product and merges each row's partials in a fixed tree,
  and the call's new tokens go back to the pool at its end (`copy_slots`). Per step it
  reads the view once, where gathering the pages again would copy them first.
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
                size: int, tile: int = ITEM_TILE) -> HostItems:
    """The work list of a call whose program row r attends slots [0, spans[r]) held in
    pages[r] (padding rows: span 0), padded to `size` items.

    Each row's items fill whole tiles of `tile` items (the last padded with masked
    items): with ITEM_TILE, page j of a row always sits at position j % ITEM_TILE of a
    tile of its own, whatever the other rows hold (what `paged_attention` needs);
    `view_attention` takes tile 1. Raises ValueError when the rows need more than `size`
    items (the caller picks size from `items_needed`)."""
    row, page, first = [], [], []
    for r, (held, span) in enumerate(zip(pages, spans)):
        n = -(-span // page_size)
        if n > len(held):
            raise ValueError(f"row {r} attends {span} slots but holds {len(held)} pages")
        pad = -n % tile
        row += [r] * (n + pad)
        page += held[:n] + [0] * pad
        first += [j * page_size for j in range(n)] + [_NEVER] * pad
    if len(row) > size:
        raise ValueError(f"{len(row)} attention items do not fit {size}")
    # The padding filled by numpy: a prefill call's list is padded to its rows' most.
    out = HostItems(row=np.full(size, rows, np.int32), page=np.zeros(size, np.int32),
                    first_slot=np.full(size, _NEVER, np.int32))
    out.row[:len(row)], out.page[:len(row)], out.first_slot[:len(row)] = row, page, first
    return out


def items_needed(spans: list[int], page_size: int, tile: int = ITEM_TILE) -> int:
    """Attention items of rows attending `spans` slots (whole tiles of `tile` per row)."""
    return sum(-(-(-(-s // page_size)) // tile) * tile for s in spans)


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
    # The rows' tiles come first (`build_items`), so the loop stops where the padding
    # starts. A trip count read from the data also keeps the loop a loop (a one-tile
    # loop XLA would inline, and fuse otherwise, changing the last bit).
    tiles = jnp.sum(items.row < r) // ITEM_TILE
    _, row_sum, row_out = jax.lax.fori_loop(0, tiles, merge_tile, init)
    out = row_out[:r] / jnp.where(row_sum[:r] > 0, row_sum[:r], 1.0)[..., None]
    return out.transpose(0, 3, 1, 2, 4).reshape(r, t, h, hd).astype(q.dtype)


# ------------------------------------------------------------------- decode over a view

@struct.dataclass
class ViewItems:
    """The work list of `view_attention` over a view (`gather_view`) of W pages: item i
    is page i of the view, of program row `row[i]` (padding: the row count), holding
    sequence positions from `first_slot[i]`. A row's items are consecutive and in slot
    order, no tile padding (`build_items(..., tile=1)`). Built once per call (`of`),
    with the plan of the rows' merges that every layer and step reuses.

    row, first_slot: [W] int32.
    row_start: [R] int32, each row's first item.
    merges: per level of `_merge_rows`, the (left, right) partials it merges, [S_l] int32
      each (the entry past the level's input: the empty partial).
    merged: [R] int32, where each row's result sits after the last level.
    """

    row: jax.Array
    first_slot: jax.Array
    row_start: jax.Array
    merges: tuple[tuple[jax.Array, jax.Array], ...]
    merged: jax.Array

    @staticmethod
    def of(items: AttentionItems, rows: int) -> "ViewItems":
        # Padding items (row `rows`, after every row's) are dropped from the counts.
        count = jnp.zeros((rows,), jnp.int32).at[items.row].add(1, mode="drop")
        start = jnp.cumsum(count) - count
        merges, merged = _merge_plan(start, count, items.row.shape[0])
        return ViewItems(row=items.row, first_slot=items.first_slot, row_start=start,
                         merges=merges, merged=merged)


def gather_view(cache: PagedKVCache, items: AttentionItems) -> PagedKVCache:
    """The pages the items read, in item order, as a pool of their own (page i: the
    page of item i), in every layer."""
    take = lambda x: jnp.take(x, items.page, axis=0)
    return cache.replace(k=tuple(map(take, cache.k)), v=tuple(map(take, cache.v)))


def view_index(items: ViewItems, slots: jax.Array, page_size: int) -> jax.Array:
    """The flat view index (view page * page_size + offset) of each slot [R, T] of its
    row; -1 stays -1."""
    chex.assert_rank(slots, 2)
    page = items.row_start[:, None] + jnp.maximum(slots, 0) // page_size
    return jnp.where(slots < 0, -1, page * page_size + slots % page_size)


def read_slots(k_pool: jax.Array, v_pool: jax.Array, index: jax.Array,
               key_layout: str = "hd_page") -> tuple[jax.Array, jax.Array]:
    """Keys and values [R, T, K, hd] at the flat pool indices `index` [R, T] (what
    `write_pages` wrote there; entries at -1 read page 0)."""
    chex.assert_rank(index, 2)
    _check_key_layout(key_layout)
    page_size = v_pool.shape[2]
    page, offset = jnp.maximum(index, 0) // page_size, jnp.maximum(index, 0) % page_size
    k = k_pool[page, :, :, offset] if key_layout == "hd_page" else k_pool[page, :, offset]
    return k, v_pool[page, :, offset]


def copy_slots(src: PagedKVCache, src_index: jax.Array, dst: PagedKVCache,
               dst_index: jax.Array) -> PagedKVCache:
    """dst with the keys and values of src's flat slots src_index [R, T] written at
    dst_index [R, T] (-1: skipped), in every layer."""
    ks, vs = [], []
    for src_k, src_v, dst_k, dst_v in zip(src.k, src.v, dst.k, dst.v):
        k, v = read_slots(src_k, src_v, src_index, src.key_layout)
        dst_k, dst_v = write_pages(dst_k, dst_v, k, v, dst_index, dst.key_layout)
        ks.append(dst_k)
        vs.append(dst_v)
    return dst.replace(k=tuple(ks), v=tuple(vs))


def _ordered_sum(x: jax.Array) -> jax.Array:
    """Sum over the last axis by halving (zero-padded to a power of two): every output
    element is the same sequence of additions whatever the array's other dimensions.
    (XLA:CPU's reduce over the same values differed in the last bit with the leading
    dimension's size.)"""
    n = x.shape[-1]
    width = 1 << (n - 1).bit_length()
    x = jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, width - n)])
    while x.shape[-1] > 1:
        half = x.shape[-1] // 2
        x = x[..., :half] + x[..., half:]
    return x[..., 0]


def _merge_plan(start: jax.Array, count: jax.Array, width: int):
    """The merges of `_merge_rows` for rows whose `count` [R] partials start at `start`
    [R] in an array of `width`: per level, (left, right) indices into that level's
    input, and where each row's result ends up.

    Each level merges a row's partials in pairs (0, 1), (2, 3), ... (an odd last one
    with the empty partial) and keeps the results packed, row after row, in an array of
    static size: a row of c partials leaves ceil(c / 2), so a level of S partials over
    R rows leaves at most (S + R) / 2. ceil(log2(width)) levels leave each row one."""
    rows, size, merges = count.shape[0], width, []
    for _ in range(max(width - 1, 0).bit_length()):
        pairs = (count + 1) // 2
        ends = jnp.cumsum(pairs)
        next_start, next_size = ends - pairs, min(size, (size + rows + 1) // 2)
        at = jnp.arange(next_size, dtype=jnp.int32)
        owner = jnp.searchsorted(ends, at, side="right", method="compare_all")
        held = owner < rows
        owner = jnp.minimum(owner, rows - 1)
        pair = at - next_start[owner]
        left = jnp.where(held, start[owner] + 2 * pair, size)  # `size`: the empty partial
        right = jnp.where(held & (2 * pair + 1 < count[owner]), left + 1, size)
        merges.append((left, right))
        start, count, size = next_start, pairs, next_size
    return tuple(merges), jnp.where(count > 0, start, size)


def _merge_rows(partial, items: ViewItems):
    """Each row's item partials (max [W, ...], sum, weighted values [W, ..., hd]) merged
    into one [R, ...] by the plan of `_merge_plan`: a fixed pairwise tree that follows
    the row's own item count alone. Rows with no items get the empty partial (max
    MASKED, sum 0), which also stands in for a missing pair (an exact no-op). Costs
    ~2W + R log W merges, not W per level."""
    with_empty = lambda parts: tuple(jnp.concatenate([x, jnp.full_like(x[:1], fill)])
                                     for x, fill in zip(parts, (MASKED, 0.0, 0.0)))
    buf = with_empty(partial)
    for left, right in items.merges:
        buf = with_empty(merge_partials(tuple(x[left] for x in buf),
                                        tuple(x[right] for x in buf)))
    return tuple(x[items.merged] for x in buf)


def view_attention(q: jax.Array, k_view: jax.Array, v_view: jax.Array, slots: jax.Array,
                   items: ViewItems, key_layout: str = "hd_page") -> jax.Array:
    """Grouped-query causal attention of new queries over their rows' pages in a view
    (`gather_view`; the new tokens already written).

    Every item's partial softmax comes from one batched product over all items (a
    row's pages are not reduced in a loop), then each row's partials are merged in a
    fixed tree (`_merge_rows`). Both depend only on the row's own items: the products
    are per item, the sums are `_ordered_sum`s, the merges element-wise. So a row's
    result does not depend on the item count or the other rows (tested bitwise). Memory:
    every item's scores at once, [W, H, T, page]: meant for decode steps (T = 1).

    Args:
      q: [R, T, H, hd] queries of the new tokens.
      k_view: [W, K, hd, page] keys ([W, K, page, hd] when key_layout is "page_hd").
      v_view: [W, K, page, hd] values.
      slots: [R, T] int32 position of each query in its row (-1: padding query).
      items: the view's work list, covering every slot <= the row's largest query slot.

    Returns:
      [R, T, H, hd] in q's dtype (zeros for padding queries); softmax in float32.
    """
    chex.assert_rank([q, k_view, v_view, slots], [4, 4, 4, 2])
    chex.assert_rank([items.row, items.first_slot], 1)
    chex.assert_equal_shape_prefix([k_view, v_view, items.row], 1)
    _check_key_layout(key_layout)
    r, t, h, hd = q.shape
    kh, page_size = v_view.shape[1], v_view.shape[2]
    acc = accumulation_dtype(q.dtype)
    q = q.reshape(r, t, kh, h // kh, hd) * jnp.asarray(hd ** -0.5, q.dtype)
    q = jnp.concatenate([q, jnp.zeros_like(q[:1])]).transpose(0, 2, 3, 1, 4)  # [R+1,K,G,T,hd]
    slots = jnp.concatenate([slots, jnp.full_like(slots[:1], -1)])           # [R+1, T]
    score_spec = "nkgtd,nkds->nkgts" if key_layout == "hd_page" else "nkgtd,nksd->nkgts"
    scores = jnp.einsum(score_spec, q[items.row], k_view.astype(q.dtype),
                        preferred_element_type=acc)                          # [W,K,G,T,p]
    positions = items.first_slot[:, None] + jnp.arange(page_size, dtype=jnp.int32)[None]
    visible = (positions[:, None, :] <= slots[items.row][:, :, None])[:, None, None]
    scores = jnp.where(visible, scores, MASKED)
    top = jnp.max(scores, axis=-1)
    probs = jnp.where(visible, jnp.exp(scores - top[..., None]), 0.0)
    out = jnp.einsum("nkgts,nksd->nkgtd", probs.astype(q.dtype), v_view.astype(q.dtype),
                     preferred_element_type=acc)
    _, row_sum, row_out = _merge_rows((top, _ordered_sum(probs), out), items)
    out = row_out / jnp.where(row_sum > 0, row_sum, 1.0)[..., None]
    return out.transpose(0, 3, 1, 2, 4).reshape(r, t, h, hd).astype(q.dtype)
