"""SGLangEngine: the Engine protocol over a pool of SGLang servers (native HTTP API).

    engine = SGLangEngine(["http://h1:30000", "http://h2:30000"], tokenizer=tok,
                          weights_dir="/shared/run/weights", export_fn=export)
    [[completion]] = await engine.generate([GenerateRequest(ids, SamplingParams(...))])
    engine.update_weights(params, version=3)     # export, then every server loads it

The wire format (request body, response checks) is `sglang/protocol.py`; this
module decides where each sample goes, what a failure does, and how weights reach the
servers, over one pool state (rotation, session pins, attempts in flight, probes, weight
versions) that generation, failover and weight sync share. Paths are in
sgl-project/sglang, under python/sglang/srt/ unless docs/.

Log-probs. For a sampled request SGLang reports log(softmax(logits / temperature)) over
the whole vocabulary: top-k, top-p and min-p choose the token (layers/sampler.py
`Sampler.forward` -> `_sample_from_probs`) but the reported log-prob is taken from the
untruncated tempered distribution ("temperature" in LOGPROB_DISTRIBUTIONS,
engine/protocol.py).
The environment variable SGLANG_RETURN_ORIGINAL_LOGPROB=1 makes it report
log_softmax(logits) before temperature ("raw"); `--rl-on-policy-target` computes
log_softmax(bf16 logits / temperature) ("temperature" again). Greedy requests report
log_softmax(logits): an all-greedy batch takes that branch, and a greedy request in a
mixed batch runs at temperature 1 with top_k 1 (sampling/sampling_params.py). Older
releases (sampler.py while it had `top_p_normalize_probs_torch`) renormalized over the
top-p set, not top-k. `logprob_distribution` says how the servers were launched
("temperature" for SGLang's default, "raw" under SGLANG_RETURN_ORIGINAL_LOGPROB,
"sampling" for agentjax's scripts/serve.py, whose JaxEngine reports the sampling
distribution); every Completion records `engine.reported_distribution` of its request
in meta["logprob_distribution"].

Routing. A sample goes to the server in rotation with the fewest outstanding requests
(then the fewest pinned sessions, then the lowest index) that has fewer than
`max_in_flight`; else it waits. The turns of a session (`GenerateRequest.session_id`)
go to the server of its first turn, whose radix cache then holds the episode's prefix
(SGLang reuses cached prefixes by itself, so a session needs no server state);
`end_session` drops the pin, and a session whose server left the rotation is re-pinned.

Failures. A transport error (refused, reset, dropped mid-answer, timed out) after which
/health does not answer either takes the server out of rotation and cancels every
attempt in flight on it; each is re-issued on another server under a fresh rid
(generation is stateless; a closed connection makes SGLang abort the request,
managers/tokenizer_manager.py), so nothing is lost and no completion is returned twice.
When /health answers, the failure is the request's: retried like HTTP 5xx and abort
finishes, with exponential backoff up to `retries` times, after which the sample comes
back as an "abort" Completion (the agent loop flags the episode). A server whose answers
fail `failure_threshold` times in a row (5xx or aborts, not those of a weight load) is
taken out like a dead one and its requests re-issued: least-outstanding balancing would
otherwise keep choosing the server that fails fastest. Its /health may still answer (a
wedged server): each time it rejoins and fails again it waits twice as long before the
next probe. An answer from older weights than those current when it was asked for (a
server restarted unnoticed with its launch weights) is re-issued and takes its server
out, to rejoin with the current weights. HTTP 4xx raises
RequestRejected, a malformed answer MalformedResponse. Servers out of rotation are
probed every `health_interval_s` and rejoin when /health answers and, once weights have
been synced, after reloading the current ones (a restarted server comes back with its
launch weights). No server in rotation for `grace_s`: EnginesUnavailable naming each URL.

Weight sync. `update_weights(params, version=v)` exports with `export_fn(params, folder)`
(a closure over `models.hf.save_hf`) into `weights_dir/v0000000v` (or takes an exported
folder), then every server at once pauses, loads it and continues
(`protocol.load_weights`): requests in flight come back as aborts and are retried,
so each completion comes from one version (meta["weight_version"], as the server reports
it). A server that fails is logged by URL and stays out of rotation until it has loaded
the weights; none succeeding raises EnginesUnavailable. Servers resolve model_path on
their own file systems: weights_dir must be shared storage at the same path. The last
`keep_versions` exported folders are kept.

Router (`router_url`): every /generate goes to an sglang-router, which balances `urls`
(its workers), retries and takes failing workers out itself; up to `max_in_flight` per
worker in rotation are in flight. Weight syncs, pause / continue and the startup check
go to the workers (the router forwards none of them). A worker that fails a load leaves
the router before generation resumes and rejoins it once it has loaded the current
weights; an answer from other weights (above) makes every worker that reports other
weights on /model_info leave it, requests waiting meanwhile. A session's turns carry its
id in the X-SMG-Routing-Key header (the router drops `session_id` from the body), which
its `manual` policy maps to one worker; with `server_sessions` the key is
`agentjax-session:<id>`, which scripts/serve.py adopts as the session, and an ended
session is closed on every worker.

LoRA (`lora=True`): `export_fn` writes a PEFT adapter folder per version instead
(models/peft.py), which every server loads as adapter "v0000000v" under the same pause
(`protocol.load_adapter`); from then on every /generate names it in `lora_path`, so no
request samples the base model, and each server unloads the adapter it held before.
Completions report the version of the adapter they named.

Event loops. `RolloutPool.collect_sync` runs every rollout in a fresh `asyncio.run` loop,
and an HTTP client belongs to one loop: each loop gets its own client, closed when the
loop ends (the pool's state persists). update_weights, health and wait_until_ready run
on a private thread's loop, so they work from plain code and from inside a running loop.
"""
from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import dataclasses
import functools
import itertools
import logging
import os
import random
import shutil
import time
import uuid
from typing import Any, Callable, Sequence

