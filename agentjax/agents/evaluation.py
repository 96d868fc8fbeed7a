"""Held-out evaluation: greedy and sampled success, pass@k, per task group.

A task counts as solved by an episode when the suite's outcome reward component (e.g.
exact match) is 1. Sampled success is the mean over `samples` episodes per task at the
rollout temperature; pass@k is the fraction of tasks solved by at least one of them.
Groups come from task metadata (`GROUP_KEYS`): the hop count, and whether SFT taught
every fact the question needs (`envs.search.demonstrators.mark_taught`) — success on untaught
questions is what reading the observations, not recalling trained answers, buys.
"""
from __future__ import annotations

import dataclasses
from collections import defaultdict
from typing import Callable, Sequence

import numpy as np

from agentjax.core.task import Task
from agentjax.engine.protocol import SamplingParams
from agentjax.agents.pool import RolloutPool
from agentjax.core.trajectory import Trajectory


def solved(traj: Trajectory, success_key: str) -> bool:
    """Whether the episode solved the task it was sampled for (failed episodes never do;
    a hindsight-relabeled one is judged by its original task: agents/hindsight.py)."""
    if traj.metadata.get("failed"):
        return False
    sampled = traj.metadata.get("hindsight", traj.metadata)
    return sampled.get("reward_components", {}).get(success_key, 0.0) >= 1.0


GROUP_KEYS = ("hops", "taught")


def _group(task: Task, key: str) -> str | None:
    value = task.metadata.get(key)
    if isinstance(value, bool):
        return "yes" if value else "no"
    return None if value is None else str(value)


def group_of(metric: str) -> str | None:
    """The task group a `success_table` metric name ends in (e.g. "hops=2" of
    "eval/success_sampled/hops=2"), else None."""
    last = metric.rsplit("/", 1)[-1]
    return last if last.split("=", 1)[0] in GROUP_KEYS and "=" in last else None


def success_table(tasks: Sequence[Task], groups: Sequence[Sequence[Trajectory]],
                  success_key: str, prefix: str) -> dict[str, float]:
    """Mean success, pass@k (k = group size) and per-task-group means of grouped
    episodes.

    Returns flat metrics: `{prefix}`, `{prefix}/pass@k`, `{prefix}/{key}={value}` for
    each of GROUP_KEYS a task has (e.g. `hops=2`, `taught=no`).
    """
    per_task = [np.mean([solved(t, success_key) for t in group]) for group in groups]
    out = {prefix: float(np.mean(per_task)) if per_task else 0.0}
    k = len(groups[0]) if groups else 0
    if k > 1:
        out[f"{prefix}/pass@{k}"] = float(np.mean([
            any(solved(t, success_key) for t in group) for group in groups]))
    by_group = defaultdict(list)
    for task, value in zip(tasks, per_task):
        for key in GROUP_KEYS:
            group = _group(task, key)
            if group is not None:
                by_group[f"{key}={group}"].append(value)
    for group in sorted(by_group):
        out[f"{prefix}/{group}"] = float(np.mean(by_group[group]))
    return out


def evaluate(pool: RolloutPool, tasks: Sequence[Task], *, success_key: str,
             sampling: SamplingParams, samples: int, prefix: str = "eval",
             inspect: Callable[[list[Trajectory]], None] | None = None) -> dict[str, float]:
    """Greedy (temperature 0, one episode per task) and sampled (`samples` episodes per
    task with `sampling`) success of the pool's current policy on `tasks`.

    `inspect`, when given, sees every episode before the metrics are computed (the
    trainer records their errors there, and stops when all of them failed).

    Returns:
      `{prefix}/success_greedy[...]`, `{prefix}/success_sampled[...]` metrics (see
      `success_table`), plus mean turns and failure counts.
    """
    # A task's greedy and sampled episodes run side by side, one group, so the engine
    # prefills its prompt once (and each context a sample reaches as greedy did). The
    # samples come first: members 0..samples-1, the seeds a sampled pass alone gives.
    greedy_sampling = dataclasses.replace(sampling, temperature=0.0, top_p=1.0, top_k=-1)
    groups = pool.collect_sync(tasks, samples + 1,
                               sampling=[sampling] * samples + [greedy_sampling],
                               first_group_id=0)
    greedy = [group[samples:] for group in groups]
    sampled = [group[:samples] for group in groups] if samples else []
    metrics = success_table(tasks, greedy, success_key, f"{prefix}/success_greedy")
    if sampled:
        metrics.update(success_table(tasks, sampled, success_key, f"{prefix}/success_sampled"))
    episodes = [t for g in list(greedy) + list(sampled) for t in g]
    if inspect is not None:
        inspect(episodes)
    metrics[f"{prefix}/mean_turns"] = float(np.mean([len(t.turns) for t in episodes]))
    metrics[f"{prefix}/failed"] = float(sum(bool(t.metadata.get("failed")) for t in episodes))
    return metrics
