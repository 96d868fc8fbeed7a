"""The JaxEngine's counters (`JaxEngine.stats`) and the clock of its device calls.

Per program ("prefill", "decode"): calls, tokens, seconds the device ran them and the
largest batch. `host_gap_s` sums the time the device sat idle between two calls while
the scheduler had work: from reading one call (or finishing a prefill round) to
dispatching the next; a call dispatched while another is still unread adds none, and
neither does idle time (`idle`). The page counts (`peak_kv_pages`, `peak_kv_pages_held`)
are sampled from the page table after each counted round. Other parts add their own
counters to the same Counter (the page table's evictions and shared prefixes, the
scheduler's preemptions and overlapped calls).

tests/engine/jax/test_stats.py; tests/engine/jax/test_engine.py reads them through the engine.
"""
from __future__ import annotations

import collections
import time

from agentjax.engine.jax.pages import PageTable


class EngineStats:
    """Counters and device-call clock (module docstring).

    Args:
      counter: the Counter the engine publishes (and its page table writes).
      table: the page table whose pages are sampled.
    """

    def __init__(self, counter: collections.Counter, table: PageTable):
        self.counter = counter
        self._table = table
        self._device_done: float | None = None  # when the device last went idle
        self._unread = 0  # decode calls dispatched, not read yet
        self._last_read = 0.0  # when the host last read a decode call

    def idle(self) -> None:
        """The scheduler has nothing to do: the time until its next call is no host gap."""
        self._device_done = None

    def reset(self) -> None:
        """Forgets the calls in flight (the engine dropped them after an error)."""
        self._unread, self._device_done = 0, None

    def dispatching(self, decode: bool) -> float:
        """The start of a device call; adds the host time since the device went idle
        (none when a call dispatched earlier is still unread)."""
        now = time.perf_counter()
        if self._device_done is not None:
            self.counter["host_gap_s"] += now - self._device_done
            self._device_done = None
        self._unread += decode
        return now

    def prefill_round(self, start: float, batch: int, tokens: int, calls: int) -> None:
        """A prefill round's calls, dispatched from `start`, are done."""
        self._count("prefill", start, batch, tokens, calls)
        self._device_done = time.perf_counter()

    def decode_read(self, dispatched: float, rows: int, tokens: int, dropped: int) -> None:
        """A decode call dispatched at `dispatched` over `rows` rows was read: `tokens`
        kept, `dropped` sampled for sequences that had already ended."""
        self.counter["dropped_decode_tokens"] += dropped
        # The device ran this call since it was dispatched or the previous one was read.
        busy_from = max(dispatched, self._last_read)
        self._unread -= 1
        if rows:
            self._count("decode", busy_from, rows, tokens)
        self._last_read = time.perf_counter()
        self._device_done = None if self._unread else self._last_read

    def _count(self, program: str, start: float, batch: int, tokens: int,
               calls: int = 1) -> None:
        """Accumulates per-program statistics (calls, seconds since `start`, tokens,
        largest batch) and samples the pages in use."""
        self.counter[f"{program}_s"] += time.perf_counter() - start
        self.counter[f"{program}_calls"] += calls
        self.counter[f"{program}_tokens"] += tokens
        self.counter[f"max_{program}_batch"] = max(self.counter[f"max_{program}_batch"], batch)
        self.counter["peak_kv_pages"] = self._table.peak_in_use
        # Held pages are a subset of those in use: counted only when that could raise
        # the peak (the count scans the pool).
        if self._table.in_use > self.counter["peak_kv_pages_held"]:
            self.counter["peak_kv_pages_held"] = max(self.counter["peak_kv_pages_held"],
                                                     self._table.held)
