"""Paged attention on GPU: JAX's Pallas (Triton) paged-attention kernel reading the pool
in place.

    tables = BlockTables(table=...)                       # [R, table_width(pages)] int32
    out = paged_attention_pallas(q, k_pool, v_pool, slots, tables)

The pure-JAX paths of `models/paged.py` copy pages: a prefill walks each row's pages in a
sequential loop of small products (on a GPU a few tiny kernel launches per step of that
loop), a decode call gathers its rows' pages into a view. Here the pool is read in place:
every query token is one program of `jax.experimental.pallas.ops.gpu.
paged_attention.paged_attention_kernel` (split-KV flash decoding over the row's block
table): a query at slot s attends the slots [0, s] of its row, which is causal attention
for a prefill chunk as well as for a decode step. So prefill and decode share one kernel
and a call costs the sum of its queries' contexts. (A prefill chunk reads its row's keys
once per query; a kernel that tiles queries, like tpu-inference's ragged paged attention,
would read them once per chunk.)

Batch invariance (the engine's deterministic mode): a query's result depends only on its
own row's block table, its slot and the pool, never on the other queries. The table
width is fixed by the engine's max_len (`table_width`), so the split of a row's pages
into `k_splits` partitions, each partition's order of pages, and the merge of the
partitions (in order, element-wise) are the same whatever else is in flight. The kernel
needs keys laid out as the values are (`key_layout="page_hd"`).

On CPU the same kernel runs in Pallas's interpret mode (slow; the tests use it to check
this path against `paged.paged_attention` and a float64 reference).
"""
from __future__ import annotations

import functools

import chex
import jax
import jax.numpy as jnp
from flax import struct

from agentjax.models.paged import merge_partials

# Query heads per program: Triton's dot needs blocks of at least 16 rows.
_BLOCK_H = 16
_MAX_SPLITS = 16
_MAX_PAGES_PER_BLOCK = 8


@struct.dataclass
class BlockTables:
    """The work list of a `paged_attention_pallas` call: table [R, width] int32, row r's
    pages in slot order (entries past its context: any page, they are masked)."""

    table: jax.Array


