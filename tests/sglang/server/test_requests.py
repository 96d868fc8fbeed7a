"""SGLang /generate bodies become the engine requests SGLang's rules say they are
(python/sglang/srt/managers/io_struct.py: GenerateReqInput.normalize_batch_and_arguments,
sampling/sampling_params.py, managers/tokenizer_manager.py: _validate_one_request), and
completions come back in its JSON (managers/detokenizer_manager.py: trim_matched_stop,
managers/schedule_batch.py: FINISH_*.to_json)."""
import math

import pytest

from agentjax.engine.protocol import Completion, SamplingParams
from agentjax.sglang.server.requests import (GenerateBody, OutputOptions, aborted,
                                              output_text, parse_generate, response_json)

VOCAB, CONTEXT = 384, 256


def parse(tokenizer, max_sequences=64, **body):
    return parse_generate(GenerateBody.model_validate(body), tokenizer=tokenizer,
                          vocab_size=VOCAB, context_length=CONTEXT,
                          max_sequences=max_sequences)


def test_a_single_request_takes_sglang_defaults_and_maps_its_sampling(tokenizer):
    [item], single = parse(tokenizer, input_ids=[5, 6, 7], rid="r1")
    assert single and item.rid == "r1" and item.sample_rids == ("r1",)
    assert item.request.input_ids == (5, 6, 7) and item.request.session_id is None
    assert item.request.sampling == SamplingParams(temperature=1.0, top_p=1.0, top_k=-1,
                                                   max_new_tokens=128, n=1)
    assert item.options == OutputOptions()

    [item], _ = parse(tokenizer, input_ids=[5, 6, 7], return_logprob=True, sampling_params={
        "temperature": 1e-7, "top_k": 1 << 30, "top_p": 0.5, "max_new_tokens": None,
        "stop": "</answer>", "stop_token_ids": [9, None, 4], "sampling_seed": 11,
        "no_stop_trim": True, "skip_special_tokens": False, "min_p": None,
        "custom_params": {"x": 1}})
    # Below 1e-6 is greedy; a top_k past the vocab keeps everything; max_new_tokens None
    # runs to the context (input + output < context); None stays the default.
    assert item.request.sampling == SamplingParams(
        temperature=0.0, top_p=0.5, top_k=-1, max_new_tokens=CONTEXT - 1 - 3,
        stop=("</answer>",), stop_token_ids=(4, 9), n=1, seed=11)
    assert item.options == OutputOptions(return_logprob=True, skip_special_tokens=False,
                                         no_stop_trim=True)
    assert len(parse(tokenizer, input_ids=[1])[0][0].rid) == 32  # a uuid4 hex


def test_batches_rids_text_and_n_follow_sglang(tokenizer):
    items, single = parse(tokenizer, input_ids=[[1, 2], [3]], rid="b",
                          sampling_params=[{"max_new_tokens": 2}, {"max_new_tokens": 3}])
    assert not single and [i.rid for i in items] == ["b_0", "b_1"]
    assert [i.request.sampling.max_new_tokens for i in items] == [2, 3]
    assert [i.request.input_ids for i in items] == [(1, 2), (3,)]

    items, _ = parse(tokenizer, text=["Paris is", "The fox"], rid=["x", "y"],
                     return_logprob=[True, False])
    assert [i.request.input_ids for i in items] == [
        tuple(tokenizer("Paris is")["input_ids"]), tuple(tokenizer("The fox")["input_ids"])]
    assert [i.options.return_logprob for i in items] == [True, False]

    # n > 1 makes even one request a batch: n samples, each with its own fresh id.
    [item], single = parse(tokenizer, text="Paris is", rid="one",
                           sampling_params={"n": 3, "sampling_seed": 5})
    assert not single and item.rid == "one_0" and item.request.sampling.n == 3
    assert len(set(item.sample_rids)) == 3 and "one_0" not in item.sample_rids


