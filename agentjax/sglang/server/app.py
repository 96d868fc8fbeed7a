"""agentjax's rollout engine (JaxEngine / LanedEngine) behind SGLang's native HTTP API.

    app = build_app(engine, tokenizer=tok, model_path="runs/x/hf", context_length=1024,
                    vocab_size=config.vocab_size, load_params=hf_params_loader(jnp.float32))
    # scripts/serve.py serves it with uvicorn; tests call it in-process (httpx.ASGITransport)

So hosts without SGLang (TPU, CPU) serve rollouts to the same HTTP client as SGLang
servers. Endpoints and shapes follow SGLang's source (sgl-project/sglang,
python/sglang/srt/entrypoints/http_server.py and managers/tokenizer_manager.py):

- POST|PUT /generate: SGLang's `GenerateReqInput` (see `rollout.server_requests` for the
  request and response rules). Streaming is not implemented: `stream=true` is a 400.
  Semantic errors are HTTP 400 `{"error": {"message"}}`; a body that does not parse is
  HTTP 400 `{"object": "error", "message", "type": "Bad Request", "param": null,
  "code": 400}` (SGLang's RequestValidationError / HTTPException handlers). A `rid`
  already in flight is a 400 ("Duplicate request ID detected"). A request whose client
  disconnects is aborted (SGLang polls for that as well). An optional `session_id`
  (SGLang's stable session identity) is passed to the engine, which then keeps the
  session's KV cache between turns; a body without one takes <id> from an
  `X-SMG-Routing-Key: agentjax-session:<id>` header instead (sglang-router drops
  `session_id` from the body and forwards that header; other routing keys only route);
  POST /close_session `{"session_id"}` frees it (a
  deterministic engine never evicts a session: keep open ones within its rows). The
  tokenizer is the one loaded at startup, whatever weights are loaded later.
- GET /health: 200 while the engine runs (503 once shutting down); GET /health_generate:
  200 after generating one token from input_ids [0] (503 when that fails, times out or
  generation is paused). GET /model_info (its `weight_version` is the served one),
  /server_info, and their older names /get_model_info, /get_server_info (SGLang 0.5.23
  keeps both; it has dropped /get_weight_version).
- POST /load_lora_adapter `{lora_name, lora_path}` (a PEFT folder; the server runs with
  --enable-lora): merges the adapter into the launch weights in float32 (`load_adapter`)
  and swaps them in as /update_weights_from_disk does; from then on requests name it in
  `lora_path`. The engine holds one set of weights, so the newest loaded adapter is the
  one requests may name (SGLang batches several: the trainer only ever names its newest
  version). POST /unload_lora_adapter `{lora_name}`: forgets it (the launch weights come
  back when it was the one served). Both answer SGLang's `{success, error_message,
  loaded_adapters}` (HTTP 400 when success is false).
- GET|POST /flush_cache: drops the engine's cached sessions; 400 while requests run.
- POST /abort_request `{rid, abort_all}`: the request (every sample of it) comes back
  HTTP 200 with finish_reason `{"type": "abort", ...}`. Unlike SGLang, an aborted
  request returns no partial output (the engine drops a cancelled request's tokens).
- POST /pause_generation `{mode}` then POST /continue_generation (tokenizer_manager.py:
  pause_generation): while paused, new requests wait. mode "abort" (default) aborts the
  requests in flight and returns once they have ended; "retract" stops them and runs
  them again from their input after continue_generation (SGLang keeps their tokens and
  recomputes their cache: here they restart, so their output comes from the weights in
  place after continue); "in_place" leaves them running — JaxEngine cannot hold a row
  mid-generation, so they keep decoding until the update lands between two decode
  rounds, then finish under the new weights with the cache they have.
- POST /update_weights_from_disk `{model_path, weight_version?, abort_all_requests?}`:
  loads the HF folder (`load_params`, e.g. models.hf.load_hf) and swaps the weights in
  place (`engine.update_weights`: same shapes, no recompilation; cached sessions end).
  When generation is not paused it waits for the requests in flight to finish and holds
  new ones meanwhile (SGLang's model_update_lock); when paused it swaps at once.
  Answers `{success, message, num_paused_requests}` (the requests left running through
  the swap by an in_place pause; HTTP 400 when success is false: the old weights stay). `weight_version` (a string, "default" at startup) changes only
  when given, and is reported in every response's meta_info.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import uuid
from typing import Any, Callable, Literal

import fastapi
import pydantic
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from agentjax import __version__
from agentjax.endpoint.app import ChatService, add_routes
from agentjax.engine.protocol import Completion, GenerateRequest, SamplingParams
from agentjax.sglang.protocol import ROUTING_KEY_HEADER, SERVER_SESSION_KEY
from agentjax.sglang.server.requests import (GenerateBody, GenerateItem, OutputOptions,
                                              aborted, parse_generate, response_json)

logger = logging.getLogger(__name__)

HEALTH_CHECK_TIMEOUT_S = 20.0  # SGLang's SGLANG_HEALTH_CHECK_TIMEOUT default
DISCONNECT_POLL_S = 1.0
FLUSH_CACHE_MESSAGE = ("Cache flushed.\nPlease check backend logs for more details. (When "
                       "there are running or waiting requests, the operation will not be "
                       "performed.)\n")


class AbortBody(pydantic.BaseModel):
    rid: str | None = ""
    abort_all: bool = False


class PauseBody(pydantic.BaseModel):
    mode: Literal["abort", "retract", "in_place"] = "abort"


class UpdateWeightsBody(pydantic.BaseModel):
    """SGLang's UpdateWeightFromDiskReqInput; its GPU-only fields are accepted and
    ignored (is_async, torch_empty_cache, keep_pause, recapture_cuda_graph, ...)."""

    model_path: str
    load_format: str | None = None
    abort_all_requests: bool = False
    weight_version: str | None = None
    flush_cache: bool = True


class CloseSessionBody(pydantic.BaseModel):
    session_id: str


class LoadLoraBody(pydantic.BaseModel):
    """SGLang's LoadLoRAAdapterReqInput (`pinned` is accepted and ignored)."""

    lora_name: str
    lora_path: str
    pinned: bool = False


