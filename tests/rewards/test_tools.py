import pytest

from agentjax.core.task import EpisodeLog, TurnLog
from agentjax.rewards import tools
from tests.rewards.episodes import OBS_1, TWO_HOP, episode


def test_counts_only_back_to_back_duplicates_after_normalization():
    log = episode(TWO_HOP, ("<search> Varo Kessin </search>", OBS_1),
                  ("<search>varo   KESSIN</search>", OBS_1),     # duplicate
                  ("<search> Quellon Corp </search>", OBS_1),
                  ("<search> Varo Kessin </search>", OBS_1),     # repeat, not back-to-back
                  ("junk", "bad"), "<answer> x </answer>")
    assert tools.tool_call_counts(log) == {"valid": 4, "duplicate": 1, "invalid": 1}


def test_distinct_tools_with_same_args_are_not_duplicates():
    log = EpisodeLog(task=TWO_HOP, turns=[
        TurnLog("a", "tool_call", tool_name="python", tool_args={"code": "1"}),
        TurnLog("b", "tool_call", tool_name="search", tool_args={"code": "1"}),
        TurnLog("c", "tool_call", tool_name="search", tool_args={"code": "1 "}),
        TurnLog("d", "tool_call", tool_name="nope", valid=False, error="unknown tool")])
    assert tools.tool_call_counts(log) == {"valid": 3, "duplicate": 1, "invalid": 1}


def test_tool_shaping_formula_and_cap():
    log = episode(TWO_HOP, ("<search> a </search>", OBS_1), ("<search> a </search>", OBS_1),
                  ("<search> b </search>", OBS_1), "<answer> x </answer>")
    # 3 valid calls (bonus for 2), 1 duplicate, 0 invalid.
    score = tools.tool_shaping(log, valid_bonus=0.1, max_bonus_calls=2, duplicate_penalty=0.05)
    assert score == pytest.approx(0.1 * 2 - 0.05)
    spam = episode(TWO_HOP, *[("junk", "bad")] * 10)
    assert tools.tool_shaping(spam, invalid_penalty=0.3, cap=0.5) == -0.5
    assert tools.tool_shaping(log, valid_bonus=10.0, max_bonus_calls=3, cap=0.2) == 0.2
    with pytest.raises(ValueError, match="cap"):
        tools.tool_shaping(log, cap=-1)
