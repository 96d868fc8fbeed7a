"""JaxEngine(deterministic=True): a seeded request's output ids and log-probs are bitwise
identical whatever else is in flight and in whatever order requests arrive."""
import asyncio
import collections
import dataclasses
import random

import jax
import numpy as np
import pytest
from flax import nnx

from agentjax.engine.protocol import GenerateRequest, SamplingParams
from agentjax.engine.jax.engine import JaxEngine
from tests.engine_fixtures import ENGINE_KWARGS
from tests.engine.reference import full_logits, reference_logp

# Two chunk widths (a 70-token prompt takes 32 + 32 + 8) and prefill calls of 2 rows, so
# sequences of different lengths share, or do not share, prefill calls depending on
# what else is in flight.
DETERMINISTIC_KWARGS = dict(ENGINE_KWARGS, prefill_chunks=(8, 32), deterministic=True,
                            deterministic_prefill_rows=2)
OBSERVATION = "<information>Paris is the capital of France</information>"


@pytest.fixture(scope="module")
def det_engine(tiny_model, tokenizer):
    engine = JaxEngine.from_model(tiny_model, tokenizer=tokenizer, **DETERMINISTIC_KWARGS)
    # Prefill at 2 rows x {8, 32} (16 items: two rows' whole tiles), decode at all 4 rows
    # x {8, 16, 32} items.
    assert engine.warmup() == 5
    yield engine
    engine.close()


def _encode(tokenizer, text):
    return tokenizer.encode(text, add_special_tokens=False)


def _workload(tokenizer):
    """(plain requests, multi-turn session sampling, session prompt, noise requests)."""
    prompt = _encode(tokenizer, "Which city is the capital of France?")
    fox = _encode(tokenizer, "The quick brown fox")
    plain = [
        GenerateRequest(prompt, SamplingParams(temperature=1.0, max_new_tokens=10, seed=11,
                                               n=2)),
        GenerateRequest(fox, SamplingParams(temperature=0.8, top_k=20, top_p=0.9,
                                            max_new_tokens=12, seed=12)),
        GenerateRequest((prompt + fox) * 3, SamplingParams(temperature=1.0,
                                                           max_new_tokens=6, seed=13)),
    ]
    session = SamplingParams(temperature=0.9, top_p=0.95, max_new_tokens=8, seed=14)
    noise = [GenerateRequest(fox[:k + 2] * (k + 1), SamplingParams(
        temperature=1.0 + 0.1 * k, max_new_tokens=5 + 3 * k, seed=100 + k)) for k in range(5)]
    noise.append(GenerateRequest(prompt, SamplingParams(temperature=0.0, max_new_tokens=9)))
    return plain, session, fox, noise


async def _session(engine, tokenizer, sampling, prompt, session_id, turns=3, pause=None):
    """A multi-turn session: each turn appends the output and a fixed observation."""
    context, outputs = list(prompt), []
    observation = _encode(tokenizer, OBSERVATION)
    for _ in range(turns):
        if pause is not None:
            await asyncio.sleep(pause())
        [[completion]] = await engine.generate(
            [GenerateRequest(context, sampling, session_id=session_id)])
        outputs.append(completion)
        context += completion.output_ids + observation
    engine.end_session(session_id)
    return outputs


def _fingerprint(completions):
    return [(c.output_ids, np.asarray(c.logprobs, np.float32).tobytes()) for c in completions]


def _alone_then_crowded(engine, tokenizer, *, crowd_seed):
    """Runs the workload one request at a time, then everything at once in shuffled
    order with staggered starts; returns the fingerprints of both runs."""
    plain, session, fox, noise = _workload(tokenizer)

    async def alone():
        runs = [await engine.generate([r]) for r in plain]
        turns = await _session(engine, tokenizer, session, fox, "alone")
        return [c for run in runs for c in run[0]] + turns

    async def crowded():
        rng = random.Random(crowd_seed)
        pause = lambda: rng.uniform(0.0, 0.02)  # noqa: E731

        async def one(request):
            await asyncio.sleep(pause())
            return (await engine.generate([request]))[0]

        jobs = [one(r) for r in plain + noise]
        jobs.append(_session(engine, tokenizer, session, fox, "crowded", pause=pause))
        order = list(range(len(jobs)))
        rng.shuffle(order)
        results = dict(zip(order, await asyncio.gather(*(jobs[i] for i in order))))
        return [c for i in range(len(plain)) for c in results[i]] + results[len(jobs) - 1]

    return _fingerprint(asyncio.run(alone())), _fingerprint(asyncio.run(crowded()))


