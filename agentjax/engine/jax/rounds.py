"""The JaxEngine's prefill and decode rounds: which sequences in flight share a device
call, the pages each call writes, and reading a call's tokens back.

- Prefill round: each sequence still prefilling takes a chunk of its own width
  (`ProgramShapes.chunk_width`); the sequences are grouped by width, one call per group
  (per `prefill_rows_per_call` sequences), dispatched back to back and waited for once.
- Decode round: every decoding sequence that gets pages for its steps; the round is
  split into calls whose views hold at most the pool's pages (rows that share a prompt
  attend its pages each).
- Overlap: while nothing else needs the scheduler, a decode call's successor over its
  rows that go on is dispatched before the host reads the call's tokens; a row that
  ended at a stop string (only the host sees those) ran one call too far and its tokens
  are dropped.

Pages come from the page table (copy-on-write copies run before the call that writes);
the arrays and dispatch are `engine/jax/calls.py`'s.
"""
from __future__ import annotations

import collections
from typing import Callable, Iterable, Sequence

from agentjax.engine.jax.calls import DecodeCall, DeviceCalls, Row
from agentjax.engine.jax.pages import PageTable
from agentjax.engine.jax.sequences import SequenceState
from agentjax.engine.jax.shapes import ProgramShapes
from agentjax.engine.jax.stats import EngineStats

# (sequence, finish reason, matched stop): the scheduler ends the sequence.
Finish = Callable[[SequenceState, str, object], None]


