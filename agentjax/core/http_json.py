"""POST a JSON request to an HTTP peer and read its JSON reply, retrying what a retry
can heal.

The clients of this project's HTTP peers (envs.retrieval.HttpRetriever: a retrieval
server; rewards.judge_http.ChatJudgeModel: an OpenAI-compatible judge) share this one
policy: a connection error, a timeout, an HTTP 5xx or a reply of the wrong shape (or
larger than `max_bytes`: it is read in chunks and dropped past the limit, so a hostile
peer cannot fill the trainer's memory) is retried with exponential backoff; any status other than 200 and 5xx fails at once (a
client error does not heal on retry); after the last attempt the error names the URL
and the last failure.
"""
from __future__ import annotations

import json
import time
from typing import Any, Callable, TypeVar

import httpx

T = TypeVar("T")
MAX_REPLY_BYTES = 64 * 2**20  # far above any retrieval or judge reply


def post_json(client: httpx.Client, url: str, payload: Any, *, parse: Callable[[Any], T],
              error: type[Exception], retries: int, backoff_s: float,
              max_bytes: int = MAX_REPLY_BYTES) -> T:
    """`parse(reply JSON)` of the first attempt that gets a well-formed 200 reply.

    Args:
      client: the httpx client (its timeout applies to every attempt).
      url: where to POST.
      payload: the request, JSON-serializable; sent as ASCII JSON, so text holding a
        lone surrogate (no UTF-8 encoding) goes out as a \\ud800-style escape rather than
        failing to encode on every attempt.
      parse: reads the decoded reply; raises `error` ("malformed response: ...") when it
        is of the wrong shape, which is retried.
      error: the exception type raised (and the one `parse` raises).
      retries: extra attempts after a failed one.
      backoff_s: the first retry's delay in seconds, doubled for each further one.
      max_bytes: the largest reply body read.

    Raises:
      error: at once on an HTTP status other than 200 and 5xx; after `retries + 1`
        failed attempts otherwise.
    """
    body = json.dumps(payload).encode("ascii")
    failures = []
    for attempt in range(retries + 1):
        if attempt:
            time.sleep(backoff_s * 2 ** (attempt - 1))
        try:
            with client.stream("POST", url, content=body,
                               headers={"Content-Type": "application/json"}) as response:
                data = _read_at_most(response, max_bytes)
        except httpx.HTTPError as e:
            failures.append(f"{type(e).__name__}: {e}")
            continue
        if data is None:
            failures.append(f"malformed response: larger than {max_bytes} bytes")
            continue
        text = data[:200].decode("utf-8", "replace")
        if response.status_code >= 500:
            failures.append(f"HTTP {response.status_code}: {text}")
            continue
        if response.status_code != 200:
            raise error(f"{url}: HTTP {response.status_code}: {text}")
        try:
            reply = json.loads(data)
        except (ValueError, RecursionError) as e:  # not JSON (or nested past parsing)
            failures.append(f"malformed response: not JSON ({type(e).__name__})")
            continue
        try:
            return parse(reply)
        except error as e:
            failures.append(str(e))
    raise error(f"{url}: {retries + 1} attempts failed; last: {failures[-1]}")


def _read_at_most(response: httpx.Response, max_bytes: int) -> bytes | None:
    """The body of a streamed response, or None once it exceeds max_bytes."""
    chunks, size = [], 0
    for chunk in response.iter_bytes():
        size += len(chunk)
        if size > max_bytes:
            return None
        chunks.append(chunk)
    return b"".join(chunks)
