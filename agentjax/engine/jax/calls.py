"""The JaxEngine's calls of its device programs: the host arrays of each call, built from
the sequences it runs, and the state the programs thread through (weights, page pool,
decode carry).

A call's shape (rows, chunk width, attention items) comes from `ProgramShapes`
(`engine/jax/shapes.py`); padding rows are inert. The pure-JAX attention takes a work
list of (row, page) items, the Pallas kernels block tables (`engine/jax/attention.py`).
Which sequences share a call, and when it is read, is the rounds' part
(`engine/jax/rounds.py`); this module only turns rows into arrays and dispatches.
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple, Sequence

import jax
import numpy as np

from agentjax.engine.jax.attention import kernel_mesh, kernel_plan
from agentjax.engine.jax.programs import (DecodeCarry, carry_sharding, copy_pages, decode,
                                          new_cache, prefill)
from agentjax.engine.jax.sequences import SequenceState
from agentjax.engine.jax.shapes import TILES, ProgramShapes
from agentjax.engine.jax.stats import EngineStats
from agentjax.models.decoder import LayerwiseWeights
from agentjax.models.paged import AttentionItems, build_items, items_needed
from agentjax.models.paged_pallas import BlockTables, block_table


class Row(NamedTuple):
    """A decode call's row: `steps` tokens for `seq`, after the `ahead` tokens a call
    not read yet makes for it (whose row `src` it continues; -1: none)."""

    seq: SequenceState
    steps: int
    ahead: int = 0
    src: int = -1

    @property
    def start(self) -> int:
        """The slot of the row's first step."""
        return self.seq.length + self.ahead

    @property
    def end(self) -> int:
        return self.start + self.steps


@dataclasses.dataclass(eq=False)
class DecodeCall:
    """A dispatched decode call: its rows and its outputs on device."""

    rows: list[Row]
    outputs: tuple  # tokens, logprobs, emitted
    dispatched: float

    def read(self) -> tuple[list[list[int]], list[list[float]], list[int]]:
        """Waits for the call: (tokens, logprobs) per row as Python lists, and how many
        steps each row emitted (a prefix of its steps)."""
        tokens, logprobs, emitted = self.outputs
        return (np.asarray(tokens).tolist(), np.asarray(logprobs).tolist(),
                np.asarray(emitted).sum(axis=1).tolist())