import aiohttp

from agentjax.engine.protocol import (LOGPROB_DISTRIBUTIONS, Completion, EnginesUnavailable,
                                     GenerateRequest, reported_distribution)
from agentjax.sglang.protocol import (INT32, ROUTING_KEY_HEADER, SERVER_SESSION_KEY,
                                     MalformedResponse, RequestRejected, add_to_router,
                                     answers_health, error_message, generate_payload,
                                     load_adapter, load_weights, parse_generate_response,
                                     read_answer, remove_from_router, sample_seed,
                                     served_version, unload_adapter, validate_request)

ExportFn = Callable[[Any, str], None]


def adapter_name(version: int) -> str:
    """The name servers hold weight version `version`'s LoRA adapter under."""
    return f"v{version:08d}"


_DONE, _RETRY, _REISSUE = "done", "retry", "reissue"


@dataclasses.dataclass(eq=False)
class _Server:
    url: str
    index: int
    outstanding: int = 0
    pinned: int = 0
    out_reason: str | None = None  # None: in rotation (unless updating)
    updating: bool = False
    version: int | None = None  # weights it loaded from this engine (None: unknown)
    adapter: str | None = None  # the LoRA adapter it holds (lora=True)
    attempts: set = dataclasses.field(default_factory=set)
    failures: int = 0  # 5xx or aborted answers in a row
    strikes: int = 0  # times taken out for failed answers since its last good one
    probe_after: float = 0.0  # time.monotonic() before which it is not probed to rejoin
    loads: int = 0  # weight loads started on it (an answer one aborted is no failure)

    @property
    def in_rotation(self) -> bool:
        return self.out_reason is None and not self.updating


class _LoopState:
    """What belongs to one event loop: the HTTP client, the wake-up event, the prober."""

    def __init__(self, client: aiohttp.ClientSession):
        self.loop = asyncio.get_running_loop()
        self.client = client
        self.changed = asyncio.Event()
        self.prober: asyncio.Task | None = None
        self.closer = asyncio.ensure_future(self._close_client_at_end())

    async def _close_client_at_end(self) -> None:
        """Closes the client's connections when the loop ends (asyncio.run cancels the
        tasks left, and this finally runs on the loop) or when cancelled by close()."""
        try:
            await asyncio.Event().wait()
        finally:
            await self.client.close()

    def notify(self) -> None:
        self.changed.set()
        self.changed = asyncio.Event()


