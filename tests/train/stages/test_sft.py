"""The SFT stages' data: an endless seeded stream that resumes from a cursor, and the
corpus share mixed into SFT."""
import numpy as np

from agentjax.core.trajectory import Trajectory, Turn
from agentjax.train.stages import sft
from agentjax.train.stages.sft import corpus_sample, shuffled_stream


def _document(tokens: int) -> Trajectory:
    return Trajectory(prompt_ids=[1] * tokens)


def test_shuffled_stream_resumes_from_any_cursor():
    items = list(range(7))
    whole = shuffled_stream(items, 3, 0, 30)
    assert sorted(whole[:7]) == items and sorted(whole[7:14]) == items
    for cursor in (0, 5, 7, 13):
        assert shuffled_stream(items, 3, cursor, 10) == whole[cursor:cursor + 10]


def test_corpus_sample_holds_the_asked_fraction_of_tokens():
    rng = np.random.default_rng(0)
    demos = [_document(20) for _ in range(40)]
    corpus = [_document(int(n)) for n in rng.integers(7, 32, 200)]
    demo_tokens = sum(t.num_tokens for t in demos)
    assert corpus_sample(corpus, demos, 0.0, seed=1) == []
    for fraction in (0.2, 0.5):
        mixed = corpus_sample(corpus, demos, fraction, seed=1)
        tokens = sum(t.num_tokens for t in mixed)
        # Whole documents: just past the asked share, by less than one document.
        assert tokens / (tokens + demo_tokens) >= fraction
        assert (tokens - mixed[-1].num_tokens) / (tokens - mixed[-1].num_tokens
                                                  + demo_tokens) < fraction
        assert mixed == corpus_sample(corpus, demos, fraction, seed=1)
        assert mixed != corpus_sample(corpus, demos, fraction, seed=2)
    # More than the corpus holds: all of it, each document once.
    everything = corpus_sample(corpus, demos[:1] * 10_000, 0.9, seed=1)
    assert sorted(map(id, everything)) == sorted(map(id, corpus))


def test_demonstrated_replies_longer_than_a_rollout_reply_are_named():
    def demo(*lengths, trainable=True):
        return Trajectory(prompt_ids=[1], turns=[
            Turn([5] * n, [0.0] * n, "stop", trainable=trainable) for n in lengths])

    assert sft.replies_past_max_new_tokens([demo(7, 24), demo(3)], 24) is None
    # An untrained reply (an invalid action kept for context) is not one to write.
    assert sft.replies_past_max_new_tokens([demo(40, trainable=False)], 24) is None
    warning = sft.replies_past_max_new_tokens([demo(7, 38), demo(30)], 24)
    assert warning == ("2 of the 3 demonstrated replies are longer than "
                       "rollout.max_new_tokens=24 (the longest 38 tokens): the policy "
                       "cannot write them whole; raise rollout.max_new_tokens")
