import asyncio

import pytest

from agentjax.core.registry import Registry
from agentjax.core.task import Task
from agentjax.rewards import composite
from tests.rewards.episodes import OBS_1, OBS_2, TWO_HOP, episode
from tests.rewards.test_code import SubprocessSandbox
from tests.rewards.test_judge import YES, CharTokenizer, ScriptedEngine, judge_of

CONFIG = {"components": {"exact_match": {"weight": 1.0},
                         "f1": 0.0,
                         "format": {"weight": 0.2},
                         "tool_shaping": {"weight": 0.2, "cap": 0.5},
                         "process": {"weight": 0.3, "include_answer": True}}}

# A policy that triggers every subgoal (reads both hop documents) with clean format and
# tool use, then answers wrongly...
GAMER = episode(TWO_HOP, ("<search> Varo Kessin </search>", OBS_1),
                ("<search> Quellon Corp </search>", OBS_2), "<answer> Quellon Corp </answer>")
# ...versus one that answers correctly with no search and a malformed first turn.
LUCKY = episode(TWO_HOP, ("junk", "Invalid action."), "<answer> Dara Voss </answer>")


def test_components_and_total():
    reward_fn = composite.make_reward_fn(CONFIG)
    total, parts = reward_fn(TWO_HOP, GAMER)
    assert parts == pytest.approx({"exact_match": 0.0, "f1": 0.0, "format": 1.0,
                                   "tool_shaping": 0.1, "process": 1.0})
    assert total == pytest.approx(0.2 * 1.0 + 0.2 * 0.1 + 0.3 * 1.0)


def test_a_subgoal_gamer_cannot_out_score_a_correct_answer():
    reward_fn = composite.make_reward_fn(CONFIG)
    gamer, _ = reward_fn(TWO_HOP, GAMER)
    lucky, parts = reward_fn(TWO_HOP, LUCKY)
    assert parts["process"] == 0.0 and parts["tool_shaping"] < 0 and parts["exact_match"] == 1
    assert lucky > gamer
    # And in the worst case over all component values the bounds allow: success with every
    # other term at its minimum still ties or beats failure with every term at its maximum.
    comps = reward_fn.components
    best_fail = sum(reward_fn.weights[c.name] * (c.low if c.kind == "outcome" else c.high)
                    for c in comps)
    worst_success = sum(reward_fn.weights[c.name] * (c.high if c.kind == "outcome" else c.low)
                        for c in comps)
    assert worst_success >= best_fail


def test_a_component_scores_only_the_tasks_it_applies_to():
    """The process reward needs subgoals; on a dataset question (Search-R1's NQ: no
    bridge entities) it is left out, and the other components still score."""
    nq = Task("nq/train_0", "who got the first nobel prize in physics?",
              answers=("Wilhelm Conrad Röntgen",), data_source="nq")
    log = episode(nq, ("<search> first nobel prize physics </search>",
                       "<information>Doc 1(Title: \"Nobel Prize\") Wilhelm Conrad Röntgen"
                       "</information>"), "<answer> Wilhelm Conrad Röntgen </answer>")
    reward_fn = composite.make_reward_fn(CONFIG)
    for total, parts in (reward_fn(nq, log), asyncio.run(reward_fn.ascore(nq, log))):
        assert parts == pytest.approx({"exact_match": 1.0, "f1": 1.0, "format": 1.0,
                                       "tool_shaping": 0.1})
        assert total == pytest.approx(1.0 + 0.2 * 1.0 + 0.2 * 0.1)
    # Where it applies it still scores (and counts in the total).
    assert "process" in reward_fn(TWO_HOP, GAMER)[1]


def test_outcome_share_is_enforced():
    with pytest.raises(ValueError, match="outcome decide only"):
        composite.make_reward_fn({"components": {"exact_match": 1.0, "process": 1.5}})
    with pytest.raises(ValueError, match="outcome decide only 0%"):
        composite.make_reward_fn({"components": {"process": 1.0}})
    # The share is explicit and can be lowered deliberately.
    reward_fn = composite.make_reward_fn({"components": {"exact_match": 1.0, "process": 1.5},
                                          "min_outcome_share": 0.4})
    assert composite.outcome_share(reward_fn.components, reward_fn.weights) == pytest.approx(0.4)


@pytest.mark.parametrize("config, match", [
    ({"components": {"nope": 1.0}}, "unknown reward component 'nope'"),
    ({"components": {"format": {"weight": 1, "colour": 1}}}, r"unknown options \['colour'\]"),
    ({"components": {"tool_shaping": {"weight": 0.1, "cap": 1, "bonus": 1}}}, "bonus"),
    ({"components": {"format": {}}}, "needs a 'weight'"),
    ({"components": {}}, "non-empty 'components'"),
    ({"components": {"f1": 1}, "weights": {}}, r"unknown keys: \['weights'\]"),
    ({"components": {"tests_pass": 1}}, "needs 'sandbox'"),
    ({"components": {"length": {"weight": 0.1, "penalty": "overlong", "max_len": 8,
                                "buffer": 2}}}, "algo.overlong_buffer"),
    ({"components": {"length": {"weight": 0.1, "penalty": "cubic"}}}, "kind must be one of"),
    ({"components": {"length": {"weight": 0.1}}}, "needs a target length"),
    ({"components": {"length": {"weight": 0.1, "target": 2, "unit": "tokens"}}}, "tokenizer"),
    ({"components": {"length": {"weight": 0.1, "unit": "miles", "target": 2, "coef": 0.1}}},
     "unit must be one of"),
    ({"components": {"length": {"weight": 0.1, "target": 2, "coef": 0.1, "length": 3}}},
     r"unknown options \['length'\]"),
])
def test_config_errors(config, match):
    with pytest.raises(ValueError, match=match):
        composite.make_reward_fn(config)


