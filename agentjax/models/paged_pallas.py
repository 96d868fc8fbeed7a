"""Paged attention on GPU: a Pallas kernel that reads the pool in place, a block of one
row's queries per program.

    plan = split_plan(pages_per_row, page_size)             # (k_splits, block_pages, width)
    tables = BlockTables(table=..., k_splits=plan[0], block_pages=plan[1])  # [R, width]
    out = paged_attention_pallas(q, k_pool, v_pool, slots, tables)

The pure-JAX paths of `models/paged.py` copy pages: a prefill walks each row's pages in a
sequential loop of small products (on a GPU a few tiny kernel launches per step of that
loop), a decode call gathers its rows' pages into a view. Here the pool is read in place.

One program takes one row, one kv head, one block of that row's query rows and one
partition of the row's pages. A row's query rows are its new tokens times the query
heads that share the kv head, token-major ([T * G, hd]), cut into blocks of at least 16
(a GPU matmul's smallest tile). A decode step (T = 1) is one block of its G heads; a
prefill chunk of 256 tokens is a few dozen blocks, and each block reads the row's keys
once for all its tokens (one program per query would read them once per token). The
program walks its partition's pages in compute blocks of `block_pages` pages up to the
last slot any of its queries attends, in table order, with an online softmax (Flash-
Attention), masking each query row to the slots <= its own.

Partitions (split-KV flash decoding) give a decode step with few rows enough programs to
fill the device. Each writes a float32 partial softmax; the partials are merged outside,
in order, element-wise.

Batch invariance (the engine's deterministic mode): a query row's bits depend only on
its own row. Its block holds only its row's tokens, and the block size follows from the
call's chunk width and the head counts, which deterministic mode fixes per sequence. A
compute block past the row's own last slot (reached for another query of its block) is
fully masked for it: its max stays, its probabilities are exactly 0, so it changes no
bit. The split plan is fixed by the engine's max_len, not by the batch. A partition the
query does not reach gives the empty partial (max MASKED, sum 0), computed or skipped.

The kernel uses Pallas's generic primitives only (loads, dots, a loop), which the
Triton lowering compiles on GPU and Pallas's interpreter runs on CPU: the tests check
this path there against `paged.paged_attention` and a float64 reference. It needs keys
laid out as the values are (`key_layout="page_hd"`).
"""
from __future__ import annotations

import functools
import importlib

from typing import Sequence

import chex
import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from agentjax.config.choices import KERNEL_PAGE_SIZES
from agentjax.models.attention import MASKED
from agentjax.models.paged import merge_partials

# Keys a program scores at once (a compute block of pages): a [query block x 128] score
# tile stays in registers at head_dim 128.
BLOCK_KEYS = 128
# Keys a partition holds at least, and the most partitions of a row. At batch 64 and
# 2 kv heads a 2k-token row in 4 partitions of 512 makes 512 programs a decode step;
# each partition adds a float32 partial ([query block, hd]) written and read back.
SPLIT_KEYS = 512
MAX_SPLITS = 16
# Query rows of a program: at least a GPU matmul tile (16), at most 64 (a prefill block
# of 64 rows x 128 keys of float32 scores).
MIN_QUERY_BLOCK = 16
MAX_QUERY_BLOCK = 64


@struct.dataclass
class BlockTables:
    """The work list of a `paged_attention_pallas` call.

    table: [R, width] int32, row r's pages in slot order (entries past its context: any
      page, they are masked).
    k_splits, block_pages: the split plan (`split_plan`); width is a multiple of
      k_splits * block_pages.
    kernel: the engine attention that runs it: "pallas_gpu" (`paged_attention_pallas`)
      or "pallas_tpu" (`paged_pallas_tpu`, which takes one partition).
    mesh, kv_head_axis: where the pool's kv heads are sharded over `kv_head_axis` of
      `mesh` (tensor parallelism), the kernel runs on each device's heads
      (`over_kv_heads`); None: one device.
    """

    table: jax.Array
    k_splits: int = struct.field(pytree_node=False, default=1)
    block_pages: int = struct.field(pytree_node=False, default=1)
    kernel: str = struct.field(pytree_node=False, default="pallas_gpu")
    mesh: jax.sharding.Mesh | None = struct.field(pytree_node=False, default=None)
    kv_head_axis: str | tuple[str, ...] | None = struct.field(pytree_node=False, default=None)