class SGLangEngine:
    """Engine protocol over SGLang servers (module docstring).

    Args:
      urls: server base URLs (http://host:port): the servers themselves, or with
        router_url the router's workers, which weight syncs, pause / continue and the
        startup check reach directly.
      router_url: an sglang-router in front of `urls`: every /generate goes to it
        (module docstring: router).
      tokenizer: optional; its eos and chat-template end-of-turn ids are added to every
        request's stop_token_ids, the ids JaxEngine always stops on.
      weights_dir: where exported versions go (shared storage the servers read).
      export_fn: export_fn(params, folder) writes an HF folder SGLang loads; needed to
        pass params (not a folder) to update_weights.
      logprob_distribution: what the servers' log-probs are (module docstring).
      max_in_flight: most requests in flight per server.
      request_timeout_s, connect_timeout_s, health_timeout_s, weight_sync_timeout_s:
        HTTP timeouts of a generation, of connecting, of /health, of each sync call.
      retries: retries of a sample after 5xx / abort / timeout answers.
      failure_threshold: 5xx or aborted answers in a row that take a server out of
        rotation (without a router).
      backoff_s: first retry delay, doubled per retry up to 16x.
      health_interval_s: how often servers out of rotation are probed.
      grace_s: how long no server may be in rotation before EnginesUnavailable.
      keep_versions: exported folders kept.
      seed: seed of the stream unseeded requests draw their sampling_seed from.
      log: where warnings go (default: this module's logger).
      server_sessions: send each turn's session_id and close ended sessions on their
        server, for servers that keep a session's KV cache between turns
        (scripts/serve.py, whose turns otherwise re-prefill the whole context). SGLang
        reuses prefixes through its radix cache instead: leave it off there.
      lora: weights are LoRA adapters: export_fn writes PEFT folders, servers (launched
        with --enable-lora) load them with /load_lora_adapter and every request names
        the current one (module docstring).
    """

    def __init__(self, urls: Sequence[str], *, tokenizer=None, weights_dir: str | None = None,
                 export_fn: ExportFn | None = None, logprob_distribution: str = "temperature",
                 max_in_flight: int = 128, request_timeout_s: float = 600.0,
                 connect_timeout_s: float = 5.0, health_timeout_s: float = 5.0,
                 weight_sync_timeout_s: float = 600.0, retries: int = 3,
                 backoff_s: float = 0.5, health_interval_s: float = 1.0, grace_s: float = 120.0,
                 keep_versions: int = 2, seed: int = 0,
                 log: Callable[[str], None] | None = None, server_sessions: bool = False,
                 lora: bool = False, router_url: str | None = None,
                 failure_threshold: int = 3):
        urls = [u.rstrip("/") for u in ([urls] if isinstance(urls, str) else urls)]
        router_url = router_url.rstrip("/") if router_url else None
        every = urls + ([router_url] if router_url else [])
        if not urls or any(not u.startswith(("http://", "https://")) for u in every):
            raise ValueError(f"SGLangEngine needs http(s):// server URLs, got {every!r}")
        if len(set(every)) != len(every):
            raise ValueError(f"SGLangEngine got a URL twice: {every!r}")
        if logprob_distribution not in LOGPROB_DISTRIBUTIONS:
            raise ValueError(f"logprob_distribution must be one of {LOGPROB_DISTRIBUTIONS}, "
                             f"got {logprob_distribution!r}")
        if min(max_in_flight, keep_versions, failure_threshold) < 1 or retries < 0:
            raise ValueError("need max_in_flight >= 1, keep_versions >= 1, "
                             "failure_threshold >= 1, retries >= 0")
        self.servers = [_Server(url, i) for i, url in enumerate(urls)]
        self.router = _Server(router_url, len(urls)) if router_url else None
        self._members = self.servers + ([self.router] if self.router else [])
        self.failure_threshold = failure_threshold
        self.stop_ids: tuple[int, ...] = ()
        if tokenizer is not None:
            from agentjax.models.tokenizer import stop_token_ids
            self.stop_ids = stop_token_ids(tokenizer)
        self.weights_dir = os.path.abspath(weights_dir) if weights_dir else None
        self.export_fn = export_fn
        self.logprob_distribution = logprob_distribution
        self.max_in_flight, self.retries, self.backoff_s = max_in_flight, retries, backoff_s
        self.request_timeout_s = request_timeout_s
        self.connect_timeout_s, self.health_timeout_s = connect_timeout_s, health_timeout_s
        self.weight_sync_timeout_s = weight_sync_timeout_s
        self.health_interval_s, self.grace_s = health_interval_s, grace_s
        self.keep_versions = keep_versions
        self.log = log or logging.getLogger(__name__).warning
        self.server_sessions = server_sessions
        self.lora = lora
        self.weight_version = 0
        self.stats: collections.Counter = collections.Counter()
        self._folder: str | None = None  # the current weights, once synced
        self._exported: list[str] = []
        self._pins: dict[str, _Server] = {}
        self._rng = random.Random(seed)
        self._rid_prefix, self._rid_count = uuid.uuid4().hex, itertools.count()
        self._unavailable_since: float | None = None
        self._state: _LoopState | None = None
        self._closed = False

    # ---------------------------------------------------------------- Engine protocol

    async def generate(self, requests: Sequence[GenerateRequest]) -> list[list[Completion]]:
        """Samples every request; returns its `n` completions per request, in order.
        Raises ValueError naming the request for invalid ones (module docstring for the
        failures it raises)."""
        if self._closed:
            raise RuntimeError("SGLangEngine is closed")
        for index, request in enumerate(requests):
            validate_request(index, request)
        state = self._loop_state()
        jobs = [(i, k) for i, request in enumerate(requests) for k in range(request.sampling.n)]
        tasks = [asyncio.ensure_future(self._sample(state, requests[i], k)) for i, k in jobs]
        try:
            results = await asyncio.gather(*tasks)
        except BaseException:
            for task in tasks:
                task.cancel()
            raise
        out: list[list[Completion]] = [[] for _ in requests]
        for (i, _), completion in zip(jobs, results):
            out[i].append(completion)
        return out

    def update_weights(self, weights: Any, *, version: int | None = None) -> None:
        """Loads new weights on every server (module docstring).

        Args:
          weights: params (exported with export_fn) or the path of an exported HF folder.
          version: the version completions will report (default: previous + 1).
        """
        version = self.weight_version + 1 if version is None else int(version)
        if isinstance(weights, (str, os.PathLike)):
            folder = os.path.abspath(os.fspath(weights))
            marker = "adapter_config.json" if self.lora else "config.json"
            if not os.path.isfile(os.path.join(folder, marker)):
                raise FileNotFoundError(f"{folder} is not an exported "
                                        f"{'PEFT adapter' if self.lora else 'HF'} folder "
                                        f"(no {marker})")
        else:
            if self.export_fn is None or self.weights_dir is None:
                raise ValueError("SGLangEngine.update_weights got params: pass export_fn and "
                                 "weights_dir to the constructor (or pass an exported folder)")
            folder = os.path.join(self.weights_dir, f"v{version:08d}")
            self.export_fn(weights, folder)
            if folder in self._exported:  # a version exported again: one folder to prune
                self._exported.remove(folder)
            self._exported.append(folder)

        async def load_everywhere(client):
            errors = await asyncio.gather(*(self._load(client, s, folder, version)
                                            for s in self.servers))
            # Before they leave `updating`, so no request of this engine reaches them.
            await asyncio.gather(*(self._leave_router(client, s)
                                   for s, error in zip(self.servers, errors) if error))
            return errors

        for server in self.servers:
            server.updating = True
        try:
            errors = self._run_sync(load_everywhere)
        finally:
            for server in self.servers:
                server.updating = False
        self.weight_version, self._folder = version, folder
        self.stats["weight_syncs"] += 1
        for server, error in zip(self.servers, errors):
            if error is not None:
                self._take_out(None, server, error)
        self._prune()
        if all(error is not None for error in errors):
            raise EnginesUnavailable(self._unavailable_message())

    def health(self) -> bool:
        """True when a server answers /health and holds the current weights (a server
        out of rotation is given the chance to rejoin first), and the router, if any,
        answers /health."""
        async def check(client, server):
            if server.out_reason is not None:
                await self._try_rejoin(None, client, server)
            return server.in_rotation and await self._answers_health(client, server)
        answers = self._run_sync(lambda client: asyncio.gather(*(
            check(client, s) for s in self._members)))
        return any(answers[:len(self.servers)]) and all(answers[len(self.servers):])

    def end_session(self, session_id: str) -> None:
        if self.router is None:
            server = self._pins.pop(session_id, None)
            if server is None:
                return
            server.pinned -= 1
            holders = [server]
        else:  # the router chose the worker: whichever holds the session frees it
            holders = self.servers
        state = self._state
        if self.server_sessions and state is not None and not state.loop.is_closed():
            # Called from the episode's coroutine: the close runs beside it. One cancelled
            # when the loop ends only delays the free: a weight update drops every session.
            for server in holders:
                state.loop.call_soon_threadsafe(functools.partial(
                    asyncio.ensure_future,
                    self._close_session(state.client, server, session_id)))

    async def _close_session(self, client: aiohttp.ClientSession, server: _Server,
                             session_id: str) -> None:
        try:
            async with client.post(f"{server.url}/close_session",
                                   json={"session_id": session_id},
                                   timeout=aiohttp.ClientTimeout(total=self.health_timeout_s)):
                pass
        except (aiohttp.ClientError, asyncio.TimeoutError):
            pass  # a server that is gone holds no session

    def wait_until_ready(self, timeout_s: float) -> None:
        """Waits until every server (and the router) answers /health; else
        EnginesUnavailable naming those that did not within timeout_s (for a trainer's
        startup check)."""
        deadline = time.monotonic() + timeout_s
        while True:
            answers = self._run_sync(lambda client: asyncio.gather(*(
                self._answers_health(client, s) for s in self._members)))
            silent = [s.url for s, ok in zip(self._members, answers) if not ok]
            if not silent:
                return
            if time.monotonic() > deadline:
                raise EnginesUnavailable(f"no answer from {', '.join(silent)} on /health "
                                         f"within {timeout_s}s")
            time.sleep(min(self.health_interval_s, max(deadline - time.monotonic(), 0)))

    def close(self) -> None:
        self._closed = True
        state, self._state = self._state, None
        if state is not None and not state.loop.is_closed():
            state.loop.call_soon_threadsafe(state.closer.cancel)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---------------------------------------------------------------- one sample

    async def _sample(self, state: _LoopState, request: GenerateRequest,
                      index: int) -> Completion:
        """One sample, re-issued and retried until it completes (module docstring)."""
        s = request.sampling
        seed = self._rng.randrange(INT32) if s.seed is None else sample_seed(s.seed, index)
        stop_ids = tuple(s.stop_token_ids) + self.stop_ids
        base, failures, attempts = f"{self._rid_prefix}-{next(self._rid_count)}", 0, 0
        # A sample that keeps losing its server (one it crashes?) stops after each lost
        # it twice.
        max_attempts = self.retries + 1 + 2 * len(self.servers)
        while True:
            attempts += 1
            payload = generate_payload(
                request.input_ids, s, seed=seed, stop_token_ids=stop_ids,
                rid=f"{base}-{attempts}",
                session_id=request.session_id if self.server_sessions else None,
                lora_name=adapter_name(self.weight_version) if self.lora else None)
            server = await self._acquire(state, request.session_id)
            kind, value = await self._attempt(state, server, payload, request.session_id)
            if kind == _DONE:
                value.meta.update(server=server.url, attempts=attempts,
                                  logprob_distribution=reported_distribution(
                                      self.logprob_distribution, s))
                if value.meta["weight_version"] is None:
                    value.meta["weight_version"] = server.version
                return value
            if kind == _REISSUE and attempts < max_attempts:
                self.stats["reissued"] += 1
                continue
            failures += 1
            if failures > self.retries or attempts >= max_attempts:
                return Completion([], [], "abort", None, {
                    "error": f"gave up after {failures} failed attempts; last: {value}",
                    "server": server.url, "attempts": attempts, "weight_version": None})
            self.stats["retried"] += 1
            await asyncio.sleep(self.backoff_s * 2 ** min(failures - 1, 4)
                                * random.uniform(0.5, 1.0))

    async def _attempt(self, state: _LoopState, server: _Server, payload: dict,
                       session_id: str | None) -> tuple[str, Any]:
        """One POST /generate as a task the server's eviction can cancel; releases the
        server's slot. (kind, Completion or why it failed)."""
        task = asyncio.ensure_future(self._post_generate(state, server, payload, session_id))
        server.attempts.add(task)
        try:
            await asyncio.wait({task})
        finally:
            server.attempts.discard(task)
            server.outstanding -= 1
            state.notify()
            if not task.done():
                task.cancel()
        if task.cancelled():
            return _REISSUE, f"{server.url} left the rotation"
        return task.result()

    async def _post_generate(self, state: _LoopState, server: _Server, payload: dict,
                             session_id: str | None) -> tuple[str, Any]:
        where = f"{server.url} (rid {payload['rid']})"
        self.stats["attempts"] += 1
        # What the answer is checked against: the weights current when it was asked for.
        version, synced, loads = self.weight_version, self._folder is not None, server.loads
        headers = None
        if server is self.router and session_id is not None:
            prefix = SERVER_SESSION_KEY if self.server_sessions else ""
            headers = {ROUTING_KEY_HEADER: prefix + session_id}
        try:
            async with state.client.post(server.url + "/generate", json=payload,
                                         headers=headers) as response:
                code, body, text = await read_answer(response)
        except (aiohttp.ClientError, asyncio.TimeoutError) as error:
            connecting = isinstance(error, (aiohttp.ClientConnectorError,
                                            aiohttp.ConnectionTimeoutError))
            what = (f"no answer within {self.request_timeout_s}s"
                    if isinstance(error, asyncio.TimeoutError) and not connecting
                    else f"{type(error).__name__}: {error}")
            # A connection that dropped (a keep-alive one the server had just closed?) or
            # an answer too slow, from a server whose /health answers, is this request's
            # failure, not the server's.
            if not connecting and await self._answers_health(state.client, server):
                return _RETRY, f"{where}: {what}"
            self._take_out(state, server, f"{what}; no /health answer")
            return _REISSUE, where
        if code >= 500:
            return self._failed_answer(state, server, loads,
                                       f"{where}: HTTP {code}: {error_message(body, text[:200])}")
        if code >= 400:
            raise RequestRejected(f"{where}: HTTP {code}: {error_message(body, text[:200])}")
        if body is None:
            raise MalformedResponse(f"{where}: HTTP {code} with a body that is not JSON: "
                                    f"{text[:200]!r}")
        completion = parse_generate_response(
            body, where=where, rid=payload["rid"], prompt_len=len(payload["input_ids"]),
            max_new_tokens=payload["sampling_params"]["max_new_tokens"])
        if completion.finish_reason == "abort":
            return self._failed_answer(state, server, loads, completion.meta["error"])
        reported = completion.meta["weight_version"]
        if "lora_path" in payload:  # the server reports its base's version
            completion.meta["weight_version"] = int(payload["lora_path"][1:])
        elif synced and reported is not None and not (
                isinstance(reported, int) and reported >= version):
            self._stale(state, server, reported)
            return _REISSUE, f"{where} sampled with weights version {reported!r}"
        server.failures = server.strikes = 0
        return _DONE, completion

    def _failed_answer(self, state: _LoopState, server: _Server, loads: int,
                       message: str) -> tuple[str, str]:
        """A 5xx or aborted answer: retried; re-issued elsewhere when it takes its server
        out of rotation (failure_threshold in a row). The router's answers are its
        workers' after its own retries, and a weight load aborts what is in flight:
        neither counts."""
        if server.out_reason is not None:
            return _REISSUE, message
        if server is self.router or server.updating or server.loads != loads:
            return _RETRY, message
        server.failures += 1
        if server.failures < self.failure_threshold:
            return _RETRY, message
        self._take_out(state, server, f"{server.failures} failed answers in a row, the "
                                      f"last: {message}")
        # A wedged server's /health may answer: each time it fails again it waits twice
        # as long before it is probed.
        server.strikes += 1
        server.probe_after = (time.monotonic()
                              + self.health_interval_s * 2 ** min(server.strikes - 1, 6))
        return _REISSUE, message

    def _stale(self, state: _LoopState, server: _Server, reported: Any) -> None:
        """An answer from weights older than those current when it was asked for (a
        server restarted with its launch weights): that server leaves the rotation and
        rejoins with the current ones. Behind a router, whichever workers serve other
        weights leave it; requests wait meanwhile."""
        if self.router is None:
            self._take_out(state, server, f"sampled with weights version {reported!r}, "
                                          f"not {self.weight_version}")
        elif not self.router.updating:
            self.router.updating = True
            asyncio.ensure_future(self._drop_stale_workers(state))

    async def _drop_stale_workers(self, state: _LoopState) -> None:
        try:
            versions = await asyncio.gather(*(
                served_version(state.client, s.url, self.health_timeout_s)
                for s in self.servers))
            for server, served in zip(self.servers, versions):
                if server.in_rotation and served != self.weight_version:
                    self._take_out(state, server, f"serves weights version {served!r}, not "
                                                  f"{self.weight_version}")
                    await self._leave_router(state.client, server)
        finally:
            self.router.updating = False
            state.notify()

    # ---------------------------------------------------------------- rotation

    async def _acquire(self, state: _LoopState, session_id: str | None) -> _Server:
        """A slot on the session's server or the least loaded one; waits for one."""
        while True:
            if self._closed:
                raise RuntimeError("SGLangEngine is closed")
            server = self._pick(session_id)
            if server is not None:
                server.outstanding += 1
                return server
            if any(s.out_reason is not None for s in self._members):
                self._ensure_prober(state)
            if not (any(s.in_rotation or s.updating for s in self.servers)
                    and (self.router is None or self.router.out_reason is None)):
                now = time.monotonic()
                self._unavailable_since = self._unavailable_since or now
                if now - self._unavailable_since > self.grace_s:
                    raise EnginesUnavailable(self._unavailable_message())
            try:
                await asyncio.wait_for(state.changed.wait(), self.health_interval_s)
            except TimeoutError:
                pass

    def _pick(self, session_id: str | None) -> _Server | None:
        if self.router is not None:  # it balances, max_in_flight per worker in rotation
            workers = sum(s.in_rotation for s in self.servers)
            fits = self.router.outstanding < self.max_in_flight * workers
            return self.router if self.router.in_rotation and fits else None
        pinned = self._pins.get(session_id) if session_id is not None else None
        if pinned is not None and pinned.in_rotation:
            return pinned if pinned.outstanding < self.max_in_flight else None
        free = [s for s in self.servers if s.in_rotation and s.outstanding < self.max_in_flight]
        server = min(free, key=lambda s: (s.outstanding, s.pinned, s.index), default=None)
        if server is not None and session_id is not None:
            if pinned is not None:
                pinned.pinned -= 1
            self._pins[session_id] = server
            server.pinned += 1
        return server

    def _take_out(self, state: _LoopState | None, server: _Server, reason: str) -> None:
        """Out of rotation: its other attempts are cancelled (and re-issued)."""
        server.version = None  # what it holds when it comes back is unknown
        if server.out_reason is not None:
            return
        server.out_reason = reason
        self.stats["taken_out"] += 1
        self.log(f"SGLangEngine: {server.url} out of rotation: {reason}")
        if state is not None:  # else called off the loop (update_weights): no tasks to touch
            current = asyncio.current_task()
            for task in list(server.attempts):
                if task is not current:
                    task.cancel()
            self._ensure_prober(state)
            state.notify()

    def _ensure_prober(self, state: _LoopState) -> None:
        if state.prober is None or state.prober.done():
            state.prober = asyncio.ensure_future(self._probe(state))

    async def _probe(self, state: _LoopState) -> None:
        """Brings servers back into rotation while any is out."""
        while not self._closed and any(s.out_reason is not None for s in self._members):
            await asyncio.sleep(self.health_interval_s)
            await asyncio.gather(*(self._try_rejoin(state, state.client, s)
                                   for s in self._members if s.out_reason is not None))

    async def _try_rejoin(self, state: _LoopState | None, client: aiohttp.ClientSession,
                          server: _Server) -> None:
        if time.monotonic() < server.probe_after or not await self._answers_health(
                client, server):
            return
        if server is not self.router:
            if self._folder is not None and server.version != self.weight_version:
                error = await self._load(client, server, self._folder, self.weight_version)
                if error is not None:
                    server.out_reason = error
                    return
            if self.router is not None:
                error = await add_to_router(client, self.router.url, server.url,
                                            self.weight_sync_timeout_s)
                if error is not None:
                    server.out_reason = error
                    return
        server.out_reason, self._unavailable_since = None, None
        self.stats["rejoined"] += 1
        self.log(f"SGLangEngine: {server.url} back in rotation")
        if state is not None:
            state.notify()

    def _unavailable_message(self) -> str:
        reasons = "; ".join(f"{s.url}: {s.out_reason or 'updating'}" for s in self._members
                            if not s.in_rotation)
        return (f"no SGLang server in rotation for {self.grace_s}s (servers: {reasons}); "
                "restart them, then resume the run")

    # ---------------------------------------------------------------- HTTP helpers

    def _loop_state(self) -> _LoopState:
        """This loop's client and event (module docstring: event loops)."""
        loop = asyncio.get_running_loop()
        if self._state is None or self._state.loop is not loop:
            self._state = _LoopState(self._session(self.request_timeout_s))
            self._unavailable_since = None  # probing restarts with this loop: so does grace
        return self._state

    def _session(self, timeout_s: float) -> aiohttp.ClientSession:
        """An HTTP client for the running loop. aiohttp, not httpx: httpcore's pool scans
        every connection each time a request starts or ends; 64 concurrent POSTs of a
        300-token /generate body cost ~12 ms of client CPU each with httpx, ~0.5 ms with
        aiohttp (scripts/bench/serve.py's rollout: 5.3 s -> 0.3 s of client CPU)."""
        return aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0),  # max_in_flight bounds each server
            timeout=aiohttp.ClientTimeout(total=timeout_s,
                                          sock_connect=self.connect_timeout_s))

    def _run_sync(self, calls: Callable[[aiohttp.ClientSession], Any]) -> Any:
        """Runs `await calls(client)` on a private thread's event loop."""
        async def main():
            async with self._session(self.weight_sync_timeout_s) as client:
                return await calls(client)

        with concurrent.futures.ThreadPoolExecutor(1) as thread:
            return thread.submit(asyncio.run, main()).result()

    async def _answers_health(self, client: aiohttp.ClientSession, server: _Server) -> bool:
        return await answers_health(client, server.url, self.health_timeout_s)

    async def _leave_router(self, client: aiohttp.ClientSession, server: _Server) -> None:
        if self.router is not None:
            error = await remove_from_router(client, self.router.url, server.url,
                                             self.weight_sync_timeout_s)
            if error is not None:
                self.log(f"SGLangEngine: {error}")

    async def _load(self, client: aiohttp.ClientSession, server: _Server, folder: str,
                    version: int) -> str | None:
        server.loads += 1
        if not self.lora:
            error = await load_weights(client, server.url, folder, version,
                                       self.weight_sync_timeout_s)
            if error is None:
                server.version = version
            return error
        name = adapter_name(version)
        error = await load_adapter(client, server.url, folder, name, self.weight_sync_timeout_s)
        if error is not None:
            return error
        old, server.version, server.adapter = server.adapter, version, name
        if old is not None and old != name:  # no request names it any more
            unload_error = await unload_adapter(client, server.url, old,
                                                self.weight_sync_timeout_s)
            if unload_error is not None:
                self.log(f"SGLangEngine: {server.url}: {unload_error}")
        return None

    def _prune(self) -> None:
        """Deletes exported folders but the last keep_versions."""
        while len(self._exported) > self.keep_versions:
            folder = self._exported.pop(0)
            try:
                shutil.rmtree(folder)
            except OSError as error:
                self.log(f"SGLangEngine: could not delete old weights {folder}: {error}")

