"""A scripted Engine and the openai clients of the endpoint tests."""
from __future__ import annotations

import asyncio
from typing import Callable

import httpx
import openai

from agentjax.engine.protocol import Completion, GenerateRequest

WEIGHT_VERSION = 3


class ScriptedEngine:
    """An Engine whose reply to a request is `script(request)` (text, encoded with the
    tokenizer, cut at max_new_tokens), after `latency_s`. Log-probs are -0.5 * (k + 1)
    for the k-th token of the whole run (distinct, so a misplaced one shows); weight
    version WEIGHT_VERSION, every token sampled by it. Records requests, the requests
    cancelled while they waited, and the sessions ended."""

    def __init__(self, tokenizer, script: Callable[[GenerateRequest], str], *,
                 latency_s: float = 0.0):
        self.tokenizer, self.script, self.latency_s = tokenizer, script, latency_s
        self.requests: list[GenerateRequest] = []
        self.completions: list[Completion] = []
        self.cancelled: list[GenerateRequest] = []
        self.ended_sessions: list[str] = []
        self.tokens = 0

    async def generate(self, requests):
        self.requests.extend(requests)
        try:
            await asyncio.sleep(self.latency_s)
        except asyncio.CancelledError:
            self.cancelled.extend(requests)
            raise
        out = []
        for request in requests:
            ids = self.tokenizer.encode(self.script(request), add_special_tokens=False)
            ids = ids[:request.sampling.max_new_tokens]
            stopped = bool(ids) and ids[-1] in request.sampling.stop_token_ids
            logprobs = [-0.5 * (self.tokens + k + 1) for k in range(len(ids))]
            self.tokens += len(ids)
            completion = Completion(ids, logprobs, "stop" if stopped else "length",
                                    ids[-1] if stopped else None,
                                    {"weight_version": WEIGHT_VERSION,
                                     "token_versions": [WEIGHT_VERSION] * len(ids),
                                     "logprob_distribution": "sampling"})
            self.completions.append(completion)
            out.append([completion])
        return out

    def update_weights(self, weights, *, version=None):
        raise NotImplementedError("the endpoint never updates weights")

    def health(self):
        return True

    def end_session(self, session_id):
        self.ended_sessions.append(session_id)


def in_process(app, base_url: str = "http://endpoint/v1") -> openai.AsyncOpenAI:
    """The real openai client, talking to `app` in-process (no retries: a test sees
    each answer as it is)."""
    transport = httpx.ASGITransport(app=app)
    return openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0,
                              http_client=httpx.AsyncClient(transport=transport,
                                                            timeout=60))
