"""The JaxEngine's scheduler: one thread, its inbox and its two queues (waiting and in
flight).

Each turn of its loop takes in what the inbox holds (blocking while idle, then waiting
`batch_wait_s` after the first request to gather concurrent callers), admits waiting
sequences while rows and pages allow (those whose session holds pages first), runs
prefill rounds, admitting again after each (the siblings of a prompt just prefilled
share it at once), then one decode round (`engine/jax/rounds.py`). Sequences finish
independently; the caller's future is resolved from this thread.

Control messages (a weight swap, `warmup`) run between rounds; the caller waits for
them. After a swap no page written by the old weights is attended again: parked sessions
and shared contexts end, and each sequence in flight prefills its context again
(`meta["recomputed"]`).

When pages run out for every sequence in flight, the most recent one is preempted (it
prefills again when pages free up) or, in deterministic mode, aborted; a request that can
never fit, or that finds the pool held by parked sessions deterministic mode may not
evict, is aborted with the reason. An exception in the loop aborts what is in flight and
the loop goes on.
"""
from __future__ import annotations

import collections
import queue
import threading
import time
import traceback
from typing import Any

from agentjax.engine.jax.calls import DeviceCalls
from agentjax.engine.jax.pages import PageTable
from agentjax.engine.jax.rounds import Rounds
from agentjax.engine.jax.sequences import SequenceState
from agentjax.engine.jax.stats import EngineStats


