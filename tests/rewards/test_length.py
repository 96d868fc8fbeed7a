import math

import pytest

from agentjax.rewards import length
from tests.rewards.episodes import OBS_1, TWO_HOP, episode


def sigmoid(x):
    return 1.0 / (1.0 + math.exp(-x))


def test_overlong_is_the_trainers_and_the_error_says_so():
    with pytest.raises(ValueError, match="algo.overlong_buffer"):
        length.length_reward(7, kind="overlong", target=6)


def test_linear_is_floored_and_sigmoid_is_a_unit_discount():
    assert length.length_reward(3, kind="linear", target=4, coef=0.1) == 0.0
    assert length.length_reward(6, kind="linear", target=4, coef=0.1) == pytest.approx(-0.2)
    assert length.length_reward(60, kind="linear", target=4, coef=0.1, max_penalty=0.3) == -0.3
    got = length.length_reward(6, kind="sigmoid", target=4, tau=2.0)
    assert got == pytest.approx(sigmoid(-(6 - 4) / 2.0) - 1.0, rel=1e-6)
    assert length.length_bounds("sigmoid") == (-1.0, 0.0)


def test_episode_length_units_and_errors():
    log = episode(TWO_HOP, ("<search> Varo Kessin </search>", OBS_1), "<answer> x </answer>")

    class Words:
        def encode(self, text):
            return text.split()

    assert length.episode_length(log) == 2
    assert length.episode_length(log, unit="tokens", tokenizer=Words()) == 4 + 3
    with pytest.raises(ValueError, match="tokenizer"):
        length.episode_length(log, unit="tokens")
    with pytest.raises(ValueError, match="unit"):
        length.episode_length(log, unit="bytes")
    with pytest.raises(ValueError, match="target"):
        length.length_reward(3, kind="linear", coef=0.1)
