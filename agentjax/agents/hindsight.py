"""Hindsight relabeling (`data.hindsight`): a group in which no episode solved its task
becomes a group for a question its episodes did answer (applied by agents/groups.py).

A policy that stops early in the multi-hop search world answers an intermediate entity
of the question's relation chain, and `envs.search.hindsight.relabel` names the shorter
question that answer solves (Hindsight Experience Replay, arXiv 1707.01495). A group of
G episodes for task T in which no episode solved T and none failed, where some episode
answered such a question T', is replaced by the same G episodes asked T' (the T' most
of them answered; the first reached on a tie): each one's prompt is re-rendered for T'
and its outcome rescored against T'. Everything after the prompt keeps its exact token
ids, action mask and behavior log-probs. Those were sampled under T's prompt, so the
trainer must recompute the old policy's log-probs (algo.old_logp='recompute', a config
rule); the truncated importance weight min(pi / pi_behavior, algo.tis_cap) then weights
each relabeled token by the ratio hindsight policy gradients weight relabeled episodes
by (Rauber et al., ICLR 2019), truncated.

A relabeled group replaces the original only when its rewards differ: a group-relative
advantage learns nothing from equal rewards, and the original is on-policy. An episode
remembers its original task, reward and components under metadata["hindsight"]; the
run's success rate (`evaluation.solved`) is that of the original tasks, the reward/*
metrics are those trained on, and rollout/hindsight_groups counts the relabeled groups.
"""
from __future__ import annotations

import collections
import dataclasses
from typing import Callable, Sequence

from agentjax.core.task import EpisodeLog, Task
from agentjax.core.trajectory import Trajectory
from agentjax.agents.evaluation import solved

Relabel = Callable[[Task, EpisodeLog], Task | None]


def hindsight_group(group: Sequence[Trajectory], relabel: Relabel, reward_fn,
                    prompt_of: Callable[[Task], list[int]], *, success_key: str,
                    max_tokens: int) -> list[Trajectory] | None:
    """The group relabeled to the question its episodes answered, or None to keep it.

    Args:
      group: one task's episodes (the pool's trajectories, with metadata["env_log"]).
      relabel: (task, log) -> the task the episode's answer solved, or None.
      reward_fn: (task, log) -> (total, components), the run's reward.
      prompt_of: task -> the prompt ids its episodes start from.
      success_key: the reward component that says a task was solved.
      max_tokens: the context budget; a group that would not fit it is kept as it is.
    """
    if any(t.metadata.get("failed") or solved(t, success_key) for t in group):
        return None
    targets = [relabel(t.task, t.metadata["env_log"]) for t in group]
    answered = collections.Counter(t.task_id for t in targets if t is not None)
    if not answered:
        return None
    [(target_id, _)] = answered.most_common(1)
    target = next(t for t in targets if t is not None and t.task_id == target_id)
    prompt = list(prompt_of(target))
    relabeled = []
    for traj in group:
        if len(prompt) + traj.num_tokens - len(traj.prompt_ids) > max_tokens:
            return None
        total, components = reward_fn(target, traj.metadata["env_log"])
        original = {"task_id": traj.task_id, "final_reward": traj.final_reward,
                    "reward_components": traj.metadata.get("reward_components", {})}
        relabeled.append(dataclasses.replace(
            traj, prompt_ids=prompt, turns=list(traj.turns), final_reward=float(total),
            task_id=target.task_id, task=target,
            metadata={**traj.metadata, "reward_components": dict(components),
                      "hindsight": original}))
    if len({t.total_reward for t in relabeled}) < 2:
        return None
    return relabeled
