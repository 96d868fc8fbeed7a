import pytest

from agentjax.rewards import format as format_lib
from tests.rewards.episodes import OBS_1, TWO_HOP, episode


@pytest.mark.parametrize("text, action", [
    ("<search> Varo Kessin </search>", "search"),
    ("<think> need the employer </think>\n<search>Varo Kessin</search>", "search"),
    ("<think></think><answer> Dara Voss </answer>", "answer"),
    ("  <answer>x < y</answer>  ", "answer"),
    # Ill-formed:
    ("Varo Kessin", None),                                   # no tags
    ("<search> </search>", None),                            # empty action
    ("<search> a </answer>", None),                          # mismatched close
    ("<search> a <search> b </search>", None),               # nested
    ("<answer> a </answer><answer> b </answer>", None),      # two actions
    ("<search> a </search> trailing", None),                 # text after the action
    ("hmm <search> a </search>", None),                      # text before the action
    ("<think> a </think> hmm <search> b </search>", None),   # text between blocks
    ("<search> a </search><information> x </information>", None),  # hallucinated obs
    ("<think> a <search> b </search>", None),                # unclosed think
    ("<answer> a </answer><think> b </think>", None),        # think after action
    ("<search> a", None),                                    # unclosed action
    ("<serch> a </serch>", None),                            # unknown tag
])
def test_turn_state_machine(text, action):
    assert format_lib.turn_is_well_formed(text) == action


def test_custom_action_tags():
    text = '<tool_call>{"name": "python", "arguments": {}}</tool_call>'
    assert format_lib.turn_is_well_formed(text, ("tool_call",), think_tag=None) == "tool_call"
    assert format_lib.turn_is_well_formed("<think>a</think>" + text, ("tool_call",), None) is None


def test_format_score_of_episodes():
    clean = episode(TWO_HOP, ("<search> Varo Kessin </search>", OBS_1), "<answer> x </answer>")
    assert format_lib.format_score(clean) == 1.0
    # One of three turns malformed, still finished: 0.5 * 2/3 + 0.5.
    messy = episode(TWO_HOP, ("Varo Kessin", "bad"), ("<search> Varo Kessin </search>", OBS_1),
                    "<answer> x </answer>")
    assert format_lib.format_score(messy) == pytest.approx(0.5 * 2 / 3 + 0.5)
    # Clean turns that never answer: half marks.
    unfinished = episode(TWO_HOP, ("<search> a </search>", OBS_1), ("<search> b </search>", OBS_1))
    assert format_lib.format_score(unfinished) == 0.5
    # Anything after an answer is ill-formed, and the episode did not end on its answer.
    after = episode(TWO_HOP, ("<answer> x </answer>", ""), ("<search> a </search>", OBS_1))
    assert format_lib.format_score(after) == pytest.approx(0.25)
    assert format_lib.format_score(episode(TWO_HOP)) == 0.0
