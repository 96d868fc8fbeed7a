"""The TPU paged-attention kernel (Pallas's TPU interpreter on CPU, DMAs and semaphores
included) against a float64 reference and the pure-JAX paged attention
(`kernel_checks`), free of data races, and its lowering for TPU."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentjax.models.paged import write_pages
from agentjax.models.paged_pallas import BlockTables
from agentjax.models.paged_pallas_tpu import (check_page_size, paged_attention_tpu,
                                              tpu_block_pages, tpu_table_width)
from tests.models import kernel_checks
from tests.models.kernel_checks import PAGE, kernel_args
from tests.models.test_paged import make_scene, reference


@functools.partial(jax.jit, static_argnames=("max_query_block", "interpret"))
def _kernel(q, k_pool, v_pool, new_k, new_v, slots, write, tables, max_query_block=128,
            interpret=None):
    k_pool, v_pool = write_pages(k_pool, v_pool, new_k, new_v, write, "page_hd")
    return paged_attention_tpu(q, k_pool, v_pool, slots, tables,
                               max_query_block=max_query_block, interpret=interpret)


def _attend(block_pages, width, max_query_block=128, interpret=None):
    """kernel_checks' attend(scene) at compute blocks of `block_pages` pages."""
    def attend(scene):
        tables = BlockTables(table=kernel_checks.scene_table(scene, width),
                             block_pages=block_pages, kernel="pallas_tpu")
        return _kernel(*kernel_args(scene), tables, max_query_block=max_query_block,
                       interpret=interpret)

    return attend


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


# Each block size once, both query-block sizes among them (the interpreter takes a
# minute a case): the default block at the default query block, the small blocks at 16.
@pytest.mark.parametrize("block_pages,width,max_query_block",
                         [(*BLOCKS[0], 128), (*BLOCKS[1], 16), (*BLOCKS[2], 128)])
def test_prefill_and_decode_match_the_float64_reference(block_pages, width,
                                                        max_query_block):
    kernel_checks.check_float64(_attend(block_pages, width, max_query_block))


def test_matches_the_pure_jax_paged_attention():
    kernel_checks.check_pure_jax(_attend(2, 4))


@pytest.mark.parametrize("new", [[1, 1, 1], [6, 9, 3]])  # decode; prefill chunks
def test_a_row_is_bitwise_independent_of_the_other_rows(new):
    kernel_checks.check_row_independence(_attend(2, 4, max_query_block=16), new)


def test_bad_shapes_are_refused():
    scene = make_scene(3, [4], [1], "page_hd", page_size=PAGE)
    with pytest.raises(ValueError, match="not a multiple of block_pages"):
        _kernel(*kernel_args(scene), BlockTables(table=jnp.zeros((1, 6), jnp.int32), block_pages=4))
    for bad in (8, 24, 100):
        with pytest.raises(ValueError, match="multiple of 16"):
            check_page_size(bad)
    check_page_size(48)


@pytest.mark.parametrize("shape", kernel_checks.LOWERING_SHAPES)
def test_the_kernel_lowers_for_tpu(shape):
    """No TPU needed: Pallas's Mosaic lowering of the kernel (what a TPU compiles), so a
    primitive Mosaic cannot take fails here, not on the first TPU host."""
    page, max_len = shape[5], shape[6]

    def attend(q, k_pool, v_pool, slots, table):
        tables = BlockTables(table, block_pages=tpu_block_pages(page), kernel="pallas_tpu")
        return paged_attention_tpu(q, k_pool, v_pool, slots, tables, interpret=False)

    text = kernel_checks.lowered(attend, shape, tpu_table_width(-(-max_len // page), page),
                                 "tpu")
    assert text.count("tpu_custom_call") == 1


def test_the_double_buffered_dmas_do_not_race():
    """The next compute block's pages are copied while this one is scored: the
    interpreter's happens-before race detector, with each DMA run when it starts, finds
    no read of a buffer a copy is still writing."""
    from jax._src.pallas.mosaic.interpret import interpret_pallas_call
    from jax.experimental.pallas import tpu as pltpu

    scene = make_scene(4, [40, 3], [1, 30], "page_hd", page_size=PAGE)
    params = pltpu.InterpretParams(detect_races=True, dma_execution_mode="eager")
    out = np.asarray(_attend(1, 4, interpret=params)(scene))   # 2-3 blocks a row
    assert interpret_pallas_call.races is not None
    assert not interpret_pallas_call.races.races_found
    expected = reference(scene["q"], scene["keys"], scene["values"], [40, 3],
                         scene["slots"])
    np.testing.assert_allclose(out, expected, rtol=2e-5, atol=2e-6)


def test_a_pool_sharded_over_kv_heads_runs_each_devices_heads(eight_devices):
    tables = BlockTables(table=jnp.zeros((2, 4), jnp.int32), block_pages=2, kernel="pallas_tpu")
    kernel_checks.check_over_kv_heads(paged_attention_tpu, tables, eight_devices)