class UnloadLoraBody(pydantic.BaseModel):
    lora_name: str


def hf_params_loader(dtype) -> Callable[[str], Any]:
    """`load_params` for build_app: the params of the HF folder at a path, in `dtype`
    (the dtype the engine was built from)."""
    from flax import nnx

    from agentjax.models.hf import load_hf

    def load(path: str):
        return nnx.split(load_hf(path, dtype=dtype)[0])[1]
    return load


@dataclasses.dataclass(eq=False)
class _Flight:
    """A request of a /generate call: its engine call and how that call was stopped."""

    item: GenerateItem
    task: asyncio.Task | None = None
    stop: str | None = None  # "abort" or "retract", set by whoever cancels `task`
    message: str = ""


class _Service:
    """The server's state; one method per endpoint (wired up by build_app)."""

    def __init__(self, engine, *, tokenizer, model_path: str, context_length: int,
                 vocab_size: int, load_params: Callable[[str], Any], weight_version: str,
                 server_args: dict[str, Any], max_sequences: int,
                 load_adapter: Callable[[str, str], Any] | None):
        self.engine, self.tokenizer = engine, tokenizer
        self.load_adapter = load_adapter
        self.adapters: dict[str, str] = {}  # loaded LoRA adapters: name -> folder
        self.adapter: str | None = None  # the one the engine's weights hold
        self.context_length, self.vocab_size = context_length, vocab_size
        self.load_params, self.max_sequences = load_params, max_sequences
        self.server_args = dict(server_args, model_path=model_path,
                                context_length=context_length, weight_version=weight_version)
        self.flights: dict[str, _Flight] = {}  # every rid in flight (samples' included)
        self.running: set[_Flight] = set()  # flights whose engine call is under way
        self.holds: set[str] = set()  # "paused" / "updating": engine calls wait
        self.gate = asyncio.Condition()
        self.update_lock = asyncio.Lock()
        self.sessions: set[str] = set()
        self.shutting_down = False

    # ------------------------------------------------------------------ /generate

    async def generate(self, body: GenerateBody, request: fastapi.Request):
        started = time.perf_counter()
        routing_key = request.headers.get(ROUTING_KEY_HEADER) or ""
        if body.session_id is None and routing_key.startswith(SERVER_SESSION_KEY):
            body = body.model_copy(
                update={"session_id": routing_key[len(SERVER_SESSION_KEY):]})
        try:
            items, single = parse_generate(
                body, tokenizer=self.tokenizer, vocab_size=self.vocab_size,
                context_length=self.context_length, max_sequences=self.max_sequences,
                adapter=self.adapter)
            flights = self._register(items)
        except ValueError as error:
            return error_response(error)
        try:
            results = await self._run_all(flights, request)
        except ValueError as error:  # the engine refused a request
            return error_response(error)
        except RuntimeError as error:  # the engine is closed or its thread died
            return error_response(error, status=503)
        finally:
            for flight in flights:
                for rid in (flight.item.rid, *flight.item.sample_rids):
                    self.flights.pop(rid, None)
        if body.session_id is not None:
            self.sessions.add(body.session_id)
        latency = time.perf_counter() - started
        outputs = [response_json(flight.item, completion, j, tokenizer=self.tokenizer,
                                 weight_version=self.weight_version, latency_s=latency)
                   for flight, completions in zip(flights, results)
                   for j, completion in enumerate(completions)]
        return JSONResponse(outputs[0] if single else outputs)

    def _register(self, items: list[GenerateItem]) -> list[_Flight]:
        for item in items:
            for rid in (item.rid, *item.sample_rids):
                if rid in self.flights:
                    raise ValueError(f"Duplicate request ID detected: {rid}")
        flights = [_Flight(item) for item in items]
        for flight in flights:
            for rid in (flight.item.rid, *flight.item.sample_rids):
                self.flights[rid] = flight
        return flights

    async def generate_one(self, request: GenerateRequest) -> Completion:
        """One engine request of the OpenAI endpoint (/v1/chat/completions): held by a
        pause or a weight update, aborted by /abort_request's abort_all, as /generate's
        requests are."""
        rid = f"chatcmpl-{uuid.uuid4().hex}"
        [flight] = self._register([GenerateItem(rid, (rid,), request, OutputOptions())])
        try:
            return (await self._run(flight))[0]
        finally:
            self.flights.pop(rid, None)

    async def _run_all(self, flights: list[_Flight], request: fastapi.Request):
        """Every flight's completions; aborts them all if the client goes away, stops the
        others when one fails (and re-raises its error)."""
        tasks = [asyncio.ensure_future(self._run(flight)) for flight in flights]
        try:
            pending = set(tasks)
            while pending:
                done, pending = await asyncio.wait(pending, timeout=DISCONNECT_POLL_S,
                                                   return_when=asyncio.FIRST_EXCEPTION)
                failed = [t for t in done if t.exception() is not None]
                if failed:
                    raise failed[0].exception()
                if pending and await request.is_disconnected():
                    for flight in flights:
                        await self._stop(flight, "abort", "the client disconnected")
            return [task.result() for task in tasks]
        finally:
            for task in tasks:
                task.cancel()

    async def _run(self, flight: _Flight) -> list[Completion]:
        """One request through the engine, waiting while generation is held, restarted
        after a retract, answered with abort completions after an abort."""
        request = flight.item.request
        if request.sampling.max_new_tokens == 0:  # prefill only: nothing is sampled
            return [Completion([], [], "length", None) for _ in range(request.sampling.n)]
        while True:
            async with self.gate:
                await self.gate.wait_for(lambda: not self.holds or flight.stop == "abort")
            if flight.stop == "abort":
                return aborted(flight.item, flight.message)
            flight.task = asyncio.ensure_future(self.engine.generate([request]))
            self.running.add(flight)
            try:
                await asyncio.wait([flight.task])
            finally:
                self.running.discard(flight)
                flight.task.cancel()  # a no-op once done; else our own caller was cancelled
            if not flight.task.cancelled():
                return flight.task.result()[0]
            if flight.stop != "retract":
                return aborted(flight.item, flight.message)
            flight.stop = None

    async def _stop(self, flight: _Flight, how: str, message: str) -> None:
        flight.stop, flight.message = how, message
        if flight.task is not None:
            flight.task.cancel()
        async with self.gate:
            self.gate.notify_all()

    async def _stop_running(self, how: str, message: str) -> int:
        """Stops every engine call under way; returns once they have ended."""
        stopping = [flight for flight in self.running if flight.task is not None]
        for flight in stopping:
            await self._stop(flight, how, message)
        if stopping:
            await asyncio.wait([flight.task for flight in stopping])
        return len(stopping)

    async def _set_hold(self, name: str, on: bool) -> None:
        async with self.gate:
            (self.holds.add if on else self.holds.discard)(name)
            self.gate.notify_all()

    # ------------------------------------------------------------------ control

    @property
    def weight_version(self) -> str:
        return self.server_args["weight_version"]

    async def abort_request(self, body: AbortBody) -> Response:
        if body.abort_all:
            for flight in set(self.flights.values()):
                await self._stop(flight, "abort", "Aborted by /abort_request (abort_all)")
        elif body.rid and body.rid in self.flights:
            await self._stop(self.flights[body.rid], "abort",
                             f"Aborted by /abort_request (rid {body.rid})")
        return Response(status_code=200)

    async def pause_generation(self, body: PauseBody | None = None):
        mode = (body or PauseBody()).mode
        await self._set_hold("paused", True)
        if mode != "in_place":
            await self._stop_running(mode, "Aborted by /pause_generation")
        return {"message": "Generation paused successfully.", "status": "ok"}

    async def continue_generation(self):
        await self._set_hold("paused", False)
        return {"message": "Generation continued successfully.", "status": "ok"}

    async def update_weights_from_disk(self, body: UpdateWeightsBody):
        if body.load_format not in (None, "auto", "safetensors"):
            return _update_answer(False, f"load_format {body.load_format!r} is not supported: "
                                         "this server loads HF safetensors folders", 0)
        async with self.update_lock:
            try:  # off the event loop: reading a checkpoint takes a while
                params = await asyncio.to_thread(self.load_params, body.model_path)
            except Exception as error:  # noqa: BLE001 - any unreadable folder is reported
                return _update_failed(body, error)
            if body.abort_all_requests:
                await self._stop_running("abort", "Aborted by /update_weights_from_disk")

            def swapped():  # before generation resumes: answers carry the new version
                self.server_args["model_path"] = body.model_path
                self.adapters.clear()
                self.adapter = None
                if body.weight_version is not None:
                    self.server_args["weight_version"] = body.weight_version

            try:
                in_flight = await self._swap(params, swapped)
            except (ValueError, RuntimeError) as error:
                return _update_failed(body, error)
        message = "Succeeded to update model weights."
        if body.weight_version is not None:
            message += f" Weight version updated to {body.weight_version}."
        logger.info("weights updated from %s (version %s)", body.model_path,
                    self.weight_version)
        return _update_answer(True, message, in_flight)

    async def _swap(self, params, swapped: Callable[[], None]) -> int:
        """Puts `params` into the engine between requests (module docstring: waits for
        those in flight unless paused), calls `swapped()` before generation resumes;
        returns the requests left running through the swap."""
        paused = "paused" in self.holds
        if not paused:
            await self._set_hold("updating", True)
        try:
            if not paused and self.running:
                await asyncio.wait([flight.task for flight in self.running])
            in_flight = len(self.running)
            # On the event loop: LanedEngine's bookkeeping is not thread-safe. The swap
            # itself is one cast of the weights plus a wait between two decode rounds.
            self.engine.update_weights(params)
            self.sessions.clear()  # update_weights ended the engine's sessions
            swapped()
            return in_flight
        finally:
            if not paused:
                await self._set_hold("updating", False)

    async def load_lora_adapter(self, body: LoadLoraBody):
        if self.load_adapter is None:
            return _lora_answer(False, "LoRA is not enabled: launch the server with "
                                       "--enable-lora", self.adapters)
        if body.lora_name in self.adapters:
            return _lora_answer(False, f"The lora name {body.lora_name!r} is already loaded",
                                self.adapters)
        async with self.update_lock:
            try:  # off the event loop: reading and merging take a while
                params = await asyncio.to_thread(self.load_adapter, body.lora_path,
                                                 self.server_args["model_path"])

                def swapped():
                    self.adapters[body.lora_name] = body.lora_path
                    self.adapter = body.lora_name

                await self._swap(params, swapped)
            except Exception as error:  # noqa: BLE001 - a bad adapter is the caller's error
                return _lora_answer(False, f"{type(error).__name__}: {error}", self.adapters)
        logger.info("LoRA adapter %s loaded from %s", body.lora_name, body.lora_path)
        return _lora_answer(True, "", self.adapters)

    async def unload_lora_adapter(self, body: UnloadLoraBody):
        if body.lora_name not in self.adapters:
            return _lora_answer(False, f"LoRA adapter {body.lora_name!r} is not loaded",
                                self.adapters)
        async with self.update_lock:
            if body.lora_name == self.adapter:  # the launch weights come back
                try:
                    params = await asyncio.to_thread(self.load_params,
                                                     self.server_args["model_path"])

                    def swapped():
                        self.adapter = None

                    await self._swap(params, swapped)
                except Exception as error:  # noqa: BLE001
                    return _lora_answer(False, f"{type(error).__name__}: {error}",
                                        self.adapters)
            del self.adapters[body.lora_name]
        return _lora_answer(True, "", self.adapters)

    async def flush_cache(self) -> Response:
        if self.flights:
            return Response(FLUSH_CACHE_MESSAGE, status_code=400)
        for session in self.sessions:
            self.engine.end_session(session)
        self.sessions.clear()
        return Response(FLUSH_CACHE_MESSAGE, status_code=200)

    async def close_session(self, body: CloseSessionBody) -> Response:
        self.sessions.discard(body.session_id)
        self.engine.end_session(body.session_id)
        return Response(status_code=200)

    # ------------------------------------------------------------------ status

    async def health(self) -> Response:
        healthy = not self.shutting_down and self.engine.health()
        return Response(status_code=200 if healthy else 503)

    async def health_generate(self) -> Response:
        if self.shutting_down or not self.engine.health() or "paused" in self.holds:
            return Response(status_code=503)
        probe = GenerateRequest([0], SamplingParams(temperature=0.0, max_new_tokens=1))
        try:
            [[completion]] = await asyncio.wait_for(self.engine.generate([probe]),
                                                    HEALTH_CHECK_TIMEOUT_S)
        except (asyncio.TimeoutError, RuntimeError):
            return Response(status_code=503)
        return Response(status_code=503 if completion.finish_reason == "abort" else 200)

    async def model_info(self) -> dict[str, Any]:
        args = self.server_args
        return {"model_path": args["model_path"], "tokenizer_path": args.get("tokenizer_path"),
                "is_generation": True, "preferred_sampling_params": None,
                "weight_version": self.weight_version}

    async def server_info(self) -> dict[str, Any]:
        lanes = getattr(self.engine, "lanes", [self.engine])
        return {**self.server_args,
                "max_total_num_tokens": self.context_length * self.server_args.get(
                    "max_running_requests", 1),
                "max_req_input_len": self.context_length - 1,
                "internal_states": [{"engine_stats": dict(getattr(lane, "stats", {}))}
                                    for lane in lanes],
                "version": f"agentjax-{__version__}"}


