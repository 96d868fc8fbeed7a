"""JaxEngine against full forwards of the same model (one shared engine, few compiles)."""
import asyncio

import jax
import numpy as np
import pytest
from flax import nnx

from agentjax.engine.protocol import GenerateRequest, SamplingParams
from agentjax.engine.jax.engine import JaxEngine
from tests.engine_fixtures import ENGINE_KWARGS
from tests.engine.reference import full_logits, reference_logp

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=12)
MAX_LEN = ENGINE_KWARGS["max_len"]


def _generate(engine, *requests):
    return engine.generate_sync(list(requests))


def _prompts(tokenizer):
    texts = ["Which city is the capital of France?", "The quick brown fox",
             "<search>capital of France</search> <information>Paris</information> answer:"]
    return [tokenizer.encode(t, add_special_tokens=False) for t in texts]


def _check_against_full_forward(model, request, completion):
    """Each output token's log-prob (and, greedy, the token itself) vs a full forward."""
    ids = list(request.input_ids) + completion.output_ids
    logits = full_logits(model, ids)
    s = request.sampling
    for i, token in enumerate(completion.output_ids):
        ref = reference_logp(logits[len(request.input_ids) - 1 + i], s.temperature, s.top_k,
                             s.top_p)
        assert np.isfinite(ref[token]), f"token {i} outside the sampling set"
        np.testing.assert_allclose(completion.logprobs[i], ref[token], atol=1e-4,
                                   err_msg=f"token {i}")
        if s.temperature == 0:
            assert token == int(np.argmax(logits[len(request.input_ids) - 1 + i]))


def _ends_correctly(engine, request, completion):
    s = request.sampling
    if completion.finish_reason == "stop":
        assert completion.output_ids[-1] in engine.eos_token_ids + s.stop_token_ids
        assert completion.matched_stop == completion.output_ids[-1]
    else:
        assert completion.finish_reason == "length"
        assert len(completion.output_ids) == s.max_new_tokens


def test_greedy_and_sampled_outputs_match_full_forwards(engine, tiny_model, tokenizer):
    prompts = _prompts(tokenizer)
    requests = [
        GenerateRequest(prompts[0], SamplingParams(temperature=0.0, max_new_tokens=5)),
        GenerateRequest(prompts[1], SamplingParams(temperature=0.0, max_new_tokens=20)),
        GenerateRequest(prompts[2], SamplingParams(temperature=1.0, max_new_tokens=9, seed=1)),
        GenerateRequest(prompts[0], SamplingParams(temperature=0.7, top_k=20, top_p=0.9,
                                                   max_new_tokens=14, seed=2, n=2)),
        GenerateRequest(prompts[1], SamplingParams(temperature=1.3, top_p=0.5,
                                                   max_new_tokens=7, seed=3)),
    ]
    results = _generate(engine, *requests)
    assert [len(r) for r in results] == [1, 1, 1, 2, 1]
    for request, completions in zip(requests, results):
        for completion in completions:
            _ends_correctly(engine, request, completion)
            _check_against_full_forward(tiny_model, request, completion)
            assert completion.meta["prompt_tokens"] == len(request.input_ids)
            # Full forwards check greedy log-probs untempered, the others as sampled.
            assert completion.meta["logprob_distribution"] == (
                "raw" if request.sampling.temperature == 0 else "sampling")
    # Sequences finished independently with their own budgets.
    assert len(results[0][0].output_ids) <= 5 and len(results[1][0].output_ids) <= 20
    assert results[3][0].output_ids != results[3][1].output_ids  # n=2: distinct samples


def test_seeded_sampling_is_reproducible_in_any_batch(engine, tokenizer):
    prompt = _prompts(tokenizer)[1]
    seeded = GenerateRequest(prompt, SamplingParams(temperature=1.0, max_new_tokens=10, seed=7))
    [[alone]] = _generate(engine, seeded)
    [[again]] = _generate(engine, seeded)
    crowd = _generate(engine, GenerateRequest(_prompts(tokenizer)[0], SamplingParams(seed=9)),
                      seeded, GenerateRequest(prompt, SamplingParams(max_new_tokens=3)))
    assert alone.output_ids == again.output_ids == crowd[1][0].output_ids
    # Other program shapes in the crowd: equal up to float rounding (the engine's 1e-4);
    # bitwise only with deterministic=True (test_jax_engine_deterministic.py).
    np.testing.assert_allclose(alone.logprobs, crowd[1][0].logprobs, atol=1e-4)
    [[other]] = _generate(engine, GenerateRequest(
        prompt, SamplingParams(temperature=1.0, max_new_tokens=10, seed=8)))
    assert other.output_ids != alone.output_ids