def split_plan(pages_per_row: int) -> tuple[int, int, int]:
    """(k_splits, pages per compute block, table width) for rows of at most
    `pages_per_row` pages: up to 16 partitions of whole compute blocks of a power of two
    pages (at most 8), the table width a multiple of both."""
    if pages_per_row < 1:
        raise ValueError(f"pages_per_row must be >= 1, got {pages_per_row}")
    k_splits = min(_MAX_SPLITS, pages_per_row)
    per_split = -(-pages_per_row // k_splits)
    block = min(_MAX_PAGES_PER_BLOCK, 1 << (per_split.bit_length() - 1))
    per_split = -(-per_split // block) * block
    return k_splits, block, k_splits * per_split


def table_width(pages_per_row: int) -> int:
    """Columns of the block tables for rows of at most `pages_per_row` pages."""
    return split_plan(pages_per_row)[2]


def check_page_size(page_size: int) -> None:
    """Triton's blocks are powers of two of at least 16 slots."""
    if page_size < 16 or page_size & (page_size - 1):
        raise ValueError(f"the Pallas GPU attention needs a page_size that is a power of two "
                         f">= 16, got {page_size}")


def _partitions(q, k_pool, v_pool, table, length, *, k_splits, block, interpret):
    """One query's per-partition (out [S, K, Gp, hd] f32, sum [S, K, Gp], max [S, K, Gp])
    over its row's pages; q [K, Gp, hd], table [width], length [1]."""
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import triton as plgpu
    from jax.experimental.pallas.ops.gpu import paged_attention as gpu_paged

    kh, heads, hd = q.shape
    num_pages, _, page_size, _ = v_pool.shape
    per_split = table.shape[0] // k_splits
    kernel = functools.partial(gpu_paged.paged_attention_kernel, num_heads=heads,
                               pages_per_compute_block=block,
                               mask_value=gpu_paged.DEFAULT_MASK_VALUE,
                               attn_logits_soft_cap=None)
    # The pool stays where it is: a program sees one kv head's pages [P, page, hd].
    pool_spec = pl.BlockSpec((num_pages, None, page_size, hd), lambda h, i, s: (0, h, 0, 0))
    return pl.pallas_call(
        kernel,
        grid=(kh, heads // _BLOCK_H, k_splits),
        in_specs=[pl.BlockSpec((None, _BLOCK_H, hd), lambda h, i, s: (h, i, 0)),
                  pool_spec, None, pool_spec, None,
                  pl.BlockSpec((None, per_split), lambda h, i, s: (s, 0)),
                  pl.BlockSpec((1,), lambda h, i, s: (0,))],
        out_specs=[pl.BlockSpec((None, None, _BLOCK_H, hd), lambda h, i, s: (s, h, i, 0)),
                   pl.BlockSpec((None, None, _BLOCK_H), lambda h, i, s: (s, h, i)),
                   pl.BlockSpec((None, None, _BLOCK_H), lambda h, i, s: (s, h, i))],
        out_shape=[jax.ShapeDtypeStruct((k_splits, kh, heads, hd), jnp.float32),
                   jax.ShapeDtypeStruct((k_splits, kh, heads), jnp.float32),
                   jax.ShapeDtypeStruct((k_splits, kh, heads), jnp.float32)],
        interpret=interpret,
        compiler_params=plgpu.CompilerParams(num_warps=4, num_stages=2),
        name="agentjax_paged_attention",
    )(q, k_pool, None, v_pool, None, table.reshape(k_splits, per_split), length)


def paged_attention_pallas(q: jax.Array, k_pool: jax.Array, v_pool: jax.Array,
                           slots: jax.Array, tables: BlockTables, *,
                           interpret: bool | None = None) -> jax.Array:
    """Grouped-query causal attention of new queries over their rows' pages, one kernel
    program per query (module docstring).

    Args:
      q: [R, T, H, hd] queries of the new tokens.
      k_pool: [P, K, page, hd] keys of one layer (key_layout "page_hd"; the new tokens
        already written).
      v_pool: [P, K, page, hd] values.
      slots: [R, T] int32 position of each query in its row (-1: padding query).
      tables: [R, width] block tables, width from `table_width`.
      interpret: run the kernel in Pallas's interpreter (default: on CPU).

    Returns:
      [R, T, H, hd] in q's dtype (zeros for padding queries); softmax in float32.
    """
    chex.assert_rank([q, k_pool, v_pool, slots, tables.table], [4, 4, 4, 2, 2])
    chex.assert_equal_shape([k_pool, v_pool])
    r, t, h, hd = q.shape
    kh = v_pool.shape[1]
    width = tables.table.shape[1]
    k_splits, block, planned = split_plan(width)
    if planned != width:
        raise ValueError(f"block tables {width} wide: not a table_width ({planned})")
    if interpret is None:
        interpret = jax.default_backend() == "cpu"
    groups = h // kh
    padded = -(-groups // _BLOCK_H) * _BLOCK_H
    queries = (q * jnp.asarray(hd ** -0.5, q.dtype)).reshape(r * t, kh, groups, hd)
    queries = jnp.pad(queries, ((0, 0), (0, 0), (0, padded - groups), (0, 0)))
    lengths = (jnp.maximum(slots, -1) + 1).reshape(r * t, 1).astype(jnp.int32)
    table = jnp.repeat(tables.table, t, axis=0)                            # [R*T, width]
    run = functools.partial(_partitions, k_splits=k_splits, block=block, interpret=interpret)
    out, total, top = jax.vmap(run, in_axes=(0, None, None, 0, 0))(
        queries, k_pool, v_pool, table, lengths)
    # Partitions merged one by one, in order: element-wise, so no reduction whose order
    # could follow the batch shape. An empty partition has max = the mask value and
    # sum 0: it scales by 0 and adds 0.
    merged = (top[:, 0], total[:, 0], out[:, 0])
    for s in range(1, k_splits):
        merged = merge_partials(merged, (top[:, s], total[:, s], out[:, s]))
    _, row_sum, row_out = merged
    row_out = row_out / jnp.where(row_sum > 0, row_sum, 1.0)[..., None]
    return row_out[:, :, :groups].reshape(r, t, h, hd).astype(q.dtype)