class DeviceCalls:
    """Dispatches the engine's prefill, decode and page-copy programs.

    Args:
      weights: the engine's weights (`WeightLoader.load`); a swap assigns `weights`.
      shapes: the engine's program shapes.
      attention: the resolved attention ("paged", "pallas_gpu" or "pallas_tpu").
      kv_pages: pages in the pool.
      cache_dtype: the pool's dtype.
      decode_steps: tokens per decode call.
      max_stop_ids: width of a decode call's stop-id table.
      stats: the clock each dispatch reports to.
    """

    def __init__(self, weights: LayerwiseWeights, shapes: ProgramShapes, *, attention: str,
                 kv_pages: int, cache_dtype, decode_steps: int, max_stop_ids: int,
                 stats: EngineStats):
        self.weights = weights
        self._shapes = shapes
        self._attention = attention
        self._kv_pages = kv_pages
        self._cache_dtype = cache_dtype
        self._key_layout = "hd_page" if attention == "paged" else "page_hd"
        self._decode_steps = decode_steps
        self._max_stop_ids = max_stop_ids
        self._stats = stats
        self._kernel_plan = (None if attention == "paged" else
                             kernel_plan(attention, shapes.pages_per_row, shapes.page_size))
        self.cache = self._new_cache()
        self.kernel_mesh = {} if attention == "paged" else kernel_mesh(self.cache)
        self._carry_sharding = carry_sharding(self.cache)
        self._carry = self._new_carry()

    def _new_cache(self):
        return new_cache(self.weights, self.weights.config, self._kv_pages,
                         self._shapes.page_size, self._cache_dtype, self._key_layout)

    def _new_carry(self) -> DecodeCarry:
        return jax.device_put(DecodeCarry.empty(self._shapes.max_slots), self._carry_sharding)

    def reset(self) -> None:
        """A fresh pool and carry (a failed call may have been donated the old ones)."""
        self.cache = self._new_cache()
        self._carry = self._new_carry()

    def wait(self) -> None:
        """Waits for every call dispatched so far."""
        jax.block_until_ready(self.cache)

    def copy_pages(self, copies: Sequence[tuple[int, int]]) -> None:
        """Runs copy-on-write page copies (one program: max_slots copies, the rest
        padding)."""
        max_slots = self._shapes.max_slots
        for start in range(0, max(len(copies), 1), max_slots):
            part = copies[start:start + max_slots]
            src = np.zeros(max_slots, np.int32)
            dst = np.full(max_slots, self._kv_pages, np.int32)  # out of range: skipped
            for i, (a, b) in enumerate(part):
                src[i], dst[i] = a, b
            self.cache = copy_pages(self.cache, src, dst)

    def prefill(self, seqs: Sequence[SequenceState], rows: int, width: int,
                size: int | None = None) -> tuple[float, list[int]]:
        """Dispatches the prefill of the next (up to) `width` context ids of each sequence
        (row i), without waiting for it; attention items default to the shape for the
        rows' spans. Returns (its dispatch time, the ids it prefills per sequence); the
        caller advances the sequences' lengths."""
        tokens = np.zeros((rows, width), np.int32)
        slots = np.full((rows, width), -1, np.int32)
        write = np.full((rows, width), -1, np.int32)
        counts = []
        for row, seq in enumerate(seqs):
            chunk = seq.context(seq.length, min(seq.length + width, seq.context_length - 1))
            end = seq.length + len(chunk)
            tokens[row, :len(chunk)] = chunk
            slots[row, :len(chunk)] = np.arange(seq.length, end)
            write[row, :len(chunk)] = self._flat_slots(seq, seq.length, end)
            counts.append(len(chunk))
        spans = [s.length + n for s, n in zip(seqs, counts)]
        if size is None:
            size = self._item_count(spans, rows, "prefill")
        items = self._items(seqs, spans, rows, size, "prefill")
        dispatched = self._stats.dispatching(decode=False)
        self.cache = prefill(self.weights, self.cache, tokens, slots, write, items)
        return dispatched, counts

    def decode(self, work: list[Row], rows: int | None = None,
               size: int | None = None) -> DecodeCall:
        """Dispatches a decode call over `work` (row i: work[i]) without waiting for it;
        rows and attention items default to the shapes for the work."""
        if rows is None:
            rows = self._shapes.rows(len(work), "decode")
            size = self._item_count([row.end for row in work], rows, "decode")
        lengths = np.zeros(rows, np.int32)
        last = np.zeros(rows, np.int32)
        active = np.zeros(rows, bool)
        budget = np.zeros(rows, np.int32)
        src = np.full(rows, -1, np.int32)
        write = np.full((rows, self._decode_steps), -1, np.int32)
        stop_ids = np.full((rows, self._max_stop_ids), -1, np.int32)
        for i, row in enumerate(work):
            seq = row.seq
            lengths[i] = row.start
            if row.src < 0:
                last[i] = seq.context(seq.length, seq.length + 1)[0]
            src[i] = row.src
            active[i] = True
            budget[i] = row.steps
            write[i, :row.steps] = self._flat_slots(seq, row.start, row.end)
            ids = sorted(seq.stop_ids)
            stop_ids[i, :len(ids)] = ids
        items = self._items([row.seq for row in work], [row.end for row in work], rows,
                            size, "decode")
        keys, positions, temperature, top_k, top_p = _sampling_arrays(work, rows)
        dispatched = self._stats.dispatching(decode=True)
        self.cache, *outputs, carry = decode(
            self.weights, self.cache, lengths, last, active, write, items, keys,
            positions, budget, stop_ids, temperature, top_k, top_p, self._carry, src,
            num_steps=self._decode_steps)
        # Kept where the next call expects it (one executable whatever produced it).
        self._carry = jax.device_put(carry, self._carry_sharding)
        return DecodeCall(work, tuple(outputs), dispatched)

    def _item_count(self, spans: Sequence[int], rows: int, kind: str) -> int:
        """The attention items of a `kind` call whose rows attend `spans` slots."""
        return self._shapes.items(items_needed(spans, self._shapes.page_size, TILES[kind]),
                                  rows, kind)

    def _items(self, seqs: Sequence[SequenceState], spans: Sequence[int], rows: int,
               size: int, kind: str) -> AttentionItems | BlockTables:
        if self._kernel_plan is not None:
            k_splits, block_pages, width = self._kernel_plan
            return BlockTables(table=block_table([s.pages for s in seqs], rows, width),
                               k_splits=k_splits, block_pages=block_pages,
                               kernel=self._attention, **self.kernel_mesh)
        pages = [s.pages for s in seqs] + [[]] * (rows - len(seqs))
        spans = list(spans) + [0] * (rows - len(seqs))
        host = build_items(pages, spans, rows, self._shapes.page_size, size, TILES[kind])
        return AttentionItems(row=host.row, page=host.page, first_slot=host.first_slot)

    def _flat_slots(self, seq: SequenceState, start: int, stop: int) -> np.ndarray:
        """Flat pool indices (page * page_size + offset) of the sequence's slots
        [start, stop)."""
        size = self._shapes.page_size
        first = start // size
        slots = np.arange(start, stop)
        pages = np.asarray(seq.pages[first:-(-stop // size)], np.int64)
        return pages[slots // size - first] * size + slots % size


def _sampling_arrays(work: Sequence[Row], size: int):
    """Each row's key, the position its first step samples, and its sampling
    parameters."""
    keys = np.zeros((size, 2), np.uint32)
    positions = np.zeros(size, np.int32)
    temperature = np.ones(size, np.float32)
    top_k = np.full(size, -1, np.int32)
    top_p = np.ones(size, np.float32)
    for i, row in enumerate(work):
        keys[i] = row.seq.key
        positions[i] = row.seq.context_length + row.ahead
        temperature[i] = row.seq.sampling.temperature
        top_k[i] = row.seq.sampling.top_k
        top_p[i] = row.seq.sampling.top_p
    return keys, positions, temperature, top_k, top_p
