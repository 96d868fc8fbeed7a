"""agentjax.core.http_json.post_json: a reply past max_bytes is dropped unread beyond the
limit and retried like a malformed one; a reply at the limit is read whole."""
import json

import httpx
import pytest

from agentjax.core.http_json import post_json


class PeerError(Exception):
    pass


def _post(body: bytes, max_bytes: int, calls: list):
    def handler(request):
        calls.append(request)
        return httpx.Response(200, content=body)
    with httpx.Client(transport=httpx.MockTransport(handler)) as client:
        return post_json(client, "http://peer.test/x", {"q": 1}, parse=lambda reply: reply,
                         error=PeerError, retries=2, backoff_s=0.001, max_bytes=max_bytes)


def test_a_reply_past_the_limit_is_refused_and_retried():
    calls = []
    with pytest.raises(PeerError, match=r"peer.test.*3 attempts failed.*larger than 1000 "
                                        r"bytes"):
        _post(b'"' + b"x" * 2000 + b'"', 1000, calls)
    assert len(calls) == 3


def test_a_reply_at_the_limit_is_read_whole():
    body = json.dumps({"result": "y" * 980}).encode()
    calls = []
    assert _post(body, len(body), calls) == {"result": "y" * 980} and len(calls) == 1
