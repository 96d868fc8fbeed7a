"""SGLang's native HTTP API as SGLangEngine speaks it: the /generate body of one sample,
the checks an answer passes before it becomes a Completion, and the control calls
(/health; pause, load weights, continue).

Paths below are in sgl-project/sglang, under python/sglang/srt/ unless they say docs/.

Request (managers/io_struct.py `GenerateReqInput`, sampling/sampling_params.py
`SamplingParams`):
- `input_ids`: token ids in, `output_ids` out; text never round-trips.
- `sampling_params` carries every field agentjax controls, neutral values included
  (min_p 0, no penalties): SGLang fills absent fields from the model's
  generation_config.json (`--sampling-defaults model`, the default of current releases),
  so an absent top_p could silently become Qwen's 0.8. `top_k <= 0` is sent as -1 (its
  `verify` rejects 0). `n` is always 1: a request with n > 1 becomes n requests with
  their own seeds, since SGLang would give n copies of one request one seed.
- `sampling_seed` (not `seed`): read only by servers launched with
  `--enable-deterministic-inference` (sampling/sampling_batch_info.py builds the seed
  tensor only then; layers/sampler.py `multinomial_with_seed` draws from seed and
  position), ignored otherwise. Versions whose SamplingParams lacks the field (before
  sglang PR #10678) reject the request: an unknown sampling_params key raises. SGLang's
  flashinfer backend refuses seeded top-k/top-p sampling (layers/sampler.py
  `_sample_from_probs`): launch with `--sampling-backend pytorch` for that. Seeds travel
  as int32 (sampling_batch_info.py).
- `skip_special_tokens: false`, `no_stop_trim: true`: `output_ids` are never trimmed
  (managers/tokenizer_manager.py copies the scheduler's ids); these keep `text` whole
  too. Stop strings are matched on the decoded tail of the output ids
  (managers/schedule_batch.py `Req._check_str_based_finish`), stop ids and eos on the
  last id: generation ends on the id that completes a stop, and that id is the last one.
- `return_logprob: true`, `logprob_start_len: -1` (output tokens only),
  `return_text_in_logprobs: false` (the triples carry null text).
- `rid`: unique per attempt; SGLang rejects a rid already in flight.

Response (managers/tokenizer_manager.py `_handle_batch_output`): `{"text", "output_ids",
"meta_info": {"id", "finish_reason", "prompt_tokens", "completion_tokens",
"cached_tokens", "weight_version", "output_token_logprobs": [[logprob, id, null], ...]}}`.
`finish_reason` (managers/schedule_batch.py `FINISH_*.to_json`): `{"type": "stop",
"matched": id | str}`, `{"type": "length", "length": n}`, `{"type": "abort", "message",
"status_code", "err_type"}`. A ValueError becomes HTTP 400 `{"error": {"message"}}`
(entrypoints/http_server.py `_create_error_response`).

`parse_generate_response` turns that into a Completion or raises `MalformedResponse`:
one finite log-prob per output id with the same token id, the rid echoed, the prompt
length echoed, at most max_new_tokens ids, a stop's matched id the last output id. A
response that breaks the protocol is an error, never silently wrong data.

Weights (docs/advanced_features/sglang_for_rl.md, "pause_generation --- update weights
--- continue_generation is the correct execution flow"): `load_weights` posts
/pause_generation {"mode": "abort"} (requests in flight come back as aborts),
/update_weights_from_disk {model_path, weight_version, flush_cache: true} (answers
`{success, message}`; flush_cache drops radix entries of the old weights), then
/continue_generation, which is sent even when the update failed.

Weight version of a server (entrypoints/http_server.py `model_info`): GET /model_info
answers `{"weight_version", "model_path", ...}` (0.5.6 to 0.5.23; /get_weight_version is
gone in 0.5.23).

sglang-router (the sgl-model-gateway, pip package sglang-router 0.3.x; its
docs/advanced_features/sgl_model_gateway.md): it parses /generate into a fixed struct
and forwards only the fields it knows, so `session_id` never reaches the worker; of the
request's headers it forwards `X-SMG-Routing-Key` (src/routers/header_utils.rs), which
its `manual` policy maps to one worker for good (src/policies/manual.rs); a key
`agentjax-session:<id>` also makes scripts/serve.py keep session <id> when the body names
none (a client sends it only when it closes its sessions: serve.py keeps a session's
cache until /close_session). It answers 404 to
/pause_generation and /update_weights_from_disk (it fans out only /flush_cache), so
weights go to the workers themselves. Its worker list: GET /workers `{"workers": [{"id",
"url", "is_healthy", ...}]}`, POST /workers `{"url"}` queues a registration (HTTP 202),
DELETE /workers/{id} a removal (HTTP 202).

LoRA (docs/advanced_features/lora.md; servers launched with --enable-lora
--max-lora-rank R --lora-target-modules ...): `load_adapter` pauses the same way, posts
/load_lora_adapter {lora_name, lora_path} (a PEFT folder) and continues; every /generate
then names the adapter in `lora_path` (null: the base model), and `unload_adapter`
posts /unload_lora_adapter {lora_name} for a version no request names any more.
"""
from __future__ import annotations

