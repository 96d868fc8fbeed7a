"""The GPU paged-attention kernel (Pallas interpret mode on CPU) against a float64
reference and the pure-JAX paged attention."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentjax.models.paged import AttentionItems, build_items, paged_attention, write_pages
from agentjax.models.paged_pallas import (MAX_SPLITS, BlockTables, check_page_size,
                                          missing_backend, paged_attention_pallas,
                                          query_block, split_plan)
from tests.models.test_paged import make_scene, reference

PAGE = 16
pytestmark = pytest.mark.skipif(missing_backend() is not None,
                                reason=f"the kernel cannot run: {missing_backend()}")


def _tables(scene, plan):
    """Block tables of the scene's rows for a split plan (k_splits, block_pages, width)."""
    k_splits, block_pages, width = plan
    table = np.zeros((len(scene["held"]), width), np.int32)
    for row, held in enumerate(scene["held"]):
        table[row, :len(held)] = held
    return BlockTables(table=jnp.asarray(table), k_splits=k_splits, block_pages=block_pages)


@functools.partial(jax.jit, static_argnames="max_query_block")
def _kernel(q, k_pool, v_pool, new_k, new_v, slots, write, tables, max_query_block=64):
    k_pool, v_pool = write_pages(k_pool, v_pool, new_k, new_v, write, "page_hd")
    return paged_attention_pallas(q, k_pool, v_pool, slots, tables,
                                  max_query_block=max_query_block)


def _args(scene):
    return ([jnp.asarray(scene[n], jnp.float32)
             for n in ("q", "k_pool", "v_pool", "new_k", "new_v")]
            + [jnp.asarray(scene["slots"]), jnp.asarray(scene["write"])])


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
    for lengths, new in [([0, 21, 40], [9, 5, 1]),        # prefill from empty and append
                         ([0, 3], [40, 20]),              # prefill over several pages
                         ([3, 47, 0, 16], [1, 1, 1, 1])]:  # decode, one row at a page edge
        scene = make_scene(0, lengths, new, "page_hd", page_size=PAGE)
        out = np.asarray(_kernel(*_args(scene), _tables(scene, plan),
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

    out = _kernel(*_args(scene), _tables(scene, (2, 1, 4)))
    np.testing.assert_allclose(np.asarray(out), np.asarray(pure(*_args(scene))),
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("new", [[1, 1, 1], [6, 9, 3]])  # decode; prefill chunks
def test_a_row_is_bitwise_independent_of_the_other_rows(new):
    """Deterministic mode's property: row 1 alone (the others padding), among other rows,
    and in a bigger batch at another position give the same bits."""
    scene = make_scene(2, [5, 37, 2], new, "page_hd", page_size=PAGE)
    plan = (2, 2, 8)
    crowd = np.asarray(_kernel(*_args(scene), _tables(scene, plan)))
    alone = dict(scene)
    for name in ("slots", "write"):
        alone[name] = np.where(np.arange(3)[:, None] == 1, scene[name], -1)
    alone_out = np.asarray(_kernel(*_args(alone), _tables(
        dict(scene, held=[[], scene["held"][1], []]), plan)))
    assert np.array_equal(crowd[1], alone_out[1])
    bigger = {name: np.concatenate([scene[name][1:], scene[name]]) for name in
              ("q", "new_k", "new_v", "slots", "write")}
    bigger = dict(scene, **bigger, held=scene["held"][1:] + scene["held"])
    out = np.asarray(_kernel(*_args(bigger), _tables(bigger, plan)))
    assert np.array_equal(out[0], crowd[1]) and np.array_equal(out[3], crowd[1])


def test_bad_shapes_are_refused():
    scene = make_scene(3, [4], [1], "page_hd", page_size=PAGE)
    with pytest.raises(ValueError, match="not a multiple of k_splits"):
        _kernel(*_args(scene), BlockTables(table=jnp.zeros((1, 6), jnp.int32), k_splits=4))
    for bad in (8, 48):
        with pytest.raises(ValueError, match="power of two >= 16"):
            check_page_size(bad)
    check_page_size(64)
    with pytest.raises(ValueError, match=">= 1"):
        split_plan(0, 64)
    with pytest.raises(ValueError, match="power of two >= 16"):
        split_plan(4, 8)


@pytest.mark.parametrize("shape", [
    # rows, tokens, heads, kv heads, head_dim, page, max_len, dtype
    (64, 1, 16, 2, 128, 64, 2048, jnp.bfloat16),     # Qwen2.5-3B decode (device bench)
    (8, 256, 16, 2, 128, 64, 2048, jnp.bfloat16),    # its prefill chunk
    (64, 1, 14, 2, 64, 64, 2048, jnp.bfloat16),      # Qwen2.5-0.5B decode
    (4, 256, 28, 4, 128, 64, 32768, jnp.bfloat16),   # Qwen2.5-7B, a 32k row
    (2, 1, 16, 2, 128, 256, 1000, jnp.float32),      # pages bigger than a compute block
])
def test_the_kernel_lowers_to_triton_for_cuda(shape):
    """No GPU needed: the Triton lowering of the kernel (what a GPU compiles), so a
    primitive or block shape Triton cannot take fails here, not on the first lent GPU."""
    from jax.experimental.pallas import triton  # noqa: F401  (registers the lowering)

    rows, tokens, heads, kv_heads, hd, page, max_len, dtype = shape
    pages_per_row = -(-max_len // page)
    k_splits, block, width = split_plan(pages_per_row, page)
    pool = jax.ShapeDtypeStruct((rows * pages_per_row, kv_heads, page, hd), dtype)
    args = (jax.ShapeDtypeStruct((rows, tokens, heads, hd), dtype), pool, pool,
            jax.ShapeDtypeStruct((rows, tokens), jnp.int32),
            jax.ShapeDtypeStruct((rows, width), jnp.int32))

    def attend(q, k_pool, v_pool, slots, table):
        return paged_attention_pallas(q, k_pool, v_pool, slots,
                                      BlockTables(table, k_splits, block), interpret=False)

    text = jax.jit(attend).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    assert text.count("xla.gpu.triton") == 1 and "agentjax_paged_attention" in text
