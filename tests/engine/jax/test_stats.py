"""EngineStats: per-program counters, and the host gap counted only while the device
waits for the scheduler (not while idle, not while a dispatched call is unread)."""
import collections
import time
import types

from agentjax.engine.jax.pages import PageTable
from agentjax.engine.jax.stats import EngineStats


def _stats():
    counter = collections.Counter()
    table = PageTable(8, 4, evict_parked=True, stats=counter)
    return EngineStats(counter, table), counter, table


def test_rounds_count_calls_tokens_batches_and_pages():
    stats, counter, table = _stats()
    held = types.SimpleNamespace(pages=[], length=0)
    assert table.prepare_writes(held, 12) == []  # a sequence holds 3 pages of 4 slots
    start = stats.dispatching(decode=False)
    stats.prefill_round(start, batch=2, tokens=30, calls=2)
    call = stats.dispatching(decode=True)
    stats.decode_read(call, rows=4, tokens=12, dropped=3)
    assert (counter["prefill_calls"], counter["prefill_tokens"], counter["max_prefill_batch"]) == (
        2, 30, 2)
    assert (counter["decode_calls"], counter["decode_tokens"], counter["max_decode_batch"]) == (
        1, 12, 4)
    assert counter["dropped_decode_tokens"] == 3
    assert counter["peak_kv_pages"] == counter["peak_kv_pages_held"] == 3
    assert counter["prefill_s"] > 0 and counter["decode_s"] > 0


def test_the_host_gap_is_the_device_waiting_for_the_scheduler():
    stats, counter, _ = _stats()
    first = stats.dispatching(decode=True)
    assert counter["host_gap_s"] == 0  # nothing ran before: no gap
    second = stats.dispatching(decode=True)  # overlapped: the first is still unread
    stats.decode_read(first, rows=1, tokens=1, dropped=0)
    time.sleep(0.01)
    assert counter["host_gap_s"] == 0  # the second call still runs: the device is busy
    stats.decode_read(second, rows=1, tokens=1, dropped=0)
    time.sleep(0.01)
    stats.dispatching(decode=False)
    gap = counter["host_gap_s"]
    assert gap >= 0.01  # read to dispatch, with nothing on the device
    stats.prefill_round(time.perf_counter(), batch=1, tokens=1, calls=1)
    stats.idle()  # nothing to do: the wait for the next request is no gap
    time.sleep(0.01)
    stats.dispatching(decode=True)
    assert counter["host_gap_s"] == gap
