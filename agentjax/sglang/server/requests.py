"""SGLang's native `/generate` body in, engine requests out; completions back to its JSON.

Used by `rollout.server` (agentjax's engine behind SGLang's HTTP API). Every rule below
comes from SGLang's source (sgl-project/sglang, python/sglang/srt/...):

- Inputs (`managers/io_struct.py: GenerateReqInput.normalize_batch_and_arguments`):
  `text` or `input_ids`; `input_ids` as list[int] is one request, list[list[int]] a
  batch. Text is tokenized as SGLang's tokenizer manager does (`tokenizer(text)`: special
  tokens added the tokenizer's way). `sampling_params` is one dict for all or one per
  request. `n > 1` turns one request into a batch; `n` must be equal across a batch; the
  answer is a list ordered request by request, the `n` samples of each together, each
  sample with a fresh `meta_info.id` (`tokenizer_manager.py: _handle_batch_request`
  regenerates the rid of every copy). `rid`: a string for one request; for a batch, a
  list as long as the batch, or a string made `f"{rid}_{i}"`, or none (uuids); ids within
  one request must be unique ("Duplicate request IDs detected within the request").
- Sampling (`sampling/sampling_params.py`): SGLang builds `SamplingParams(**params)`, so
  an unknown key fails; here it is a 400 naming the key. `None` means the default.
  temperature < 1e-6 is greedy; top_k -1 (or >= vocab) keeps every token; top_p in
  (0, 1]; max_new_tokens >= 0 (None: up to the context length; 0: prefill only, answered
  with no output). The per-request seed is `sampling_seed`. Parameters this engine cannot
  honour (min_p, penalties, grammars, logit_bias, ignore_eos, stop_regex, min_new_tokens)
  are refused when set to anything but their neutral value — never silently dropped,
  since dropping them changes what is sampled.
- Context (`tokenizer_manager.py: _validate_one_request`): the input must be shorter
  than the context length, and input + max_new_tokens too.
- Output (`managers/detokenizer_manager.py: trim_matched_stop`,
  `tokenizer_manager.py: _handle_batch_output / convert_logprob_style`):
  `output_ids` are every sampled token, stop token or stop string included; only `text`
  is trimmed (a matched stop id drops the last token before decoding, a matched stop
  string cuts the text where it starts; `no_stop_trim` keeps both). `finish_reason` is
  `{"type": "stop", "matched": id_or_str}`, `{"type": "length", "length":
  max_new_tokens}` or `{"type": "abort", "message", "status_code", "err_type"}`
  (`managers/schedule_batch.py`). With `return_logprob`, `output_token_logprobs` holds
  `[logprob, token_id, text_or_null]` per output token and `input_token_logprobs` the
  default window of `logprob_start_len=-1`: `[[null, last_input_id, text_or_null]]`.
  Non-finite floats are sent as null (SGLang's orjson does the same).

Where this server differs from SGLang, deliberately:
- n > 1 with a `sampling_seed`: SGLang's copies share the seed, and its seeded sampler
  hashes (seed, position), so the copies come out identical; here sample j draws from
  `fold_in(PRNGKey(seed), j)`, as JaxEngine does in-process, so they differ and a served
  request equals the in-process one. JAX keys keep the seed's low 32 bits (x64 is off),
  in process as here.
- The log-probs are those of the distribution sampled from (after temperature, top-k and
  top-p, renormalized; greedy reports the untempered log-softmax, as SGLang does): see
  `rollout.sampling`. SGLang's (layers/sampler.py) are log softmax(logits / temperature)
  over the whole vocabulary, top-k / top-p not renormalized (with
  SGLANG_RETURN_ORIGINAL_LOGPROB=1: before the temperature); they agree when top_k and
  top_p are off.
- `text` and `input_ids` together, a list `rid` or list `sampling_params` for a single
  request, and a batch-size mismatch are 400s (SGLang errors or picks one silently).
- Input-token log-probs (`logprob_start_len >= 0`), top log-probs and
  `token_ids_logprob` are refused: the engine computes output log-probs only.
"""
from __future__ import annotations

import dataclasses
import math
import uuid
from typing import Any

import pydantic
from pydantic import StrictInt

from agentjax.engine.protocol import Completion, GenerateRequest, SamplingParams