@pytest.mark.parametrize("body,message", [
    (dict(input_ids=[1], stream=True), "stream=true is not supported"),
    (dict(input_ids=[1], image_data="x.png"), "image_data is not supported"),
    (dict(input_ids=[1], lora_path="adapter"),
     "lora_path 'adapter': this server samples one set of weights, the base model (no "
     "adapter loaded)"),
    (dict(input_ids=[[1], [2]], lora_path=["adapter", None]), "lora_path 'adapter'"),
    (dict(), "Either text, input_ids or input_embeds should be provided."),
    (dict(text="a", input_ids=[1]), "either text or input_ids, not both"),
    (dict(input_ids=[]), "input_ids cannot be empty."),
    (dict(input_ids=[[1], []]), "request 1: the input has no tokens"),
    (dict(text=""), "text is empty"),
    (dict(text=[]), "at least one input"),
    (dict(input_ids=[1, VOCAB]), f"input_ids must be in [0, {VOCAB})"),
    (dict(input_ids=[-1]), f"input_ids must be in [0, {VOCAB})"),
    (dict(input_ids=[1], sampling_params={"top_p": 0.0}), "top_p must be in (0, 1], got 0.0"),
    (dict(input_ids=[1], sampling_params={"temperature": math.nan}), "temperature must be"),
    (dict(input_ids=[1], sampling_params={"temperature": -1}), "temperature must be"),
    (dict(input_ids=[1], sampling_params={"top_k": 0}), "top_k must be -1 (disable) or at"),
    (dict(input_ids=[1], sampling_params={"max_new_tokens": -1}), "at least 0, got -1"),
    (dict(input_ids=[1], sampling_params={"n": 0}), "n must be >= 1"),
    (dict(input_ids=[1], sampling_params={"seed": 3}),
     "sampling_params.seed: unknown sampling parameter"),
    (dict(input_ids=[1], sampling_params={"temperature": "hot"}),
     "sampling_params.temperature: Input should be a valid number"),
    (dict(input_ids=[1], sampling_params={"min_p": 0.1}), "min_p=0.1 is not supported"),
    (dict(input_ids=[1], sampling_params={"repetition_penalty": 1.1}),
     "repetition_penalty=1.1 is not supported"),
    (dict(input_ids=[1], sampling_params={"ignore_eos": True}), "ignore_eos=True is not"),
    (dict(input_ids=[1], sampling_params={"regex": "a+"}), "regex='a+' is not supported"),
    (dict(input_ids=[1], sampling_params={"stop_token_ids": [VOCAB]}), "stop_token_ids must"),
    (dict(input_ids=[1], sampling_params={"sampling_seed": 2**63}), "fit in 64 bits"),
    (dict(input_ids=[1] * CONTEXT), "The input (256 tokens) is longer than the model's"),
    (dict(input_ids=[1] * 10, sampling_params={"max_new_tokens": CONTEXT - 10}),
     "You requested a total of 256 tokens: 10 tokens from the input messages and 246"),
    (dict(input_ids=[1], rid=["a"]), "rid must be a string for a single request"),
    (dict(input_ids=[1], sampling_params=[{}]), "sampling_params is a list but the request"),
    (dict(input_ids=[[1], [2]], rid=["a"]), "rids length mismatch with the batch_size"),
    (dict(input_ids=[[1], [2]], rid=["a", "a"]), "Duplicate request IDs detected within the "
                                                 "request: ['a']"),
    (dict(input_ids=[[1], [2]], sampling_params=[{}]), "1 entries for a batch of 2"),
    (dict(input_ids=[[1], [2]], sampling_params=[{"n": 2}, {}]),
     "The parallel_sample_num should be the same for all samples in sample params."),
    (dict(input_ids=[[1], [2]], return_logprob=[True, False], sampling_params={"n": 2}),
     "Cannot use list return_logprob with parallel_sample_num > 1"),
    (dict(input_ids=[1], return_logprob=True, logprob_start_len=0), "logprob_start_len must"),
    (dict(input_ids=[1], return_logprob=True, top_logprobs_num=2), "top_logprobs_num must"),
    (dict(input_ids=[1], token_ids_logprob=[3]), "token_ids_logprob is not supported"),
    (dict(input_ids=[1], session_id="s", sampling_params={"n": 2}), "session_id must have n"),
    (dict(input_ids=[[1]] * 5, sampling_params={"n": 13}), "5 requests x n=13 sequences"),
])
def test_requests_sglang_or_this_engine_cannot_serve_are_refused_by_name(tokenizer, body,
                                                                         message):
    with pytest.raises(ValueError) as error:
        parse(tokenizer, **body)
    assert message in str(error.value)