import asyncio
import json
import math
from typing import Any, Sequence

import aiohttp
import numpy as np

from agentjax.engine.protocol import Completion, GenerateRequest, SamplingParams, check_request

INT32 = 2**31
ROUTING_KEY_HEADER = "X-SMG-Routing-Key"  # sglang-router's session affinity (docstring)
# A routing key that also asks scripts/serve.py to keep the session's cache: a client that
# does not close its sessions sends the bare session id, which serve.py only routes by.
SERVER_SESSION_KEY = "agentjax-session:"
# log(softmax) of a near-certain token may round above 0 (SGLang takes log(probs)).
LOGPROB_ROUNDING = 1e-4


class MalformedResponse(ValueError):
    """A server's answer does not follow SGLang's /generate protocol."""


class RequestRejected(ValueError):
    """The server refused the request as invalid (HTTP 4xx): retrying cannot help."""


def validate_request(index: int, request: GenerateRequest) -> None:
    """ValueError naming `requests[index]` unless SGLang can take it."""
    s = request.sampling
    where = check_request(index, request)
    if s.seed is not None and not -INT32 <= s.seed < INT32:
        raise ValueError(f"{where}: seed {s.seed} does not fit SGLang's int32 sampling_seed")


def sample_seed(seed: int, index: int) -> int:
    """The seed of sample `index` of a request seeded `seed`: the seed itself for the
    first sample (so a one-sample request carries its seed unchanged to the server), a
    31-bit seed derived from (seed, index) for the others."""
    if index == 0:
        return seed
    state = np.random.SeedSequence([seed % 2**32, index]).generate_state(1)[0]
    return int(state & 0x7FFFFFFF)


def generate_payload(input_ids: Sequence[int], sampling: SamplingParams, *, seed: int,
                     stop_token_ids: Sequence[int], rid: str,
                     session_id: str | None = None,
                     lora_name: str | None = None) -> dict[str, Any]:
    """The /generate body of one sample (module docstring); `session_id` only for servers
    that keep a session's KV cache between turns (scripts/serve.py), `lora_name` the
    loaded adapter to sample with (None: the server's model as it is)."""
    if not -INT32 <= seed < INT32:
        raise ValueError(f"seed {seed} does not fit SGLang's int32 sampling_seed")
    extra = {} if session_id is None else {"session_id": session_id}
    if lora_name is not None:
        extra["lora_path"] = lora_name
    return {**extra,
        "input_ids": [int(t) for t in input_ids],
        "sampling_params": {
            "temperature": float(sampling.temperature),
            "top_p": float(sampling.top_p),
            "top_k": int(sampling.top_k) if sampling.top_k > 0 else -1,
            "min_p": 0.0,
            "repetition_penalty": 1.0,
            "frequency_penalty": 0.0,
            "presence_penalty": 0.0,
            "max_new_tokens": int(sampling.max_new_tokens),
            "stop": list(sampling.stop),
            "stop_token_ids": sorted({int(t) for t in stop_token_ids}),
            "ignore_eos": False,
            "n": 1,
            "sampling_seed": int(seed),
            "skip_special_tokens": False,
            "no_stop_trim": True,
        },
        "return_logprob": True,
        "logprob_start_len": -1,
        "return_text_in_logprobs": False,
        "stream": False,
        "rid": rid,
    }


