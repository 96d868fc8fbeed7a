"""SGLang's /generate wire format: the body sent for one sample and every check an
answer passes. Answers are written as SGLang builds them (paths under
sgl-project/sglang python/sglang/srt/)."""
import copy
import json

import numpy as np
import pytest

from agentjax.engine.protocol import GenerateRequest, SamplingParams
from agentjax.sglang.protocol import (MalformedResponse, error_message,
                                              generate_payload, parse_generate_response,
                                              sample_seed, validate_request, weight_version)

RID = "c0ffee-3-1"
WHERE = "http://h1:30000 (rid c0ffee-3-1)"


def _answer(output_ids, finish_reason, *, logprobs=None, version="default", prompt_tokens=5):
    """tokenizer_manager.py `_handle_batch_output`: {"text", "output_ids", "meta_info"};
    without return_text_in_logprobs `detokenize_logprob_tokens` leaves the triples' text
    None (JSON null)."""
    logprobs = logprobs if logprobs is not None else [-0.5 - k for k in range(len(output_ids))]
    return json.loads(json.dumps({"text": "whatever", "output_ids": output_ids, "meta_info": {
        "id": RID, "finish_reason": finish_reason, "prompt_tokens": prompt_tokens,
        "weight_version": version, "completion_tokens": len(output_ids), "cached_tokens": 3,
        "e2e_latency": 0.25,
        "output_token_logprobs": [[lp, t, None] for lp, t in zip(logprobs, output_ids)]}}))


def _parse(body, max_new_tokens=8):
    return parse_generate_response(body, where=WHERE, rid=RID, prompt_len=5,
                                   max_new_tokens=max_new_tokens)


def test_payload_sends_every_sampling_field_explicitly():
    sampling = SamplingParams(temperature=0.7, top_p=0.9, top_k=0, max_new_tokens=12,
                              stop=("</answer>",), stop_token_ids=(9, 4), n=3, seed=5)
    body = generate_payload(np.array([1, 2, 3]), sampling, seed=77, stop_token_ids=(9, 4, 2),
                            rid=RID)
    assert body == {
        "input_ids": [1, 2, 3],
        "sampling_params": {
            "temperature": 0.7, "top_p": 0.9, "top_k": -1, "min_p": 0.0,
            "repetition_penalty": 1.0, "frequency_penalty": 0.0, "presence_penalty": 0.0,
            "max_new_tokens": 12, "stop": ["</answer>"], "stop_token_ids": [2, 4, 9],
            "ignore_eos": False, "n": 1, "sampling_seed": 77, "skip_special_tokens": False,
            "no_stop_trim": True},
        "return_logprob": True, "logprob_start_len": -1, "return_text_in_logprobs": False,
        "stream": False, "rid": RID}
    json.dumps(body)  # plain JSON types only (numpy ids converted)
    assert generate_payload([1], SamplingParams(top_k=20), seed=0, stop_token_ids=(),
                            rid=RID)["sampling_params"]["top_k"] == 20
    with pytest.raises(ValueError, match="int32"):
        generate_payload([1], sampling, seed=2**31, stop_token_ids=(), rid=RID)


def test_sample_seeds():
    assert sample_seed(1234, 0) == 1234  # a one-sample request keeps its seed
    others = [sample_seed(1234, i) for i in range(1, 6)]
    assert len(set(others + [1234])) == 6 and all(0 <= s < 2**31 for s in others)
    assert others == [sample_seed(1234, i) for i in range(1, 6)]
    assert sample_seed(-5, 1) == sample_seed(-5, 1) >= 0


def test_finish_reasons_become_completions():
    # schedule_batch.py FINISH_MATCHED_TOKEN.to_json: {"type": "stop", "matched": id}
    stop_id = _parse(_answer([11, 12, 151645], {"type": "stop", "matched": 151645},
                             version="7"))
    assert (stop_id.output_ids, stop_id.finish_reason, stop_id.matched_stop) == (
        [11, 12, 151645], "stop", 151645)
    assert stop_id.logprobs == [-0.5, -1.5, -2.5]
    assert stop_id.meta == {"weight_version": 7, "cached_tokens": 3, "prompt_tokens": 5,
                            "completion_tokens": 3, "rid": RID}
    # FINISH_MATCHED_STR.to_json: {"type": "stop", "matched": "</answer>"}
    stop_str = _parse(_answer([11, 12], {"type": "stop", "matched": "</answer>"}))
    assert stop_str.matched_stop == "</answer>" and stop_str.meta["weight_version"] == "default"
    # FINISH_LENGTH.to_json: {"type": "length", "length": n}
    length = _parse(_answer([3] * 8, {"type": "length", "length": 8}))
    assert length.finish_reason == "length" and length.matched_stop is None
    # FINISH_ABORT.to_json: {"type": "abort", "message", "status_code", "err_type"}
    abort = _parse(_answer([11], {"type": "abort", "message": "Abort in waiting queue",
                                  "status_code": None, "err_type": None}))
    assert (abort.output_ids, abort.logprobs, abort.finish_reason) == ([], [], "abort")
    assert "Abort in waiting queue" in abort.meta["error"] and WHERE in abort.meta["error"]


