"""Format score: a tag-order state machine over the policy's turns.

Each policy turn must read `[<think> ... </think>] <ACTION> ... </ACTION>` where ACTION
is one of `action_tags` (Search-R1: `search`, `answer`; hermes: `tool_call`), with only
whitespace between blocks, no nested or stray tags, no `<information>` written by the
policy, and non-empty action content. A turn whose action is a terminal tag (`answer`)
ends the episode; nothing may follow it.

The score in [0, 1] is `0.5 * (well-formed turns / turns) + 0.5 * [the last turn is a
well-formed terminal action]`, so a policy is paid for every clean turn but gets full
marks only when it also finishes with an answer.
"""
from __future__ import annotations

import re
from typing import Sequence

from agentjax.core.task import EpisodeLog

_TAG_RE = re.compile(r"<(/?)([A-Za-z_]+)>")


def turn_is_well_formed(text: str, action_tags: Sequence[str] = ("search", "answer"),
                        think_tag: str | None = "think") -> str | None:
    """Runs the state machine over one turn.

    Args:
      text: the policy's text for this turn.
      action_tags: tags that may carry the turn's one action.
      think_tag: optional reasoning tag allowed once before the action (None: none).

    Returns:
      The action tag of a well-formed turn, else None.
    """
    state, action, pos = "start", None, 0
    for m in _TAG_RE.finditer(text):
        between = text[pos:m.start()]
        closing, tag = m.group(1) == "/", m.group(2)
        if state in ("start", "after_think", "done") and between.strip():
            return None  # free text outside blocks
        if state == "start" and not closing and tag == think_tag:
            state = "think"
        elif state in ("start", "after_think") and not closing and tag in action_tags:
            state, action = "action", tag
        elif state == "think" and closing and tag == think_tag:
            state = "after_think"
        elif state == "action" and closing and tag == action and between.strip():
            state = "done"
        else:
            return None  # wrong order, nesting, stray tag or empty action
        pos = m.end()
    if state != "done" or text[pos:].strip():
        return None
    return action


def format_score(log: EpisodeLog, *, action_tags: Sequence[str] = ("search", "answer"),
                 terminal_tags: Sequence[str] = ("answer",),
                 think_tag: str | None = "think") -> float:
    """Format score of an episode in [0, 1] (module docstring).

    Args:
      log: the episode.
      action_tags: tags that may carry a turn's action.
      terminal_tags: action tags that end the episode.
      think_tag: optional reasoning tag allowed before the action (None: none).
    """
    if not log.turns:
        return 0.0
    actions = [turn_is_well_formed(t.action_text, action_tags, think_tag) for t in log.turns]
    # A terminal action before the last turn makes every turn after it ill-formed.
    for i, action in enumerate(actions[:-1]):
        if action in terminal_tags:
            actions[i + 1:] = [None] * (len(actions) - i - 1)
            break
    well_formed = sum(a is not None for a in actions) / len(actions)
    finished = actions[-1] in terminal_tags
    return 0.5 * well_formed + 0.5 * float(finished)


def native_format_score(log: EpisodeLog) -> float:
    """Format score of a native tool-calling episode in [0, 1]: `0.5 * (turns the tool-call
    parser read whole / turns) + 0.5 * [the last turn answered]`. A turn with a malformed
    call (`valid` False) or cut inside a call (kind "truncated") is not read whole; the
    call markup itself is the model's own format, which the parser checked
    (envs/turns.py)."""
    if not log.turns:
        return 0.0
    whole = sum(t.valid and t.kind != "truncated" for t in log.turns) / len(log.turns)
    return 0.5 * whole + 0.5 * float(log.turns[-1].kind == "answer")
