"""LanedEngine: lanes give the same seeded outputs as one engine of a lane's shape, spread
the load, keep sessions on their lane and swap weights everywhere."""
import asyncio

import jax
import pytest
from flax import nnx

from agentjax.engine.protocol import GenerateRequest, SamplingParams
from agentjax.engine.jax.engine import JaxEngine
from agentjax.engine.jax.lanes import LanedEngine
from tests.engine.jax.test_engine_deterministic import DETERMINISTIC_KWARGS

LANE_KWARGS = dict(DETERMINISTIC_KWARGS, max_slots=2)  # a lane's shapes


@pytest.fixture(scope="module")
def laned(tiny_model, tokenizer):
    engine = LanedEngine.from_model(tiny_model, lanes=2, tokenizer=tokenizer,
                                    **dict(LANE_KWARGS, max_slots=4))
    engine.warmup()
    yield engine
    engine.close()


def _requests(tokenizer, count, max_new_tokens=6):
    prompt = tokenizer.encode("Which city is the capital of France?", add_special_tokens=False)
    return [GenerateRequest(prompt[:8 + i], SamplingParams(temperature=1.0, seed=i,
                                                           max_new_tokens=max_new_tokens))
            for i in range(count)]


def test_lanes_match_one_engine_of_a_lanes_shape_and_share_the_load(laned, tiny_model,
                                                                     tokenizer):
    requests = _requests(tokenizer, 6)
    before = [lane.stats["decode_calls"] for lane in laned.lanes]
    together = laned.generate_sync(requests)
    assert all(lane.stats["decode_calls"] > b for lane, b in zip(laned.lanes, before))
    with JaxEngine.from_model(tiny_model, tokenizer=tokenizer, **LANE_KWARGS) as single:
        alone = [single.generate_sync([r])[0] for r in requests]
    for got, want in zip(together, alone):
        assert got[0].output_ids == want[0].output_ids
        assert got[0].logprobs == want[0].logprobs


def test_sessions_stay_on_their_lane_and_weight_swaps_reach_every_lane(laned, tiny_model,
                                                                       tokenizer):
    first = _requests(tokenizer, 4)
    sessions = [GenerateRequest(r.input_ids, r.sampling, session_id=f"s{i}")
                for i, r in enumerate(first)]
    out = laned.generate_sync(sessions)
    # Reversed: routing by load alone would now send each session to the other lane.
    again = [GenerateRequest(list(r.input_ids) + c[0].output_ids + r.input_ids[:3],
                             r.sampling, session_id=r.session_id)
             for r, c in reversed(list(zip(sessions, out)))]
    second = laned.generate_sync(again)
    assert all(c[0].meta["cached_tokens"] > 0 for c in second)
    for r in sessions:
        laned.end_session(r.session_id)
    assert not laned._session_lane

    compiles = laned.compile_counts
    requests = _requests(tokenizer, 4)
    old = laned.generate_sync(requests)
    params = jax.tree.map(lambda x: -x, nnx.split(tiny_model)[1])
    laned.update_weights(params, version=7)
    new = laned.generate_sync(requests)
    assert all(c[0].meta["weight_version"] == 7 for c in new)
    assert [c[0].output_ids for c in new] != [c[0].output_ids for c in old]
    assert laned.compile_counts == compiles
    laned.update_weights(nnx.split(tiny_model)[1])
    assert [c[0].output_ids for c in laned.generate_sync(requests)] == [
        c[0].output_ids for c in old]


def test_sessions_opened_one_at_a_time_fill_the_lanes_evenly(laned, tokenizer):
    # 4 sessions, 2 rows per lane: each session keeps its row until it ends, so a lane
    # given a third one (routing by requests in flight alone) would have to abort it.
    for i, request in enumerate(_requests(tokenizer, 4)):
        [[completion]] = laned.generate_sync(
            [GenerateRequest(request.input_ids, request.sampling, session_id=f"open{i}")])
        assert completion.finish_reason != "abort", completion.meta
    assert sorted(laned._session_lane.values()) == [0, 0, 1, 1]
    for i in range(4):
        laned.end_session(f"open{i}")
    assert laned._load == [0, 0]


def test_unseeded_requests_draw_different_noise_in_each_lane(laned, tokenizer):
    [request] = _requests(tokenizer, 1, max_new_tokens=12)
    unseeded = GenerateRequest(request.input_ids, SamplingParams(temperature=2.0,
                                                                 max_new_tokens=12))
    # One call: the load routing puts the two copies in different lanes.
    outputs = [c[0].output_ids for c in laned.generate_sync([unseeded, unseeded])]
    assert outputs[0] != outputs[1]


def test_lanes_must_split_the_slots_evenly(tiny_model, tokenizer):
    with pytest.raises(ValueError, match="split evenly"):
        LanedEngine.from_model(tiny_model, lanes=3, tokenizer=tokenizer, **LANE_KWARGS)
    with pytest.raises(ValueError, match="at least one lane"):
        LanedEngine([])
    with LanedEngine.from_model(tiny_model, lanes=1, tokenizer=tokenizer,
                                **LANE_KWARGS) as one_lane:
        assert asyncio.run(one_lane.generate([])) == []
