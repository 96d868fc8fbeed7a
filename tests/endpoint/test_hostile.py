"""Hostile inputs to the endpoint: bodies that are not JSON or not a chat request,
unknown roles, a 5 MB message, 1,000 concurrent sessions, session ids never opened or
reused after their rollout closed, a client that disconnects mid-call (in-process and
over TCP to a real uvicorn server) and a session closed mid-call. Each gets a 4xx in
OpenAI's error shape, or a clean abort, and the next call is answered."""
import asyncio
import socket
import threading
import time

import httpx
import openai
import pytest
import uvicorn

from agentjax.endpoint import app as endpoint_app
from agentjax.endpoint.app import build_app
from agentjax.endpoint.sessions import SessionInUse, Sessions
from agentjax.engine.protocol import Completion, SamplingParams
from agentjax.models import chat
from tests.endpoint.fakes import ScriptedEngine, in_process

HELLO = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def make(tokenizer, *, latency_s=0.0, max_context=512):
    engine = ScriptedEngine(tokenizer, lambda request: f"fox {request.session_id}",
                            latency_s=latency_s)
    sessions = Sessions()
    app = build_app(engine, tokenizer, sessions=sessions, max_context=max_context,
                    model_name="m", sampling_defaults=SamplingParams(max_new_tokens=8))
    return engine, sessions, app


def raw_client(app) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://e",
                             timeout=60)


def assert_error(response: httpx.Response, status: int, param=None, code=None):
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert error["type"] == "invalid_request_error"
    assert (error["param"], error["code"]) == (param, code), error


@pytest.mark.parametrize("body, param", [
    (b'{"model": "m", "messages": [', None),
    (b"\xff\xfe not utf-8", None),
    (b"[1, 2]", None),
    (b"[" * 100_000 + b"]" * 100_000, None),
    (b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "metadata": '
     + b"[" * 100 + b"]" * 100 + b"}", None),
    (b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "seed": '
     + b"9" * 5000 + b"}", None),
    (b'{"model": "m"}', "messages"),
    (b'{"model": "m", "messages": []}', "messages"),
    (b'{"model": "m", "messages": "hi"}', "messages"),
    (b'{"model": "m", "messages": [{"role": "wizard", "content": "hi"}]}',
     "messages[0].role"),
    (b'{"model": "m", "messages": [{"role": "function", "content": "hi"}]}',
     "messages[0].role"),
    (b'{"model": "m", "messages": [{"role": "user", "content": 7}]}',
     "messages[0].content"),
    (b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}',
     "temperature"),
    (b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": [{"type": '
     b'"retrieval"}]}', "tools[0]"),
])
def test_bad_bodies_are_400s_and_the_next_call_is_answered(tokenizer, body, param):
    engine, sessions, app = make(tokenizer)
    sessions.open("s")

    async def calls():
        async with raw_client(app) as client:
            bad = await client.post("/sessions/s/v1/chat/completions", content=body,
                                    headers={"content-type": "application/json"})
            good = await client.post("/sessions/s/v1/chat/completions", json=HELLO)
            return bad, good
    bad, good = asyncio.run(calls())
    assert_error(bad, 400, param)
    assert good.status_code == 200 and good.json()["choices"][0]["message"]["content"]
    assert len(sessions.close("s")) == 1 and len(engine.requests) == 1