def _ids(tokenizer, text):
    return tokenizer.encode(text, add_special_tokens=False)


def test_only_the_text_is_trimmed_at_a_stop(tokenizer):
    answer = _ids(tokenizer, "The answer is 42.")
    eos = tokenizer.eos_token_id
    text = lambda ids, matched, **opts: output_text(  # noqa: E731
        tokenizer, ids, {"type": "stop", "matched": matched}, OutputOptions(**opts))
    assert text(answer + [eos], eos) == "The answer is 42."
    assert text(answer + [eos], eos, no_stop_trim=True,
                skip_special_tokens=False) == "The answer is 42." + tokenizer.eos_token
    assert text(answer + [eos], eos, no_stop_trim=True) == "The answer is 42."
    assert text(answer, " is") == "The answer"
    assert text(answer, " is", no_stop_trim=True) == "The answer is 42."
    assert text(answer, "absent") == "The answer is 42."
    length = {"type": "length", "length": 5}
    assert output_text(tokenizer, answer, length, OutputOptions()) == "The answer is 42."


def test_responses_have_sglangs_meta_info_and_logprob_triples(tokenizer):
    [item], _ = parse(tokenizer, input_ids=[5, 6, 7], rid="q", return_logprob=True,
                      return_text_in_logprobs=True, sampling_params={"max_new_tokens": 3})
    answer = _ids(tokenizer, "The answer is 42.")
    logprobs = [-0.5 * (k + 1) for k in range(len(answer))]
    logprobs[1] = math.nan  # sent as null, as SGLang's orjson does
    completion = Completion(answer, logprobs, "stop", "42", {"cached_tokens": 2})
    out = response_json(item, completion, 0, tokenizer=tokenizer, weight_version="v3",
                        latency_s=0.25)
    assert out["output_ids"] == answer and out["text"] == "The answer is "
    assert out["meta_info"] == {
        "id": "q", "finish_reason": {"type": "stop", "matched": "42"}, "prompt_tokens": 3,
        "weight_version": "v3", "total_retractions": 0,
        "input_token_logprobs": [[None, 7, tokenizer.decode([7])]],
        "output_token_logprobs": [[None if k == 1 else -0.5 * (k + 1), t,
                                   tokenizer.decode([t])] for k, t in enumerate(answer)],
        "completion_tokens": len(answer), "cached_tokens": 2, "e2e_latency": 0.25}

    length = response_json(item, Completion([9, 9, 9], [-1.0] * 3, "length"), 0,
                           tokenizer=tokenizer, weight_version="v3", latency_s=0.0)
    assert length["meta_info"]["finish_reason"] == {"type": "length", "length": 3}
    [abort] = aborted(item, "stopped by the test")
    out = response_json(item, abort, 0, tokenizer=tokenizer, weight_version="v3",
                        latency_s=0.0)
    assert out["output_ids"] == [] and out["meta_info"]["finish_reason"] == {
        "type": "abort", "message": "stopped by the test", "status_code": None,
        "err_type": None}
    assert out["meta_info"]["output_token_logprobs"] == []

    [plain], _ = parse(tokenizer, input_ids=[5])
    out = response_json(plain, Completion([9], [-1.0], "length"), 0, tokenizer=tokenizer,
                        weight_version="default", latency_s=0.0)
    assert "output_token_logprobs" not in out["meta_info"]