def error_message(body: Any, fallback: str) -> str:
    """The message of an SGLang error body (`{"error": {"message"}}`, FastAPI's
    `{"detail"}`), else `fallback`."""
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])
        if body.get("detail"):
            return str(body["detail"])
        if body.get("message"):
            return str(body["message"])
    return fallback


def weight_version(value: Any) -> int | str | None:
    """SGLang reports weight versions as strings ("default" until a first update);
    agentjax's versions are integers: a string of digits becomes an int."""
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return value


def _fail(where: str, problem: str):
    raise MalformedResponse(f"{where}: {problem}")


def _is_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _logprobs(where: str, triples: Any, output_ids: list[int]) -> list[float]:
    """Log-probs of `[logprob, token_id, text|null]` triples checked against the ids."""
    if not isinstance(triples, list) or len(triples) != len(output_ids):
        _fail(where, f"output_token_logprobs must hold one [logprob, token_id, text] per "
                     f"output id ({len(output_ids)}), got "
                     f"{len(triples) if isinstance(triples, list) else type(triples).__name__}")
    out = []
    for k, (triple, token) in enumerate(zip(triples, output_ids)):
        if (not isinstance(triple, list) or len(triple) != 3 or isinstance(triple[0], bool)
                or not isinstance(triple[0], (int, float))):
            _fail(where, f"output_token_logprobs[{k}] is not [logprob, token_id, text]: "
                         f"{triple!r}")
        logprob, triple_id = float(triple[0]), triple[1]
        if triple_id != token:
            _fail(where, f"output_token_logprobs[{k}] is for token {triple_id!r} but "
                         f"output_ids[{k}] is {token}")
        if not math.isfinite(logprob) or logprob > LOGPROB_ROUNDING:
            _fail(where, f"output_token_logprobs[{k}] has log-prob {logprob} (a sampled "
                         "token's log-prob is finite and <= 0)")
        out.append(logprob)
    return out


def parse_generate_response(body: Any, *, where: str, rid: str, prompt_len: int,
                            max_new_tokens: int) -> Completion:
    """A Completion from one /generate answer (module docstring), or MalformedResponse.

    An abort comes back as a Completion with finish_reason "abort", no output ids and
    meta["error"] (the caller retries it). meta holds weight_version,
    cached_tokens, prompt_tokens, completion_tokens, rid.

    Args:
      body: the decoded JSON.
      where: names the server and request in errors.
      rid: the rid sent (meta_info.id must echo it).
      prompt_len: len(input_ids) sent (meta_info.prompt_tokens must echo it).
      max_new_tokens: the cap sent.
    """
    if not isinstance(body, dict) or not isinstance(body.get("meta_info"), dict):
        _fail(where, f"expected an object with meta_info, got {str(body)[:200]!r}")
    meta_info = body["meta_info"]
    reason = meta_info.get("finish_reason")
    if not isinstance(reason, dict) or reason.get("type") not in ("stop", "length", "abort"):
        _fail(where, f"finish_reason must be {{'type': 'stop' | 'length' | 'abort', ...}}, "
                     f"got {reason!r}")
    if meta_info.get("id", rid) != rid:
        _fail(where, f"answer is for rid {meta_info['id']!r}, not {rid!r}")
    output_ids = body.get("output_ids")
    if not isinstance(output_ids, list) or not all(_is_id(t) for t in output_ids):
        _fail(where, f"output_ids must be a list of token ids, got {str(output_ids)[:200]!r}")
    meta = {"weight_version": weight_version(meta_info.get("weight_version")),
            "cached_tokens": meta_info.get("cached_tokens"),
            "prompt_tokens": meta_info.get("prompt_tokens"),
            "completion_tokens": meta_info.get("completion_tokens"), "rid": rid}
    if reason["type"] == "abort":  # nothing of a partial output is kept
        meta["error"] = f"{where} aborted: {reason.get('message') or 'no message'}"
        return Completion([], [], "abort", None, meta)
    logprobs = _logprobs(where, meta_info.get("output_token_logprobs"), output_ids)
    if meta["prompt_tokens"] is not None and meta["prompt_tokens"] != prompt_len:
        _fail(where, f"prompt_tokens is {meta['prompt_tokens']}, but {prompt_len} ids were "
                     "sent")
    if meta["completion_tokens"] is not None and meta["completion_tokens"] != len(output_ids):
        _fail(where, f"completion_tokens is {meta['completion_tokens']} for "
                     f"{len(output_ids)} output ids")
    if len(output_ids) > max_new_tokens:
        _fail(where, f"{len(output_ids)} output ids exceed max_new_tokens={max_new_tokens}")
    matched = None
    if reason["type"] == "stop":
        matched = reason.get("matched")
        if _is_id(matched):
            if output_ids[-1:] != [matched]:
                _fail(where, f"stopped on token {matched}, which is not the last output id")
        elif not isinstance(matched, str) and matched is not None:
            _fail(where, f"a stop's matched must be a token id or a string, got {matched!r}")
    return Completion(list(output_ids), logprobs, reason["type"], matched, meta)


