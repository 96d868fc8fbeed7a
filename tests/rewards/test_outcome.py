import time

import pytest

from agentjax.core.task import Task
from agentjax.rewards import outcome
from tests.rewards.episodes import OBS_1, OBS_2, TWO_HOP, episode


@pytest.mark.parametrize("text, expected", [
    ("The  Quellon Corp.", "quellon corp"),
    ("an Apple, a day!", "apple day"),
    ("Théâtre  de la Ville", "théâtre de la ville"),
    ("", ""),
])
def test_normalize_answer(text, expected):
    assert outcome.normalize_answer(text) == expected


def test_extract_answer_takes_the_last_one():
    assert outcome.extract_answer("<answer> a </answer> then <answer>\n b \n</answer>") == "b"
    assert outcome.extract_answer("<answer>unclosed") is None
    assert outcome.extract_answer("no tags") is None


def test_extract_answer_is_linear_in_unclosed_tags():
    # 1 MB of unclosed tags: the regex `<answer>(.*?)</answer>` rescanned the rest of the
    # text from each one (hours); a single scan takes milliseconds.
    text = "<answer>" * 125_000
    start = time.perf_counter()
    assert outcome.extract_answer(text) is None
    assert outcome.extract_answer("<answer> x </answer>" + text) == "x"
    assert time.perf_counter() - start < 1.0


def test_episode_answer_reads_the_last_answer_across_turns():
    log = episode(TWO_HOP, ("<search> Varo Kessin </search>", OBS_1),
                  "<answer> Wrong </answer> <answer> Dara Voss </answer>")
    assert outcome.episode_answer(log) == "Dara Voss"
    # An untagged final answer (e.g. a final_answer tool) falls back to log.final_answer.
    log = episode(TWO_HOP, ("<search> Varo Kessin </search>", OBS_1))
    assert outcome.episode_answer(log) is None
    log.final_answer = "Dara Voss"
    assert outcome.episode_answer(log) == "Dara Voss"


def test_exact_match_against_aliases():
    targets = ["Quellon Corp", "Quellon Corporation"]
    assert outcome.exact_match("the quellon corporation!", targets) == 1.0
    assert outcome.exact_match("Quellon", targets) == 0.0
    assert outcome.exact_match(None, targets) == 0.0
    assert outcome.exact_match("x", []) == 0.0


def test_f1_hand_computed():
    # pred tokens {quellon, corp, company} vs {quellon, corp}: P = 2/3, R = 1, F1 = 0.8.
    assert outcome.f1_score("the Quellon Corp company", ["Quellon Corp"]) == pytest.approx(0.8)
    # Best target wins: {dara} vs {dara, voss}: P = 1, R = 1/2 -> 2/3.
    assert outcome.f1_score("Dara", ["Nobody", "Dara Voss"]) == pytest.approx(2 / 3)
    # Repeated tokens are counted with multiplicity: {a1 a1 b} vs {a1 b b}: overlap 2.
    assert outcome.f1_score("x x y", ["x y y"]) == pytest.approx(2 / 3)
    assert outcome.f1_score("nothing shared", ["Dara Voss"]) == 0.0
    assert outcome.f1_score(None, ["Dara Voss"]) == 0.0
    assert outcome.f1_score("", ["Dara Voss"]) == 0.0


def test_outcome_of_a_full_episode():
    log = episode(TWO_HOP, ("<search> Varo Kessin </search>", OBS_1),
                  ("<search> Quellon Corp </search>", OBS_2), "<answer> Dara Voss </answer>")
    prediction = outcome.episode_answer(log)
    assert outcome.exact_match(prediction, TWO_HOP.answers) == 1.0
    assert outcome.f1_score(prediction, Task("x", "q", ("Voss",)).answers) == pytest.approx(2 / 3)
