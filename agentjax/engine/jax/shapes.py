"""The shape of each program call the JaxEngine makes — rows, prefill chunk width,
attention items — and so the finite set of programs it compiles.

- Rows: a call over n sequences runs the smallest batch bucket >= n (else max_slots
  rows); padding rows are inert.
- Chunk width: picked per sequence from its own remaining tokens (`chunk_width`).
- Attention items: one per (row, page) the call attends (`models/paged.py`), padded to
  a count that is one of few: the attention costs the tokens the rows hold.
  - Prefill: one count per row count, what full rows need (a row's items in whole
    tiles). Its attention loops over the rows' tiles and stops where the padding
    starts, so padding costs nothing on the device (measured: a 4-row call of 64-token
    chunks at 16 items and padded to 2048 took the same time) and 3 int32 per item to
    send; a count per power of two made a row count's programs many (at a 32k context,
    11 counts for 16 rows: 81 prefill programs at serve.py's defaults, now 9).
  - Decode: powers of two, and the midpoints 3 x 2^k from 96 items: every decode step
    computes every item of its view, padding too, so there it pays at most 1/3 for
    padding, not 1/2; below, padding costs little and each count is one more program.
    Decode counts stop at `view_pages`, the pool's page count: a decode call copies the
    pages it attends into a view, and the engine splits a round whose rows attend more
    (through a shared context) into calls within it.
  The GPU kernel (`models/paged_pallas.py`) takes block tables of a fixed width
  instead: one program per rows and chunk width.

Deterministic (batch-invariant) mode fixes the rows independently of what else is in
flight: prefill always runs `deterministic_prefill_rows` rows, decode always max_slots,
and chunk widths depend on the sequence alone. The item count still follows what is in
flight: a row's result does not depend on it (the items of a row are merged in order
and padding items belong to no row).

Pure Python: tests/engine/jax/test_shapes.py.
"""
from __future__ import annotations

from typing import Sequence

# `models.paged.ITEM_TILE` (this module imports no JAX): a prefill row's items fill whole
# tiles; a decode row's come one by one.
ITEM_TILE = 4
TILES = {"prefill": ITEM_TILE, "decode": 1}
# The fewest attention items of a call (smaller lists round up to it): two tiles.
MIN_ITEMS = 2 * ITEM_TILE
# Decode item counts take the midpoint 3 x 2^k between powers of two from this one on.
MIDPOINTS_FROM = 64