def test_stop_strings_and_stop_ids_keep_the_stop(engine, tokenizer):
    prompt = _prompts(tokenizer)[0]
    base = SamplingParams(temperature=0.0, max_new_tokens=24)
    [[free]] = _generate(engine, GenerateRequest(prompt, base))
    out = free.output_ids
    eos = set(engine.eos_token_ids)
    # A stop id: the first output token that did not occur before it (k >= 2).
    k = next(i for i in range(2, len(out)) if out[i] not in out[:i] and out[i] not in eos)
    [[by_id]] = _generate(engine, GenerateRequest(
        prompt, SamplingParams(temperature=0.0, max_new_tokens=24, stop_token_ids=(out[k],))))
    assert by_id.output_ids == out[:k + 1] and by_id.finish_reason == "stop"
    assert by_id.matched_stop == out[k]
    # A stop string: the text of tokens k-1..k, when it does not occur earlier.
    stop = tokenizer.decode(out[k - 1:k + 1])
    first = next(j for j in range(len(out)) if stop in tokenizer.decode(out[:j + 1]))
    [[by_text]] = _generate(engine, GenerateRequest(
        prompt, SamplingParams(temperature=0.0, max_new_tokens=24, stop=(stop,))))
    assert by_text.output_ids == out[:first + 1] and by_text.finish_reason == "stop"
    assert by_text.matched_stop == stop
    assert stop in tokenizer.decode(by_text.output_ids)
    # Both: the stop id wins at its own token; a string completed before it wins.
    [[both]] = _generate(engine, GenerateRequest(prompt, SamplingParams(
        temperature=0.0, max_new_tokens=24, stop=(stop,), stop_token_ids=(out[k],))))
    assert both.output_ids == out[:first + 1]
    assert both.matched_stop == (out[k] if first == k else stop)


def test_concurrent_callers_share_one_batch_and_each_prompt_is_prefilled_once(engine,
                                                                              tokenizer):
    # Prompts no other test sent (a shared prompt outlives its requests).
    prompts = [tokenizer.encode(t, add_special_tokens=False)
               for t in ("A fresh question about Rome?", "Another one about Oslo?")]
    before = dict(engine.stats)

    async def callers():
        return await asyncio.gather(*(
            engine.generate([GenerateRequest(prompts[i % 2], GREEDY)]) for i in range(4)))

    results = asyncio.run(callers())
    assert len(results) == 4
    delta = {k: engine.stats[k] - before.get(k, 0) for k in engine.stats}
    # One call prefills the two distinct prompts (all ids but the last); the two callers
    # that repeat one share its pages.
    assert delta["prefill_calls"] == 1
    assert delta["prefill_tokens"] == sum(len(p) - 1 for p in prompts)
    assert delta["shared_prefixes"] == 2
    assert engine.stats["max_decode_batch"] >= 4
    assert [r[0][0].meta.get("shared_prefix", False) for r in results] == [
        False, False, True, True]
    # Same prompt, greedy: identical outputs whatever row they used.
    assert results[0][0][0].output_ids == results[2][0][0].output_ids



def test_a_long_prompt_prefills_before_the_batch_decodes(engine, tokenizer):
    """Prefill first: a prompt of three chunks is prefilled before anyone decodes, so
    the short rows and the long one decode together (one call of 4 tokens each) and the
    long row does not decode alone after the others finished."""
    long_prompt = (tokenizer.encode("A long question about the rivers of Europe, "
                                    "their sources and their mouths?",
                                    add_special_tokens=False) * 8)[:80]
    short = [tokenizer.encode(t, add_special_tokens=False)
             for t in ("Rivers of Spain?", "Rivers of Peru?", "Rivers of Chad?")]
    sampling = SamplingParams(temperature=1.0, max_new_tokens=ENGINE_KWARGS["decode_steps"],
                              seed=3)
    before = dict(engine.stats)
    results = _generate(engine, *(GenerateRequest(p, sampling) for p in short + [long_prompt]))
    delta = {k: engine.stats[k] - before.get(k, 0) for k in engine.stats}
    assert delta["prefill_calls"] == 3  # the long prompt's 79 ids in chunks of 32
    assert delta["decode_calls"] == 1
    assert all(len(c.output_ids) >= 1 for [c] in results)