# SGLang's _SAMPLING_EPS: temperatures below it sample greedily.
GREEDY_BELOW = 1e-6
_INT64 = 2**63


class GenerateBody(pydantic.BaseModel):
    """`GenerateReqInput`'s fields this server reads; other fields are ignored, as
    FastAPI ignores them for SGLang. The SGLang inputs it cannot serve are listed so that
    setting one is refused rather than dropped."""

    model_config = pydantic.ConfigDict(extra="ignore")

    rid: str | list[str] | None = None
    text: str | list[str] | None = None
    input_ids: list[StrictInt] | list[list[StrictInt]] | None = None
    sampling_params: dict[str, Any] | list[dict[str, Any]] | None = None
    return_logprob: bool | list[bool] | None = None
    logprob_start_len: int | list[int] | None = None
    top_logprobs_num: int | list[int] | None = None
    token_ids_logprob: list[int] | list[list[int]] | None = None
    return_text_in_logprobs: bool = False
    stream: bool = False
    session_id: str | None = None
    input_embeds: Any = None
    image_data: Any = None
    video_data: Any = None
    audio_data: Any = None
    lora_path: Any = None
    custom_logit_processor: Any = None
    session_params: Any = None
    return_hidden_states: Any = False


_UNSERVED_INPUTS = ("input_embeds", "image_data", "video_data", "audio_data",
                    "custom_logit_processor", "session_params", "return_hidden_states")


class SGLangSamplingParams(pydantic.BaseModel):
    """SGLang's `SamplingParams` API fields (sampling/sampling_params.py), defaults
    included; unknown keys are an error, as `SamplingParams(**params)` makes them."""

    model_config = pydantic.ConfigDict(extra="forbid")

    max_new_tokens: int | None = 128
    stop: str | list[str] | None = None
    stop_token_ids: list[int | None] | None = None
    stop_regex: str | list[str] | None = None
    temperature: float | None = 1.0
    top_p: float | None = 1.0
    top_k: int | None = -1
    min_p: float | None = 0.0
    frequency_penalty: float | None = 0.0
    presence_penalty: float | None = 0.0
    repetition_penalty: float | None = 1.0
    min_new_tokens: int | None = 0
    n: int | None = 1
    json_schema: str | None = None
    regex: str | None = None
    ebnf: str | None = None
    structural_tag: str | None = None
    ignore_eos: bool | None = False
    skip_special_tokens: bool | None = True
    spaces_between_special_tokens: bool | None = True
    no_stop_trim: bool | None = False
    custom_params: dict[str, Any] | None = None  # read only by custom logit processors
    stream_interval: int | None = None  # streaming only
    logit_bias: dict[str, float] | None = None
    sampling_seed: int | None = None


# Sampling parameters the engine does not implement, with their neutral values.
_UNSERVED_SAMPLING = {"stop_regex": None, "min_p": 0.0, "frequency_penalty": 0.0,
                      "presence_penalty": 0.0, "repetition_penalty": 1.0, "min_new_tokens": 0,
                      "json_schema": None, "regex": None, "ebnf": None, "structural_tag": None,
                      "ignore_eos": False, "logit_bias": None}


@dataclasses.dataclass(frozen=True)
class OutputOptions:
    """How one request's completions are rendered (they never change the sampling)."""

    return_logprob: bool = False
    return_text_in_logprobs: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False


@dataclasses.dataclass(frozen=True)
class GenerateItem:
    """One request of a /generate call: the engine request (its `n` samples) and how to
    answer it.

    Attributes:
      rid: the request's id (unique among requests in flight).
      sample_rids: `meta_info.id` of each sample: (rid,) when n == 1, else fresh uuids.
      request: what the engine samples (`request.sampling.n` completions).
      options: how the completions are rendered.
    """

    rid: str
    sample_rids: tuple[str, ...]
    request: GenerateRequest
    options: OutputOptions


