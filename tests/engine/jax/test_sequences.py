"""SequenceState: what a decode call's tokens leave on a sequence (kept up to the first
that ends it), and the Completion its caller gets."""
import asyncio

import numpy as np
import pytest

from agentjax.engine.jax.sequences import SequenceState, StopStrings
from agentjax.engine.protocol import SamplingParams


class CharTokenizer:
    """Token t decodes to the letter chr(ord('a') + t)."""

    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(ord("a") + t) for t in ids)


@pytest.fixture
def loop():
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def _sequence(loop, *, max_new_tokens=8, stop_ids=(), stop=(), input_ids=(1, 2, 3)):
    sampling = SamplingParams(max_new_tokens=max_new_tokens, stop=stop)
    seq = SequenceState(input_ids=input_ids, sampling=sampling, session_id=None,
                        key=np.zeros(2, np.uint32), stop_ids=frozenset(stop_ids),
                        stop_strings=StopStrings(CharTokenizer(), stop),
                        future=loop.create_future(), loop=loop)
    seq.length = len(input_ids) - 1  # prefilled: the next decode step feeds the last id
    return seq


def test_tokens_are_kept_up_to_a_stop_id_and_the_rest_dropped(loop):
    seq = _sequence(loop, stop_ids={9})
    assert seq.record([4, 5], [-0.1, -0.2], max_len=64, version=1) is None
    assert seq.record([6, 9, 7, 8], [-0.3, -0.4, -0.5, -0.6], max_len=64, version=2) == (
        "stop", 9)
    assert seq.outputs == [4, 5, 6, 9] and seq.logprobs == [-0.1, -0.2, -0.3, -0.4]
    assert seq.versions == [1, 1, 2, 2]
    # Every token fed so far is cached: the context but its last id.
    assert seq.length == seq.context_length - 1 == 6 and seq.decoding
    assert seq.context(2, 5) == (3, 4, 5)


def test_a_stop_string_across_two_calls_ends_at_its_last_token(loop):
    seq = _sequence(loop, stop=("cde",))
    assert seq.record([0, 2], [0.0, 0.0], max_len=64, version=0) is None      # "ac"
    assert seq.record([3, 4, 5], [0.0] * 3, max_len=64, version=0) == ("stop", "cde")
    assert seq.outputs == [0, 2, 3, 4]


def test_a_stop_id_before_a_stop_string_wins(loop):
    seq = _sequence(loop, stop_ids={3}, stop=("de",))
    assert seq.record([3, 4], [0.0, 0.0], max_len=64, version=0) == ("stop", 3)
    assert seq.outputs == [3]


def test_the_token_budget_and_max_len_end_a_sequence(loop):
    budget = _sequence(loop, max_new_tokens=3)
    assert budget.record([4, 5, 6, 7], [0.0] * 4, max_len=64, version=0) == ("length", None)
    assert budget.outputs == [4, 5, 6]
    # max_len 5 slots hold the 3 input ids and 2 outputs; the third output is sampled
    # from them and never fed.
    room = _sequence(loop, max_new_tokens=8)
    assert room.record([4, 5, 6, 7], [0.0] * 4, max_len=5, version=0) == ("length", None)
    assert room.outputs == [4, 5, 6]


def test_the_caller_gets_its_completion_and_a_cancelled_future_marks_the_sequence():
    async def run():
        loop = asyncio.get_running_loop()
        seq = _sequence(loop, stop_ids={9})
        seq.meta["cached_tokens"] = 2
        seq.record([4, 9], [-1.0, -2.0], max_len=64, version=3)
        seq.resolve("stop", 9, version=3, error=None)
        completion = await seq.future
        cancelled = _sequence(loop)
        cancelled.future.cancel()
        await asyncio.sleep(0)
        return seq, completion, cancelled

    seq, completion, cancelled = asyncio.run(run())
    assert seq.finished and not seq.cancelled and cancelled.cancelled
    assert (completion.output_ids, completion.logprobs) == ([4, 9], [-1.0, -2.0])
    assert (completion.finish_reason, completion.matched_stop) == ("stop", 9)
    assert completion.meta["cached_tokens"] == 2 and "error" not in completion.meta
    assert completion.meta["prompt_tokens"] == 3 and completion.meta["completion_tokens"] == 2
    assert completion.meta["weight_version"] == 3 and completion.meta["token_versions"] == [3, 3]
