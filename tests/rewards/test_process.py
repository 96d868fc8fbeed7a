import pytest

from agentjax.core.task import Task
from agentjax.rewards import process
from tests.rewards.episodes import OBS_1, OBS_2, TWO_HOP, episode


def test_subgoals_per_hop():
    assert process.subgoals(TWO_HOP) == ["Quellon Corp", "Dara Voss"]
    assert process.subgoals(TWO_HOP, include_answer=False) == ["Quellon Corp"]


def test_reached_hops_are_read_from_observations():
    none = episode(TWO_HOP, "<answer> Dara Voss </answer>")
    first = episode(TWO_HOP, ("<search> Varo Kessin </search>", OBS_1), "<answer> x </answer>")
    both = episode(TWO_HOP, ("<search> Varo Kessin </search>", OBS_1),
                   ("<search> Quellon Corp </search>", OBS_2), "<answer> x </answer>")
    assert process.subgoal_reward(TWO_HOP, none) == 0.0
    assert process.subgoal_reward(TWO_HOP, first) == 0.5
    assert process.subgoal_reward(TWO_HOP, both) == 1.0
    assert process.subgoal_reward(TWO_HOP, first, include_answer=False) == 1.0


def test_whole_word_match_ignores_confusable_names_and_echoed_errors():
    twin = episode(TWO_HOP, ("<search> Quellon </search>",
                             "<information>Doc 1(Title: Quellon Corpus) Quellon Corpus is "
                             "based in Dara Vossa.</information>"))
    assert process.subgoals_reached(TWO_HOP, twin) == [False, False]
    # A corrective observation echoing the policy's malformed text does not count.
    echoed = episode(TWO_HOP, ("Quellon Corp Dara Voss", "Invalid action: Quellon Corp Dara Voss"))
    assert process.subgoal_reward(TWO_HOP, echoed) == 0.0


def test_missing_metadata_is_a_clear_error():
    with pytest.raises(ValueError, match="bridge_entities"):
        process.subgoal_reward(Task("x", "q", ("a",)), episode(TWO_HOP))
