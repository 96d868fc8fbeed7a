"""The JaxEngine's host-side table of cache rows: which row holds what, and sessions.

A row is free, holds a sequence in flight, or is parked: it keeps the cache of a
multi-turn session between its turns (`GenerateRequest.session_id`). The next request of
the session is checked token by token against the ids cached there; the common prefix
is reused and only the rest is prefilled (`meta["cached_tokens"]`). When rows run out,
the least recently released parked session is evicted (unless eviction is off); if it
returns, it is prefilled from scratch (`meta["reprefilled"]`).

Pure Python (and a numpy array of row lengths, handed to the device programs as is): no
JAX, so every case is unit tested on its own (tests/engine/jax/test_slots.py).
"""
from __future__ import annotations

import collections
import dataclasses
import itertools
from typing import Any, Iterable, Protocol, Sequence

import numpy as np


class Occupant(Protocol):
    """What the table reads and writes on a sequence (the engine's `_Sequence`)."""

    input_ids: tuple[int, ...]
    outputs: list[int]
    session_id: str | None
    slot: int | None
    prefilled: int
    meta: dict[str, Any]


@dataclasses.dataclass(eq=False)
class Session:
    """A multi-turn session: its cache row (None once evicted) and the ids cached there.

    busy: a request of the session is in flight; ended: `end_session` arrived while busy;
    last_used: when its row was last parked (release order), for eviction.
    """

    slot: int | None
    cached_ids: list[int]
    last_used: int
    busy: bool = False
    ended: bool = False


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading ids `a` and `b` share."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class SlotTable:
    """Cache rows, their occupants and lengths, and the sessions (module docstring).

    Args:
      num_rows: cache rows (the engine's max_slots).
      evict_parked: whether a parked session's row may be taken for another sequence.
      stats: a counter that records "evictions".

    Attributes:
      rows: per row, its sequence in flight, the id of the session parked there, or None.
      lengths: int32 [num_rows], tokens cached in each row.
      sessions: session id -> Session.
    """

    def __init__(self, num_rows: int, *, evict_parked: bool, stats: collections.Counter):
        self.evict_parked = evict_parked
        self.stats = stats
        self.rows: list[Occupant | str | None] = [None] * num_rows
        self.lengths = np.zeros(num_rows, np.int32)
        self.sessions: dict[str, Session] = {}
        self._release_order = itertools.count(1)

    def in_flight(self) -> list[Occupant]:
        """The sequences holding rows, in row order."""
        return [o for o in self.rows if o is not None and not isinstance(o, str)]

    def admit(self, waiting: Iterable[Occupant]) -> collections.deque:
        """Gives waiting sequences cache rows (sessions holding a row first); sets each
        admitted one's `slot`, `prefilled` (the cached prefix it reuses) and `meta`.
        Returns the sequences that must keep waiting: their session has a request in
        flight, or no row is free (or evictable)."""
        ordered = sorted(waiting, key=lambda s: not (
            s.session_id in self.sessions and self.sessions[s.session_id].slot is not None))
        still_waiting = collections.deque()
        for seq in ordered:
            if not self._admit(seq):
                still_waiting.append(seq)
        return still_waiting

    def _admit(self, seq: Occupant) -> bool:
        session = self.sessions.get(seq.session_id) if seq.session_id else None
        if session is not None and session.busy:
            return False  # one request per session at a time
        if session is not None and session.slot is not None:
            slot = session.slot
            reuse = common_prefix(session.cached_ids, seq.input_ids)
            seq.meta["prefix_mismatch"] = reuse < len(session.cached_ids)
        else:
            slot = self._free_row()
            if slot is None:
                return False
            reuse = 0
            if session is not None:
                seq.meta["reprefilled"] = True
        # At least one token is prefilled: its logits give the first sample.
        reuse = min(reuse, len(seq.input_ids) - 1)
        if seq.session_id is not None:
            session = session or Session(slot=slot, cached_ids=[], last_used=0)
            session.slot, session.busy = slot, True
            self.sessions[seq.session_id] = session
        seq.slot, seq.prefilled = slot, reuse
        seq.meta["cached_tokens"] = reuse
        self.lengths[slot] = reuse
        self.rows[slot] = seq
        return True

    def _free_row(self) -> int | None:
        """A free row; else (when evicting) the least recently used parked session's
        row, evicting it; else None."""
        for slot, owner in enumerate(self.rows):
            if owner is None:
                return slot
        parked = [(self.sessions[o].last_used, slot) for slot, o in enumerate(self.rows)
                  if isinstance(o, str)]
        if not parked or not self.evict_parked:
            return None
        _, slot = min(parked)
        evicted = self.sessions[self.rows[slot]]
        evicted.slot, evicted.cached_ids = None, []
        self.rows[slot] = None
        self.stats["evictions"] += 1
        return slot

    def release(self, seq: Occupant) -> None:
        """Frees the sequence's row, or parks it for its session (which then caches the
        sequence's first `lengths[row]` ids: input then outputs)."""
        slot, seq.slot = seq.slot, None
        session = self.sessions.get(seq.session_id) if seq.session_id else None
        if session is None or session.ended:
            self.sessions.pop(seq.session_id, None)
            self.rows[slot] = None
            return
        session.busy = False
        session.cached_ids = list((seq.input_ids + tuple(seq.outputs))[:self.lengths[slot]])
        session.last_used = next(self._release_order)
        self.rows[slot] = seq.session_id

    def end_session(self, session_id: str) -> None:
        """Frees the session's parked row; a session with a request in flight ends when
        that request is released."""
        session = self.sessions.get(session_id)
        if session is None:
            return
        if session.busy:
            session.ended = True
            return
        del self.sessions[session_id]
        if session.slot is not None and self.rows[session.slot] == session_id:
            self.rows[session.slot] = None

    def end_idle_sessions(self) -> None:
        """Ends every session without a request in flight."""
        for session_id in [k for k, v in self.sessions.items() if not v.busy]:
            self.end_session(session_id)

    def clear(self) -> None:
        """Empties every row and forgets every session."""
        self.rows = [None] * len(self.rows)
        self.sessions.clear()
        self.lengths[:] = 0