async def answers_health(client: aiohttp.ClientSession, url: str, timeout_s: float) -> bool:
    """True when GET url/health answers 200 within timeout_s."""
    try:
        async with client.get(url + "/health",
                              timeout=aiohttp.ClientTimeout(total=timeout_s)) as response:
            return response.status == 200
    except (aiohttp.ClientError, asyncio.TimeoutError):
        return False


async def read_answer(response: aiohttp.ClientResponse) -> tuple[int, Any, str]:
    """(HTTP status, the body parsed as JSON or None, the body's text)."""
    text = await response.text()
    try:
        return response.status, json.loads(text), text
    except ValueError:
        return response.status, None, text


async def _control(client: aiohttp.ClientSession, url: str, path: str, body: dict,
                   timeout_s: float) -> None:
    """POSTs a control call; RuntimeError unless it succeeded."""
    async with client.post(url + path, json=body,
                           timeout=aiohttp.ClientTimeout(total=timeout_s)) as response:
        code, answer, text = await read_answer(response)
    if code >= 300 or (isinstance(answer, dict) and answer.get("success") is False):
        raise RuntimeError(f"{path}: HTTP {code}: {error_message(answer, text[:200])}")


async def _paused_call(client: aiohttp.ClientSession, url: str, path: str, body: dict,
                       timeout_s: float, what: str) -> str | None:
    """Pause (aborting requests in flight), `path`, continue; None, or why it failed."""
    try:
        await _control(client, url, "/pause_generation", {"mode": "abort"}, timeout_s)
        try:
            await _control(client, url, path, body, timeout_s)
        finally:
            await _control(client, url, "/continue_generation", {}, timeout_s)
    except (aiohttp.ClientError, asyncio.TimeoutError, RuntimeError) as error:
        return f"{what} failed: {type(error).__name__}: {error}"
    return None


async def load_weights(client: aiohttp.ClientSession, url: str, folder: str, version: int,
                       timeout_s: float) -> str | None:
    """Pause, load `folder` as `version`, continue (module docstring); None, or why it
    failed."""
    return await _paused_call(
        client, url, "/update_weights_from_disk",
        {"model_path": folder, "weight_version": str(version), "flush_cache": True},
        timeout_s, f"loading weights version {version} from {folder}")


async def load_adapter(client: aiohttp.ClientSession, url: str, folder: str, name: str,
                       timeout_s: float) -> str | None:
    """Pause, load the PEFT adapter `folder` as `name`, continue (module docstring);
    None, or why it failed."""
    return await _paused_call(client, url, "/load_lora_adapter",
                              {"lora_name": name, "lora_path": folder}, timeout_s,
                              f"loading LoRA adapter {name} from {folder}")


