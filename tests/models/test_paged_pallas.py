"""The GPU paged-attention kernel (Pallas interpret mode on CPU) against a float64
reference and the pure-JAX paged attention."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentjax.models.paged import AttentionItems, build_items, paged_attention, write_pages
from agentjax.models.paged_pallas import (BlockTables, check_page_size,
                                          paged_attention_pallas, split_plan, table_width)
from tests.models.test_paged import make_scene, reference

PAGE = 16


def _tables(scene, pages_per_row):
    width = table_width(pages_per_row)
    table = np.zeros((len(scene["held"]), width), np.int32)
    for row, held in enumerate(scene["held"]):
        table[row, :len(held)] = held
    return BlockTables(table=jnp.asarray(table))


@jax.jit
def _kernel(q, k_pool, v_pool, new_k, new_v, slots, write, tables):
    k_pool, v_pool = write_pages(k_pool, v_pool, new_k, new_v, write, "page_hd")
    return paged_attention_pallas(q, k_pool, v_pool, slots, tables)


def _args(scene):
    return ([jnp.asarray(scene[n], jnp.float32)
             for n in ("q", "k_pool", "v_pool", "new_k", "new_v")]
            + [jnp.asarray(scene["slots"]), jnp.asarray(scene["write"])])


def test_split_plan_by_hand():
    # (k_splits, pages per compute block, width): up to 16 splits of power-of-two blocks.
    assert split_plan(1) == (1, 1, 1)
    assert split_plan(9) == (9, 1, 9)
    assert split_plan(16) == (16, 1, 16)
    assert split_plan(33) == (16, 2, 64)      # 3 pages a split -> blocks of 2 -> 4
    assert split_plan(100) == (16, 4, 128)    # 7 -> blocks of 4 -> 8
    assert split_plan(512) == (16, 8, 512)    # 32k tokens of 64-slot pages
    for pages in range(1, 300):
        k_splits, block, width = split_plan(pages)
        assert width >= pages and width % (k_splits * block) == 0
        assert block & (block - 1) == 0 and block <= 8


@pytest.mark.parametrize("pages_per_row", [4, 40])  # one page a split; blocks of 2 pages
def test_prefill_and_decode_match_the_float64_reference(pages_per_row):
    for lengths, new in [([0, 21, 40], [9, 5, 1]),        # prefill from empty and append
                         ([3, 47, 0, 16], [1, 1, 1, 1])]:  # decode, one row at a page edge
        scene = make_scene(0, lengths, new, "page_hd", page_size=PAGE)
        out = np.asarray(_kernel(*_args(scene), _tables(scene, pages_per_row)))
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

    out = _kernel(*_args(scene), _tables(scene, 4))
    np.testing.assert_allclose(np.asarray(out), np.asarray(pure(*_args(scene))),
                               rtol=1e-5, atol=1e-6)


def test_a_row_is_bitwise_independent_of_the_other_rows():
    """Deterministic mode's property: row 1 alone (the others padding), among other rows,
    and in a bigger batch at another position give the same bits."""
    scene = make_scene(2, [5, 37, 2], [1, 1, 1], "page_hd", page_size=PAGE)
    crowd = np.asarray(_kernel(*_args(scene), _tables(scene, 40)))
    alone = dict(scene)
    for name in ("slots", "write"):
        alone[name] = np.where(np.arange(3)[:, None] == 1, scene[name], -1)
    alone_out = np.asarray(_kernel(*_args(alone), _tables(
        dict(scene, held=[[], scene["held"][1], []]), 40)))
    assert np.array_equal(crowd[1], alone_out[1])
    bigger = {name: np.concatenate([scene[name][1:], scene[name]]) for name in
              ("q", "new_k", "new_v", "slots", "write")}
    bigger = dict(scene, **bigger, held=scene["held"][1:] + scene["held"])
    out = np.asarray(_kernel(*_args(bigger), _tables(bigger, 40)))
    assert np.array_equal(out[0], crowd[1]) and np.array_equal(out[3], crowd[1])


def test_bad_shapes_are_refused():
    scene = make_scene(3, [4], [1], "page_hd", page_size=PAGE)
    with pytest.raises(ValueError, match="not a table_width"):
        _kernel(*_args(scene), BlockTables(table=jnp.zeros((1, 17), jnp.int32)))
    for bad in (8, 48):
        with pytest.raises(ValueError, match="power of two >= 16"):
            check_page_size(bad)
    check_page_size(64)
    with pytest.raises(ValueError, match=">= 1"):
        split_plan(0)