def _lora_answer(success: bool, error: str, adapters: dict[str, str]) -> JSONResponse:
    """SGLang's LoadLoRAAdapterReqOutput (HTTP 400 when it failed)."""
    return JSONResponse({"success": success, "error_message": error or None,
                         "loaded_adapters": dict(adapters)},
                        status_code=200 if success else 400)


def _update_answer(success: bool, message: str, num_paused_requests: int) -> JSONResponse:
    return JSONResponse({"success": success, "message": message,
                         "num_paused_requests": num_paused_requests},
                        status_code=200 if success else 400)


def _update_failed(body: UpdateWeightsBody, error: Exception) -> JSONResponse:
    logger.warning("weights from %s not loaded: %s", body.model_path, error)
    return _update_answer(False, f"Failed to update weights: {error}. Rolling back to "
                                 "original weights.", 0)


def error_response(error: Exception, status: int = 400) -> JSONResponse:
    """SGLang's `_create_error_response`: `{"error": {"message"}}`."""
    return JSONResponse({"error": {"message": str(error)}}, status_code=status)


def _bad_request(message: str) -> JSONResponse:
    """SGLang's ErrorResponse for a body that does not parse (HTTP 400)."""
    return JSONResponse({"object": "error", "message": message, "type": "Bad Request",
                         "param": None, "code": 400}, status_code=400)


