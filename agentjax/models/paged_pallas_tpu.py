"""Paged attention on TPU: a Pallas (Mosaic) kernel that copies each row's pages from
the pool in HBM into VMEM by DMA, a block of one row's queries per program.

    tables = BlockTables(table=..., block_pages=tpu_block_pages(page_size))  # [R, width]
    out = paged_attention_tpu(q, k_pool, v_pool, slots, tables)

The anchor is tpu-inference's ragged paged attention (RPA v3, also sglang-jax's): pages
stay where they are in HBM, the kernel gathers the ones a row attends with DMAs, double-
buffered so the next compute block's pages arrive while this one is scored. It is
written afresh, smaller: one program takes one row, one kv head and one block of that
row's query rows (its new tokens times the query heads sharing the kv head, token-
major, as in the GPU kernel of `paged_pallas.py`) and walks the row's pages in compute
blocks of `block_pages` pages, in table order, up to the last slot any query of its
block attends, with an online softmax (Flash-Attention). No split-KV: a TPU core runs
the grid as a loop, so partitions would add partials without adding parallelism (the
two cores of a megacore chip split the parallel grid axes).

Batch invariance (the engine's deterministic mode): a query row's bits depend only on
its own row. A program reads only its row; every block shape is static (the query block
from the call's chunk width and head counts, which deterministic mode fixes per
sequence; the compute block from the page size); a compute block past a query's own slot
is fully masked for it (max unchanged, probabilities exactly 0).

The Pallas TPU interpreter runs the kernel on CPU (the tests check it against
`paged.paged_attention` and a float64 reference, bitwise row independence included),
and the tests lower it for TPU on CPU, which runs Mosaic's verifier-level checks. It
needs keys laid out as the values are (`key_layout="page_hd"`).
"""
from __future__ import annotations

import functools

import chex
import jax
import jax.numpy as jnp

from agentjax.config.choices import KERNEL_PAGE_SIZES
from agentjax.models.attention import MASKED
from agentjax.models.paged_pallas import BlockTables, from_query_rows, query_block, query_rows

# Keys a compute block scores at once: a [query block x 256] float32 score tile, two
# 128-lane MXU passes. Fewer keys would leave the loop's per-block cost (a DMA wait and
# start) larger than its matmuls.
BLOCK_KEYS = 256
# Query rows of a program: at most 128 (a [128 x 256] float32 score tile, 128 KiB of
# VMEM); at least 16 (`query_block`), the sublanes of a bfloat16 tile.
MAX_QUERY_BLOCK = 128