def _break(edit):
    body = _answer([11, 12, 13], {"type": "stop", "matched": 13})
    edit(body)
    return body


MALFORMED = [
    ("not an object", lambda b: b.clear(), "meta_info"),
    ("finish_reason missing", lambda b: b["meta_info"].pop("finish_reason"), "finish_reason"),
    ("finish_reason unknown", lambda b: b["meta_info"].update(finish_reason={"type": "eos"}),
     "finish_reason"),
    ("rid of another request", lambda b: b["meta_info"].update(id="other"), "rid 'other'"),
    ("output_ids missing", lambda b: b.pop("output_ids"), "output_ids"),
    ("output id negative", lambda b: b.update(output_ids=[11, -1, 13]), "output_ids"),
    ("one log-prob short", lambda b: b["meta_info"]["output_token_logprobs"].pop(),
     "one \\[logprob, token_id, text\\] per output id \\(3\\), got 2"),
    ("log-probs missing", lambda b: b["meta_info"].pop("output_token_logprobs"), "got NoneType"),
    ("triple for another token", lambda b: b["meta_info"]["output_token_logprobs"][1]
     .__setitem__(1, 99), "is for token 99 but output_ids\\[1\\] is 12"),
    ("log-prob null", lambda b: b["meta_info"]["output_token_logprobs"][0].__setitem__(0, None),
     "not \\[logprob, token_id, text\\]"),
    ("log-prob NaN", lambda b: b["meta_info"]["output_token_logprobs"][0]
     .__setitem__(0, float("nan")), "log-prob nan"),
    ("log-prob positive", lambda b: b["meta_info"]["output_token_logprobs"][0]
     .__setitem__(0, 0.5), "log-prob 0.5"),
    ("prompt length differs", lambda b: b["meta_info"].update(prompt_tokens=4),
     "prompt_tokens is 4, but 5"),
    ("completion_tokens differs", lambda b: b["meta_info"].update(completion_tokens=2),
     "completion_tokens is 2"),
    ("matched id not last", lambda b: b["meta_info"].update(
        finish_reason={"type": "stop", "matched": 12}), "not the last output id"),
    ("matched a list", lambda b: b["meta_info"].update(
        finish_reason={"type": "stop", "matched": [1.5]}), "token id or a string"),
]


@pytest.mark.parametrize("what,edit,message", MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_answers_are_errors_naming_the_problem(what, edit, message):
    with pytest.raises(MalformedResponse, match=message) as error:
        _parse(_break(edit))
    assert WHERE in str(error.value)


def test_more_ids_than_asked_is_malformed():
    with pytest.raises(MalformedResponse, match="exceed max_new_tokens=2"):
        _parse(_answer([1, 2, 3], {"type": "length", "length": 3}), max_new_tokens=2)


def test_the_answer_is_not_mutated():
    body = _answer([11, 12, 13], {"type": "stop", "matched": 13})
    before = copy.deepcopy(body)
    completion = _parse(body)
    completion.output_ids.append(0)
    assert body == before


def test_error_messages_and_versions():
    # entrypoints/http_server.py `_create_error_response`: {"error": {"message": str(e)}}
    assert error_message({"error": {"message": "Duplicate request ID"}}, "x") == \
        "Duplicate request ID"
    assert error_message({"detail": "Not Found"}, "x") == "Not Found"  # FastAPI's 404
    assert error_message({"success": False, "message": "load failed"}, "x") == "load failed"
    assert error_message(None, "plain text") == "plain text"
    assert (weight_version("12"), weight_version("default"), weight_version(None)) == (
        12, "default", None)


@pytest.mark.parametrize("request_,message", [
    (GenerateRequest([]), "input_ids"),
    (GenerateRequest([1, -2]), "input_ids"),
    (GenerateRequest(["a"]), "input_ids"),
    (GenerateRequest([1], SamplingParams(n=0)), "n and max_new_tokens"),
    (GenerateRequest([1], SamplingParams(max_new_tokens=0)), "n and max_new_tokens"),
    (GenerateRequest([1], SamplingParams(temperature=-1.0)), "temperature"),
    (GenerateRequest([1], SamplingParams(top_p=0.0)), "top_p"),
    (GenerateRequest([1], SamplingParams(n=2), session_id="s"), "session"),
    (GenerateRequest([1], SamplingParams(seed=2**31)), "int32"),
])
def test_invalid_requests_name_the_request(request_, message):
    with pytest.raises(ValueError, match=message) as error:
        validate_request(3, request_)
    assert "requests[3]" in str(error.value)
    validate_request(0, GenerateRequest(np.array([5, 6]), SamplingParams(seed=-3)))
