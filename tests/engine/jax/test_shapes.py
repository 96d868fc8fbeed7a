"""ProgramShapes: rows gathered, chunk widths, spans and the program set (no JAX)."""
import numpy as np
import pytest

from agentjax.engine.jax.shapes import ProgramShapes


def _shapes(deterministic=False, **kwargs):
    settings = dict(max_slots=16, max_len=512, prefill_chunks=(16, 64, 256),
                    batch_buckets=None, attention_spans=None, deterministic=deterministic,
                    deterministic_prefill_rows=2)
    settings.update(kwargs)
    return ProgramShapes(settings.pop("max_slots"), settings.pop("max_len"), **settings)


def test_defaults_and_settings_are_normalised():
    shapes = _shapes()
    assert shapes.batch_buckets == (1, 4)  # powers of 4 below max_slots
    assert shapes.spans == (128, 256, 512)  # powers of 2 from 128 to max_len / 2, max_len
    odd = _shapes(prefill_chunks=(64, 16, 16), batch_buckets=(0, 8, 2, 16, 99),
                  attention_spans=(600, 32, 0))
    assert odd.chunks == (16, 64) and odd.batch_buckets == (2, 8) and odd.spans == (32, 512)


def test_gathered_rows_take_the_smallest_bucket_and_pad_past_the_last_row():
    shapes = _shapes()
    gather, cache_rows, rows = shapes.layout([7, 3], "decode")
    assert gather and list(cache_rows) == [7, 3, 16, 16] and rows == [0, 1]
    assert cache_rows.dtype == np.int32
    gather, cache_rows, rows = shapes.layout([5], "prefill")
    assert gather and list(cache_rows) == [5] and rows == [0]


def test_more_rows_than_the_largest_bucket_run_over_every_row():
    shapes = _shapes()
    gather, cache_rows, rows = shapes.layout([9, 2, 4, 1, 0], "decode")
    assert not gather and list(cache_rows) == list(range(16)) and rows == [9, 2, 4, 1, 0]
    gather, _, rows = _shapes(batch_buckets=()).layout([3], "prefill")
    assert not gather and rows == [3]


def test_deterministic_shapes_do_not_depend_on_the_rows_in_flight():
    shapes = _shapes(deterministic=True)
    for slots in ([4], [4, 9]):
        gather, cache_rows, _ = shapes.layout(slots, "prefill")
        assert gather and len(cache_rows) == 2
        gather, cache_rows, _ = shapes.layout(slots, "decode")
        assert not gather and len(cache_rows) == 16
    assert shapes.span(10) == shapes.span(500) == 512
    assert shapes.prefill_rows_per_call == 2 and _shapes().prefill_rows_per_call == 16


@pytest.mark.parametrize("needed,span", [(1, 128), (128, 128), (129, 256), (511, 512),
                                         (900, 512)])
def test_span_is_the_smallest_holding_the_rows(needed, span):
    assert _shapes().span(needed) == span


@pytest.mark.parametrize("remaining,width", [
    (1, 16), (16, 16), (17, 16),    # 64 would be mostly padding: rounds of 16
    (48, 64), (64, 64),             # a quarter or less of 64 is padding
    (47, 16), (200, 256), (191, 64), (300, 256), (5000, 256),
])
def test_chunk_width_trades_padding_for_rounds(remaining, width):
    assert _shapes().chunk_width(remaining) == width


def test_programs_list_every_shape_the_engine_may_call():
    shapes = _shapes(batch_buckets=(4,), attention_spans=(128,), prefill_chunks=(16, 64))
    assert shapes.programs() == [
        ("prefill", 4, 16), ("prefill", 4, 64), ("prefill", None, 16), ("prefill", None, 64),
        ("decode", 4, 128), ("decode", 4, 512), ("decode", None, 128), ("decode", None, 512)]
    assert _shapes(deterministic=True, prefill_chunks=(16, 64)).programs() == [
        ("prefill", 2, 16), ("prefill", 2, 64), ("decode", None, 512)]
