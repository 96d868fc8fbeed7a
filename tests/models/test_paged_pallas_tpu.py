"""The TPU paged-attention kernel (Pallas's TPU interpreter on CPU, DMAs and semaphores
included) against a float64 reference and the pure-JAX paged attention, and its
lowering for TPU."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentjax.models.paged import AttentionItems, build_items, paged_attention, write_pages
from agentjax.models.paged_pallas import BlockTables
from agentjax.models.paged_pallas_tpu import (check_page_size, paged_attention_tpu,
                                              tpu_block_pages, tpu_table_width)
from tests.models.test_paged import make_scene, reference
from tests.models.test_paged_pallas import _args

PAGE = 16


def _tables(scene, block_pages, width):
    table = np.zeros((len(scene["held"]), width), np.int32)
    for row, held in enumerate(scene["held"]):
        table[row, :len(held)] = held
    return BlockTables(table=jnp.asarray(table), block_pages=block_pages, kernel="tpu")


@functools.partial(jax.jit, static_argnames="max_query_block")
def _kernel(q, k_pool, v_pool, new_k, new_v, slots, write, tables, max_query_block=128):
    k_pool, v_pool = write_pages(k_pool, v_pool, new_k, new_v, write, "page_hd")
    return paged_attention_tpu(q, k_pool, v_pool, slots, tables,
                               max_query_block=max_query_block)


def test_block_pages_and_table_width_by_hand():
    # Compute blocks of 256 keys (one page when pages are bigger); tables in whole blocks.
    assert [tpu_block_pages(p) for p in (16, 64, 128, 256, 512, 48)] == [16, 4, 2, 1, 1, 5]
    assert tpu_table_width(32, 64) == 32       # the device bench: 2k tokens of 64
    assert tpu_table_width(1, 64) == 4         # one page still fills a block
    assert tpu_table_width(17, 16) == 32
    assert tpu_table_width(5, 256) == 5


# (pages per compute block, table width) at 16-slot pages: one page a block; 2-page
# blocks; the default 16-page (256-key) block.
BLOCKS = [(1, 4), (2, 8), (16, 16)]


@pytest.mark.parametrize("block_pages,width", BLOCKS)
@pytest.mark.parametrize("max_query_block", [16, 128])
def test_prefill_and_decode_match_the_float64_reference(block_pages, width,
                                                        max_query_block):
    for lengths, new in [([0, 21, 40], [9, 5, 1]),        # prefill from empty and append
                         ([0, 3], [40, 20]),              # prefill over several pages
                         ([3, 47, 0, 16], [1, 1, 1, 1])]:  # decode, one row at a page edge
        scene = make_scene(0, lengths, new, "page_hd", page_size=PAGE)
        out = np.asarray(_kernel(*_args(scene), _tables(scene, block_pages, width),
                                 max_query_block=max_query_block))
        expected = reference(scene["q"], scene["keys"], scene["values"], lengths,
                             scene["slots"])
        np.testing.assert_allclose(out, expected, rtol=2e-5, atol=2e-6)
        assert not out[scene["slots"] < 0].any()  # padding queries read zeros


def test_matches_the_pure_jax_paged_attention():
    scene = make_scene(1, [5, 30, 12], [4, 1, 7], "page_hd", page_size=PAGE)
    items = build_items(scene["held"], scene["total"], 3, PAGE, 16)
    items = AttentionItems(*(jnp.asarray(x) for x in (items.row, items.page, items.first_slot)))

    @jax.jit
    def pure(q, k_pool, v_pool, new_k, new_v, slots, write):
        k_pool, v_pool = write_pages(k_pool, v_pool, new_k, new_v, write, "page_hd")
        return paged_attention(q, k_pool, v_pool, slots, items, "page_hd")

    out = _kernel(*_args(scene), _tables(scene, 2, 4))
    np.testing.assert_allclose(np.asarray(out), np.asarray(pure(*_args(scene))),
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("new", [[1, 1, 1], [6, 9, 3]])  # decode; prefill chunks
def test_a_row_is_bitwise_independent_of_the_other_rows(new):
    """Deterministic mode's property: row 1 alone (the others padding), among other rows,
    and in a bigger batch at another position give the same bits."""
    scene = make_scene(2, [5, 37, 2], new, "page_hd", page_size=PAGE)
    crowd = np.asarray(_kernel(*_args(scene), _tables(scene, 2, 4), max_query_block=16))
    alone = dict(scene)
    for name in ("slots", "write"):
        alone[name] = np.where(np.arange(3)[:, None] == 1, scene[name], -1)
    alone_out = np.asarray(_kernel(*_args(alone), _tables(
        dict(scene, held=[[], scene["held"][1], []]), 2, 4), max_query_block=16))
    assert np.array_equal(crowd[1], alone_out[1])
    bigger = {name: np.concatenate([scene[name][1:], scene[name]]) for name in
              ("q", "new_k", "new_v", "slots", "write")}
    bigger = dict(scene, **bigger, held=scene["held"][1:] + scene["held"])
    out = np.asarray(_kernel(*_args(bigger), _tables(bigger, 2, 4), max_query_block=16))
    assert np.array_equal(out[0], crowd[1]) and np.array_equal(out[3], crowd[1])


def test_bad_shapes_are_refused():
    scene = make_scene(3, [4], [1], "page_hd", page_size=PAGE)
    with pytest.raises(ValueError, match="not a multiple of block_pages"):
        _kernel(*_args(scene), BlockTables(table=jnp.zeros((1, 6), jnp.int32), block_pages=4))
    for bad in (8, 24, 100):
        with pytest.raises(ValueError, match="multiple of 16"):
            check_page_size(bad)
    check_page_size(48)


@pytest.mark.parametrize("shape", [
    # rows, tokens, heads, kv heads, head_dim, page, max_len, dtype
    (64, 1, 16, 2, 128, 64, 2048, jnp.bfloat16),     # Qwen2.5-3B decode (device bench)
    (8, 256, 16, 2, 128, 64, 2048, jnp.bfloat16),    # its prefill chunk
    (64, 1, 14, 2, 64, 64, 2048, jnp.bfloat16),      # Qwen2.5-0.5B decode
    (4, 256, 28, 4, 128, 64, 32768, jnp.bfloat16),   # Qwen2.5-7B, a 32k row
    (2, 1, 16, 2, 128, 512, 1000, jnp.float32),      # pages bigger than a compute block
])
def test_the_kernel_lowers_for_tpu(shape):
    """No TPU needed: Pallas's Mosaic lowering of the kernel (what a TPU compiles), so a
    primitive Mosaic cannot take fails here, not on the first TPU host."""
    rows, tokens, heads, kv_heads, hd, page, max_len, dtype = shape
    pages_per_row = -(-max_len // page)
    width = tpu_table_width(pages_per_row, page)
    pool = jax.ShapeDtypeStruct((rows * pages_per_row, kv_heads, page, hd), dtype)
    args = (jax.ShapeDtypeStruct((rows, tokens, heads, hd), dtype), pool, pool,
            jax.ShapeDtypeStruct((rows, tokens), jnp.int32),
            jax.ShapeDtypeStruct((rows, width), jnp.int32))

    def attend(q, k_pool, v_pool, slots, table):
        tables = BlockTables(table, block_pages=tpu_block_pages(page), kernel="tpu")
        return paged_attention_tpu(q, k_pool, v_pool, slots, tables, interpret=False)

    text = jax.jit(attend).trace(*args).lower(lowering_platforms=("tpu",)).as_text()
    assert text.count("tpu_custom_call") == 1


def test_the_double_buffered_dmas_do_not_race():
    """The next compute block's pages are copied while this one is scored: the
    interpreter's happens-before race detector, with each DMA run when it starts, finds
    no read of a buffer a copy is still writing."""
    from jax._src.pallas.mosaic.interpret import interpret_pallas_call
    from jax.experimental.pallas import tpu as pltpu

    scene = make_scene(4, [40, 3], [1, 30], "page_hd", page_size=PAGE)
    params = pltpu.InterpretParams(detect_races=True, dma_execution_mode="eager")

    @jax.jit
    def attend(q, k_pool, v_pool, new_k, new_v, slots, write, tables):
        k_pool, v_pool = write_pages(k_pool, v_pool, new_k, new_v, write, "page_hd")
        return paged_attention_tpu(q, k_pool, v_pool, slots, tables, interpret=params)

    out = np.asarray(attend(*_args(scene), _tables(scene, 1, 4)))   # 2-3 blocks a row
    assert interpret_pallas_call.races is not None
    assert not interpret_pallas_call.races.races_found
    expected = reference(scene["q"], scene["keys"], scene["values"], [40, 3],
                         scene["slots"])
    np.testing.assert_allclose(out, expected, rtol=2e-5, atol=2e-6)
