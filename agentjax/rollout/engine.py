"""The Engine protocol: token ids in, token ids + log-probs out.

Shaped after SGLang's native `/generate` API so that the in-process
JaxEngine and a pool of SGLang servers are interchangeable behind the agent loop.

Multi-turn: a request may carry a `session_id`. Its `input_ids` are then the whole
conversation so far (prompt, earlier outputs, observations), and an engine that keeps
per-session KV caches (JaxEngine) prefills only the tokens past what it has cached.
Engines without sessions (SGLang's radix cache reuses prefixes on its own) ignore it;
`end_session` tells an engine a session will not come back (the agent loop calls it when
an episode ends).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Protocol, Sequence, runtime_checkable


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """How to sample one request.

    Attributes:
      temperature: softmax temperature; 0 means greedy.
      top_p: nucleus sampling mass (1.0 disables it).
      top_k: keep the k most likely tokens (-1 disables it, as in SGLang).
      max_new_tokens: cap on generated tokens for this request.
      stop: stop strings; generation ends once the decoded output ends with one of
        them, and the stop string's tokens are kept in the output.
      stop_token_ids: token ids that end generation (kept in the output).
      n: number of samples for this request.
      seed: per-request seed for reproducible sampling (None: engine's stream).
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_new_tokens: int = 128
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    n: int = 1
    seed: int | None = None


@dataclasses.dataclass(frozen=True)
class GenerateRequest:
    """One generation request.

    Attributes:
      input_ids: the full context as token ids.
      sampling: the sampling parameters.
      session_id: optional multi-turn session key (see module docstring).
    """

    input_ids: Sequence[int]
    sampling: SamplingParams = SamplingParams()
    session_id: str | None = None


@dataclasses.dataclass
class Completion:
    """One sampled continuation.

    Attributes:
      output_ids: the generated token ids (stop tokens/strings included).
      logprobs: log-prob of each output token under the sampling distribution actually
        used (after temperature / top-k / top-p), aligned with output_ids.
      finish_reason: "stop" (stop id or string), "length" (max_new_tokens or context
        limit) or "abort" (engine error / cancelled).
      matched_stop: the stop token id or stop string that ended generation, else None.
      meta: engine-specific extras (e.g. cached_tokens, weight_version).
    """

    output_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    matched_stop: int | str | None = None
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)


@runtime_checkable
class Engine(Protocol):
    """What every rollout engine provides."""

    async def generate(self, requests: Sequence[GenerateRequest]) -> list[list[Completion]]:
        """Samples every request; returns, per request in order, its `n` completions."""

    def update_weights(self, weights: Any, *, version: int | None = None) -> None:
        """Swaps in new policy weights (params pytree in-process, or a checkpoint path)."""

    def health(self) -> bool:
        """True when the engine can serve requests."""

    def end_session(self, session_id: str) -> None:
        """Frees what the engine keeps for a session (no-op for engines without any)."""
