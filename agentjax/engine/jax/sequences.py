"""One completion the JaxEngine produces: its ids so far, its pages, its sampling key, its
stop conditions and the caller's future.

A request with n > 1 makes n sequences. The scheduler moves a sequence from waiting to in
flight and back (`engine/jax/scheduler.py`), the page table gives it pages
(`engine/jax/pages.py`), and each decode call's tokens are recorded here up to the first
that ends it (`SequenceState.record`). The caller's asyncio future is resolved from the
scheduler thread through its own event loop.

Pure Python: tests/engine/jax/test_sequences.py.
"""
from __future__ import annotations

import asyncio
import dataclasses
from typing import Any, Sequence

import numpy as np

from agentjax.engine.protocol import Completion, SamplingParams, reported_distribution


class StopStrings:
    """Detects the first token whose decoded text completes a stop string.

    Every byte of a stop string belongs to exactly one token, so an occurrence completed
    by the newest token lies within the last `window` tokens (window = longest stop
    string in bytes); only that window is decoded.
    """

    def __init__(self, tokenizer, stops: Sequence[str]):
        self.tokenizer = tokenizer
        self.stops = tuple(s for s in stops if s)
        self.window = max((len(s.encode("utf-8")) for s in self.stops), default=0) + 1

    def match(self, output_ids: Sequence[int]) -> str | None:
        if not self.stops:
            return None
        text = self.tokenizer.decode(list(output_ids[-self.window:]), skip_special_tokens=False)
        for stop in self.stops:
            if stop in text:
                return stop
        return None


@dataclasses.dataclass(eq=False)
class SequenceState:
    """One completion being produced (the page table's `Occupant`)."""

    input_ids: tuple[int, ...]
    sampling: SamplingParams
    session_id: str | None
    key: np.ndarray
    stop_ids: frozenset
    stop_strings: StopStrings
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    pages: list[int] = dataclasses.field(default_factory=list)
    length: int = 0  # slots of `pages` filled: the context ids but the last
    segments: list[tuple[int, int]] = dataclasses.field(default_factory=list)  # prefilled
    outputs: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    versions: list[int] = dataclasses.field(default_factory=list)  # weight version per output
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)
    cancelled: bool = False
    finished: bool = False

    def __post_init__(self):
        self.future.add_done_callback(self._mark_cancelled)

    def _mark_cancelled(self, future: asyncio.Future) -> None:
        if future.cancelled():
            self.cancelled = True

    @property
    def context_length(self) -> int:
        """Input and output ids so far."""
        return len(self.input_ids) + len(self.outputs)

    def context(self, start: int, stop: int) -> tuple[int, ...]:
        """Context ids [start, stop) (input then outputs), 0 <= start <= stop."""
        prompt = len(self.input_ids)
        if stop <= prompt:
            return self.input_ids[start:stop]
        return self.input_ids[start:] + tuple(self.outputs[max(start - prompt, 0):stop - prompt])

    @property
    def decoding(self) -> bool:
        """Every context id but the last is cached: the next decode step feeds it."""
        return self.length == self.context_length - 1

    def record(self, tokens: list[int], logprobs: list[float], *, max_len: int,
               version: int) -> tuple[str, Any] | None:
        """Records the tokens a decode call sampled (in order) up to the first that ends
        the sequence: a stop id, else a completed stop string, else its token budget or
        max_len. What was sampled after it is dropped, its slots left past `length`.
        Returns (finish reason, matched stop) when it ended, else None."""
        room = min(self.sampling.max_new_tokens - len(self.outputs),
                   max_len + 1 - self.context_length)
        end = min(len(tokens), room)
        stop = next((i for i, t in enumerate(tokens[:end]) if t in self.stop_ids), None)
        if stop is not None:
            end = stop + 1
        matched = None
        if self.stop_strings.stops:
            window = self.outputs[-self.stop_strings.window:]
            for i in range(end if stop is None else stop):
                matched = self.stop_strings.match(window + tokens[:i + 1])
                if matched is not None:
                    end = i + 1
                    break
        self.outputs += tokens[:end]
        self.logprobs += logprobs[:end]
        self.versions += [version] * end
        self.length += end  # the tokens fed are cached now
        if matched is not None:
            return "stop", matched
        if stop is not None:
            return "stop", tokens[stop]
        if end == room:
            return "length", None
        return None

    def resolve(self, reason: str, matched, *, version: int, error: str | None) -> None:
        """Hands the caller its Completion (from any thread; a caller whose event loop is
        gone gets nothing)."""
        self.finished = True
        meta = dict(self.meta, prompt_tokens=len(self.input_ids),
                    completion_tokens=len(self.outputs), weight_version=version,
                    logprob_distribution=reported_distribution("sampling", self.sampling),
                    token_versions=list(self.versions))
        if error is not None:
            meta["error"] = error
        completion = Completion(list(self.outputs), list(self.logprobs), reason, matched, meta)

        def set_result():
            if not self.future.done():
                self.future.set_result(completion)
        try:
            self.loop.call_soon_threadsafe(set_result)
        except RuntimeError:  # the caller's event loop is gone
            pass