def parse_generate(body: GenerateBody, *, tokenizer, vocab_size: int, context_length: int,
                   max_sequences: int, adapter: str | None = None
                   ) -> tuple[list[GenerateItem], bool]:
    """The requests of a /generate body, and whether it is a single request (answered
    with one object, else with a list of `sum(n)` objects in item order). `adapter`: the
    LoRA adapter the engine's weights hold (None: the base), the one `lora_path` (one
    name, or one per request) may name: the engine holds one set of weights.

    Raises:
      ValueError: the body is not a request this server can serve (the message says why;
        the server answers it with HTTP 400).
    """
    if body.stream:
        raise ValueError("stream=true is not supported: this server answers each request "
                         "once, when it is done; send stream=false")
    for name in _UNSERVED_INPUTS:
        if getattr(body, name) not in (None, False, [], {}):
            raise ValueError(f"{name} is not supported by this server (a text-only JAX "
                             "engine without multimodal inputs, session_params or hidden "
                             "states)")
    inputs, single = _inputs(body)
    batch = len(inputs)
    for name in _per_request(body.lora_path, batch, single, "lora_path", None):
        if name != adapter:
            raise ValueError(
                f"lora_path {name!r}: this server samples one set of weights, "
                + (f"the base model with the LoRA adapter {adapter!r} (name it)" if adapter
                   else "the base model (no adapter loaded)"))
    sampling = _per_request(body.sampling_params, batch, single, "sampling_params", {})
    parsed = [_parse_sampling(params or {}, i if not single else None)
              for i, params in enumerate(sampling)]
    n = parsed[0].n if parsed[0].n is not None else 1
    if any((p.n if p.n is not None else 1) != n for p in parsed):
        raise ValueError("The parallel_sample_num should be the same for all samples in "
                         "sample params.")
    if n < 1:
        raise ValueError(f"sampling_params.n must be >= 1, got {n}")
    if batch * n > max_sequences:
        raise ValueError(f"{batch} requests x n={n} sequences exceed this server's limit "
                         f"of {max_sequences} per /generate call")
    single = single and n == 1
    rids = _rids(body.rid, batch, single)
    per_request = {name: _per_request(getattr(body, name), batch, single, name, None, n)
                   for name in ("return_logprob", "logprob_start_len", "top_logprobs_num")}
    if body.token_ids_logprob:
        raise ValueError("token_ids_logprob is not supported: the engine computes the "
                         "log-prob of each sampled token only")
    if body.session_id is not None and n > 1:
        raise ValueError("a request with a session_id must have n == 1")
    items = []
    for i, (given, params, rid) in enumerate(zip(inputs, parsed, rids)):
        where = "" if single else f"request {i}: "
        input_ids = _token_ids(given, tokenizer, vocab_size, where)
        return_logprob = bool(per_request["return_logprob"][i])
        if return_logprob and per_request["logprob_start_len"][i] not in (None, -1):
            raise ValueError(f"{where}logprob_start_len must be -1 (output log-probs only): "
                             "this server does not compute input-token log-probs")
        if return_logprob and per_request["top_logprobs_num"][i]:
            raise ValueError(f"{where}top_logprobs_num must be 0: this server returns the "
                             "log-prob of each sampled token only")
        engine_sampling = _engine_sampling(params, len(input_ids), n=n, vocab_size=vocab_size,
                                           context_length=context_length, where=where)
        sample_rids = (rid,) if n == 1 else tuple(uuid.uuid4().hex for _ in range(n))
        options = OutputOptions(
            return_logprob=return_logprob,
            return_text_in_logprobs=body.return_text_in_logprobs,
            skip_special_tokens=_default(params.skip_special_tokens, True),
            spaces_between_special_tokens=_default(params.spaces_between_special_tokens, True),
            no_stop_trim=_default(params.no_stop_trim, False))
        items.append(GenerateItem(rid, sample_rids, GenerateRequest(
            tuple(input_ids), engine_sampling, session_id=body.session_id), options))
    return items, single


def _inputs(body: GenerateBody) -> tuple[list, bool]:
    """(one input per request: a str or a list of ids, single request?)."""
    if body.text is None and body.input_ids is None:
        raise ValueError("Either text, input_ids or input_embeds should be provided.")
    if body.text is not None and body.input_ids is not None:
        raise ValueError("give either text or input_ids, not both")
    if body.text is not None:
        if isinstance(body.text, str):
            return [body.text], True
        inputs = list(body.text)
    else:
        if not body.input_ids:
            raise ValueError("input_ids cannot be empty.")
        if isinstance(body.input_ids[0], int):
            return [body.input_ids], True
        inputs = list(body.input_ids)
    if not inputs:
        raise ValueError("a batch request needs at least one input")
    return inputs, False