def tpu_block_pages(page_size: int) -> int:
    """Pages of a compute block: BLOCK_KEYS keys, one page when pages are bigger."""
    check_page_size(page_size)
    return max(1, BLOCK_KEYS // page_size)


def tpu_table_width(pages_per_row: int, page_size: int) -> int:
    """Block-table width for rows of at most `pages_per_row` pages: whole compute
    blocks."""
    block = tpu_block_pages(page_size)
    return -(-pages_per_row // block) * block


def check_page_size(page_size: int) -> None:
    """Refuses a page size the kernel cannot take (`config.choices.KERNEL_PAGE_SIZES`)."""
    needs, takes = KERNEL_PAGE_SIZES["pallas_tpu"]
    if not takes(page_size):
        raise ValueError(f"the Pallas TPU attention needs a page_size that is {needs}, "
                         f"got {page_size}")


def _kernel(table_ref, last_ref, q_ref, slot_ref, k_hbm, v_hbm, o_ref, k_buf, v_buf,
            sems, *, page_size: int, block_pages: int, width: int, blocks: int):
    """One (row, kv head, query block) program (module docstring).

    table_ref [R * width] (SMEM) the rows' pages; last_ref [R * blocks] (SMEM) the last
    slot a query block attends (-1: none); q_ref [B, hd] (scaled); slot_ref [B, 1]
    (-1: padding); k_hbm / v_hbm [P, K, page, hd] the pool, in HBM; o_ref [B, hd];
    k_buf / v_buf [2, block keys, hd] VMEM; sems [2, 2, block_pages] DMA semaphores."""
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    row, head, block = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    block_keys = block_pages * page_size
    last = last_ref[row * blocks + block]
    # Truncating division (jnp's floor division lowers through sign(), which needs to
    # know the TPU generation): last + block_keys >= 0.
    trips = jax.lax.div(last + block_keys, block_keys)    # 0 when no query attends

    def copies(i, buffer):
        """The DMAs of compute block i into buffer 0 or 1."""
        for j in range(block_pages):
            page = table_ref[row * width + i * block_pages + j]
            into = pl.ds(j * page_size, page_size)
            yield pltpu.make_async_copy(k_hbm.at[page, head], k_buf.at[buffer, into],
                                        sems.at[0, buffer, j])
            yield pltpu.make_async_copy(v_hbm.at[page, head], v_buf.at[buffer, into],
                                        sems.at[1, buffer, j])

    @pl.when(trips > 0)
    def _():
        for copy in copies(0, 0):
            copy.start()

    q = q_ref[...]
    slots = slot_ref[...]                                         # [B, 1]
    rows, hd = q.shape
    precision = (jax.lax.Precision.HIGHEST if q.dtype == jnp.float32
                 else jax.lax.Precision.DEFAULT)

    def body(i, carry):
        acc_max, acc_sum, acc_out = carry
        buffer = jax.lax.rem(i, 2)
        for copy in copies(i, buffer):
            copy.wait()

        @pl.when(i + 1 < trips)
        def _():
            for copy in copies(i + 1, 1 - buffer):
                copy.start()

        keys, values = k_buf[buffer], v_buf[buffer]
        scores = jax.lax.dot_general(q, keys.astype(q.dtype), (((1,), (1,)), ((), ())),
                                     precision=precision, preferred_element_type=jnp.float32)
        positions = i * block_keys + jax.lax.broadcasted_iota(jnp.int32, (1, block_keys), 1)
        visible = positions <= slots
        scores = jnp.where(visible, scores, MASKED)
        new = jnp.maximum(acc_max, jnp.max(scores, axis=1, keepdims=True))
        keep = jnp.exp(acc_max - new)
        probs = jnp.where(visible, jnp.exp(scores - new), 0.0)
        out = jax.lax.dot_general(probs.astype(q.dtype), values.astype(q.dtype),
                                  (((1,), (0,)), ((), ())), precision=precision,
                                  preferred_element_type=jnp.float32)
        return (new, acc_sum * keep + jnp.sum(probs, axis=1, keepdims=True),
                acc_out * keep + out)

    init = (jnp.full((rows, 1), MASKED, jnp.float32), jnp.zeros((rows, 1), jnp.float32),
            jnp.zeros((rows, hd), jnp.float32))
    _, total, out = jax.lax.fori_loop(0, trips, body, init)
    o_ref[...] = (out / jnp.where(total > 0, total, 1.0)).astype(o_ref.dtype)


def paged_attention_tpu(q: jax.Array, k_pool: jax.Array, v_pool: jax.Array,
                        slots: jax.Array, tables: BlockTables, *,
                        max_query_block: int = MAX_QUERY_BLOCK,
                        interpret=None) -> jax.Array:
    """Grouped-query causal attention of new queries over their rows' pages (module
    docstring), with the arguments and result of `paged_pallas.paged_attention_pallas`
    but these:

      tables: [R, width] block tables, width a multiple of tables.block_pages
        (`tpu_table_width`, `tpu_block_pages`); one partition (k_splits is ignored).
      interpret: run the kernel in Pallas's TPU interpreter (default: off TPU); a
        `pltpu.InterpretParams` sets how (the tests detect races with one).
    """
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    chex.assert_rank([q, k_pool, v_pool, slots, tables.table], [4, 4, 4, 2, 2])
    chex.assert_equal_shape([k_pool, v_pool])
    r, t, h, hd = q.shape
    _, kh, page_size, _ = v_pool.shape
    check_page_size(page_size)
    width, block_pages = tables.table.shape[1], tables.block_pages
    if width % block_pages:
        raise ValueError(f"block tables {width} wide: not a multiple of block_pages "
                         f"({block_pages})")
    if interpret is None:
        interpret = jax.default_backend() != "tpu"
    block = query_block(t * (h // kh), max_query_block)
    queries, query_slots = query_rows(q, slots, kh, block)
    padded = query_slots.shape[1]
    blocks = padded // block
    last = query_slots.reshape(r, blocks, block).max(axis=2)
    kernel = functools.partial(_kernel, page_size=page_size, block_pages=block_pages,
                               width=width, blocks=blocks)
    block_keys = block_pages * page_size
    out = pl.pallas_call(
        kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=2,
            grid=(r, kh, blocks),
            in_specs=[pl.BlockSpec((None, None, block, hd), lambda i, k, b, *_: (i, k, b, 0)),
                      pl.BlockSpec((None, block, 1), lambda i, k, b, *_: (i, b, 0)),
                      pl.BlockSpec(memory_space=pl.ANY),
                      pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=pl.BlockSpec((None, None, block, hd), lambda i, k, b, *_: (i, k, b, 0)),
            scratch_shapes=[pltpu.VMEM((2, block_keys, hd), k_pool.dtype),
                            pltpu.VMEM((2, block_keys, hd), v_pool.dtype),
                            pltpu.SemaphoreType.DMA((2, 2, block_pages))]),
        out_shape=jax.ShapeDtypeStruct((r, kh, padded, hd), q.dtype),
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "parallel")),
        interpret=(pltpu.InterpretParams() if interpret is True else interpret),
        name="agentjax_paged_attention_tpu",
    )(tables.table.reshape(-1).astype(jnp.int32), last.reshape(-1).astype(jnp.int32),
      queries, query_slots[..., None].astype(jnp.int32), k_pool, v_pool)
    return from_query_rows(out, q.shape)
