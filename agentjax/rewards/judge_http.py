"""A judge model behind an OpenAI-compatible chat-completions server (SGLang, vLLM, ...).

    judge = LLMJudge(ChatJudgeModel("http://127.0.0.1:30000", "Qwen2.5-7B-Instruct"))

The judge prompt is sent as one user message (the server applies its model's chat
template) and `n` replies are asked for in one request:

    POST /v1/chat/completions
    {"model": ..., "messages": [{"role": "user", "content": prompt}], "n": n,
     "temperature": t, "max_tokens": m}
    -> {"choices": [{"message": {"content": "..."}, "finish_reason": "stop"}, ...]}

Failures follow `agentjax.core.http_json.post_json`: connection errors, timeouts, HTTP 5xx and
replies of the wrong shape are retried, then raise JudgeError naming the URL; an HTTP 4xx
(a model name the server does not serve, say) raises at once.
"""
from __future__ import annotations

import asyncio
import functools
from typing import Any

import httpx

from agentjax.core.http_json import post_json
from agentjax.rewards.judge import JudgeError

CHAT_PATH = "/v1/chat/completions"


class ChatJudgeModel:
    """Asks an OpenAI-compatible chat endpoint (a `judge.JudgeModel`).

    Args:
      url: the server, "http://host:port" (CHAT_PATH is appended) or the full endpoint URL.
      model: the model name the server serves (its `--served-model-name`).
      temperature: sampling temperature of the replies.
      max_tokens: most tokens per reply.
      timeout_s: per-request timeout (connect, read and write).
      retries: extra attempts after a failed request; backoff_s: the first retry's delay.
      transport: an httpx transport to send requests through (default: TCP).

    Safe to use from many threads (they share one connection pool).
    """

    def __init__(self, url: str, model: str, *, temperature: float = 0.0,
                 max_tokens: int = 256, timeout_s: float = 60.0, retries: int = 2,
                 backoff_s: float = 0.5, transport: httpx.BaseTransport | None = None):
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"judge url must start with http:// or https://, got {url!r}")
        if not model:
            raise ValueError("ChatJudgeModel needs the model name the server serves")
        if httpx.URL(url).path in ("", "/"):
            url = url.rstrip("/") + CHAT_PATH
        self.url, self.model = url, model
        self.temperature, self.max_tokens = temperature, max_tokens
        self.retries, self.backoff_s = retries, backoff_s
        self._client = httpx.Client(timeout=timeout_s, transport=transport)

    async def complete(self, prompt: str, n: int) -> list[str | None]:
        """`n` replies to `prompt` (None for a reply without text)."""
        return await asyncio.to_thread(self._post, prompt, n)

    def _post(self, prompt: str, n: int) -> list[str | None]:
        payload = {"model": self.model, "messages": [{"role": "user", "content": prompt}],
                   "n": n, "temperature": self.temperature, "max_tokens": self.max_tokens}
        return post_json(self._client, self.url, payload,
                         parse=functools.partial(_parse_choices, n=n), error=JudgeError,
                         retries=self.retries, backoff_s=self.backoff_s)

    def close(self) -> None:
        """Closes the connection pool."""
        self._client.close()


def _parse_choices(body: Any, n: int) -> list[str | None]:
    """The `n` reply texts of a chat-completions body; JudgeError("malformed response:
    ...") when it has another shape."""
    choices = body.get("choices") if isinstance(body, dict) else None
    if not isinstance(choices, list) or len(choices) != n:
        got = len(choices) if isinstance(choices, list) else "no"
        raise JudgeError(f'malformed response: expected {{"choices": [...]}} with {n} '
                         f"replies, got {got}")
    texts = []
    for i, choice in enumerate(choices):
        message = choice.get("message") if isinstance(choice, dict) else None
        if not isinstance(message, dict) or not isinstance(message.get("content"),
                                                            (str, type(None))):
            raise JudgeError(f"malformed response: choices[{i}] has no message with "
                             "string content")
        texts.append(message.get("content"))
    return texts
