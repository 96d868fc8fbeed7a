"""The Engine protocol: token ids in, token ids + log-probs out.

Shaped after SGLang's native `/generate` API so that the in-process
JaxEngine and a pool of SGLang servers are interchangeable behind the agent loop.

Multi-turn: a request may carry a `session_id`. Its `input_ids` are then the whole
conversation so far (prompt, earlier outputs, observations), and an engine that keeps
per-session KV caches (JaxEngine) prefills only the tokens past what it has cached.
Engines without sessions (SGLang's radix cache reuses prefixes on its own) ignore it;
`end_session` tells an engine a session will not come back (the agent loop calls it when
an episode ends).

An engine that cannot serve at all (every server of a pool unreachable past its grace
time) raises `EnginesUnavailable`; the agent loop and the pool let it through instead of
flagging episodes, so the trainer can checkpoint and exit.
"""
from __future__ import annotations

import dataclasses
import operator
from typing import Any, Protocol, Sequence, runtime_checkable

from agentjax.config.choices import LOGPROB_DISTRIBUTIONS


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
      logprobs: log-prob of each output token, aligned with output_ids, under the
        distribution named by meta["logprob_distribution"] (`reported_distribution`).
      finish_reason: "stop" (stop id or string), "length" (max_new_tokens or context
        limit) or "abort" (engine error / cancelled).
      matched_stop: the stop token id or stop string that ended generation, else None.
      meta: extras. Both engines set weight_version (the version of the weights that
        produced the completion), prompt_tokens, completion_tokens and
        logprob_distribution, one of LOGPROB_DISTRIBUTIONS:
          "sampling": the distribution the token was drawn from (after temperature,
            top-k and top-p, renormalized);
          "temperature": log_softmax(logits / temperature) over the whole vocabulary,
            before top-k / top-p (it differs from "sampling" on a truncated step by the
            log of the kept probability mass);
          "raw": log_softmax(logits), before temperature too (what greedy requests
            report: their sampling distribution is a point mass).
        Engines add their own (cached_tokens, the server that answered, an abort's
        error, ...). Where the weights can change while a completion decodes (the
        JaxEngine swaps between decode rounds), "token_versions" is the version that
        sampled each output token (weight_version is then the version at the end).
    """

    output_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    matched_stop: int | str | None = None
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)


def reported_distribution(engine_distribution: str, sampling: SamplingParams) -> str:
    """The distribution a completion's log-probs describe (LOGPROB_DISTRIBUTIONS).

    Args:
      engine_distribution: what the engine computes its log-probs from for sampled
        (temperature > 0) requests; a narrower name applies when it coincides with a
        wider one: "temperature" is "sampling" when neither top-k nor top-p truncates,
        "raw" is "temperature" at temperature 1.
      sampling: the request's sampling parameters.
    """
    if engine_distribution not in LOGPROB_DISTRIBUTIONS:
        raise ValueError(f"logprob distribution {engine_distribution!r} is not one of "
                         f"{LOGPROB_DISTRIBUTIONS}")
    if sampling.temperature <= 0:
        return "raw"
    if engine_distribution == "raw" and sampling.temperature == 1.0:
        engine_distribution = "temperature"
    truncated = sampling.top_k > 0 or sampling.top_p < 1.0
    if engine_distribution == "temperature" and not truncated:
        return "sampling"
    return engine_distribution


def sampled_versions(completion: Completion) -> list[int]:
    """The weight version that sampled each output token: the engine's per-token report
    (`token_versions`), else its one integer `weight_version` for every token, else []
    (a server that names its weights otherwise, e.g. SGLang's "default")."""
    meta = completion.meta
    if "token_versions" in meta:
        return [int(v) for v in meta["token_versions"]]
    version = meta.get("weight_version")
    if isinstance(version, int) and not isinstance(version, bool):
        return [version] * len(completion.output_ids)
    return []


class EnginesUnavailable(RuntimeError):
    """No engine can serve requests (e.g. every server of a pool stayed unreachable past
    its grace time); the message names them. Not an episode's failure: it ends the
    rollout, so the trainer can save a checkpoint and exit."""


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


def check_request(index: int, request: GenerateRequest) -> str:
    """ValueError naming `requests[index]` unless every engine can take the request:
    token ids, at least one sample of at least one token, a valid temperature and top_p,
    one sample per session turn. Returns that name for an engine's own checks."""
    s = request.sampling
    where = f"requests[{index}]"
    try:
        ids = list(map(operator.index, request.input_ids))
    except TypeError:
        ids = []
    if not ids or min(ids) < 0:
        raise ValueError(f"{where}.input_ids must be a non-empty sequence of token ids")
    if s.n < 1 or s.max_new_tokens < 1:
        raise ValueError(f"{where}: n and max_new_tokens must be >= 1")
    if s.temperature < 0 or not 0 < s.top_p <= 1:
        raise ValueError(f"{where}: need temperature >= 0 and 0 < top_p <= 1")
    if request.session_id is not None and s.n != 1:
        raise ValueError(f"{where}: a session request must have n == 1")
    return where