def _per_request(value, batch: int, single: bool, name: str, default, n: int = 1) -> list:
    """A field given once for all requests or as a list with one value per request."""
    if not isinstance(value, list):
        return [default if value is None else value] * batch
    if single:
        raise ValueError(f"{name} is a list but the request is a single one")
    if n > 1 and name != "sampling_params":
        raise ValueError(f"Cannot use list {name} with parallel_sample_num > 1")
    if len(value) != batch:
        raise ValueError(f"{name} has {len(value)} entries for a batch of {batch} requests")
    return value


def _rids(rid, batch: int, single: bool) -> list[str]:
    """The request ids (GenerateReqInput._normalize_rid), checked for duplicates."""
    if single:
        if isinstance(rid, list):
            raise ValueError("rid must be a string for a single request")
        return [rid if rid is not None else uuid.uuid4().hex]
    if rid is None:
        return [uuid.uuid4().hex for _ in range(batch)]
    if isinstance(rid, str):
        return [f"{rid}_{i}" for i in range(batch)]
    if len(rid) != batch:
        raise ValueError("The specified rids length mismatch with the batch_size for batch "
                         "processing.")
    duplicates = sorted({r for r in rid if rid.count(r) > 1})
    if duplicates:
        raise ValueError(f"Duplicate request IDs detected within the request: {duplicates}")
    return list(rid)


def _parse_sampling(params: dict, index: int | None) -> SGLangSamplingParams:
    where = "sampling_params" if index is None else f"sampling_params[{index}]"
    try:
        parsed = SGLangSamplingParams.model_validate(params)
    except pydantic.ValidationError as error:
        problems = [f"{where}.{'.'.join(map(str, e['loc']))}: "
                    + ("unknown sampling parameter" if e["type"] == "extra_forbidden"
                       else e["msg"])
                    for e in error.errors(include_url=False, include_input=False)[:5]]
        raise ValueError("; ".join(problems)) from None
    for name, neutral in _UNSERVED_SAMPLING.items():
        value = getattr(parsed, name)
        if value not in (None, neutral, [], {}, ""):
            raise ValueError(f"{where}.{name}={value!r} is not supported: this engine "
                             "samples with temperature, top_k, top_p, stop and a seed only")
    return parsed


def _default(value, default):
    return default if value is None else value


def _token_ids(given, tokenizer, vocab_size: int, where: str) -> list[int]:
    if isinstance(given, str):
        if not given:
            raise ValueError(f"{where}text is empty")
        ids = list(tokenizer(given)["input_ids"])
    else:
        ids = list(given)
    if not ids:
        raise ValueError(f"{where}the input has no tokens")
    if min(ids) < 0 or max(ids) >= vocab_size:
        raise ValueError(f"{where}input_ids must be in [0, {vocab_size}) (the vocab size)")
    return ids