def test_outputs_are_bitwise_identical_alone_and_in_any_crowd(det_engine, tiny_model,
                                                              tokenizer):
    before = dict(det_engine.stats)
    alone, crowded = _alone_then_crowded(det_engine, tokenizer, crowd_seed=0)
    assert det_engine.stats["max_decode_batch"] >= 4  # the crowd really shared calls
    assert det_engine.stats["max_prefill_batch"] == 2
    assert det_engine.stats["decode_calls"] > before.get("decode_calls", 0)
    assert len(alone) == 4 + 3
    for i, (a, c) in enumerate(zip(alone, crowded)):
        assert a[0] == c[0], f"completion {i}: output ids differ"
        assert a[1] == c[1], f"completion {i}: log-probs differ bitwise"
    _, again = _alone_then_crowded(det_engine, tokenizer, crowd_seed=1)
    assert again == crowded

    # Still the sampling distribution of the model: the first request against a full
    # forward (the engine's guarantee at 1e-4 holds in this mode too).
    plain, *_ = _workload(tokenizer)
    request = plain[0]
    ids, logprobs = alone[0][0], np.frombuffer(alone[0][1], np.float32)
    logits = full_logits(tiny_model, list(request.input_ids) + ids)
    for i, token in enumerate(ids):
        ref = reference_logp(logits[len(request.input_ids) - 1 + i], 1.0, -1, 1.0)
        np.testing.assert_allclose(logprobs[i], ref[token], atol=1e-4)


def _drop_shared_contexts(engine, model):
    """Swaps the same weights in: every shared context and parked session is dropped."""
    engine.update_weights(nnx.split(model)[1])


def test_prefilled_with_another_session_equals_prefilled_alone(det_engine, tiny_model,
                                                               tokenizer):
    """Two sessions admitted in one round share each prefill call (same chunk width,
    2 rows per call); each matches its run alone, turn after turn. (Each run starts
    with no shared context, or the second would prefill nothing.)"""
    _, session, fox, _ = _workload(tokenizer)
    other = dataclasses.replace(session, seed=15)

    async def together():
        return await asyncio.gather(
            _session(det_engine, tokenizer, session, fox, "together-a"),
            _session(det_engine, tokenizer, other, fox, "together-b"))

    async def apart():
        return [await _session(det_engine, tokenizer, session, fox, "apart-a"),
                await _session(det_engine, tokenizer, other, fox, "apart-b")]

    _drop_shared_contexts(det_engine, tiny_model)
    calls = det_engine.stats["prefill_calls"]
    joint = asyncio.run(together())
    joint_calls = det_engine.stats["prefill_calls"] - calls
    _drop_shared_contexts(det_engine, tiny_model)
    separate = asyncio.run(apart())
    assert joint_calls < det_engine.stats["prefill_calls"] - calls - joint_calls
    for a, b in zip(joint, separate):
        assert _fingerprint(a) == _fingerprint(b)


def test_twin_sessions_share_each_turn_and_equal_a_session_alone(det_engine, tiny_model,
                                                                 tokenizer):
    """Two sessions with the same seed reach the same context at every turn: the second
    to arrive shares the first's pages each turn (the prompt, then each action and
    observation) and prefills nothing, and both equal the session run alone, bitwise."""
    _, session, fox, _ = _workload(tokenizer)

    def run(*names):
        _drop_shared_contexts(det_engine, tiny_model)
        before = collections.Counter(det_engine.stats)

        async def together():
            return await asyncio.gather(*(
                _session(det_engine, tokenizer, session, fox, name) for name in names))

        runs = asyncio.run(together())
        delta = collections.Counter(det_engine.stats)
        delta.subtract(before)
        return [_fingerprint(turns) for turns in runs], delta

    [alone], alone_stats = run("twin-alone")
    twins, twin_stats = run("twin-a", "twin-b")
    assert twins == [alone, alone]
    assert twin_stats["prefill_tokens"] == alone_stats["prefill_tokens"]
    assert twin_stats["shared_prefixes"] - alone_stats["shared_prefixes"] == 3