def test_a_huge_message_is_refused_fast_whatever_its_framing(tokenizer):
    engine, sessions, app = make(tokenizer)
    huge = {**HELLO, "messages": [{"role": "user", "content": "fox " * (5 * 2**20 // 4)}]}
    # Under the body limit, over what the context could hold: refused untokenized.
    long = {**HELLO, "messages": [{"role": "user", "content": "fox " * 250_000}]}

    async def chunked(data: bytes):
        for start in range(0, len(data), 2**16):
            yield data[start:start + 2**16]

    async def calls():
        async with raw_client(app) as client:
            started = time.perf_counter()
            sized = await client.post("/v1/chat/completions", json=huge)
            request = client.build_request("POST", "/v1/chat/completions",
                                           json=huge)  # the same bytes, streamed
            unsized = await client.post("/v1/chat/completions",
                                        content=chunked(request.content))
            too_long = await client.post("/v1/chat/completions", json=long)
            elapsed = time.perf_counter() - started
            return sized, unsized, too_long, elapsed, await client.post(
                "/v1/chat/completions", json=HELLO)
    sized, unsized, too_long, elapsed, good = asyncio.run(calls())
    assert_error(sized, 413, code="request_too_large")
    assert_error(unsized, 413, code="request_too_large")
    assert_error(too_long, 400, "messages", "context_length_exceeded")
    assert elapsed < 5, f"{elapsed:.1f}s to refuse three large bodies"
    assert good.status_code == 200 and len(engine.requests) == 1


def test_sessions_never_opened_or_closed_are_refused_and_record_nothing(tokenizer):
    engine, sessions, app = make(tokenizer)
    sessions.open("done")

    async def calls():
        client = in_process(app, "http://e/sessions/done/v1")
        await client.chat.completions.create(**HELLO)
        sessions.close("done")
        with pytest.raises(openai.APIStatusError) as reused:
            await client.chat.completions.create(**HELLO)
        with pytest.raises(openai.NotFoundError) as unknown:
            await in_process(app, "http://e/sessions/never/v1").chat.completions.create(
                **HELLO)
        with pytest.raises(openai.APIStatusError) as models:
            await client.models.list()
        return reused.value, unknown.value, models.value
    reused, unknown, models = asyncio.run(calls())
    assert (reused.status_code, reused.code) == (410, "session_closed")
    assert (unknown.status_code, unknown.code) == (404, "session_not_found")
    assert models.status_code == 410
    assert len(engine.requests) == 1 and engine.ended_sessions == ["done"]
    with pytest.raises(SessionInUse):
        sessions.open("done")
    sessions.open("again")
    with pytest.raises(SessionInUse):
        sessions.open("again")


def test_a_thousand_concurrent_sessions_are_recorded_apart(tokenizer):
    engine, sessions, app = make(tokenizer, latency_s=0.05)
    count = 1000
    ids = [f"rollout-{i}" for i in range(count)]
    for session_id in ids:
        sessions.open(session_id)

    async def agent(http, session_id):
        # Raw HTTP: the openai client's own request building would take most of the time.
        return (await http.post(f"/sessions/{session_id}/v1/chat/completions", json={
            "model": "m", "max_tokens": 2,
            "messages": [{"role": "user", "content": f"question of {session_id}"}]})).json()

    async def agents():
        async with raw_client(app) as http:
            return await asyncio.gather(*(agent(http, s) for s in ids))
    replies = asyncio.run(agents())
    assert all(r["choices"][0]["finish_reason"] == "length" for r in replies)
    prompts = {request.session_id: list(request.input_ids) for request in engine.requests}
    assert len(engine.requests) == len(prompts) == count
    for n, (session_id, reply) in enumerate(zip(ids, replies)):
        [call] = sessions.close(session_id)
        want = tokenizer.encode(f"fox {session_id}", add_special_tokens=False)[:2]
        assert list(call.completion_ids) == want
        assert call.messages == ({"role": "user", "content": f"question of {session_id}"},)
        assert list(call.prompt_ids) == prompts[session_id]
        assert tokenizer.decode(call.prompt_ids).endswith(
            f"question of {session_id}<|im_end|>\n<|im_start|>assistant\n")
        if n % 100 == 0:  # rendering all of them again would double the test's time
            assert list(call.prompt_ids) == chat.prompt_ids(tokenizer, call.messages)
        assert reply["agentjax"]["session_id"] == session_id
        assert reply["usage"]["completion_tokens"] == 2
    assert not sessions.open_ids() and sorted(engine.ended_sessions) == sorted(ids)


def test_a_client_gone_mid_call_aborts_its_engine_request_and_is_recorded_as_abort(
        tokenizer, monkeypatch):
    monkeypatch.setattr(endpoint_app, "DISCONNECT_POLL_S", 0.02)
    engine, sessions, app = make(tokenizer, latency_s=0.3)
    sessions.open("s")

    async def calls():
        client = in_process(app, "http://e/sessions/s/v1")
        # A call polled for its client many times is not taken for a disconnected one.
        slow = await client.chat.completions.create(**HELLO)
        engine.latency_s = 60
        call = asyncio.ensure_future(client.chat.completions.create(**HELLO))
        while len(engine.requests) < 2:
            await asyncio.sleep(0.01)
        call.cancel()  # in-process, the app runs in the caller's task
        with pytest.raises(asyncio.CancelledError):
            await call
        engine.latency_s = 0
        return slow, await client.chat.completions.create(**HELLO)
    slow, after = asyncio.run(calls())
    assert engine.cancelled == engine.requests[1:2]
    assert slow.choices[0].message.content and after.choices[0].message.content
    _, aborted, answered = sessions.close("s")
    assert (aborted.finish_reason, aborted.completion_ids, aborted.logprobs) == (
        "abort", (), ())
    assert aborted.prompt_ids == answered.prompt_ids and answered.finish_reason == "length"


def test_a_session_closed_mid_call_cancels_it_and_records_nothing(tokenizer):
    engine, sessions, app = make(tokenizer, latency_s=60)
    sessions.open("s")
    sessions.open("other")

    async def calls():
        call = asyncio.ensure_future(
            in_process(app, "http://e/sessions/s/v1").chat.completions.create(**HELLO))
        while not engine.requests:
            await asyncio.sleep(0.01)
        assert sessions.close("s") == []
        with pytest.raises(openai.APIStatusError) as closed:
            await call
        engine.latency_s = 0
        other = await in_process(app, "http://e/sessions/other/v1").chat.completions.create(
            **HELLO)
        return closed.value, other
    closed, other = asyncio.run(calls())
    assert (closed.status_code, closed.code) == (410, "session_closed")
    assert engine.cancelled == engine.requests[:1] and other.choices[0].message.content
    assert len(sessions.close("other")) == 1


class FailingEngine(ScriptedEngine):
    """Refuses its first request, fails the second, aborts the third."""

    async def generate(self, requests):
        self.requests.extend(requests)
        failures = [ValueError("requests[0]: too many stop ids"), KeyError("a bug")]
        if len(self.requests) <= len(failures):
            raise failures[len(self.requests) - 1]
        return [[Completion([], [], "abort", None, {"error": "does not fit the cache"})]]


def test_engine_failures_are_answered_in_openai_shape_and_recorded_as_aborts(tokenizer):
    engine, sessions = FailingEngine(tokenizer, lambda request: ""), Sessions()
    app = build_app(engine, tokenizer, sessions=sessions, max_context=512, model_name="m",
                    sampling_defaults=SamplingParams())
    sessions.open("s")

    async def calls():
        async with raw_client(app) as client:
            return [await client.post("/sessions/s/v1/chat/completions", json=HELLO)
                    for _ in range(3)]
    refused, failed, aborted = asyncio.run(calls())
    assert_error(refused, 400)
    assert failed.status_code == aborted.status_code == 500
    assert failed.json()["error"]["code"] == "engine_error"
    assert "does not fit the cache" in aborted.json()["error"]["message"]
    assert [c.finish_reason for c in sessions.close("s")] == ["abort"] * 3


class Server:
    """uvicorn serving an app on a free port in a thread."""

    def __init__(self, app):
        self.socket = socket.socket()
        self.socket.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.socket.getsockname()[1]}"
        config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=1)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run,
                                       kwargs={"sockets": [self.socket]}, daemon=True)

    def __enter__(self):
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started and time.monotonic() < deadline:
            time.sleep(0.01)
        assert self.server.started, "uvicorn did not start"
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(timeout=30)
        self.socket.close()


def test_over_tcp_the_openai_client_is_answered_and_a_dropped_connection_aborts(
        tokenizer, monkeypatch):
    monkeypatch.setattr(endpoint_app, "DISCONNECT_POLL_S", 0.02)
    engine, sessions, app = make(tokenizer, latency_s=0.3)
    sessions.open("s")
    with Server(app) as server:
        client = openai.OpenAI(base_url=f"{server.url}/sessions/s/v1", api_key="unused",
                               max_retries=0)
        first = client.chat.completions.create(**HELLO)  # polled, and answered
        engine.latency_s = 60
        with pytest.raises(httpx.ReadTimeout):  # the client gives up and hangs up
            httpx.post(f"{server.url}/sessions/s/v1/chat/completions", json=HELLO,
                       timeout=0.5)
        deadline = time.monotonic() + 10
        while not engine.cancelled and time.monotonic() < deadline:
            time.sleep(0.05)
        engine.latency_s = 0
        after = client.chat.completions.create(**HELLO)
        calls = sessions.close("s")
    assert first.choices[0].message.content and after.choices[0].message.content
    assert engine.cancelled == engine.requests[1:2]
    assert [call.finish_reason for call in calls] == ["length", "abort", "length"]