def _bucket_sizes(low: int, high: int, midpoints: bool) -> list[int]:
    """Powers of two (and, with `midpoints`, 3 x 2^k between those from MIDPOINTS_FROM)
    from the first >= low up to the first >= high (high included)."""
    sizes, size = [], 1 << max(low - 1, 0).bit_length()
    while True:
        with_midpoint = midpoints and size >= MIDPOINTS_FROM
        for candidate in (size, 3 * size // 2) if with_midpoint else (size,):
            if candidate >= low:
                sizes.append(candidate)
            if candidate >= high:
                return sizes
        size *= 2


def item_sizes(rows: int, pages_per_row: int, kind: str,
               view_pages: int | None = None) -> list[int]:
    """The attention item counts of `kind` ("prefill" / "decode") calls with `rows` rows
    of at most `pages_per_row` pages (module docstring): prefill, what full rows need;
    decode, from MIN_ITEMS up to that, stopping at `view_pages` (the most pages a
    decode call's view holds), itself the last."""
    tile = TILES[kind]
    full = max(rows * -(-pages_per_row // tile) * tile, MIN_ITEMS)
    if kind == "prefill":
        return [full]
    sizes = _bucket_sizes(MIN_ITEMS, full, midpoints=True)
    if view_pages is not None and view_pages < sizes[-1]:
        sizes = [s for s in sizes if s < view_pages] + [view_pages]
    return sizes


class ProgramShapes:
    """Program shapes of one engine (module docstring).

    Args:
      max_slots: sequences in flight at once (the most rows of a call).
      max_len: slots per sequence at most.
      page_size: slots per KV page.
      prefill_chunks: prefill chunk widths.
      batch_buckets: row counts of calls (those outside (0, max_slots) are dropped);
        None: 1, 4, 16, 64, ... below max_slots.
      deterministic: fixed row counts whatever else is in flight.
      deterministic_prefill_rows: rows of every prefill call when deterministic.
      block_tables: the calls take block tables (no attention item counts).
      view_pages: the most pages a decode call attends (its view, `models/paged.py`);
        the engine splits a decode round into calls within it. None: no bound.
    """

    def __init__(self, max_slots: int, max_len: int, page_size: int, *,
                 prefill_chunks: Sequence[int], batch_buckets: Sequence[int] | None,
                 deterministic: bool, deterministic_prefill_rows: int,
                 block_tables: bool = False, view_pages: int | None = None):
        self.max_slots, self.max_len, self.page_size = max_slots, max_len, page_size
        self.block_tables = block_tables
        self.view_pages = None if block_tables else view_pages
        self.deterministic = deterministic
        self.deterministic_prefill_rows = deterministic_prefill_rows
        self.pages_per_row = -(-max_len // page_size)
        self.chunks = tuple(sorted(set(int(c) for c in prefill_chunks)))
        if batch_buckets is None:
            batch_buckets = [4 ** i for i in range(8) if 4 ** i < max_slots]
        self.batch_buckets = tuple(sorted({int(b) for b in batch_buckets
                                           if 0 < b < max_slots}))

    @property
    def prefill_rows_per_call(self) -> int:
        """Most sequences one prefill call takes."""
        return self.deterministic_prefill_rows if self.deterministic else self.max_slots

    def rows(self, count: int, kind: str) -> int:
        """Rows of a `kind` ("prefill" / "decode") call over `count` sequences."""
        if self.deterministic:
            return self.deterministic_prefill_rows if kind == "prefill" else self.max_slots
        return next((b for b in self.batch_buckets if b >= count), self.max_slots)

    def item_sizes(self, rows: int, kind: str) -> list[int]:
        """The attention item counts of `kind` calls with `rows` rows (`item_sizes`);
        [0] with block tables."""
        if self.block_tables:
            return [0]
        return item_sizes(rows, self.pages_per_row, kind, self.view_pages)

    def items(self, needed: int, rows: int, kind: str) -> int:
        """The item count of a `kind` call whose rows need `needed` items (0 with block
        tables)."""
        if self.block_tables:
            return 0
        return next(s for s in self.item_sizes(rows, kind) if s >= needed)

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

    def programs(self) -> list[tuple[str, int, int, int]]:
        """Every program the engine may call: (kind, rows, prefill chunk width or decode
        steps — 0 —, attention items)."""
        if self.deterministic:
            prefill_rows, decode_rows = [self.deterministic_prefill_rows], [self.max_slots]
        else:
            prefill_rows = decode_rows = list(self.batch_buckets) + [self.max_slots]
        return ([("prefill", r, w, n) for r in prefill_rows for w in self.chunks
                 for n in self.item_sizes(r, "prefill")]
                + [("decode", r, 0, n) for r in decode_rows
                   for n in self.item_sizes(r, "decode")])


def default_kv_pages(max_slots: int, max_len: int, page_size: int) -> int:
    """The engine's pool when none is given: every slot can hold max_len tokens."""
    return max_slots * -(-max_len // page_size)


def engine_shapes(*, max_slots: int, max_len: int, page_size: int = 64,
                  kv_pages: int | None = None, prefill_chunks: Sequence[int] = (16, 64, 256),
                  batch_buckets: Sequence[int] | None = None, deterministic: bool = False,
                  deterministic_prefill_rows: int = 4, block_tables: bool = False,
                  **_) -> ProgramShapes:
    """The ProgramShapes of a JaxEngine built with these keyword arguments (its
    defaults; arguments that set no shape are ignored): what a launcher or a bench
    states its compile budget from without building the engine."""
    kv_pages = default_kv_pages(max_slots, max_len, page_size) if kv_pages is None else kv_pages
    return ProgramShapes(max_slots, max_len, page_size, prefill_chunks=prefill_chunks,
                         batch_buckets=batch_buckets, deterministic=deterministic,
                         deterministic_prefill_rows=deterministic_prefill_rows,
                         block_tables=block_tables, view_pages=kv_pages)