def test_the_same_context_computed_another_way_is_not_shared(det_engine, tiny_model,
                                                             tokenizer):
    """Session a decodes its first 2 action tokens, c prefills them with its prompt; both
    then send the same next turn. Their cached keys came from other programs (a decode
    step's row count against a prefill call's), so c does not share a's context: it
    prefills its observation itself, and its turn equals its turn alone, bitwise. (At
    this tiny shape XLA:CPU happens to give both programs the same bits; the engine
    may not assume that of a real model's matmuls.)"""
    _, _, fox, _ = _workload(tokenizer)
    observation = _encode(tokenizer, OBSERVATION)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=6)
    [[probe]] = det_engine.generate_sync([GenerateRequest(fox, greedy)])
    action = probe.output_ids
    following = SamplingParams(temperature=1.0, max_new_tokens=8, seed=3)

    def second_turn(names):
        _drop_shared_contexts(det_engine, tiny_model)
        out = []
        for name in names:
            first_ids, steps = (fox, 6) if name.startswith("a") else (fox + action[:2], 4)
            [[first]] = det_engine.generate_sync([GenerateRequest(
                first_ids, dataclasses.replace(greedy, max_new_tokens=steps),
                session_id=name)])
            assert first_ids + first.output_ids == fox + action
            [[second]] = det_engine.generate_sync([GenerateRequest(
                fox + action + observation, following, session_id=name)])
            det_engine.end_session(name)
            out.append(second)
        return out

    [alone] = second_turn(["c-alone"])
    a, c = second_turn(["a-first", "c-after"])
    assert "shared_prefix" not in c.meta and c.meta["cached_tokens"] == len(fox) + 5
    assert _fingerprint([c]) == _fingerprint([alone])
    assert a.output_ids == c.output_ids