def block_table(held: Sequence[Sequence[int]], rows: int, width: int) -> np.ndarray:
    """[rows, width] int32: row r's pages `held[r]` in slot order, then page 0 (masked)
    to the width; rows past `held`: all page 0."""
    table = np.zeros((rows, width), np.int32)
    for row, pages in enumerate(held):
        table[row, :len(pages)] = pages
    return table


def split_plan(pages_per_row: int, page_size: int) -> tuple[int, int, int]:
    """(k_splits, pages per compute block, table width) for rows of at most
    `pages_per_row` pages of `page_size` slots: compute blocks of BLOCK_KEYS keys (one
    page if pages are bigger), partitions of at least SPLIT_KEYS keys, at most
    MAX_SPLITS of them. Every count is a power of two, as Triton's blocks must be: the
    width is pages_per_row rounded up to one (the loops stop at each row's last page)."""
    if pages_per_row < 1:
        raise ValueError(f"pages_per_row must be >= 1, got {pages_per_row}")
    check_page_size(page_size)
    block = max(1, BLOCK_KEYS // page_size)
    width = max(block, 1 << (pages_per_row - 1).bit_length())
    least = max(block, SPLIT_KEYS // page_size)
    k_splits = max(1, min(MAX_SPLITS, width // least))
    return k_splits, block, width


def missing_backend() -> str | None:
    """Why this jax cannot run the kernel (its Pallas Triton backend, deprecated for
    Mosaic GPU, is gone), or None."""
    try:
        importlib.import_module("jax.experimental.pallas.triton")
    except ImportError as error:
        return f"this jax has no Pallas Triton backend ({error})"
    return None


def check_page_size(page_size: int) -> None:
    """Refuses a page size the kernel cannot take (`config.choices.KERNEL_PAGE_SIZES`)."""
    needs, takes = KERNEL_PAGE_SIZES["pallas_gpu"]
    if not takes(page_size):
        raise ValueError(f"the Pallas GPU attention needs a page_size that is {needs}, "
                         f"got {page_size}")


def query_block(query_rows: int, most: int = MAX_QUERY_BLOCK) -> int:
    """Query rows of a program for a row of `query_rows` (tokens x grouped heads): the
    power of two holding them, within [MIN_QUERY_BLOCK, most]."""
    return min(most, max(MIN_QUERY_BLOCK, 1 << max(query_rows - 1, 0).bit_length()))


def over_kv_heads(kernel, tables: BlockTables):
    """`kernel(q, k_pool, v_pool, slots, tables)` on each device's kv heads (and their
    query heads) when `tables.mesh` shards them, else the kernel itself.

    A Pallas call is one opaque op to XLA's partitioner: on a pool sharded over kv heads
    it would gather every head's pages onto each device and run the whole call there.
    Each (row, kv head) of a kernel is independent, so the shards need no
    communication. Query head h belongs to kv head h // G, so a contiguous shard of the
    query heads is the query heads of the same shard of kv heads."""
    if tables.mesh is None:
        return kernel
    from jax.sharding import PartitionSpec

    heads = PartitionSpec(None, None, tables.kv_head_axis, None)      # q and the output
    pool = PartitionSpec(None, tables.kv_head_axis, None, None)
    return jax.shard_map(kernel, mesh=tables.mesh, out_specs=heads,
                         in_specs=(heads, pool, pool, PartitionSpec(), PartitionSpec()),
                         check_vma=False)


def query_rows(q: jax.Array, slots: jax.Array, kv_heads: int,
               block: int) -> tuple[jax.Array, jax.Array]:
    """The kernels' query rows: per row and kv head its new tokens times the query heads
    sharing the kv head, token-major, padded to whole blocks of `block`.

    Returns queries [R, K, N, hd] scaled by hd^-0.5 and their slots [R, N] (-1: padding),
    N = T * G rounded up to a multiple of block."""
    r, t, h, hd = q.shape
    groups = h // kv_heads
    padded = -(-(t * groups) // block) * block
    queries = (q * jnp.asarray(hd ** -0.5, q.dtype)).reshape(r, t, kv_heads, groups, hd)
    queries = queries.transpose(0, 2, 1, 3, 4).reshape(r, kv_heads, t * groups, hd)
    queries = jnp.pad(queries, ((0, 0), (0, 0), (0, padded - t * groups), (0, 0)))
    query_slots = jnp.repeat(jnp.maximum(slots, -1), groups, axis=1)
    query_slots = jnp.pad(query_slots, ((0, 0), (0, padded - t * groups)), constant_values=-1)
    return queries, query_slots


def from_query_rows(out: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    """[R, K, N, hd] per-query-row outputs (`query_rows`) back to [R, T, H, hd]."""
    r, t, h, hd = shape
    kv_heads = out.shape[1]
    out = out[:, :, :t * (h // kv_heads)].reshape(r, kv_heads, t, h // kv_heads, hd)
    return out.transpose(0, 2, 1, 3, 4).reshape(r, t, h, hd)


def _kernel(q_ref, slot_ref, table_ref, k_ref, v_ref, o_ref, sum_ref, max_ref, *,
            page_size: int, block_pages: int):
    """One (row, kv head, query block, partition) program (module docstring).

    q_ref [B, hd] (scaled), slot_ref [B] (-1: padding), table_ref [per_split] the
    partition's pages; k_ref / v_ref [P, page, hd] one kv head's pool; outputs the
    partial softmax: o_ref [B, hd] float32, sum_ref and max_ref [B]."""
    from jax.experimental import pallas as pl

    per_split = table_ref.shape[0]
    block_keys = block_pages * page_size
    first_page = pl.program_id(3) * per_split
    q = q_ref[...]
    rows, hd = q.shape
    slots = slot_ref[...]
    # Pages this partition holds up to the block's last attended slot (-1: none).
    pages = jnp.minimum(per_split, jnp.max(slots) // page_size + 1 - first_page)
    trips = (jnp.maximum(pages, 0) + block_pages - 1) // block_pages
    precision = (jax.lax.Precision.HIGHEST if q.dtype == jnp.float32
                 else jax.lax.Precision.DEFAULT)
    offsets = jnp.arange(block_keys, dtype=jnp.int32)

    def body(i, carry):
        acc_max, acc_sum, acc_out = carry
        held = table_ref[pl.ds(i * block_pages, block_pages)]
        keys = k_ref[held].reshape(block_keys, hd)
        values = v_ref[held].reshape(block_keys, hd)
        scores = jax.lax.dot_general(q, keys.astype(q.dtype), (((1,), (1,)), ((), ())),
                                     precision=precision, preferred_element_type=jnp.float32)
        positions = (first_page + i * block_pages) * page_size + offsets
        visible = positions[None, :] <= slots[:, None]
        scores = jnp.where(visible, scores, MASKED)
        new = jnp.maximum(acc_max, jnp.max(scores, axis=1))
        keep = jnp.exp(acc_max - new)
        probs = jnp.where(visible, jnp.exp(scores - new[:, None]), 0.0)
        out = jnp.dot(probs.astype(q.dtype), values.astype(q.dtype), precision=precision,
                      preferred_element_type=jnp.float32)
        return new, acc_sum * keep + jnp.sum(probs, axis=1), acc_out * keep[:, None] + out

    init = (jnp.full((rows,), MASKED, jnp.float32), jnp.zeros((rows,), jnp.float32),
            jnp.zeros((rows, hd), jnp.float32))
    top, total, out = jax.lax.fori_loop(0, trips, body, init)
    o_ref[...] = out
    sum_ref[...] = total
    max_ref[...] = top


def paged_attention_pallas(q: jax.Array, k_pool: jax.Array, v_pool: jax.Array,
                           slots: jax.Array, tables: BlockTables, *,
                           max_query_block: int = MAX_QUERY_BLOCK,
                           interpret: bool | None = None) -> jax.Array:
    """Grouped-query causal attention of new queries over their rows' pages (module
    docstring).

    Args:
      q: [R, T, H, hd] queries of the new tokens.
      k_pool: [P, K, page, hd] keys of one layer (key_layout "page_hd"; the new tokens
        already written).
      v_pool: [P, K, page, hd] values.
      slots: [R, T] int32 position of each query in its row (-1: padding query).
      tables: [R, width] block tables and their split plan (`split_plan`).
      max_query_block: the most query rows a program takes (`query_block`).
      interpret: run the kernel in Pallas's interpreter (default: on CPU).

    Returns:
      [R, T, H, hd] in q's dtype (zeros for padding queries); softmax in float32.
    """
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import triton as plgpu

    chex.assert_rank([q, k_pool, v_pool, slots, tables.table], [4, 4, 4, 2, 2])
    chex.assert_equal_shape([k_pool, v_pool])
    r, t, h, hd = q.shape
    num_pages, kh, page_size, _ = v_pool.shape
    width, k_splits = tables.table.shape[1], tables.k_splits
    if width % (k_splits * tables.block_pages):
        raise ValueError(f"block tables {width} wide: not a multiple of k_splits "
                         f"({k_splits}) x block_pages ({tables.block_pages})")
    if interpret is None:
        interpret = jax.default_backend() == "cpu"
    block = query_block(t * (h // kh), max_query_block)
    queries, query_slots = query_rows(q, slots, kh, block)
    padded = query_slots.shape[1]
    per_split = width // k_splits
    table = tables.table.reshape(r, k_splits, per_split)
    pool_spec = pl.BlockSpec((num_pages, None, page_size, hd),
                             lambda i, k, b, s: (0, k, 0, 0))
    partial_shape = (k_splits, r, kh, padded)
    out, total, top = pl.pallas_call(
        functools.partial(_kernel, page_size=page_size, block_pages=tables.block_pages),
        grid=(r, kh, padded // block, k_splits),
        in_specs=[pl.BlockSpec((None, None, block, hd), lambda i, k, b, s: (i, k, b, 0)),
                  pl.BlockSpec((None, block), lambda i, k, b, s: (i, b)),
                  pl.BlockSpec((None, None, per_split), lambda i, k, b, s: (i, s, 0)),
                  pool_spec, pool_spec],
        out_specs=[pl.BlockSpec((None, None, None, block, hd),
                                lambda i, k, b, s: (s, i, k, b, 0)),
                   pl.BlockSpec((None, None, None, block), lambda i, k, b, s: (s, i, k, b)),
                   pl.BlockSpec((None, None, None, block), lambda i, k, b, s: (s, i, k, b))],
        out_shape=[jax.ShapeDtypeStruct(partial_shape + (hd,), jnp.float32),
                   jax.ShapeDtypeStruct(partial_shape, jnp.float32),
                   jax.ShapeDtypeStruct(partial_shape, jnp.float32)],
        interpret=interpret,
        compiler_params=plgpu.CompilerParams(num_warps=4 if block <= 16 else 8,
                                             num_stages=2),
        name="agentjax_paged_attention",
    )(queries, query_slots, table, k_pool, v_pool)
    # Partitions merged one by one, in order: element-wise, so no reduction whose order
    # could follow the batch shape. The empty partial scales by 0 and adds 0.
    merged = (top[0], total[0], out[0])
    for s in range(1, k_splits):
        merged = merge_partials(merged, (top[s], total[s], out[s]))
    _, row_sum, row_out = merged
    row_out = row_out / jnp.where(row_sum > 0, row_sum, 1.0)[..., None]
    return from_query_rows(row_out, q.shape).astype(q.dtype)
