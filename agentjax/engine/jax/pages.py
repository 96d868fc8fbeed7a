"""The JaxEngine's host-side page table: which KV pages each sequence, parked session and
shared context holds, with reference counts and copy-on-write.

A sequence's cache is a list of pages (slot s at page s // page_size); `length` slots
are filled. Pages are allocated as tokens arrive and released when a sequence ends, so
the pool in use follows the tokens held; max_len is only a cap per request.

- Sessions (`GenerateRequest.session_id`): after a turn the session keeps its pages
  (not a batch row); its next request is checked token by token against the ids cached
  there and prefills only past the common prefix (`meta["cached_tokens"]`).
- Shared contexts: every sequence that prefills registers its context (all ids but the
  last, which its first decode step feeds) with how its slots were computed; a later
  sequence whose context and computation match shares those pages and prefills nothing
  (`meta["shared_prefix"]`). The G samples of a GRPO group thus prefill their prompt
  once, and at a later turn the samples that took the same actions and saw the same
  observations prefill that observation once; a sibling that arrives while the first
  is still prefilling waits for it.
- Provenance: a context is keyed by its ids and its prefill segments (start, end), the
  slots outside them having been written by decode steps. Chunk boundaries follow from
  a segment alone (`ProgramShapes.chunk_width`), so a shared page holds bitwise what the
  sequence would have computed itself in deterministic mode; the same ids reached
  through another split between decoded and prefilled slots are not shared.
- Copy-on-write: a page referenced twice is copied before a sequence writes into it
  (`prepare_writes` returns the copies for the engine to run on device).
- Reclaiming: when pages run out, shared contexts (least recently used first) are
  dropped, then (when eviction is allowed) parked sessions; an evicted session that
  returns is prefilled from scratch (`meta["reprefilled"]`).

Pure Python and numpy: tests/engine/jax/test_pages.py.
"""
from __future__ import annotations

import collections
import dataclasses
import itertools
from typing import Any, Protocol, Sequence

import numpy as np


class Occupant(Protocol):
    """What the table reads and writes on a sequence (the engine's `SequenceState`)."""

    input_ids: tuple[int, ...]
    outputs: list[int]
    session_id: str | None
    pages: list[int]
    length: int
    segments: list[tuple[int, int]]
    meta: dict[str, Any]


@dataclasses.dataclass(eq=False)
class Session:
    """A multi-turn session: its pages, the ids cached in them and the prefill segments
    that wrote them (the rest was decoded).

    busy: a request of the session is in flight; ended: `end_session` arrived while busy;
    last_used: when it was last parked (release order), for eviction.
    """

    pages: list[int]
    cached_ids: list[int]
    last_used: int
    segments: list[tuple[int, int]] = dataclasses.field(default_factory=list)
    busy: bool = False
    ended: bool = False


Key = tuple[tuple[int, ...], tuple[tuple[int, int], ...]]  # (context ids, prefill segments)