def test_parked_sessions_are_never_evicted(det_engine, tokenizer):
    """Parked sessions that hold the whole pool: the request that finds no page is
    aborted with the reason; ending a session frees its pages."""
    prompt = _encode(tokenizer, "The quick brown fox")
    sampling = SamplingParams(temperature=1.0, max_new_tokens=3, seed=1)
    evictions = det_engine.stats["evictions"]
    # Distinct 80-token prompts of 6 pages each (with their outputs): 4 fill the 24.
    sessions = [f"parked-{i}" for i in range(det_engine.kv_pages // 6)]
    for i, session_id in enumerate(sessions):
        ids = [5 + i] + (prompt * 20)[:79]
        det_engine.generate_sync([GenerateRequest(ids, sampling, session_id=session_id)])
    [[refused]] = det_engine.generate_sync([GenerateRequest(prompt, sampling,
                                                            session_id="one-too-many")])
    assert refused.finish_reason == "abort" and "parked sessions" in refused.meta["error"]
    assert det_engine.stats["evictions"] == evictions
    det_engine.end_session(sessions[0])
    [[admitted]] = det_engine.generate_sync([GenerateRequest(prompt, sampling,
                                                             session_id="one-too-many")])
    assert admitted.finish_reason in ("stop", "length") and admitted.output_ids
    for session_id in sessions[1:] + ["one-too-many"]:
        det_engine.end_session(session_id)


def test_default_mode_guarantees_closeness_only(engine, tokenizer):
    """deterministic=False: program shapes follow what is in flight (here a 1-row
    program alone, all rows in the crowd), so a row's log-probs may differ in the
    last bits (measured up to ~1e-5 on XLA:CPU) and a near-tie may flip a token; only
    closeness to the engine's 1e-4 guarantee is asserted."""
    plain, *_ = _workload(tokenizer)
    request = plain[1]
    [[alone]] = engine.generate_sync([request])
    crowd = engine.generate_sync(plain[2:] + [request] + plain[:1])
    crowded = crowd[1][0]
    assert alone.output_ids == crowded.output_ids  # no near-tie in this workload
    np.testing.assert_allclose(alone.logprobs, crowded.logprobs, atol=1e-4)


def test_overlapped_decode_calls_change_no_output(det_engine, tiny_model, tokenizer):
    """Overlap (each decode call dispatched before the previous one is read) gives the
    outputs of an engine without it, bitwise: in the crowd, and alone where rows end
    inside a call whose successor already runs — at a stop id (the carry stops the
    row on device), at a stop string (found on the host: the successor's tokens are
    dropped, and the session's next turn prefills over the slots they wrote) and at
    max_new_tokens."""
    serial = JaxEngine.from_model(tiny_model, tokenizer=tokenizer, overlap=False,
                                  **DETERMINISTIC_KWARGS)
    prompt = _encode(tokenizer, "Which city is the capital of France?")
    free = SamplingParams(temperature=1.0, max_new_tokens=20, seed=21)
    [[reference]] = serial.generate_sync([GenerateRequest(prompt, free)])
    out = reference.output_ids
    # Ends past the first call (decode_steps = 4): tokens 9 and 13.
    k = next(i for i in range(9, 16) if out[i] not in out[:i]
             and out[i] not in serial.eos_token_ids)
    stop = tokenizer.decode(out[12:14])
    stop_at = next(j for j in range(len(out)) if stop in tokenizer.decode(out[:j + 1]))
    by_id = dataclasses.replace(free, stop_token_ids=(out[k],))
    by_text = dataclasses.replace(free, stop=(stop,))

    def run(engine):
        before = collections.Counter(engine.stats)
        alone = [engine.generate_sync([GenerateRequest(prompt, s)])[0][0]
                 for s in (free, by_id, dataclasses.replace(free, max_new_tokens=10))]
        turns = asyncio.run(_session(engine, tokenizer, by_text, prompt,
                                     f"stop-text-{id(engine)}"))
        dropped = engine.stats["dropped_decode_tokens"] - before["dropped_decode_tokens"]
        _, crowded = _alone_then_crowded(engine, tokenizer, crowd_seed=2)
        ends = [(c.finish_reason, c.matched_stop) for c in alone + turns]
        overlapped = engine.stats["overlapped_decode_calls"] - before[
            "overlapped_decode_calls"]
        return _fingerprint(alone + turns) + crowded, ends, overlapped, dropped

    try:
        with_overlap, ends, overlapped, dropped = run(det_engine)
        without, serial_ends, serial_overlapped, serial_dropped = run(serial)
    finally:
        serial.close()
    assert with_overlap == without and ends == serial_ends
    assert overlapped > 0 and serial_overlapped == 0
    # The stop-string turns ran past their stop in a successor call: 4 tokens each.
    # The first turn's stop string (token 13) ended it in the call of tokens 12-15; its
    # successor (16-19) already ran: 4 tokens dropped.
    assert dropped == 4 and serial_dropped == 0
    assert ends[1] == ("stop", out[k]) and ends[3] == ("stop", stop)
    assert with_overlap[1][0] == out[:k + 1] and with_overlap[3][0] == out[:stop_at + 1]


def test_a_prefill_round_is_waited_for_once(det_engine, monkeypatch):
    """4 prompts of 8 ids to prefill, 2 rows a prefill call: one round of 2 calls,
    dispatched back to back (the host builds the second while the device runs the
    first) and waited for once."""
    waits = []
    block = jax.block_until_ready
    monkeypatch.setattr(jax, "block_until_ready", lambda x: waits.append(1) or block(x))
    before = det_engine.stats["prefill_calls"]
    sampling = SamplingParams(temperature=1.0, max_new_tokens=2, seed=4)
    det_engine.generate_sync([GenerateRequest([7 + i] * 9, sampling) for i in range(4)])
    assert det_engine.stats["prefill_calls"] - before == 2
    assert len(waits) == 1


def test_overlap_runs_while_requests_wait_for_a_row(tiny_model, tokenizer):
    """6 requests for 4 rows: while every row is busy the 2 waiting ones cannot be
    admitted, so decode calls go on overlapped; each joins when a row frees, with the
    outputs of an engine without overlap."""
    prompt = _encode(tokenizer, "Which city is the capital of France?")
    requests = [GenerateRequest(prompt[:8 + i], SamplingParams(
        temperature=1.0, max_new_tokens=6 + 4 * i, seed=30 + i)) for i in range(6)]
    runs = {}
    for overlap in (True, False):
        with JaxEngine.from_model(tiny_model, tokenizer=tokenizer, overlap=overlap,
                                  eos_token_ids=(), **DETERMINISTIC_KWARGS) as engine:
            waiting = []  # sequences waiting at each overlapped dispatch
            follow = engine._rounds._dispatch_following

            def spy(call, engine=engine, follow=follow):
                waiting.append(len(engine._scheduler._waiting))
                return follow(call)

            engine._rounds._dispatch_following = spy
            results = engine.generate_sync(requests)
            runs[overlap] = (_fingerprint([c for [c] in results]), waiting)
    assert runs[True][0] == runs[False][0]
    assert 2 in runs[True][1] and runs[False][1] == []