async def unload_adapter(client: aiohttp.ClientSession, url: str, name: str,
                         timeout_s: float) -> str | None:
    """Unloads adapter `name`; None, or why it failed."""
    try:
        await _control(client, url, "/unload_lora_adapter", {"lora_name": name}, timeout_s)
    except (aiohttp.ClientError, asyncio.TimeoutError, RuntimeError) as error:
        return f"unloading LoRA adapter {name} failed: {type(error).__name__}: {error}"
    return None


async def served_version(client: aiohttp.ClientSession, url: str,
                         timeout_s: float) -> int | str | None:
    """The weight version a server reports on /model_info (None when it does not
    answer)."""
    try:
        async with client.get(url + "/model_info",
                              timeout=aiohttp.ClientTimeout(total=timeout_s)) as response:
            code, answer, _ = await read_answer(response)
    except (aiohttp.ClientError, asyncio.TimeoutError):
        return None
    if code != 200 or not isinstance(answer, dict):
        return None
    return weight_version(answer.get("weight_version"))


async def _router_call(client: aiohttp.ClientSession, method: str, url: str,
                       timeout_s: float, body: dict | None = None) -> Any:
    """The JSON answer of a router worker-list call; RuntimeError unless HTTP 2xx."""
    async with client.request(method, url, json=body,
                              timeout=aiohttp.ClientTimeout(total=timeout_s)) as response:
        code, answer, text = await read_answer(response)
    if not 200 <= code < 300:
        raise RuntimeError(f"{method} {url}: HTTP {code}: {error_message(answer, text[:200])}")
    return answer


async def router_workers(client: aiohttp.ClientSession, router_url: str,
                         timeout_s: float) -> dict[str, str]:
    """{worker URL: the router's worker id} of the workers a router routes to."""
    answer = await _router_call(client, "GET", router_url + "/workers", timeout_s)
    workers = answer.get("workers") if isinstance(answer, dict) else None
    if not isinstance(workers, list):
        raise RuntimeError(f"GET {router_url}/workers: no worker list in {str(answer)[:200]!r}")
    return {str(w["url"]).rstrip("/"): str(w["id"]) for w in workers
            if isinstance(w, dict) and "url" in w and "id" in w}


async def _set_routed(client: aiohttp.ClientSession, router_url: str, worker_url: str,
                      routed: bool, timeout_s: float, poll_s: float) -> str | None:
    """Queues the worker's registration (routed) or removal at the router, then waits
    until GET /workers shows it done (the router does both in the background); None, or
    why that failed."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    what = "adding" if routed else "removing"
    try:
        workers = await router_workers(client, router_url, timeout_s)
        if routed and worker_url not in workers:
            await _router_call(client, "POST", router_url + "/workers", timeout_s,
                               {"url": worker_url})
        elif not routed and worker_url in workers:
            await _router_call(client, "DELETE",
                               f"{router_url}/workers/{workers[worker_url]}", timeout_s)
        while (worker_url in await router_workers(client, router_url, timeout_s)) != routed:
            if asyncio.get_running_loop().time() > deadline:
                raise RuntimeError(f"GET /workers does not show it done within {timeout_s}s")
            await asyncio.sleep(poll_s)
    except (aiohttp.ClientError, asyncio.TimeoutError, RuntimeError) as error:
        return (f"{what} {worker_url} at the router {router_url} failed: "
                f"{type(error).__name__}: {error}")
    return None


async def add_to_router(client: aiohttp.ClientSession, router_url: str, worker_url: str,
                        timeout_s: float, poll_s: float = 0.05) -> str | None:
    """Has the router route to `worker_url` again; None, or why that failed."""
    return await _set_routed(client, router_url, worker_url, True, timeout_s, poll_s)


async def remove_from_router(client: aiohttp.ClientSession, router_url: str, worker_url: str,
                             timeout_s: float, poll_s: float = 0.05) -> str | None:
    """Has the router stop routing to `worker_url` (a no-op when it does not); None, or
    why that failed."""
    return await _set_routed(client, router_url, worker_url, False, timeout_s, poll_s)
