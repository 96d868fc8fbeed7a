"""The Engine protocol's log-prob distribution names: which one a completion reports."""
import pytest

from agentjax.engine.protocol import SamplingParams, reported_distribution

PLAIN = SamplingParams(temperature=0.8)
TOP_P = SamplingParams(temperature=0.8, top_p=0.9)
TOP_K = SamplingParams(temperature=0.8, top_k=20)
T1_TOP_P = SamplingParams(temperature=1.0, top_p=0.9)
T1 = SamplingParams(temperature=1.0)
GREEDY = SamplingParams(temperature=0.0, top_p=0.5)


@pytest.mark.parametrize("engine,sampling,expected", [
    # An engine reporting the sampling distribution always does, but for greedy requests.
    ("sampling", PLAIN, "sampling"), ("sampling", TOP_P, "sampling"),
    ("sampling", GREEDY, "raw"),
    # SGLang's default: untruncated tempered softmax; it is the sampling distribution
    # exactly when neither top-k nor top-p truncates.
    ("temperature", PLAIN, "sampling"), ("temperature", TOP_P, "temperature"),
    ("temperature", TOP_K, "temperature"), ("temperature", GREEDY, "raw"),
    # SGLANG_RETURN_ORIGINAL_LOGPROB: untempered; at temperature 1 that is the tempered one.
    ("raw", PLAIN, "raw"), ("raw", TOP_K, "raw"), ("raw", T1, "sampling"),
    ("raw", T1_TOP_P, "temperature"), ("raw", GREEDY, "raw"),
])
def test_reported_distribution(engine, sampling, expected):
    assert reported_distribution(engine, sampling) == expected


def test_unknown_distribution_is_an_error():
    with pytest.raises(ValueError, match="'processed' is not one of"):
        reported_distribution("processed", PLAIN)