class Rounds:
    """Prefill and decode rounds over the sequences in flight (module docstring).

    Args:
      device: the program calls.
      table: the page table.
      stats: the counters and clock.
      shapes: the engine's program shapes.
      max_len: most context ids of a sequence.
      decode_steps: tokens per decode call.
      overlap: dispatch a decode call's successor before reading it (the scheduler
        reads it between calls, so it may change between rounds).
    """

    def __init__(self, device: DeviceCalls, table: PageTable, stats: EngineStats,
                 shapes: ProgramShapes, *, max_len: int, decode_steps: int, overlap: bool):
        self._device = device
        self._table = table
        self._stats = stats
        self._shapes = shapes
        self._max_len = max_len
        self._decode_steps = decode_steps
        self.overlap = overlap

    def warmup(self) -> None:
        """Runs every program once on inert rows (all padding / inactive: no page
        changes)."""
        for kind, rows, width, items in self._shapes.programs():
            if kind == "prefill":
                self._device.prefill([], rows, width, items)
            else:
                self._read(self._device.decode([], rows, items), version=0, finish=None)
        self._device.copy_pages([])
        self._device.wait()

    def prefill(self, in_flight: Sequence[SequenceState]) -> bool:
        """One prefill call per chunk width in use (per `prefill_rows_per_call`
        sequences), dispatched one after the other and waited for once: the host builds
        a call while the device runs the one before. Returns whether any sequence
        prefilled."""
        shapes, by_width, copies = self._shapes, collections.defaultdict(list), []
        for seq in in_flight:
            if not seq.decoding:
                remaining = seq.context_length - 1 - seq.length
                width = shapes.chunk_width(remaining)
                if self._writable(seq, seq.length + min(width, remaining), copies):
                    by_width[width].append(seq)
        if copies:
            self._device.copy_pages(copies)
        per_call, dispatched, tokens, largest = shapes.prefill_rows_per_call, [], 0, 0
        for width, seqs in sorted(by_width.items()):
            for start in range(0, len(seqs), per_call):
                batch = seqs[start:start + per_call]
                when, counts = self._device.prefill(
                    batch, shapes.rows(len(batch), "prefill"), width)
                for seq, count in zip(batch, counts):
                    seq.length += count
                    if seq.decoding:
                        self._table.prefilled(seq)
                dispatched.append(when)
                tokens, largest = tokens + sum(counts), max(largest, len(batch))
        if dispatched:
            self._device.wait()
            self._stats.prefill_round(dispatched[0], largest, tokens, len(dispatched))
        return bool(by_width)

    def decode(self, in_flight: Sequence[SequenceState], *, version: int, finish: Finish,
               quiet: Callable[[], bool]) -> bool:
        """Decode calls over every decoding sequence that has pages for its steps. While
        overlap is on, the scheduler is `quiet` (nothing to take in or admit, no
        cancellation) and every sequence in flight runs in the call, each call's
        successor over the rows that go on is dispatched before the host reads the
        call's tokens. Tokens are recorded under weight `version`; a sequence that ends
        is handed to `finish`. Returns whether any sequence decoded."""
        work, _ = self._work(Row(seq, 0) for seq in in_flight if seq.decoding)
        calls = [self._device.decode(batch) for batch in self._view_batches(work)]
        while calls:
            following = None
            if (len(calls) == 1 and self.overlap and quiet()
                    and sum(not row.seq.finished for row in calls[0].rows) == len(in_flight)):
                following = self._dispatch_following(calls[0])
            for call in calls:
                self._read(call, version=version, finish=finish)
            calls = [following] if following is not None else []
        return bool(work)

    def _writable(self, seq: SequenceState, end: int, copies: list) -> bool:
        """Pages for slots [seq.length, end) are the sequence's own (copies queued)."""
        planned = self._table.prepare_writes(seq, end)
        if planned is None:
            return False
        copies.extend(planned)
        return True

    def _work(self, candidates: Iterable[Row]) -> tuple[list[Row], bool]:
        """The candidates' rows with their steps (a row's `steps` is replaced by its
        budget: tokens left, room left, decode_steps), made writable; rows with no budget
        left are dropped. Returns (rows, whether every row with a budget got pages)."""
        work, copies, complete = [], [], True
        for row in candidates:
            seq = row.seq
            steps = min(seq.sampling.max_new_tokens - len(seq.outputs) - row.ahead,
                        self._max_len - seq.length - row.ahead, self._decode_steps)
            if steps <= 0:
                continue
            if self._writable(seq, row.start + steps, copies):
                work.append(row._replace(steps=steps))
            else:
                complete = False
        if copies:
            self._device.copy_pages(copies)
        return work, complete

    def _dispatch_following(self, call: DecodeCall) -> DecodeCall | None:
        """The call after `call` (not read yet), over its rows that go on if they emit
        every step: a row that stops early is inactive there by the carry, or (at a stop
        string, found on the host) its tokens are dropped. None when a row lacks pages
        or the rows' pages outgrow one view: the round ends and the scheduler decides."""
        work, complete = self._work(
            Row(row.seq, 0, row.steps, src) for src, row in enumerate(call.rows)
            if not row.seq.finished)
        if not work or not complete:
            return None
        if len(list(self._view_batches(work))) > 1:
            return None
        self._stats.counter["overlapped_decode_calls"] += 1
        # Done already: the device waited for the host (its work outlasts a call).
        self._stats.counter["host_bound_decode_calls"] += call.outputs[0].is_ready()
        return self._device.decode(work)

    def _view_batches(self, work: list[Row]):
        """The decode calls of a round, rows in order, split where a call would attend
        more pages than its view may hold (rows sharing a prompt attend its pages each,
        so a round can attend more pages than the pool has)."""
        limit = self._shapes.view_pages
        batch, pages = [], 0
        for row in work:
            need = self._table.pages_for(row.end)
            if batch and limit is not None and pages + need > limit:
                yield batch
                batch, pages = [], 0
            batch.append(row)
            pages += need
        if batch:
            yield batch

    def _read(self, call: DecodeCall, *, version: int, finish: Finish | None) -> None:
        """Waits for `call` and records its tokens for the sequences still in flight."""
        tokens, logprobs, counts = call.read()
        # Rows of sequences that finished (at a stop string) after the call was
        # dispatched: their tokens are dropped.
        dropped = sum(n for row, n in zip(call.rows, counts) if row.seq.finished)
        self._stats.decode_read(call.dispatched, len(call.rows), sum(counts) - dropped,
                                dropped)
        for i, (row, count) in enumerate(zip(call.rows, counts)):
            if not row.seq.finished:
                ended = row.seq.record(tokens[i][:count], logprobs[i][:count],
                                       max_len=self._max_len, version=version)
                if ended is not None:
                    finish(row.seq, *ended)
