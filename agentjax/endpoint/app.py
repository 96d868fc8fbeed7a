"""The OpenAI chat-completions API on any `Engine`, recording each rollout's calls.

    sessions = Sessions()
    app = build_app(engine, tokenizer, sessions=sessions, sampling_defaults=SamplingParams(),
                    max_context=4096, model_name="policy")
    sessions.open("r1")      # the agent's client: base_url=".../sessions/r1/v1"
    ...
    calls = sessions.close("r1")

Routes:
  POST /v1/chat/completions                       plain serving, nothing recorded
  POST /sessions/{session_id}/v1/chat/completions recorded into the session (404 when it
                                                  was never opened, 410 once closed)
  GET  /v1/models, /sessions/{session_id}/v1/models

A call renders its messages and tools with the model's chat template (`models.chat`:
the template's own tool rendering, or the Hermes fallback), samples the ids on the
engine (the session id is the engine's session key, so a multi-turn agent prefills only
its new tokens), and answers a ChatCompletion (`replies`). The request fields honoured,
refused and ignored: `requests`. Errors have OpenAI's shape (`requests.ApiError`).

Bounds, each answered before any engine work:
  * a body over `max_request_bytes` (default 4 MiB): 413, read no further;
  * a prompt of `max_context` tokens or more: 400 `context_length_exceeded` (a
    message text so long that it cannot fit whatever its tokens is refused before it
    is tokenized: no token covers more characters than the vocabulary's longest);
  * max_tokens past the context is clamped to what is left (as SGLang and vLLM do when
    the request does not name max_tokens); `usage` and the reply's "agentjax" field say
    what was used.
Rendering, tokenizing and decoding run on one worker thread: a long prompt does not
stall the event loop, and the tokenizer is never used by two of them at once.

A training run may force a session's sampling: `session_sampling(session_id)` returns
the SamplingParams to use (temperature, top_p, top_k and seed replace the request's;
max_new_tokens caps the request's max_tokens; its stop strings and ids add to the
request's), or None to take the request's.

A client that goes away mid-call (checked once a second, as the SGLang-protocol server
does) gets its engine request cancelled; so does a call still in flight when its
session closes (that client gets a 410). The call is then recorded with finish_reason
"abort" and no completion ids: visible to the runner, never training data by accident.
An engine that refuses a request (400), cannot serve (503), fails (500, logged with its
traceback) or aborts it (500) has the call recorded the same way.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import time
import uuid
from typing import Any, Awaitable, Callable

import fastapi
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from agentjax.endpoint.replies import Reply, completion_chunks, completion_json, read_completion
from agentjax.endpoint.requests import ApiError, ChatRequest, parse_chat_request
from agentjax.endpoint.sessions import RecordedCall, SessionError, Sessions
from agentjax.engine.protocol import (Completion, EnginesUnavailable, GenerateRequest,
                                      SamplingParams, sampled_versions)
from agentjax.models import chat
from agentjax.models.tokenizer import stop_token_ids
from agentjax.parsers.tool_calls import TOOL_PARSERS

logger = logging.getLogger(__name__)

MAX_REQUEST_BYTES = 4 * 2**20
DISCONNECT_POLL_S = 1.0
SessionSampling = Callable[[str], SamplingParams | None]


class _ClientGone(Exception):
    """The client disconnected while its call ran."""


class ChatService:
    """The endpoint's state; `add_routes` wires its methods to paths (module docstring).

    Args:
      engine: the Engine (its `end_session` frees a closed session's cache).
      tokenizer: the model's HF tokenizer with its chat template.
      sessions: where session calls are recorded; None: plain serving only.
      sampling_defaults: what a request that names no temperature, top_p, top_k, seed or
        max_tokens gets; its stop strings and stop ids apply to every request.
      max_context: longest prompt + completion; at most the engine's own limit (the
        JaxEngine's max_len), which would otherwise abort what does not fit.
      model_name: the model id the replies and /v1/models name.
      tool_parser: a name of parsers.tool_calls.TOOL_PARSERS, or "auto": the format
        `chat.tool_parser_for` reads from the template (found on the first request with
        tools; a template of no known format then answers 500 naming the setting).
      session_sampling: forced sampling per session (module docstring).
      generate: one engine request to its completion (default: `engine.generate`); the
        SGLang-protocol server passes its own, so pauses and weight updates hold these
        requests as they hold /generate's.
      weight_version: the version a reply reports (default: the completion's
        meta["weight_version"]).
      max_request_bytes: the largest body read.
    """

    def __init__(self, engine, tokenizer, *, sessions: Sessions | None,
                 sampling_defaults: SamplingParams, max_context: int, model_name: str,
                 tool_parser: str = "auto", session_sampling: SessionSampling | None = None,
                 generate: Callable[[GenerateRequest], Awaitable[Completion]] | None = None,
                 weight_version: Callable[[], int | str] | None = None,
                 max_request_bytes: int = MAX_REQUEST_BYTES):
        if tool_parser != "auto":
            TOOL_PARSERS.get(tool_parser)  # an unknown name fails here, naming the formats
        if max_context < 2:
            raise ValueError(f"max_context {max_context} must be >= 2")
        self.engine, self.tokenizer, self.sessions = engine, tokenizer, sessions
        self.defaults, self.max_context, self.model_name = (sampling_defaults, max_context,
                                                            model_name)
        self.tool_parser, self.session_sampling = tool_parser, session_sampling
        self.generate = generate or self._engine_generate
        self.weight_version, self.max_request_bytes = weight_version, max_request_bytes
        self.stop_ids = tuple(sorted(set(stop_token_ids(tokenizer))
                                     | set(sampling_defaults.stop_token_ids)))
        self.longest_token = max(map(len, tokenizer.get_vocab()))
        self.created = int(time.time())
        self.flights: dict[str, set[asyncio.Task]] = {}  # session -> its engine calls
        self._worker = concurrent.futures.ThreadPoolExecutor(1, "endpoint-tokenizer")
        self._loop: asyncio.AbstractEventLoop | None = None
        if sessions is not None:
            sessions.add_close_hook(self._session_closed)

    async def _engine_generate(self, request: GenerateRequest) -> Completion:
        return (await self.engine.generate([request]))[0][0]

    # ------------------------------------------------------------------ routes

    async def chat_completions(self, request: fastapi.Request) -> Response:
        return await self._answer(request, None)

    async def session_chat_completions(self, request: fastapi.Request,
                                       session_id: str) -> Response:
        return await self._answer(request, session_id)

    async def models(self) -> dict[str, Any]:
        return {"object": "list", "data": [
            {"id": self.model_name, "object": "model", "created": self.created,
             "owned_by": "agentjax", "max_model_len": self.max_context}]}

    async def session_models(self, session_id: str) -> Response:
        try:
            self._check_session(session_id)
        except ApiError as error:
            return error_response(error)
        return JSONResponse(await self.models())

    # ------------------------------------------------------------------ one call

    async def _answer(self, request: fastapi.Request, session_id: str | None) -> Response:
        self._loop = asyncio.get_running_loop()
        try:
            return await self._chat(request, session_id)
        except ApiError as error:
            return error_response(error)

    async def _chat(self, http: fastapi.Request, session_id: str | None) -> Response:
        if session_id is not None:
            self._check_session(session_id)
        call = parse_chat_request(await self._read_body(http))
        if call.text_size() > self.max_context * self.longest_token:
            raise _too_long(f"more than {self.max_context * self.longest_token} characters",
                            self.max_context)
        prompt = await self._on_worker(self._prompt_ids, call)
        if len(prompt) >= self.max_context:
            raise _too_long(f"{len(prompt)} prompt tokens", self.max_context)
        sampling = self._sampling(call, session_id, room=self.max_context - len(prompt))
        if session_id is not None:  # it may have closed while the prompt was rendered
            self._check_session(session_id)
        record = functools.partial(self._record, session_id, call, prompt)
        try:
            completion = await self._generate(GenerateRequest(prompt, sampling, session_id),
                                              http, session_id)
        except _ClientGone:
            record(None)
            return Response(status_code=499)  # nobody reads it: the client is gone
        except asyncio.CancelledError:  # this handler was cancelled (an in-process client)
            record(None)
            raise
        except ApiError as error:
            if error.code != "session_closed":
                record(None)
            raise
        except EnginesUnavailable:
            # Not this call's failure but the run's: it leaves the app unanswered, so an
            # in-process client (the agent runner's) sees it and the trainer can stop
            # with a checkpoint; a client over HTTP gets uvicorn's 500.
            record(None)
            raise
        record(completion)
        if completion.finish_reason == "abort":
            raise ApiError(f"the engine aborted the request: "
                           f"{completion.meta.get('error', 'no reason given')}", status=500,
                           code="engine_abort")
        reply = await self._on_worker(self._reply, call, completion, len(prompt))
        return self._respond(call, reply, completion, sampling, session_id)

    async def _read_body(self, http: fastapi.Request) -> bytes:
        length = http.headers.get("content-length", "")
        too_large = ApiError(f"the request body exceeds {self.max_request_bytes} bytes",
                             status=413, code="request_too_large")
        if length.isdigit() and int(length) > self.max_request_bytes:
            raise too_large
        chunks, size = [], 0
        async for chunk in http.stream():
            size += len(chunk)
            if size > self.max_request_bytes:
                raise too_large
            chunks.append(chunk)
        return b"".join(chunks)

    async def _on_worker(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self._worker, fn, *args)

    def _prompt_ids(self, call: ChatRequest) -> list[int]:
        try:
            if not call.continue_final:
                return chat.prompt_ids(self.tokenizer, call.template_messages,
                                       call.tools or None)
            *earlier, last = call.template_messages
            return (chat.prompt_ids(self.tokenizer, earlier, call.tools or None)
                    + self.tokenizer.encode(last["content"], add_special_tokens=False))
        except Exception as error:  # noqa: BLE001 - a template refusing the messages
            # (Gemma's raise_exception on a system message or roles out of turn).
            raise ApiError(f"the chat template cannot render these messages: "
                           f"{type(error).__name__}: {error}", param="messages") from None

    def _sampling(self, call: ChatRequest, session_id: str | None, room: int
                  ) -> SamplingParams:
        forced = (self.session_sampling(session_id)
                  if session_id is not None and self.session_sampling else None)
        if forced is None:
            base = self.defaults
            temperature, top_p, top_k, seed = (
                _given(call.temperature, base.temperature), _given(call.top_p, base.top_p),
                _given(call.top_k, base.top_k), _given(call.seed, base.seed))
            cap = _given(call.max_tokens, base.max_new_tokens)
        else:
            base = forced
            temperature, top_p, top_k, seed = (forced.temperature, forced.top_p,
                                               forced.top_k, forced.seed)
            cap = min(_given(call.max_tokens, forced.max_new_tokens), forced.max_new_tokens)
        return SamplingParams(
            temperature=temperature, top_p=top_p, top_k=top_k,
            max_new_tokens=max(1, min(cap, room)),
            stop=tuple(dict.fromkeys(call.stop + self.defaults.stop + base.stop)),
            stop_token_ids=tuple(sorted(set(self.stop_ids) | set(base.stop_token_ids))),
            n=1, seed=seed)

    async def _generate(self, request: GenerateRequest, http: fastapi.Request,
                        session_id: str | None) -> Completion:
        """The engine's completion; cancels the engine call when the client goes away."""
        task = asyncio.ensure_future(self.generate(request))
        if session_id is not None:
            self.flights.setdefault(session_id, set()).add(task)
        try:
            while not task.done():
                await asyncio.wait([task], timeout=DISCONNECT_POLL_S)
                if not task.done() and await http.is_disconnected():
                    raise _ClientGone
            if task.cancelled():  # only a session's close cancels it
                raise ApiError(f"session {session_id!r} was closed during the call",
                               status=410, code="session_closed")
            try:
                return task.result()
            except EnginesUnavailable:
                raise
            except ValueError as error:  # the engine refused the request
                raise ApiError(str(error)) from None
            except RuntimeError as error:  # closed, its thread died, no server reachable
                raise ApiError(f"the engine cannot serve: {error}", status=503,
                               code="engine_unavailable") from None
            except Exception as error:  # noqa: BLE001 - an engine bug: loud, and answered
                logger.exception("the engine failed a chat completion")
                raise ApiError(f"the engine failed: {type(error).__name__}: {error}",
                               status=500, code="engine_error") from None
        finally:
            task.cancel()  # a no-op once done
            if session_id is not None:
                flights = self.flights.get(session_id, set())
                flights.discard(task)
                if not flights:
                    self.flights.pop(session_id, None)

    def _record(self, session_id: str | None, call: ChatRequest, prompt: list[int],
                completion: Completion | None) -> None:
        """Records the call in its session; None: it was aborted before its completion."""
        if session_id is None or self.sessions is None:
            return
        meta = {} if completion is None else completion.meta
        aborted = completion is None or completion.finish_reason == "abort"
        recorded = RecordedCall(
            prompt_ids=tuple(prompt),
            completion_ids=() if aborted else tuple(map(int, completion.output_ids)),
            logprobs=() if aborted else tuple(map(float, completion.logprobs)),
            versions=() if aborted else tuple(sampled_versions(completion)),
            finish_reason="abort" if aborted else completion.finish_reason,
            weight_version=meta.get("weight_version", ""), messages=call.messages,
            tools=call.tools,
            # An engine that does not say samples from its distribution as the agent
            # loop assumes (agents/loop.py).
            logprob_distribution=meta.get("logprob_distribution", "sampling"))
        try:
            self.sessions.record(session_id, recorded)
        except SessionError as error:  # closed while the call ran: nothing recorded
            if not aborted:
                raise ApiError(str(error), status=error.status,
                               code="session_closed") from None

    def _reply(self, call: ChatRequest, completion: Completion, prompt_tokens: int) -> Reply:
        parser = None
        if call.parse_calls:
            parser = self._parser()
        turn = sum(m["role"] == "assistant" for m in call.template_messages)
        return read_completion(self.tokenizer, completion, prompt_tokens=prompt_tokens,
                               stop_ids=self.stop_ids, parser=parser, tools=call.tools,
                               turn=turn, logprobs=call.logprobs)

    def _parser(self) -> str:
        if self.tool_parser == "auto":
            try:
                self.tool_parser = chat.tool_parser_for(self.tokenizer)
            except ValueError as error:
                raise ApiError(f"this server cannot read tool calls: {error} (the server's "
                               "tool parser setting)", status=500) from None
        return self.tool_parser

    def _respond(self, call: ChatRequest, reply: Reply, completion: Completion,
                 sampling: SamplingParams, session_id: str | None) -> Response:
        version = (self.weight_version() if self.weight_version is not None
                   else completion.meta.get("weight_version"))
        extra = {"weight_version": version, "session_id": session_id,
                 "sampling": {"temperature": sampling.temperature, "top_p": sampling.top_p,
                              "top_k": sampling.top_k, "seed": sampling.seed,
                              "max_tokens": sampling.max_new_tokens,
                              "stop": list(sampling.stop)}}
        fields = dict(completion_id=f"chatcmpl-{uuid.uuid4().hex}", created=int(time.time()),
                      model=self.model_name, extra=extra)
        if call.stream:
            return StreamingResponse(
                completion_chunks(reply, include_usage=call.include_usage, **fields),
                media_type="text/event-stream")
        return JSONResponse(completion_json(reply, **fields))

    # ------------------------------------------------------------------ sessions

    def _check_session(self, session_id: str) -> None:
        if self.sessions is None:
            raise ApiError("this server records no sessions", status=404,
                           code="session_not_found")
        try:
            self.sessions.check(session_id)
        except SessionError as error:
            raise ApiError(str(error), status=error.status,
                           code="session_closed" if error.status == 410
                           else "session_not_found") from None

    def _session_closed(self, session_id: str) -> None:
        """Close hook: cancels the session's calls in flight (on the event loop, from
        whatever thread closed it) and frees the engine's cache of the session."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._cancel_flights, session_id)
        self.engine.end_session(session_id)

    def _cancel_flights(self, session_id: str) -> None:
        for task in self.flights.get(session_id, ()):
            task.cancel()


def _given(value, default):
    return default if value is None else value


def _too_long(what: str, max_context: int) -> ApiError:
    return ApiError(f"This model's maximum context length is {max_context} tokens; the "
                    f"messages have {what}. Shorten the messages.", param="messages",
                    code="context_length_exceeded")


def error_response(error: ApiError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status)


def add_routes(app: fastapi.FastAPI, service: ChatService) -> None:
    """The endpoint's routes on `app` (module docstring); session routes only when the
    service records sessions."""
    app.add_api_route("/v1/chat/completions", service.chat_completions, methods=["POST"])
    app.add_api_route("/v1/models", service.models, methods=["GET"])
    if service.sessions is not None:
        app.add_api_route("/sessions/{session_id}/v1/chat/completions",
                          service.session_chat_completions, methods=["POST"])
        app.add_api_route("/sessions/{session_id}/v1/models", service.session_models,
                          methods=["GET"])


def build_app(engine, tokenizer, *, sessions: Sessions | None,
              sampling_defaults: SamplingParams, max_context: int, model_name: str,
              tool_parser: str = "auto", session_sampling: SessionSampling | None = None,
              max_request_bytes: int = MAX_REQUEST_BYTES) -> fastapi.FastAPI:
    """A FastAPI app serving the endpoint on `engine` (module docstring; the arguments are
    ChatService's). `app.state.chat` is the ChatService."""
    service = ChatService(engine, tokenizer, sessions=sessions,
                          sampling_defaults=sampling_defaults, max_context=max_context,
                          model_name=model_name, tool_parser=tool_parser,
                          session_sampling=session_sampling,
                          max_request_bytes=max_request_bytes)
    app = fastapi.FastAPI(title="agentjax OpenAI-compatible endpoint")
    app.state.chat = service

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request, error: StarletteHTTPException):  # unknown path, method
        return error_response(ApiError(str(error.detail), status=error.status_code))

    add_routes(app, service)
    return app