def _engine_sampling(p: SGLangSamplingParams, input_len: int, *, n: int, vocab_size: int,
                     context_length: int, where: str) -> SamplingParams:
    """The engine's SamplingParams for SGLang's (SamplingParams.__post_init__ / verify and
    tokenizer_manager._validate_one_request)."""
    temperature = _default(p.temperature, 1.0)
    top_p = _default(p.top_p, 1.0)
    top_k = _default(p.top_k, -1)
    if not math.isfinite(temperature) or temperature < 0:
        raise ValueError(f"{where}temperature must be a non-negative finite number, got "
                         f"{temperature}.")
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"{where}top_p must be in (0, 1], got {top_p}.")
    if top_k < 1 and top_k != -1:
        raise ValueError(f"{where}top_k must be -1 (disable) or at least 1, got {top_k}.")
    if input_len >= context_length:
        raise ValueError(f"{where}The input ({input_len} tokens) is longer than the model's "
                         f"context length ({context_length} tokens).")
    max_new_tokens = p.max_new_tokens
    if max_new_tokens is None:
        max_new_tokens = context_length - 1 - input_len
    if max_new_tokens < 0:
        raise ValueError(f"{where}max_new_tokens must be at least 0, got {max_new_tokens}.")
    if max_new_tokens + input_len >= context_length:
        raise ValueError(
            f"{where}Requested token count exceeds the model's maximum context length of "
            f"{context_length} tokens. You requested a total of {max_new_tokens + input_len} "
            f"tokens: {input_len} tokens from the input messages and {max_new_tokens} tokens "
            "for the completion. Please reduce the number of tokens in the input messages "
            "or the completion to fit within the limit.")
    stop_ids = tuple(sorted({int(t) for t in p.stop_token_ids or () if t is not None}))
    if stop_ids and (stop_ids[0] < 0 or stop_ids[-1] >= vocab_size):
        raise ValueError(f"{where}stop_token_ids must be in [0, {vocab_size})")
    seed = p.sampling_seed
    if seed is not None and not -_INT64 <= seed < _INT64:
        raise ValueError(f"{where}sampling_seed must fit in 64 bits, got {seed}")
    stop = (p.stop,) if isinstance(p.stop, str) else tuple(p.stop or ())
    return SamplingParams(
        temperature=0.0 if temperature < GREEDY_BELOW else temperature, top_p=top_p,
        top_k=-1 if top_k >= vocab_size else top_k, max_new_tokens=max_new_tokens,
        stop=stop, stop_token_ids=stop_ids, n=n, seed=seed)


def finish_reason(completion: Completion, max_new_tokens: int) -> dict[str, Any]:
    """SGLang's finish_reason JSON (managers/schedule_batch.py: FINISH_*.to_json)."""
    if completion.finish_reason == "stop":
        return {"type": "stop", "matched": completion.matched_stop}
    if completion.finish_reason == "length":
        return {"type": "length", "length": max_new_tokens}
    return {"type": "abort", "message": completion.meta.get("error", "Aborted"),
            "status_code": None, "err_type": None}


def output_text(tokenizer, output_ids, reason: dict[str, Any],
                options: OutputOptions) -> str:
    """The response's `text` (detokenizer_manager.py: trim_matched_stop; its falsy
    `matched` test, which leaves a stop on token id 0 untrimmed, is kept)."""
    matched = None if options.no_stop_trim else reason.get("matched")
    ids = list(output_ids)
    if matched and isinstance(matched, int):
        ids = ids[:-1]
    text = tokenizer.decode(ids, skip_special_tokens=options.skip_special_tokens,
                            spaces_between_special_tokens=options.spaces_between_special_tokens)
    if matched and isinstance(matched, str):
        start = text.find(matched)
        text = text if start == -1 else text[:start]
    return text


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def response_json(item: GenerateItem, completion: Completion, sample: int, *, tokenizer,
                  weight_version: str, latency_s: float) -> dict[str, Any]:
    """One `/generate` answer object (tokenizer_manager.py: _handle_batch_output)."""
    reason = finish_reason(completion, item.request.sampling.max_new_tokens)
    meta: dict[str, Any] = {"id": item.sample_rids[sample], "finish_reason": reason,
                            "prompt_tokens": len(item.request.input_ids),
                            "weight_version": weight_version, "total_retractions": 0}
    if item.options.return_logprob:
        def token_text(ids):
            if not item.options.return_text_in_logprobs:
                return [None] * len(ids)
            return [tokenizer.decode([i]) for i in ids]

        last = item.request.input_ids[-1]
        meta["input_token_logprobs"] = [[None, last, token_text([last])[0]]]
        meta["output_token_logprobs"] = [
            [_finite(lp), t, text] for lp, t, text in zip(
                completion.logprobs, completion.output_ids,
                token_text(completion.output_ids))]
    meta.update(completion_tokens=len(completion.output_ids),
                cached_tokens=int(completion.meta.get("cached_tokens", 0)),
                e2e_latency=latency_s)
    return {"text": output_text(tokenizer, completion.output_ids, reason, item.options),
            "output_ids": list(completion.output_ids), "meta_info": meta}


def aborted(item: GenerateItem, message: str) -> list[Completion]:
    """The completions of a request stopped before it finished (no output: the engine
    does not hand back a cancelled request's partial tokens)."""
    return [Completion([], [], "abort", None, {"error": message})
            for _ in range(item.request.sampling.n)]

