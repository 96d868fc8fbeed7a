"""ProgramShapes: rows, attention items, chunk widths and the program set (no JAX)."""
import pytest

from agentjax.engine.jax import shapes as shapes_module
from agentjax.engine.jax.shapes import MIN_ITEMS, ProgramShapes
from agentjax.models import paged


def _shapes(deterministic=False, **kwargs):
    settings = dict(max_slots=16, max_len=512, page_size=64, prefill_chunks=(16, 64, 256),
                    batch_buckets=None, deterministic=deterministic,
                    deterministic_prefill_rows=2)
    settings.update(kwargs)
    return ProgramShapes(settings.pop("max_slots"), settings.pop("max_len"),
                         settings.pop("page_size"), **settings)


def test_the_tile_is_the_attention_kernels():
    assert shapes_module.ITEM_TILE == paged.ITEM_TILE


def test_defaults_and_settings_are_normalised():
    shapes = _shapes()
    assert shapes.batch_buckets == (1, 4)  # powers of 4 below max_slots
    assert shapes.pages_per_row == 8
    odd = _shapes(prefill_chunks=(64, 16, 16), batch_buckets=(0, 8, 2, 16, 99), max_len=100)
    assert odd.chunks == (16, 64) and odd.batch_buckets == (2, 8)
    assert odd.pages_per_row == 2  # a partial last page counts


def test_rows_take_the_smallest_bucket_else_every_row():
    shapes = _shapes()
    assert [shapes.rows(n, "decode") for n in (1, 2, 4, 5, 16)] == [1, 4, 4, 16, 16]
    assert _shapes(batch_buckets=()).rows(1, "prefill") == 16
    assert shapes.prefill_rows_per_call == 16


def test_deterministic_rows_do_not_depend_on_what_is_in_flight():
    shapes = _shapes(deterministic=True)
    assert {shapes.rows(n, "prefill") for n in (1, 2)} == {2}
    assert {shapes.rows(n, "decode") for n in (1, 7, 16)} == {16}
    assert shapes.prefill_rows_per_call == 2


@pytest.mark.parametrize("needed,rows,items", [
    (1, 1, 8), (8, 1, 8),                  # one row holds at most 8 pages: 2 tiles
    (1, 4, 32), (9, 4, 32), (32, 4, 32),   # four rows: 32 whatever they hold
    (1, 16, 128), (128, 16, 128)])
def test_prefill_items_are_what_full_rows_need(needed, rows, items):
    """One count per row count: the attention stops where the padding tiles start."""
    assert _shapes().items(needed, rows, "prefill") == items


@pytest.mark.parametrize("needed,rows,items", [
    (1, 1, MIN_ITEMS), (8, 1, 8),            # one row holds at most 8 pages
    (9, 4, 16), (17, 4, 32), (33, 8, 64),    # powers of two up to 64
    (65, 16, 96), (97, 16, 128)])            # then midpoints too
def test_decode_items_also_take_the_midpoints(needed, rows, items):
    assert _shapes().items(needed, rows, "decode") == items


def test_item_sizes_end_at_what_full_rows_need():
    shapes = _shapes(max_len=96, page_size=16)  # 6 pages a row
    assert shapes.item_sizes(1, "prefill") == [8]  # 6 pages: 2 whole tiles
    assert shapes.item_sizes(4, "prefill") == [32]
    assert shapes.item_sizes(4, "decode") == [8, 16, 32]  # 24 pages, one by one
    assert _shapes(max_len=1024).item_sizes(16, "decode") == [8, 16, 32, 64, 96, 128, 192,
                                                              256]  # 16 rows x 16 pages
    with pytest.raises(StopIteration):
        shapes.items(33, 4, "prefill")


def test_decode_item_sizes_stop_at_the_view_bound():
    assert _shapes(max_len=1024, view_pages=100).item_sizes(16, "decode") == [
        8, 16, 32, 64, 96, 100]
    assert _shapes(max_len=1024, view_pages=64).item_sizes(16, "decode")[-1] == 64
    assert _shapes(max_len=1024, view_pages=5000).item_sizes(16, "decode")[-1] == 256
    bounded = _shapes(max_len=1024, view_pages=100)
    assert bounded.item_sizes(16, "prefill")[-1] == 256  # prefill reads the pool in place
    assert _shapes(view_pages=4, block_tables=True).view_pages is None


@pytest.mark.parametrize("remaining,width", [
    (1, 16), (16, 16), (17, 16),    # 64 would be mostly padding: rounds of 16
    (48, 64), (64, 64),             # a quarter or less of 64 is padding
    (47, 16), (200, 256), (191, 64), (300, 256), (5000, 256),
])
def test_chunk_width_trades_padding_for_rounds(remaining, width):
    assert _shapes().chunk_width(remaining) == width


def test_block_tables_make_one_program_per_rows_and_chunk():
    shapes = _shapes(batch_buckets=(4,), prefill_chunks=(16, 64), max_len=128,
                     block_tables=True)
    assert shapes.items(37, 16, "decode") == 0 and shapes.item_sizes(4, "prefill") == [0]
    assert shapes.programs() == ([("prefill", r, w, 0) for r in (4, 16) for w in (16, 64)]
                                 + [("decode", r, 0, 0) for r in (4, 16)])


def test_programs_list_every_shape_the_engine_may_call():
    # 2 pages a row. Prefill: a tile of 4 items each, so 4 rows need 16 items, 16 rows
    # 64. Decode: items one by one, 8 and 32.
    shapes = _shapes(batch_buckets=(4,), prefill_chunks=(16, 64), max_len=128)
    prefill = {4: (16,), 16: (64,)}
    decode = {4: (8,), 16: (8, 16, 32)}
    assert shapes.programs() == (
        [("prefill", r, w, n) for r in (4, 16) for w in (16, 64) for n in prefill[r]]
        + [("decode", r, 0, n) for r in (4, 16) for n in decode[r]])
    assert _shapes(deterministic=True, prefill_chunks=(16, 64), max_len=128).programs() == (
        [("prefill", 2, w, 8) for w in (16, 64)] + [("decode", 16, 0, n) for n in decode[16]])
