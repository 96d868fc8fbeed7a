"""The shape of each program call the JaxEngine makes: rows gathered, prefill chunk width,
decode attention span — and so the finite set of programs it compiles.

- Rows: a call touching n rows gathers them into the smallest batch bucket >= n (padding
  rows point past the last row: they read zeros and their writes are dropped); a call
  touching more rows than the largest bucket runs over every row without gathering.
- Chunk width: picked per sequence from its own remaining tokens (`chunk_width`).
- Span: a decode call attends over the smallest attention span holding its longest row.

Deterministic (batch-invariant) mode fixes every shape independently of what else is in
flight: prefill always gathers `deterministic_prefill_rows` rows, decode always runs all
rows at span max_len, and chunk widths already depend on the sequence alone.

Pure Python (numpy row arrays): tests/engine/jax/test_shapes.py.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np


class ProgramShapes:
    """Program shapes of one engine (module docstring).

    Args:
      max_slots: cache rows.
      max_len: cache slots per row.
      prefill_chunks: prefill chunk widths.
      batch_buckets: gathered batch sizes (those outside (0, max_slots) are dropped);
        None: 1, 4, 16, 64, ... below max_slots.
      attention_spans: decode spans (max_len is always one); None: powers of two from 128
        up to max_len / 2.
      deterministic: fixed shapes whatever else is in flight.
      deterministic_prefill_rows: rows of every prefill call when deterministic.
    """

    def __init__(self, max_slots: int, max_len: int, *, prefill_chunks: Sequence[int],
                 batch_buckets: Sequence[int] | None, attention_spans: Sequence[int] | None,
                 deterministic: bool, deterministic_prefill_rows: int):
        self.max_slots, self.max_len = max_slots, max_len
        self.deterministic = deterministic
        self.deterministic_prefill_rows = deterministic_prefill_rows
        # Padding rows of a gathered program point past the last row: they read zeros
        # and their writes are dropped.
        self.padding_row = max_slots
        self.chunks = tuple(sorted(set(int(c) for c in prefill_chunks)))
        if batch_buckets is None:
            batch_buckets = [4 ** i for i in range(8) if 4 ** i < max_slots]
        self.batch_buckets = tuple(sorted({int(b) for b in batch_buckets
                                           if 0 < b < max_slots}))
        if attention_spans is None:
            # A call copies its span out of the cache: about as much traffic as two
            # decode steps' attention, worth it only well below max_len.
            attention_spans = [2 ** i for i in range(7, max_len.bit_length())
                               if 2 ** i <= max_len // 2]
        self.spans = tuple(sorted({int(w) for w in attention_spans if 0 < w < max_len}
                                  | {max_len}))

    @property
    def prefill_rows_per_call(self) -> int:
        """Most sequences one prefill call takes."""
        return self.deterministic_prefill_rows if self.deterministic else self.max_slots

    def layout(self, slots: Sequence[int], kind: str) -> tuple[bool, np.ndarray, list[int]]:
        """How a `kind` ("prefill" / "decode") call covers the cache rows `slots`:
        gathered into a batch of fixed size, or run over all rows.

        Returns (gather, cache row of each program row, program row of each slot)."""
        if self.deterministic:
            size = self.deterministic_prefill_rows if kind == "prefill" else None
        elif self.batch_buckets and len(slots) <= self.batch_buckets[-1]:
            size = next(b for b in self.batch_buckets if b >= len(slots))
        else:
            size = None
        if size is None:
            return False, self.all_rows(), list(slots)
        assert len(slots) <= size, (len(slots), size)
        cache_rows = np.full(size, self.padding_row, np.int32)
        cache_rows[:len(slots)] = slots
        return True, cache_rows, list(range(len(slots)))

    def all_rows(self) -> np.ndarray:
        """The cache rows of a call that does not gather: every row, in order."""
        return np.arange(self.max_slots, dtype=np.int32)

    def span(self, needed: int) -> int:
        """The smallest attention span holding `needed` slots (max_len when
        deterministic: the span is a shape shared by the whole batch)."""
        if self.deterministic:
            return self.max_len
        return next((w for w in self.spans if w >= needed), self.max_len)

    def chunk_width(self, remaining: int) -> int:
        """Prefill chunk width for a sequence with `remaining` tokens left to prefill: the
        smallest chunk holding them if at most a quarter of it would be padding (or none
        is smaller), else the largest chunk they fill. On CPU prefill is compute bound:
        padding costs as much as tokens, an extra round little. The width depends on the
        sequence alone, so its chunk boundaries do too (deterministic mode relies on it).
        """
        holding = next((c for c in self.chunks if c >= remaining), None)
        if holding is not None and (4 * (holding - remaining) <= holding
                                    or holding == self.chunks[0]):
            return holding
        return max((c for c in self.chunks if c <= remaining), default=self.chunks[0])

    def programs(self) -> list[tuple[str, int | None, int]]:
        """Every program the engine may call: (kind, rows gathered — None: all rows —,
        prefill chunk width or decode span)."""
        if self.deterministic:
            return ([("prefill", self.deterministic_prefill_rows, w) for w in self.chunks]
                    + [("decode", None, self.max_len)])
        layouts = list(self.batch_buckets) + [None]
        return ([("prefill", rows, w) for rows in layouts for w in self.chunks]
                + [("decode", rows, span) for rows in layouts for span in self.spans])
