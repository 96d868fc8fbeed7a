"""What the endpoint records for a training run: each session's calls, in order.

A rollout opens a session, its agent's calls through `/sessions/<id>/v1/...` are each
recorded as a `RecordedCall` (the exact ids the engine saw and sampled), and the rollout
closes the session to take them; a closed or reused session id is refused.
"""
from __future__ import annotations

import dataclasses
import threading


@dataclasses.dataclass(frozen=True)
class RecordedCall:
    prompt_ids: tuple[int, ...]          # exactly the ids given to the engine
    completion_ids: tuple[int, ...]      # as sampled (stop token included)
    logprobs: tuple[float, ...]          # aligned with completion_ids
    versions: tuple[int, ...]            # per-token weight version (loop.sampled_versions)
    finish_reason: str                   # "stop" | "length" | "abort"
    weight_version: int | str
    messages: tuple[dict, ...]           # the request's messages, as sent
    tools: tuple[dict, ...]              # the request's tools ("" none)
    logprob_distribution: str            # Completion.meta["logprob_distribution"]


class Sessions:
    """The open sessions and their calls; thread-safe (the app and the runner share it)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._open: dict[str, list[RecordedCall]] = {}
        self._used: set[str] = set()

    def open(self, session_id: str) -> None:
        """Starts recording `session_id`; ValueError if it is open or was used before."""
        with self._lock:
            if session_id in self._used:
                raise ValueError(f"session {session_id!r} is open or was used already")
            self._used.add(session_id)
            self._open[session_id] = []

    def record(self, session_id: str, call: RecordedCall) -> None:
        """Appends a call; KeyError if the session is not open."""
        with self._lock:
            if session_id not in self._open:
                raise KeyError(f"session {session_id!r} is not open")
            self._open[session_id].append(call)

    def close(self, session_id: str) -> list[RecordedCall]:
        """Ends the session and returns its calls in order; further calls are refused."""
        with self._lock:
            return self._open.pop(session_id)