def test_accepts_ml_collections_config():
    import ml_collections
    config = ml_collections.ConfigDict({"components": {"exact_match": {"weight": 1.0},
                                                       "format": {"weight": 0.1}}})
    total, _ = composite.make_reward_fn(config)(TWO_HOP, LUCKY)
    assert total == pytest.approx(1.0 + 0.1 * (0.5 * 0.5 + 0.5))


def test_tests_pass_and_math_components():
    task = Task("c1", "write add",
                metadata={"tests": ["assert add(2, 3) == 5", "assert add(0, 0) == 1"]})
    log = episode(task, "<answer>```python\ndef add(a, b):\n    return a + b\n```</answer>")
    reward_fn = composite.make_reward_fn({"components": {"tests_pass": 1.0}},
                                         sandbox=SubprocessSandbox())
    assert reward_fn(task, log) == (0.5, {"tests_pass": 0.5})
    maths = Task("m1", "3/6?", answers=("1/2",))
    reward_fn = composite.make_reward_fn({"components": {"math_match": 1.0}})
    assert reward_fn(maths, episode(maths, r"<answer> \boxed{0.5} </answer>"))[0] == 1.0
    with pytest.raises(ValueError, match="no answers"):
        reward_fn(Task("m2", "?"), episode(maths, "<answer> 1 </answer>"))


def test_judge_component_sync_and_async():
    judge = judge_of(ScriptedEngine([YES, YES]))
    reward_fn = composite.make_reward_fn({"components": {"judge": 1.0, "format": 0.5}},
                                         judge=judge)
    assert reward_fn(TWO_HOP, LUCKY)[1]["judge"] == 1.0
    assert asyncio.run(reward_fn.ascore(TWO_HOP, LUCKY))[1]["judge"] == 1.0


def test_out_of_bounds_component_is_caught(monkeypatch):
    registered = Registry("reward component")  # test_broken stays within this test
    for name in composite.REWARDS:
        registered.register(name)(composite.REWARDS.get(name))
    monkeypatch.setattr(composite, "REWARDS", registered)
    composite.register_reward("test_broken", "shaping")(
        lambda: composite.Term(lambda task, log: 2.0, 0.0, 1.0))
    reward_fn = composite.make_reward_fn({"components": {"exact_match": 1.0,
                                                         "test_broken": 0.1}})
    with pytest.raises(AssertionError, match="outside its bounds"):
        reward_fn(TWO_HOP, LUCKY)
    assert composite.registered_rewards()["test_broken"] == "shaping"
    assert composite.REWARDS.get("test_broken").kind == "shaping"
    with pytest.raises(ValueError, match="reward component 'test_broken' is already registered"):
        composite.register_reward("test_broken", "outcome")(lambda: None)
    with pytest.raises(ValueError, match="reward kind must be one of"):
        composite.register_reward("test_bad_kind", "bonus")


def test_the_registered_components_and_their_kinds():
    built_in = {name: kind for name, kind in composite.registered_rewards().items()
                if not name.startswith("test_")}
    assert built_in == {
        "exact_match": "outcome", "f1": "outcome", "math_match": "outcome",
        "tests_pass": "outcome", "all_tests_pass": "outcome", "judge": "outcome",
        "format": "shaping", "code_format": "shaping",
        "tool_shaping": "shaping", "length": "shaping", "process": "process"}


def test_length_component_counts_turns_or_tokens():
    config = {"components": {"exact_match": 1.0,
                             "length": {"weight": 1.0, "penalty": "linear", "target": 1,
                                        "coef": 0.2, "max_penalty": 0.3}}}
    reward_fn = composite.make_reward_fn(config)
    # GAMER has 3 turns: -0.2 * (3 - 1) = -0.4, floored at -0.3 (its lower bound).
    assert reward_fn(TWO_HOP, GAMER)[1]["length"] == pytest.approx(-0.3)
    assert [c.low for c in reward_fn.components] == [0.0, -0.3]
    config["components"]["length"].update(unit="tokens", target=40, coef=0.001)
    reward_fn = composite.make_reward_fn(config, tokenizer=CharTokenizer())
    # CharTokenizer: one token per character, 92 in GAMER's actions: -0.001 * (92 - 40).
    assert sum(len(t.action_text) for t in GAMER.turns) == 92
    assert reward_fn(TWO_HOP, GAMER)[1]["length"] == pytest.approx(-0.052, abs=1e-6)
