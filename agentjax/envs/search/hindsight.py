"""Hindsight relabeling for the multi-hop search world (after Hindsight
Experience Replay, arXiv 1707.01495).

A failed episode whose final answer is nonetheless a true fact of the world becomes a
success for the question it did answer. In the search world the common case is a policy
that stopped early: asked for the country of the birthplace of X's employer's founder,
it answered the founder. Its answer is the end of a prefix of the question's relation
chain, so the relabeled task asks that prefix ("Who is the founder of the employer of
X?"), whose answer is exactly what the episode said. Only prefixes of the original chain
from the original start entity are considered: the episode's searches then are a sound
demonstration for the new question too (answers reached by other paths are left alone).
The RL stage relabels whole groups with it when `data.hindsight` is set
(agents/hindsight.py).
"""
from __future__ import annotations

from typing import Collection

from agentjax.envs.search.world import World
from agentjax.core.task import EpisodeLog, Task
from agentjax.rewards.outcome import episode_answer, exact_match


def relabel(task: Task, log: EpisodeLog, world: World, *,
            exclude_questions: Collection[str] = ()) -> Task | None:
    """The task the episode's answer actually solved, or None.

    Args:
      task: the original world task (metadata["chain"] from `World.make_task`).
      log: the episode.
      world: the world the task came from.
      exclude_questions: question texts never to produce (e.g. the held-out split, so
        relabeled training data cannot leak test questions).

    Returns:
      None when the episode answered correctly, did not answer, or answered something
      that is not the end of a strict prefix of the chain; else the prefix Task (id
      `"{task_id}/hindsight{k}"`, metadata["relabeled_from"] = the original id).
    """
    chain = task.metadata.get("chain")
    if not chain:
        raise ValueError(f"task {task.task_id!r} has no metadata['chain']; hindsight "
                         "relabeling needs a world task")
    answer = episode_answer(log)
    if answer is None or exact_match(answer, task.answers):
        return None
    relations = [hop["relation"] for hop in chain]
    for k in range(len(chain) - 1, 0, -1):
        reached = world.entity(chain[k - 1]["object_id"])
        if exact_match(answer, (reached.name, *reached.aliases)):
            new = world.make_task(chain[0]["subject_id"], relations[:k],
                                  f"{task.task_id}/hindsight{k}")
            if new.question in exclude_questions:
                return None
            return Task(new.task_id, new.question, new.answers, new.data_source,
                        {**new.metadata, "relabeled_from": task.task_id})
    return None
