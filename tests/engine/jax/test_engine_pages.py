"""The JaxEngine's paged KV cache: group prompts prefilled once, weight swaps that never
attend an old-policy key, and a pool smaller than the load (preemption, aborts)."""
import asyncio

import jax
import numpy as np
import pytest
from flax import nnx

from agentjax.engine.protocol import GenerateRequest, SamplingParams
from agentjax.engine.jax.engine import JaxEngine
from tests.engine_fixtures import ENGINE_KWARGS
from tests.engine.reference import full_logits, reference_logp


def _check(model, input_ids, completion, outputs=None):
    """Every output's log-prob (temperature 1, no cut) against a full forward of `model`;
    `outputs` restricts the check to those output indices."""
    ids = list(input_ids) + completion.output_ids
    logits = full_logits(model, ids)
    for i in (range(len(completion.output_ids)) if outputs is None else outputs):
        ref = reference_logp(logits[len(input_ids) - 1 + i], 1.0, -1, 1.0)
        np.testing.assert_allclose(completion.logprobs[i], ref[completion.output_ids[i]],
                                   atol=1e-4, err_msg=f"token {i}")


def test_a_group_prefills_its_prompt_once_and_copies_pages_on_write(engine, tiny_model,
                                                                    tokenizer):
    # 37 ids: 36 to prefill end mid-page (16-slot pages), so each sample copies the third.
    prompt = tokenizer.encode("A group prompt: which river flows through Vienna, and "
                              "which through Prague? Answer:", add_special_tokens=False)
    prompt = (prompt * 3)[:37]
    before = dict(engine.stats)
    sampling = SamplingParams(temperature=1.0, max_new_tokens=10, seed=21, n=4)
    [group] = engine.generate_sync([GenerateRequest(prompt, sampling)])
    delta = {k: engine.stats[k] - before.get(k, 0) for k in engine.stats}
    assert delta["prefill_tokens"] == len(prompt) - 1
    assert delta["shared_prefixes"] == 3
    # The siblings join as soon as the prompt is prefilled: all 4 decode in phase.
    assert delta["decode_calls"] <= -(-10 // ENGINE_KWARGS["decode_steps"])
    assert len({tuple(c.output_ids) for c in group}) > 1  # they diverged
    for completion in group:
        _check(tiny_model, prompt, completion)
    # Sample i of an n=i+1 request draws sample i's noise: the same tokens, although
    # this time every sample shares the prompt the group left behind.
    for i, completion in enumerate(group[1:], start=1):
        [samples] = engine.generate_sync([GenerateRequest(
            prompt, SamplingParams(temperature=1.0, max_new_tokens=10, seed=21, n=i + 1))])
        assert all(s.meta["shared_prefix"] for s in samples)
        assert samples[-1].output_ids == completion.output_ids


def test_a_weight_swap_drops_every_page_of_the_old_weights(engine, tiny_model, tokenizer):
    """Swapped to other weights mid-decode: tokens sampled before the swap follow the old
    model, those after it the new model over the whole context (its keys recomputed)."""
    graphdef, params = nnx.split(tiny_model)
    other = nnx.split(type(tiny_model)(tiny_model.config, rngs=nnx.Rngs(7)))[1]
    other = jax.tree.map(lambda x: x * 8.0 if x.ndim >= 2 else x, other)
    prompt = tokenizer.encode("Which city is the capital of France?",
                              add_special_tokens=False)

    async def swap_while_decoding(seed):
        calls = engine.stats["decode_calls"]
        pending = asyncio.ensure_future(engine.generate([GenerateRequest(
            prompt, SamplingParams(temperature=1.0, max_new_tokens=40, seed=seed))]))
        while engine.stats["decode_calls"] == calls and not pending.done():
            await asyncio.sleep(0.001)
        old = engine.weight_version
        await asyncio.to_thread(engine.update_weights, other, version=old + 1)
        [[completion]] = await pending
        return old, completion

    try:
        for seed in range(20):  # a short completion may end before the swap lands
            old, completion = asyncio.run(swap_while_decoding(seed))
            versions = completion.meta["token_versions"]
            if versions[0] == old and versions[-1] == old + 1:
                break
            engine.update_weights(params)
        else:
            raise AssertionError("no completion straddled a weight swap in 20 attempts")
        assert completion.meta["recomputed"] == 1
        cut = versions.index(old + 1)
        _check(tiny_model, prompt, completion, range(cut))
        _check(nnx.merge(graphdef, other), prompt, completion,
               range(cut, len(completion.output_ids)))
    finally:
        engine.update_weights(params)


@pytest.fixture(scope="module")
def small_pool(tiny_model, tokenizer):
    """8 pages of 16 slots for 4 rows: two 70-token sequences need 10."""
    engine = JaxEngine.from_model(tiny_model, tokenizer=tokenizer,
                                  **dict(ENGINE_KWARGS, kv_pages=8))
    yield engine
    engine.close()


def test_a_pool_smaller_than_the_load_preempts_and_recomputes(small_pool, tiny_model):
    prompts = [[5 + i] + list(range(40, 79)) for i in range(4)]
    sampling = SamplingParams(temperature=1.0, max_new_tokens=30, seed=5)
    results = small_pool.generate_sync([GenerateRequest(p, sampling) for p in prompts])
    assert small_pool.stats["preemptions"] > 0
    assert small_pool.stats["peak_kv_pages"] <= 8
    for prompt, [completion] in zip(prompts, results):
        assert completion.finish_reason in ("stop", "length")
        _check(tiny_model, prompt, completion)


def test_a_request_the_pool_cannot_hold_is_aborted_with_the_reason(tiny_model, tokenizer):
    with JaxEngine.from_model(tiny_model, tokenizer=tokenizer,
                              **dict(ENGINE_KWARGS, kv_pages=4)) as engine:  # 64 slots
        [[too_big]] = engine.generate_sync([GenerateRequest([5] * 90, SamplingParams())])
    assert too_big.finish_reason == "abort" and "kv_pages=4" in too_big.meta["error"]


def test_deterministic_mode_aborts_rather_than_recompute(tiny_model, tokenizer):
    with JaxEngine.from_model(tiny_model, tokenizer=tokenizer, deterministic=True,
                              **dict(ENGINE_KWARGS, kv_pages=8)) as engine:
        prompts = [[5 + i] + list(range(40, 79)) for i in range(4)]
        sampling = SamplingParams(temperature=1.0, max_new_tokens=30, seed=5)
        results = engine.generate_sync([GenerateRequest(p, sampling) for p in prompts])
        reasons = [c.finish_reason for [c] in results]
        assert "abort" in reasons and engine.stats["preemptions"] == 0
        aborted = next(c for [c] in results if c.finish_reason == "abort")
        assert "ran out" in aborted.meta["error"] and "kv_pages" in aborted.meta["error"]


def test_a_round_attending_more_pages_than_the_pool_runs_in_calls_within_it(tiny_model,
                                                                             tokenizer):
    """4 samples share a prompt of 4 pages: a decode round attends 4 x 5 = 20 pages, the
    pool holds 12. The round runs as calls of at most 12 pages (so the view a call
    gathers never outgrows the pool), with the outputs of an engine that needs no split."""
    prompt = [5] + list(range(40, 104))  # 64 slots to prefill: 4 full pages
    sampling = SamplingParams(temperature=1.0, max_new_tokens=8, seed=9, n=4)
    runs = {}
    for pages in (12, None):
        with JaxEngine.from_model(tiny_model, tokenizer=tokenizer,
                                  **dict(ENGINE_KWARGS, kv_pages=pages)) as engine:
            [group] = engine.generate_sync([GenerateRequest(prompt, sampling)])
            runs[pages] = ([(c.output_ids, c.logprobs) for c in group],
                           engine.stats["decode_calls"],
                           engine._shapes.item_sizes(4, "decode")[-1])
    (split, split_calls, split_view), (whole, whole_calls, whole_view) = runs[12], runs[None]
    assert split == whole
    assert split_view == 12 and whole_view == 24  # the pool: 4 rows x 6 pages
    assert split_calls > whole_calls


def test_a_sequence_left_out_of_a_call_for_pages_joins_the_next_one_with_overlap(
        tiny_model, tokenizer):
    """A full pool (4 rows x 2 pages): the first decode call must copy the shared last
    prompt page of a row and finds no free page, so one row sits it out. With overlap
    the engine reads that call before the next (no chain runs past a waiting row): the
    row joins the second call, as without overlap, with the same outputs."""
    prompts = [[5 + i] + list(range(40, 55)) for i in range(4)]  # 15 slots: 1 page
    sampling = SamplingParams(temperature=1.0, max_new_tokens=16, seed=3)
    runs = {}
    for overlap in (True, False):
        with JaxEngine.from_model(tiny_model, tokenizer=tokenizer, overlap=overlap,
                                  **dict(ENGINE_KWARGS, kv_pages=8)) as engine:
            results = engine.generate_sync([GenerateRequest(p, sampling) for p in prompts])
            runs[overlap] = ([(c.output_ids, c.logprobs) for [c] in results],
                             engine.stats["decode_calls"],
                             engine.stats["overlapped_decode_calls"])
    (outputs, calls, overlapped), (serial, serial_calls, _) = runs[True], runs[False]
    assert outputs == serial and overlapped > 0
    assert calls == serial_calls == 1 + 16 // ENGINE_KWARGS["decode_steps"]