def build_app(engine, *, tokenizer, model_path: str, context_length: int, vocab_size: int,
              load_params: Callable[[str], Any], weight_version: str = "default",
              server_args: dict[str, Any] | None = None,
              max_sequences: int = 65536,
              load_adapter: Callable[[str, str], Any] | None = None,
              served_model_name: str | None = None,
              tool_call_parser: str = "auto") -> fastapi.FastAPI:
    """The FastAPI app serving `engine` with SGLang's native API (module docstring).

    Args:
      engine: a JaxEngine or LanedEngine (the app never closes it).
      tokenizer: the model's HF tokenizer (text inputs, stop strings, response text).
      model_path: reported by /get_model_info until a weight update replaces it.
      context_length: longest input + output a request may ask for (<= the engine's
        max_len).
      vocab_size: the model's vocabulary size (token ids are checked against it).
      load_params: path -> params of the engine's structure (`hf_params_loader`).
      weight_version: the version reported until an update sets another.
      server_args: extra fields reported by /get_server_info (the command-line flags).
      max_sequences: most sequences (requests x n) one /generate call may ask for.
      load_adapter: (PEFT folder, base HF folder) -> params of the engine's structure:
        the base with that adapter merged in (`main.adapter_loader`); None: LoRA is off.
      served_model_name: the model id of the OpenAI endpoint (default: model_path).
      tool_call_parser: the OpenAI endpoint's tool-call format (a name of
        parsers.tool_calls.TOOL_PARSERS, or "auto": read from the chat template).

    The OpenAI endpoint (agentjax.endpoint: POST /v1/chat/completions, GET /v1/models)
    serves the same engine for evaluation with any OpenAI client: plain serving, no
    sessions; its requests are held, paused and aborted as /generate's are, and its
    replies report this server's weight_version. A request that names no max_tokens may
    fill the context.

    `app.state.service.shutting_down = True` makes /health answer 503 (scripts/serve.py
    sets it when a shutdown signal arrives).
    """
    service = _Service(engine, tokenizer=tokenizer, model_path=model_path,
                       context_length=context_length, vocab_size=vocab_size,
                       load_params=load_params, weight_version=weight_version,
                       server_args=server_args or {}, max_sequences=max_sequences,
                       load_adapter=load_adapter)
    app = fastapi.FastAPI(title="agentjax SGLang-protocol server")
    app.state.service = service

    @app.exception_handler(RequestValidationError)
    async def invalid_body(request, error: RequestValidationError):
        problems = [f"{'.'.join(map(str, e['loc']))}: {e['msg']}"
                    for e in error.errors()[:5]]
        return _bad_request("; ".join(problems))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request, error: StarletteHTTPException):
        return _bad_request(str(error.detail)) if error.status_code == 400 else JSONResponse(
            {"object": "error", "message": str(error.detail), "type": str(error.status_code),
             "param": None, "code": error.status_code}, status_code=error.status_code)

    app.add_api_route("/generate", service.generate, methods=["POST", "PUT"])
    app.add_api_route("/health", service.health, methods=["GET"])
    app.add_api_route("/health_generate", service.health_generate, methods=["GET"])
    for prefix in ("/", "/get_"):
        app.add_api_route(f"{prefix}model_info", service.model_info, methods=["GET"])
        app.add_api_route(f"{prefix}server_info", service.server_info, methods=["GET"])
    app.add_api_route("/flush_cache", service.flush_cache, methods=["GET", "POST"])
    app.add_api_route("/abort_request", service.abort_request, methods=["POST"])
    app.add_api_route("/pause_generation", service.pause_generation, methods=["POST"])
    app.add_api_route("/continue_generation", service.continue_generation, methods=["POST"])
    app.add_api_route("/update_weights_from_disk", service.update_weights_from_disk,
                      methods=["POST"])
    app.add_api_route("/close_session", service.close_session, methods=["GET", "POST"])
    app.add_api_route("/load_lora_adapter", service.load_lora_adapter, methods=["POST"])
    app.add_api_route("/unload_lora_adapter", service.unload_lora_adapter, methods=["POST"])
    add_routes(app, ChatService(
        engine, tokenizer, sessions=None,
        sampling_defaults=SamplingParams(max_new_tokens=context_length),
        max_context=context_length, model_name=served_model_name or model_path,
        tool_parser=tool_call_parser, generate=service.generate_one,
        weight_version=lambda: service.weight_version))
    return app
