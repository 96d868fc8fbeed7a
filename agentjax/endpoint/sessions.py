"""Per-rollout recording of the calls made through the OpenAI-compatible endpoint.

    sessions = Sessions()
    sessions.open("rollout-17")            # before the agent gets its base URL
    ...                                    # the agent's calls land in the session
    calls = sessions.close("rollout-17")   # the RecordedCalls, in the order they ended

A session id is used once: a call to an id never opened, or to one already closed, is
refused (`UnknownSession`, `SessionClosed`) and nothing is recorded, so a straggling
call of a finished rollout (a background task the agent left running, a client retry)
can never add tokens to another rollout's data. Closing a session runs its close hooks:
the app cancels the session's calls still in flight and frees the engine's KV cache of
the session.

Thread-safe: the app records from the event loop, a runner may open and close from
another thread.
"""
from __future__ import annotations

import dataclasses
import re
import threading
from typing import Any, Callable

# What an id may hold: it travels in a URL path (`/sessions/<id>/v1`).
_SESSION_ID = re.compile(r"[A-Za-z0-9._~:@-]{1,256}")


@dataclasses.dataclass(frozen=True)
class RecordedCall:
    """One chat-completion call, as the engine saw it.

    Attributes:
      prompt_ids: exactly the ids given to the engine (the chat template's rendering of
        `messages` and `tools`).
      completion_ids: as sampled, the stop token included; () for an aborted call (the
        engine hands back no partial output).
      logprobs: the engine's log-prob of each completion id (aligned with them), under
        `logprob_distribution`.
      versions: the weight version that sampled each completion id (`sampled_versions`);
        () where the engine reports no integer version.
      finish_reason: "stop", "length", or "abort" (the client went away, or the engine
        aborted the request): an aborted call is no training data.
      weight_version: the engine's weight version when the completion ended.
      messages: the request's messages, as sent.
      tools: the request's tools, as sent (() when none).
      logprob_distribution: what `logprobs` describe (Completion.meta
        "logprob_distribution"; "sampling" when the engine does not say, as the
        agent loop assumes).
    """

    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    versions: tuple[int, ...]
    finish_reason: str
    weight_version: int | str
    messages: tuple[dict, ...]
    tools: tuple[dict, ...]
    logprob_distribution: str


class SessionError(ValueError):
    """A session operation refused; `status` is the HTTP status the endpoint answers."""

    status = 400


class UnknownSession(SessionError):
    """The id was never opened."""

    status = 404


class SessionClosed(SessionError):
    """The id was opened and closed: it is never reused. 410 Gone rather than 409: the
    openai client retries a 409 (twice, with back-off), never a 410."""

    status = 410


class SessionInUse(SessionError):
    """`open` of an id that is open, or was used before."""

    status = 409


class Sessions:
    """The open sessions and their calls (module docstring)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._open: dict[str, list[RecordedCall]] = {}
        # Every id ever closed: reuse is refused for the life of the object (an id is a
        # few dozen bytes; a run of a million rollouts keeps some tens of MB).
        self._closed: set[str] = set()
        self._close_hooks: list[Callable[[str], Any]] = []

    def add_close_hook(self, hook: Callable[[str], Any]) -> None:
        """`hook(session_id)` runs after each close, in the closing thread (the app
        registers one that cancels the session's calls in flight and ends the engine's
        session)."""
        with self._lock:
            self._close_hooks.append(hook)

    def open(self, session_id: str) -> None:
        """Opens `session_id` for recording.

        Raises:
          SessionError: the id is not 1-256 characters of [A-Za-z0-9._~:@-].
          SessionInUse: the id is open or was closed before.
        """
        if not isinstance(session_id, str) or not _SESSION_ID.fullmatch(session_id):
            raise SessionError(f"session id {session_id!r} must be 1-256 characters of "
                               "letters, digits and ._~:@-")
        with self._lock:
            if session_id in self._open or session_id in self._closed:
                raise SessionInUse(f"session {session_id!r} is already open or was used")
            self._open[session_id] = []

    def check(self, session_id: str) -> None:
        """Raises UnknownSession or SessionClosed unless `session_id` is open."""
        with self._lock:
            self._check(session_id)

    def _check(self, session_id: str) -> None:
        if session_id in self._open:
            return
        if session_id in self._closed:
            raise SessionClosed(f"session {session_id!r} is closed: its rollout has ended")
        raise UnknownSession(f"session {session_id!r} was never opened")

    def record(self, session_id: str, call: RecordedCall) -> None:
        """Appends `call` to the open session (raises as `check` does otherwise)."""
        with self._lock:
            self._check(session_id)
            self._open[session_id].append(call)

    def calls(self, session_id: str) -> list[RecordedCall]:
        """The calls recorded so far in an open session (a copy)."""
        with self._lock:
            self._check(session_id)
            return list(self._open[session_id])

    def close(self, session_id: str) -> list[RecordedCall]:
        """Closes the session for good and returns its calls; further calls to it are
        refused. Raises as `check` does when the session is not open."""
        with self._lock:
            self._check(session_id)
            calls = self._open.pop(session_id)
            self._closed.add(session_id)
            hooks = list(self._close_hooks)
        for hook in hooks:
            hook(session_id)
        return calls

    def open_ids(self) -> list[str]:
        """The ids of the sessions open now."""
        with self._lock:
            return list(self._open)