def written_before(segments: Sequence[tuple[int, int]], length: int) -> list[tuple[int, int]]:
    """The segments that wrote slots below `length` (a segment cut by it is kept whole:
    its slots below `length` were computed in its chunks)."""
    return [s for s in segments if s[0] < length]


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading ids `a` and `b` share."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class PageTable:
    """Pages, their reference counts, sessions and shared contexts (module docstring).

    Args:
      num_pages: pages in the device pool.
      page_size: slots per page.
      evict_parked: whether a parked session's pages may be reclaimed.
      stats: a counter that records "evictions", "shared_prefixes", "contexts_reclaimed".
      max_contexts: shared contexts kept at most (the least recently used go first).
    """

    def __init__(self, num_pages: int, page_size: int, *, evict_parked: bool,
                 stats: collections.Counter, max_contexts: int = 64):
        self.page_size = page_size
        self.evict_parked = evict_parked
        self.stats = stats
        self.max_contexts = max_contexts
        self.refs = np.zeros(num_pages, np.int32)
        # References the shared contexts hold (a page only they reference is reclaimable).
        self.context_refs = np.zeros(num_pages, np.int32)
        self._free = list(range(num_pages - 1, -1, -1))  # a stack: lowest ids first
        self.peak_in_use = 0
        self.sessions: dict[str, Session] = {}
        # A shared context's key -> its pages (held by the table), most recently used last.
        self.contexts: collections.OrderedDict[Key, list[int]] = collections.OrderedDict()
        self.prefilling: dict[Key, Occupant] = {}  # contexts being prefilled
        self._prefilling_key: dict[int, Key] = {}  # id(sequence) -> the context it prefills
        self._release_order = itertools.count(1)

    # ------------------------------------------------------------------ pages

    @property
    def num_pages(self) -> int:
        return len(self.refs)

    @property
    def in_use(self) -> int:
        return len(self.refs) - len(self._free)

    @property
    def free(self) -> int:
        return len(self._free)

    @property
    def held(self) -> int:
        """Pages a sequence or a parked session holds: in use, less those only shared
        contexts reference (a cache, reclaimed when pages run out)."""
        return int(np.count_nonzero(self.refs > self.context_refs))

    def pages_for(self, slots: int) -> int:
        return -(-slots // self.page_size)

    def _allocate(self) -> int:
        page = self._free.pop()
        self.refs[page] = 1
        self.peak_in_use = max(self.peak_in_use, self.in_use)
        return page

    def _retain(self, pages: Sequence[int]) -> None:
        for page in pages:
            self.refs[page] += 1

    def _release(self, pages: Sequence[int]) -> None:
        for page in pages:
            self.refs[page] -= 1
            assert self.refs[page] >= 0, page
            if self.refs[page] == 0:
                self._free.append(page)

    def writes_need(self, seq: Occupant, end: int) -> int:
        """Pages `prepare_writes(seq, end)` would allocate (new ones and copies)."""
        first, last = seq.length // self.page_size, self.pages_for(end)
        held = len(seq.pages)
        copies = sum(self.refs[seq.pages[j]] > 1 for j in range(first, min(last, held)))
        return copies + max(0, last - held)

    def prepare_writes(self, seq: Occupant, end: int) -> list[tuple[int, int]] | None:
        """Makes the pages of slots [seq.length, end) the sequence's own: allocates the
        missing ones and replaces shared ones by copies (reclaiming if needed). Returns
        the (source, destination) page copies to run on device, or None (nothing
        changed) when the pool cannot hold them."""
        if not self.reclaim(self.writes_need(seq, end)):
            return None
        copies = []
        for j in range(seq.length // self.page_size, self.pages_for(end)):
            if j == len(seq.pages):
                seq.pages.append(self._allocate())
            elif self.refs[seq.pages[j]] > 1:
                new = self._allocate()
                copies.append((seq.pages[j], new))
                self._release([seq.pages[j]])
                seq.pages[j] = new
        return copies

    def truncate(self, seq: Occupant, length: int) -> None:
        """Keeps the pages of the first `length` slots; sets seq.length."""
        keep = self.pages_for(length)
        self._release(seq.pages[keep:])
        del seq.pages[keep:]
        seq.length = length

    def reclaim(self, needed: int) -> bool:
        """Frees pages until `needed` are free: shared contexts first (least recently used),
        then parked sessions when eviction is allowed. False if it cannot.

        A context whose every page a sequence, a session or another context still holds
        frees nothing when dropped (a group's prompt while its samples run), so the
        contexts that free a page go first."""
        for key in list(self.contexts):
            if self.free >= needed:
                break
            if (self.refs[self.contexts[key]] == 1).any():
                self._drop_context(self.contexts.pop(key))
                self.stats["contexts_reclaimed"] += 1
        while self.free < needed and self.contexts:
            self._drop_context(self.contexts.popitem(last=False)[1])
            self.stats["contexts_reclaimed"] += 1
        if self.free < needed and self.evict_parked:
            parked = sorted((s.last_used, sid) for sid, s in self.sessions.items()
                            if not s.busy and s.pages)
            for _, sid in parked:
                if self.free >= needed:
                    break
                session = self.sessions[sid]
                self._release(session.pages)
                session.pages, session.cached_ids, session.segments = [], [], []
                self.stats["evictions"] += 1
        return self.free >= needed

    # ------------------------------------------------------------------ sequences

    def admit(self, seq: Occupant, decode_steps: int) -> bool:
        """Gives a waiting sequence its cached prefix (its session's pages, or a shared
        context) and the pages to prefill the rest and run one decode round. False (and
        nothing changed) if its session is busy, its context is being prefilled by
        another sequence, or the pool cannot hold it."""
        session = self.sessions.get(seq.session_id) if seq.session_id else None
        if session is not None and session.busy:
            return False  # one request per session at a time
        # A preempted sequence comes back with outputs: its context is input + outputs.
        ids = tuple(seq.input_ids) + tuple(seq.outputs)
        context = len(ids) - 1  # slots prefill fills; the last id is decoded
        cached = session is not None and bool(session.pages)
        reuse = min(common_prefix(session.cached_ids, ids), context) if cached else 0
        mismatch = cached and reuse < len(session.cached_ids)
        segments = written_before(session.segments, reuse) if cached else []
        if reuse < context:
            segments.append((reuse, context))
        key = (ids[:context], tuple(segments))
        shared = None
        if reuse < context:
            if key in self.prefilling:
                return False  # a sibling prefills it: share its pages once it is done
            shared = self.contexts.get(key)
        if shared is not None:
            self.contexts.move_to_end(key)
            seq.pages = list(shared)
            self._retain(seq.pages)
            length = context
        elif cached:
            # The session's references pass to the sequence (so reclaiming cannot take them).
            seq.pages, session.pages = session.pages, []
            length = reuse
        else:
            seq.pages, length = [], 0
        self.truncate(seq, length)
        if not self.reclaim(self.writes_need(seq, context + decode_steps)):
            if shared is None and cached:  # the session keeps what it shares with this request
                session.pages = seq.pages
                session.cached_ids = session.cached_ids[:reuse]
                session.segments = written_before(session.segments, reuse)
            else:
                self._release(seq.pages)
            seq.pages, seq.length = [], 0
            return False
        # Reserve the pages (copies of shared ones are made when first written).
        while len(seq.pages) < self.pages_for(context + decode_steps):
            seq.pages.append(self._allocate())
        if cached:
            seq.meta["prefix_mismatch"] = mismatch
            self._release(session.pages)  # what a shared context replaced
        if shared is not None:
            seq.meta["shared_prefix"] = True
            self.stats["shared_prefixes"] += 1
        if session is not None and not cached:
            seq.meta["reprefilled"] = True
        if seq.session_id is not None:
            self.sessions[seq.session_id] = Session(pages=[], cached_ids=[], last_used=0,
                                                    busy=True)
        seq.meta["cached_tokens"] = length
        seq.segments = segments
        if length < context:
            self.prefilling[key] = seq
            self._prefilling_key[id(seq)] = key
        return True

    def prefilled(self, seq: Occupant) -> None:
        """Called when a sequence has prefilled its whole context: shares it if it
        registered it (the shared context holds its own references)."""
        key = self._unregister(seq)
        if key is None:
            return
        pages = seq.pages[:self.pages_for(len(key[0]))]
        self._retain(pages)
        self.context_refs[pages] += 1
        self.contexts[key] = pages
        while len(self.contexts) > self.max_contexts:
            self._drop_context(self.contexts.popitem(last=False)[1])

    def _drop_context(self, pages: list[int]) -> None:
        self.context_refs[pages] -= 1
        self._release(pages)

    def recompute(self, seq: Occupant) -> None:
        """Drops every slot of a sequence in flight, which prefills its context again."""
        self._unregister(seq)
        self.truncate(seq, 0)
        seq.segments = [(0, len(seq.input_ids) + len(seq.outputs) - 1)]

    def release(self, seq: Occupant, *, park: bool = True) -> None:
        """Frees the sequence's pages, or parks them in its session (which then caches
        the first `seq.length` ids of input then outputs)."""
        self._unregister(seq)
        session = self.sessions.get(seq.session_id) if seq.session_id else None
        if session is None or session.ended or not park:
            if session is not None:
                del self.sessions[seq.session_id]
            self._release(seq.pages)
        else:
            self.truncate(seq, seq.length)
            session.pages, session.busy = list(seq.pages), False
            session.cached_ids = list((seq.input_ids + tuple(seq.outputs))[:seq.length])
            session.segments = written_before(seq.segments, seq.length)
            session.last_used = next(self._release_order)
        seq.pages, seq.length = [], 0

    def _unregister(self, seq: Occupant) -> Key | None:
        """Forgets that `seq` prefills a context for sharing; returns that context's key
        (None: it prefills none)."""
        key = self._prefilling_key.pop(id(seq), None)
        if key is not None:
            del self.prefilling[key]
        return key

    def end_session(self, session_id: str) -> None:
        """Frees a parked session's pages; a session with a request in flight ends when
        that request is released."""
        session = self.sessions.get(session_id)
        if session is None:
            return
        if session.busy:
            session.ended = True
            return
        del self.sessions[session_id]
        self._release(session.pages)

    def drop_cached(self) -> None:
        """Ends every idle session and drops every shared context (their pages hold keys
        of old weights)."""
        for session_id in [k for k, v in self.sessions.items() if not v.busy]:
            self.end_session(session_id)
        while self.contexts:
            self._drop_context(self.contexts.popitem()[1])
        self.prefilling.clear()
        self._prefilling_key.clear()

    def clear(self) -> None:
        """Forgets everything: every page is free."""
        self.sessions.clear()
        self.contexts.clear()
        self.prefilling.clear()
        self._prefilling_key.clear()
        self.refs[:] = 0
        self.context_refs[:] = 0
        self._free = list(range(len(self.refs) - 1, -1, -1))
