"""TurnEnv: every observation and turn error leaves `step` capped and valid UTF-8."""
import pytest

from agentjax.core.task import Task
from agentjax.parsers.actions import Action, invalid
from agentjax.envs.turns import TurnEnv, clip, valid_utf8

TASK = Task("t", "q")


def test_clip_keeps_head_and_tail_within_the_cap():
    assert clip("abc", 4) == "abc"
    text = "".join(chr(ord("a") + i % 26) for i in range(1000))
    for cap in (50, 51, 100, 999):
        cut = clip(text, cap)
        assert len(cut) <= cap and cut.startswith(text[:5]) and cut.endswith(text[-5:])
        head, marker_and_tail = cut.split("\n...[", 1)
        omitted = int(marker_and_tail.split(" ", 1)[0])
        tail = marker_and_tail.split("]...\n", 1)[1]
        assert len(head) + omitted + len(tail) == len(text)
    # A cap too small for the marker keeps the head only.
    assert clip(text, 10) == text[:10]


def test_valid_utf8_replaces_lone_surrogates_only():
    assert valid_utf8("plain é 🙂") == "plain é 🙂"
    assert valid_utf8("a\ud800b\udcff") == "a?b?"


class EchoEnv(TurnEnv):
    """Echoes the action in its observation, its error, or its correction."""

    stop, observation_role = ("</x>",), "tool"

    def initial_messages(self, task):
        return []

    def parse(self, action_text):
        if action_text.startswith("bad"):
            return invalid(action_text)
        return Action(kind="tool_call", tool_name="echo", arguments={})

    def corrective_observation(self, action):
        return f"Invalid: {action.error}"

    def act(self, action, turn):
        turn.observation = self.log.turns[-1].action_text if self.log.turns else "first"
        turn.observation += turn.observation
        turn.error = turn.observation


@pytest.mark.parametrize("action", ["bad" + "\ud800" * 10**6, "ok" * 10**6])
def test_step_caps_observations_and_errors(action):
    env = EchoEnv(max_turns=3, max_observation_chars=500)
    env.reset(TASK)
    env.step(action)
    obs, done, _, info = env.step(action)
    assert not done and 0 < len(obs) <= 500 and len(info["error"]) <= 500
    obs.encode("utf-8")
    info["error"].encode("utf-8")
    assert env.log.turns[-1].observation == obs


def test_cap_must_be_positive():
    with pytest.raises(ValueError, match="max_observation_chars"):
        EchoEnv(max_turns=1, max_observation_chars=0)
