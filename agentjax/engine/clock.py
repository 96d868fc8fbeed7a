"""EngineClock: an Engine that forwards to another and measures its idle time.

    clock = EngineClock(engine)
    pool = RolloutPool(clock, ...)          # or pool.with_engine(clock)
    ...
    clock.idle_s()                          # seconds so far with no generate call out

An engine is idle while no `generate` call is outstanding: every episode is waiting on
its tool, or nobody is rolling out (the learner updates). It works for any Engine (the
in-process JaxEngine, an HTTP server pool), from any thread.
"""
from __future__ import annotations

import threading
import time
from typing import Any, Callable, Sequence

from agentjax.engine.protocol import Completion, Engine, GenerateRequest


class EngineClock:
    """Engine protocol over `engine`, counting idle seconds (module docstring).

    Args:
      engine: the engine every call goes to.
      clock: seconds, monotonic (tests pass a fake).
    """

    def __init__(self, engine: Engine, clock: Callable[[], float] = time.perf_counter):
        self.engine = engine
        self._clock = clock
        self._lock = threading.Lock()
        self._outstanding = 0
        self._idle = 0.0
        self._idle_since = clock()

    def idle_s(self) -> float:
        """Seconds since construction during which no generate call was outstanding."""
        with self._lock:
            if self._outstanding:
                return self._idle
            return self._idle + self._clock() - self._idle_since

    async def generate(self, requests: Sequence[GenerateRequest]) -> list[list[Completion]]:
        with self._lock:
            if not self._outstanding:
                self._idle += self._clock() - self._idle_since
            self._outstanding += 1
        try:
            return await self.engine.generate(requests)
        finally:
            with self._lock:
                self._outstanding -= 1
                if not self._outstanding:
                    self._idle_since = self._clock()

    def update_weights(self, weights: Any, *, version: int | None = None) -> None:
        self.engine.update_weights(weights, version=version)

    def health(self) -> bool:
        return self.engine.health()

    def end_session(self, session_id: str) -> None:
        self.engine.end_session(session_id)
