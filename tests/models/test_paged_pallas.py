"""The GPU paged-attention kernel (Pallas interpret mode on CPU) against a float64
reference and the pure-JAX paged attention (`kernel_checks`), and its Triton lowering."""
import functools

import jax
import jax.numpy as jnp
import pytest

from agentjax.models.paged import write_pages
from agentjax.models.paged_pallas import (MAX_SPLITS, BlockTables, check_page_size,
                                          missing_backend, paged_attention_pallas,
                                          query_block, split_plan)
from tests.models import kernel_checks
from tests.models.kernel_checks import PAGE, kernel_args
from tests.models.test_paged import make_scene

pytestmark = pytest.mark.skipif(missing_backend() is not None,
                                reason=f"the kernel cannot run: {missing_backend()}")


@functools.partial(jax.jit, static_argnames="max_query_block")
def _kernel(q, k_pool, v_pool, new_k, new_v, slots, write, tables, max_query_block=64):
    k_pool, v_pool = write_pages(k_pool, v_pool, new_k, new_v, write, "page_hd")
    return paged_attention_pallas(q, k_pool, v_pool, slots, tables,
                                  max_query_block=max_query_block)


def _attend(plan, max_query_block=64):
    """kernel_checks' attend(scene) at a split plan (k_splits, block_pages, width)."""
    k_splits, block_pages, width = plan

    def attend(scene):
        tables = BlockTables(table=kernel_checks.scene_table(scene, width), k_splits=k_splits,
                             block_pages=block_pages)
        return _kernel(*kernel_args(scene), tables, max_query_block=max_query_block)

    return attend


def test_split_plan_by_hand():
    # (k_splits, pages per compute block, width): blocks of 128 keys, partitions of at
    # least 512 keys, at most 16 of them, every count a power of two.
    assert split_plan(32, 64) == (4, 2, 32)       # the device bench: 2k tokens of 64
    assert split_plan(1, 64) == (1, 2, 2)         # one page still fills a block
    assert split_plan(512, 64) == (16, 2, 512)    # 32k tokens: 16 partitions of 2k
    assert split_plan(16, 16) == (1, 8, 16)       # 256 tokens: one partition
    assert split_plan(100, 16) == (4, 8, 128)     # 4 partitions of 32 pages
    assert split_plan(5, 256) == (4, 1, 8)        # pages bigger than a block
    power_of_two = lambda n: n & (n - 1) == 0
    for page in (16, 64, 256):
        for pages in range(1, 1100):
            k_splits, block, width = split_plan(pages, page)
            assert pages <= width < 2 * max(pages, block)
            assert all(map(power_of_two, (k_splits, block, width)))
            assert block * page >= 128 and 1 <= k_splits <= MAX_SPLITS
            assert width % (k_splits * block) == 0
            assert k_splits == 1 or width // k_splits * page >= 512


def test_query_block_by_hand():
    # A decode step's heads (one token) fill one block of 16; prefill blocks grow to 64.
    assert [query_block(n) for n in (1, 7, 16, 17, 40, 64, 65, 2048)] == [
        16, 16, 16, 32, 64, 64, 64, 64]
    assert query_block(2048, most=16) == 16


# Split plans at 16-slot pages: one partition of one page a block; 2 of 2-page blocks;
# 4 of one page (pages past a row's end: masked table padding).
PLANS = [(1, 1, 4), (2, 2, 8), (4, 1, 16)]


@pytest.mark.parametrize("plan", PLANS)
@pytest.mark.parametrize("max_query_block", [16, 64])
def test_prefill_and_decode_match_the_float64_reference(plan, max_query_block):
    kernel_checks.check_float64(_attend(plan, max_query_block))


def test_matches_the_pure_jax_paged_attention():
    kernel_checks.check_pure_jax(_attend((2, 1, 4)))


@pytest.mark.parametrize("new", [[1, 1, 1], [6, 9, 3]])  # decode; prefill chunks
def test_a_row_is_bitwise_independent_of_the_other_rows(new):
    kernel_checks.check_row_independence(_attend((2, 2, 8)), new)


def test_bad_shapes_are_refused():
    scene = make_scene(3, [4], [1], "page_hd", page_size=PAGE)
    with pytest.raises(ValueError, match="not a multiple of k_splits"):
        _kernel(*kernel_args(scene), BlockTables(table=jnp.zeros((1, 6), jnp.int32), k_splits=4))
    for bad in (8, 48):
        with pytest.raises(ValueError, match="power of two >= 16"):
            check_page_size(bad)
    check_page_size(64)
    with pytest.raises(ValueError, match=">= 1"):
        split_plan(0, 64)
    with pytest.raises(ValueError, match="power of two >= 16"):
        split_plan(4, 8)


@pytest.mark.parametrize("shape", kernel_checks.LOWERING_SHAPES)
def test_the_kernel_lowers_to_triton_for_cuda(shape):
    """No GPU needed: the Triton lowering of the kernel (what a GPU compiles), so a
    primitive or block shape Triton cannot take fails here, not on the first lent GPU."""
    from jax.experimental.pallas import triton  # noqa: F401  (registers the lowering)

    page, max_len = shape[5], shape[6]
    k_splits, block, width = split_plan(-(-max_len // page), page)

    def attend(q, k_pool, v_pool, slots, table):
        return paged_attention_pallas(q, k_pool, v_pool, slots,
                                      BlockTables(table, k_splits, block), interpret=False)

    text = kernel_checks.lowered(attend, shape, width, "cuda")
    assert text.count("xla.gpu.triton") == 1 and "agentjax_paged_attention" in text


def test_a_pool_sharded_over_kv_heads_runs_each_devices_heads(eight_devices):
    tables = BlockTables(table=jnp.zeros((2, 8), jnp.int32), k_splits=2, block_pages=2)
    kernel_checks.check_over_kv_heads(paged_attention_pallas, tables, eight_devices)