class Scheduler:
    """The scheduler thread and its queues (module docstring).

    Args:
      rounds: the prefill and decode rounds.
      device: the program calls (weights swapped here; reset after an error).
      table: the page table.
      stats: the counters and clock.
      max_slots: sequences in flight at once.
      max_len: most context ids of a sequence.
      decode_steps: tokens per decode call (a sequence is admitted with pages for one).
      batch_wait_s: when idle, how long to wait after a request for concurrent ones.
      deterministic: abort rather than preempt a sequence when pages run out.
    """

    def __init__(self, rounds: Rounds, device: DeviceCalls, table: PageTable,
                 stats: EngineStats, *, max_slots: int, max_len: int, decode_steps: int,
                 batch_wait_s: float, deterministic: bool):
        self._rounds = rounds
        self._device = device
        self._table = table
        self._stats = stats
        self._max_slots = max_slots
        self._max_len = max_len
        self._decode_steps = decode_steps
        self._batch_wait_s = batch_wait_s
        self._deterministic = deterministic
        self._in_flight: list[SequenceState] = []
        self._waiting: collections.deque[SequenceState] = collections.deque()
        self._inbox: queue.Queue = queue.Queue()
        self.weight_version = 0
        self.stopped = False
        self._thread = threading.Thread(target=self._serve, name="jax-engine", daemon=True)
        self._thread.start()

    # ---------------------------------------------------------------- other threads

    @property
    def running(self) -> bool:
        """True until `stop`, while the thread runs."""
        return not self.stopped and self._thread.is_alive()

    def submit(self, seq: SequenceState) -> None:
        self._inbox.put(("sequence", seq))

    def end_session(self, session_id: str) -> None:
        """Frees the session's pages (asynchronously, in the scheduler thread)."""
        self._inbox.put(("end_session", session_id))

    def call(self, kind: str, payload: Any) -> None:
        """Posts a control message ("warmup", or "weights" with (weights, version)) and
        waits until the thread has run it; re-raises what it raised."""
        done, outcome = threading.Event(), {}
        self._inbox.put((kind, (payload, done, outcome)))
        while not done.wait(timeout=1.0):
            if not self.running:
                raise RuntimeError(f"{kind}: the engine is not running")
        if "error" in outcome:
            raise RuntimeError(f"{kind} failed in the engine thread") from outcome["error"]

    def stop(self) -> None:
        """Stops the thread; in-flight requests are aborted."""
        if not self.stopped:
            self.stopped = True
            self._inbox.put(("stop", None))
            self._thread.join(timeout=30)

    # ---------------------------------------------------------------- the thread

    def _serve(self) -> None:
        while True:
            try:
                if not self._receive():
                    break
                progressed = False
                while True:  # prefill first, admitting as it goes
                    self._drop_cancelled()  # a long prompt's caller may give up meanwhile
                    self._admit()
                    if not self._rounds.prefill(self._in_flight):
                        break
                    progressed = True
                progressed = self._rounds.decode(
                    self._in_flight, version=self.weight_version, finish=self._finish,
                    quiet=self._quiet) or progressed
                if self._in_flight and not progressed:
                    self._resolve_starvation()
            except Exception as error:  # noqa: BLE001 - never let the thread die
                self._abort_all(f"engine error: {type(error).__name__}: {error}",
                                traceback.format_exc())
        self._abort_all("engine closed", None)

    def _receive(self) -> bool:
        """Handles inbox messages (blocking while idle); False once asked to stop."""
        messages = []
        if not self._waiting and not self._in_flight:
            self._stats.idle()
            messages.append(self._inbox.get())
            deadline = time.perf_counter() + self._batch_wait_s
            while messages[-1][0] == "sequence" and (left := deadline - time.perf_counter()) > 0:
                try:
                    messages.append(self._inbox.get(timeout=left))
                except queue.Empty:
                    break
        while True:
            try:
                messages.append(self._inbox.get_nowait())
            except queue.Empty:
                break
        for kind, payload in messages:
            if kind == "stop":
                return False
            if kind == "sequence":
                self._enqueue(payload)
            elif kind == "end_session":
                self._table.end_session(payload)
            else:
                self._control(kind, *payload)
        return True

    def _quiet(self) -> bool:
        """Nothing needs the scheduler before the next decode call: no message to take
        in, no waiting sequence a free row could admit, no cancellation. With every row
        busy, waiting sequences wait either way."""
        admissible = self._waiting and len(self._in_flight) < self._max_slots
        return (not admissible and self._inbox.empty()
                and not any(seq.cancelled for seq in self._in_flight))

    def _control(self, kind: str, payload: Any, done: threading.Event, outcome: dict) -> None:
        """Runs a `call` message."""
        try:
            if kind == "warmup":
                self._rounds.warmup()
            else:
                self._swap_weights(*payload)
        except Exception as error:  # noqa: BLE001 - handed to the waiting caller
            outcome["error"] = error
        finally:
            done.set()

    def _swap_weights(self, weights, version: int | None) -> None:
        """Swaps the weights in; no page written by the old ones is attended again."""
        self._device.weights = weights
        self.weight_version = self.weight_version + 1 if version is None else version
        self._table.drop_cached()
        for seq in self._in_flight:
            if seq.length:
                seq.meta["recomputed"] = seq.meta.get("recomputed", 0) + 1
            self._table.recompute(seq)

    def _enqueue(self, seq: SequenceState) -> None:
        if len(seq.input_ids) > self._max_len:
            self._finish(seq, "abort", None, error=(
                f"input of {len(seq.input_ids)} tokens does not fit max_len={self._max_len}"))
            return
        need = self._table.pages_for(len(seq.input_ids) - 1 + self._decode_steps)
        if need > self._table.num_pages:
            self._finish(seq, "abort", None, error=(
                f"input of {len(seq.input_ids)} tokens needs {need} KV pages, the pool has "
                f"kv_pages={self._table.num_pages} of {self._table.page_size} slots"))
            return
        seq.meta["weight_version_start"] = self.weight_version
        self._waiting.append(seq)

    def _drop_cancelled(self) -> None:
        self._waiting = collections.deque(s for s in self._waiting if not s.cancelled)
        for seq in [s for s in self._in_flight if s.cancelled]:
            self._release(seq)

    def _release(self, seq: SequenceState) -> None:
        self._in_flight.remove(seq)
        self._table.release(seq)

    def _admit(self) -> None:
        """Moves waiting sequences in flight (those whose session holds pages first),
        while rows and pages allow (`PageTable.admit`)."""
        sessions = self._table.sessions
        ordered = sorted(self._waiting, key=lambda s: not (
            s.session_id in sessions and bool(sessions[s.session_id].pages)))
        still_waiting = collections.deque()
        for seq in ordered:
            if (len(self._in_flight) < self._max_slots
                    and self._table.admit(seq, self._decode_steps)):
                self._in_flight.append(seq)
            else:
                still_waiting.append(seq)
        if still_waiting and not self._in_flight:
            # Nothing in flight will free pages: the pool is held by parked sessions that
            # may not be evicted (deterministic mode). Waiting would hang the caller.
            for seq in still_waiting:
                self._finish(seq, "abort", None, error=(
                    f"JaxEngine: the KV pool ({self._pool()}) is held by {len(sessions)} "
                    f"parked sessions, which deterministic mode never evicts; "
                    f"end_session() finished ones or raise kv_pages"))
            still_waiting.clear()
        self._waiting = still_waiting

    def _resolve_starvation(self) -> None:
        """No sequence in flight could get pages for its next round: free some. Default
        mode preempts the most recent sequence (it prefills its context again when
        pages free up); deterministic mode aborts it (a recomputed context would change
        its later outputs)."""
        seq = self._in_flight[-1]
        if self._deterministic:
            self._finish(seq, "abort", None, error=(
                f"JaxEngine: the KV pool ({self._pool()}) ran out with "
                f"{len(self._in_flight)} sequences in flight; raise kv_pages or lower "
                f"max_slots"))
            return
        self._stats.counter["preemptions"] += 1
        seq.meta["preempted"] = seq.meta.get("preempted", 0) + 1
        self._table.truncate(seq, 0)
        self._release(seq)
        self._waiting.appendleft(seq)

    def _pool(self) -> str:
        return f"{self._table.num_pages} pages of {self._table.page_size} slots"

    def _finish(self, seq: SequenceState, reason: str, matched,
                error: str | None = None) -> None:
        if seq in self._in_flight:
            self._release(seq)
        seq.resolve(reason, matched, version=self.weight_version, error=error)

    def _abort_all(self, message: str, details: str | None) -> None:
        seqs = list(self._waiting) + self._in_flight
        self._waiting.clear()
        self._in_flight = []
        self._stats.reset()
        self._table.clear()
        for seq in seqs:
            seq.pages, seq.length = [], 0
            seq.meta["traceback"] = details
            self._finish(seq, "abort", None, error=message)
        if details is not None:  # buffers may have been donated to the failed call
            self._device.reset()
