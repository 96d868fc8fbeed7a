"""Process (subgoal) reward for multi-hop search.

A hand-crafted check per hop: hop i is reached when a tool observation (the result of a
valid call) contains that hop's bridge entity (whole words, after SQuAD normalization).
The subgoals are `task.metadata["bridge_entities"]` (objects of every hop but the
last), plus the final answer's entity when `include_answer` (finding the document that
states it).
Being a process reward it can be gamed by searching without answering; the composite
reward therefore lets the outcome decide at least half of the total.
"""
from __future__ import annotations

import re

from agentjax.core.task import EpisodeLog, Task
from agentjax.rewards.outcome import normalize_answer

_TAG_RE = re.compile(r"</?[A-Za-z_]+>")


def has_subgoals(task: Task) -> bool:
    """Whether `task` is a multi-hop task with subgoals (a question of the synthetic
    world); a dataset question (NQ, HotpotQA) has none."""
    return "bridge_entities" in task.metadata


def subgoals(task: Task, *, include_answer: bool = True) -> list[str]:
    """The entity names whose retrieval marks each hop as reached."""
    if not has_subgoals(task):
        raise ValueError(f"task {task.task_id!r} has no metadata['bridge_entities']; the "
                         "process reward needs multi-hop tasks (agentjax.envs.search.world)")
    goals = list(task.metadata["bridge_entities"])
    if include_answer and task.answers:
        goals.append(task.answers[0])
    return goals


def subgoals_reached(task: Task, log: EpisodeLog, *, include_answer: bool = True) -> list[bool]:
    """Per subgoal, whether any observation of the episode contains its entity."""
    # Only the results of valid tool calls count: a corrective observation that echoes
    # a malformed action must not let the policy trigger subgoals by writing names.
    seen = [f" {normalize_answer(_TAG_RE.sub(' ', t.observation))} " for t in log.turns
            if t.valid and t.tool_name is not None and t.observation]
    return [any(f" {normalize_answer(goal)} " in text for text in seen)
            for goal in subgoals(task, include_answer=include_answer)]


def subgoal_reward(task: Task, log: EpisodeLog, *, include_answer: bool = True) -> float:
    """Fraction of subgoals reached, in [0, 1] (0 when the task has none).

    Args:
      task: a task with metadata["bridge_entities"].
      log: the episode.
      include_answer: count finding the answer's entity as the last subgoal.
    """
    reached = subgoals_reached(task, log, include_answer=include_answer)
    return sum(reached) / len(reached) if reached else 0.0