def test_sessions_reuse_the_cache_and_match_reprefilling(engine, tiny_model, tokenizer):
    prompt = _prompts(tokenizer)[0]
    sampling = SamplingParams(temperature=1.0, max_new_tokens=8, seed=4)
    observation = tokenizer.encode("<information>Paris</information>", add_special_tokens=False)

    def turn(context, session):
        [[c]] = _generate(engine, GenerateRequest(context, sampling, session_id=session))
        return c

    first = turn(prompt, "s-main")
    context = prompt + first.output_ids + observation
    cached = turn(context, "s-main")
    fresh = turn(context, None)
    assert cached.meta["cached_tokens"] == len(prompt) + len(first.output_ids) - 1
    assert fresh.meta["cached_tokens"] == 0
    assert cached.output_ids == fresh.output_ids
    request = GenerateRequest(context, sampling)
    _check_against_full_forward(tiny_model, request, cached)
    _check_against_full_forward(tiny_model, request, fresh)

    # A history that differs from the cached one reuses only the common prefix.
    edited = list(context)
    edited[3] = (edited[3] + 1) % len(tokenizer)
    mismatch = turn(edited + cached.output_ids, "s-main")
    assert mismatch.meta["cached_tokens"] == 3 and mismatch.meta["prefix_mismatch"]
    assert mismatch.output_ids == turn(edited + cached.output_ids, None).output_ids

    # Parked sessions hold pages, not rows: more sessions than max_slots stay cached
    # until the pool runs out; then the least recently used is evicted, and re-prefilled
    # when it returns. Each long session holds 6 of the pool's 24 pages.
    pool = engine.kv_pages
    long_prompts = [[5 + i] + (prompt * 16)[:79] for i in range(pool // 6 + 1)]
    for i in range(ENGINE_KWARGS["max_slots"] + 1):
        turn(prompt[:-1] + [7 + i], f"s-{i}")
    assert engine.stats["evictions"] == 0
    for i, ids in enumerate(long_prompts):
        turn(ids, f"long-{i}")
    assert engine.stats["evictions"] >= 1
    again = turn(context, "s-main")
    assert again.meta["reprefilled"] and again.meta["cached_tokens"] == 0
    assert again.output_ids == fresh.output_ids
    for session in ([f"s-{i}" for i in range(ENGINE_KWARGS["max_slots"] + 1)]
                    + [f"long-{i}" for i in range(len(long_prompts))] + ["s-main"]):
        engine.end_session(session)


def test_update_weights_changes_outputs_without_recompiling(engine, tiny_model, tokenizer):
    request = GenerateRequest(_prompts(tokenizer)[1], GREEDY)
    [[original]] = _generate(engine, request)
    compiles = engine.compile_counts
    graphdef, params = nnx.split(tiny_model)
    other = nnx.split(type(tiny_model)(tiny_model.config, rngs=nnx.Rngs(1)))[1]
    other = jax.tree.map(lambda x: x * 8.0 if x.ndim >= 2 else x, other)
    engine.update_weights(other, version=5)
    [[swapped]] = _generate(engine, request)
    assert swapped.output_ids != original.output_ids
    assert swapped.meta["weight_version"] == 5
    _check_against_full_forward(nnx.merge(graphdef, other), request, swapped)
    engine.update_weights(params)
    [[restored]] = _generate(engine, request)
    assert restored.output_ids == original.output_ids and restored.meta["weight_version"] == 6
    assert engine.compile_counts == compiles

    bad = jax.tree.map(lambda x: x, params)
    bad["embed"].set_value(bad["embed"].get_value()[:, :8])
    with pytest.raises(ValueError, match=r"embed.*expects"):
        engine.update_weights(bad)


def test_a_swap_during_decoding_is_reported_per_token(engine, tiny_model, tokenizer):
    """Weights swapped while a sequence decodes: tokens sampled before the swap report
    the old version, those after it the new one (the same weights here, so the shared
    engine samples as before)."""
    params = nnx.split(tiny_model)[1]
    prompt = _prompts(tokenizer)[0]

    async def swap_while_decoding(seed):
        old = engine.weight_version
        calls = engine.stats["decode_calls"]
        pending = asyncio.ensure_future(engine.generate([GenerateRequest(
            prompt, SamplingParams(temperature=1.0, max_new_tokens=80, seed=seed))]))
        while engine.stats["decode_calls"] == calls and not pending.done():
            await asyncio.sleep(0.001)
        await asyncio.to_thread(engine.update_weights, params, version=old + 1)
        [[completion]] = await pending
        return old, completion

    for seed in range(20):  # a short completion may end before the swap lands
        old, completion = asyncio.run(swap_while_decoding(seed))
        versions = completion.meta["token_versions"]
        assert len(versions) == len(completion.output_ids)
        assert versions == sorted(versions) and set(versions) <= {old, old + 1}
        if versions[0] == old and versions[-1] == old + 1:
            assert completion.meta["weight_version"] == old + 1
            break
    else:
        raise AssertionError("no completion straddled a weight swap in 20 attempts")


def test_warmup_compiled_every_program(engine, tokenizer):
    """The fixture ran `warmup`: a workload touching every row count, chunk and item
    count compiles nothing new, and warming up again is free."""
    compiles = engine.compile_counts
    programs = engine.warmup()
    # Rows 1 (bucket) and 4 (max_slots), prefill at the 1 chunk and decode. One row
    # holds at most 6 pages: prefill 8 items (2 whole tiles), decode 8. Four rows 24:
    # prefill 32, decode 8, 16 or 32.
    assert programs == 2 + (1 + 3)
    prompts = _prompts(tokenizer)
    long_prompt = (prompts[0] * 4)[:70]  # > one 32-token chunk, 5 pages
    _generate(engine, GenerateRequest(prompts[1], GREEDY))                       # gathered
    _generate(engine, *[GenerateRequest(p, GREEDY) for p in prompts],
              GenerateRequest(long_prompt, SamplingParams(max_new_tokens=12)))  # all rows
    assert engine.compile_counts == compiles


def test_cancelled_requests_free_their_rows_and_bad_input(engine, tiny_model, tokenizer):
    prompt = _prompts(tokenizer)[0]

    async def cancel_then_generate():
        """Cancels 4 long generations once they decode; a generation may finish before
        the cancellation lands (the engine is fast), so up to 20 attempts."""
        for attempt in range(20):
            long = GenerateRequest(prompt, SamplingParams(temperature=1.0, max_new_tokens=80,
                                                          seed=attempt))
            decoded = engine.stats["decode_tokens"]
            task = asyncio.ensure_future(engine.generate([long] * 4))
            while engine.stats["decode_tokens"] == decoded and not task.done():
                await asyncio.sleep(0.001)
            if task.cancel():
                with pytest.raises(asyncio.CancelledError):
                    await task
                [[after]] = await engine.generate([GenerateRequest(prompt, GREEDY)])
                # The cancelled rows stopped early: far fewer than 4 x 79 decoded tokens.
                assert engine.stats["decode_tokens"] - decoded < 4 * 79
                return after
            await task
        pytest.fail("every generation finished before it could be cancelled")

    after = asyncio.run(cancel_then_generate())
    assert after.finish_reason in ("stop", "length") and after.output_ids
    assert engine.health()

    [[too_long]] = _generate(engine, GenerateRequest([5] * (MAX_LEN + 1), GREEDY))
    assert too_long.finish_reason == "abort" and "max_len" in too_long.meta["error"]
    # A prompt that fills the cache still yields one token, then stops on length.
    [[full]] = _generate(engine, GenerateRequest([5] * MAX_LEN, GREEDY))
    assert full.finish_reason == "length" and len(full.output_ids) == 1
    for bad, match in [
        (GenerateRequest([], GREEDY), "empty"),
        (GenerateRequest([10 ** 6], GREEDY), r"input_ids must be in"),
        (GenerateRequest([5], SamplingParams(n=2), session_id="x"), "session"),
        (GenerateRequest([5], SamplingParams(top_p=0.0)), "top_p"),
    ]:
        with pytest.raises(ValueError, match=match):
            _generate(engine, bad)
    with JaxEngine.from_model(tiny_model, **ENGINE_KWARGS) as no_tokenizer:
        with pytest.raises(ValueError, match="stop strings need"):
            _generate(no_tokenizer, GenerateRequest([5], SamplingParams(stop=("x",))))


def test_sharded_params_give_the_same_outputs(engine, tiny_model, tokenizer, eight_devices):
    from agentjax.core.parallel import make_mesh, shard_params

    mesh = make_mesh({"data": 1, "fsdp": 2, "tensor": 4}, devices=eight_devices)
    graphdef, params = nnx.split(tiny_model)
    sharded = shard_params(params, mesh)
    assert len(jax.tree.leaves(sharded)[0].sharding.device_set) == 8
    request = GenerateRequest(_prompts(tokenizer)[1], SamplingParams(temperature=1.0, seed=3,
                                                                     max_new_tokens=6))
    [[reference]] = _generate(engine, request)
    with JaxEngine(graphdef, sharded, tokenizer=tokenizer, max_slots=2, max_len=MAX_LEN,
                   prefill_chunks=(16,), batch_buckets=(), decode_steps=3) as sharded_engine:
        [[out]] = _generate(sharded_engine, request)
        assert sharded_engine._device.cache.k[0].sharding.mesh == mesh
    assert out.output_ids == reference.output_ids
    np.testing.assert_allclose(out.logprobs, reference.logprobs, atol=1e-4)
