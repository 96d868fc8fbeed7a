"""What happens to a group of episodes between the pool and the batch: the one
post-processing the synchronous and the asynchronous rollout sources share.

    rules = GroupRules(success_key, hindsight, overlong, ...)   # train/stages/rl.py
    groups, info = collect_groups(pool, sampler, rules, sampling_of, prompts=P,
                                  group_size=G)                   # sync: one step's groups
    groups, relabeled = rules.finish(groups)                      # async: each group

A finished group is (in this order) relabeled by hindsight when nothing in it solved its
task (`data.hindsight`, agents/hindsight.py), then shaped for overlong episodes (DAPO's
overlong penalty, `algo.overlong_buffer`). The synchronous source also draws again for
groups whose rewards are all equal (DAPO's dynamic sampling) and fills the batch with
set-aside groups when the rounds run out. Either way a step's groups are numbered 0..P-1
in order, and the r-th draw of step s samples with seed index `seed_index(s, r)`.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import numpy as np

from agentjax.agents.evaluation import solved
from agentjax.agents.hindsight import hindsight_group
from agentjax.agents.loop import describe_error
from agentjax.core.task import Task
from agentjax.core.trajectory import Trajectory
from agentjax.engine.protocol import SamplingParams
from agentjax.rl.shaping import dynamic_sampling_keep, overlong_penalty

Group = list[Trajectory]


def seed_index(step: int, draw: int = 0) -> int:
    """The sampling-seed index of the `draw`-th collection of `step` (dynamic sampling
    draws more than once per step)."""
    return step * 100 + draw


def number_groups(groups: Sequence[Group]) -> None:
    """Group ids 0..len(groups) - 1, in order (what the advantage estimators group by)."""
    for group_id, group in enumerate(groups):
        for traj in group:
            traj.group_id = group_id


@dataclasses.dataclass(frozen=True)
class Overlong:
    """DAPO's overlong shaping: a penalty on episodes whose action tokens (a compacted or
    segmented rollout's, every segment's) enter the last `buffer` tokens before
    `max_len` (rl.shaping.overlong_penalty)."""

    max_len: int
    buffer: int
    factor: float

    def apply(self, trajectories: Sequence[Trajectory]) -> None:
        """Adds the penalty to each final reward, recorded as the "overlong" component."""
        lengths = np.array([t.rollout_action_tokens for t in trajectories], np.float32)
        penalties = np.asarray(overlong_penalty(lengths, max_len=self.max_len,
                                                buffer=self.buffer, factor=self.factor))
        for traj, penalty in zip(trajectories, penalties):
            traj.final_reward += float(penalty)
            traj.metadata.setdefault("reward_components", {})["overlong"] = float(penalty)


@dataclasses.dataclass(frozen=True)
class Hindsight:
    """Relabels a group that solved nothing to a question its episodes answered."""

    relabel: Callable
    reward_fn: Callable
    prompt_of: Callable[[Task], list[int]]
    success_key: str
    max_tokens: int

    def __call__(self, group: Group) -> Group | None:
        return hindsight_group(group, self.relabel, self.reward_fn, self.prompt_of,
                               success_key=self.success_key, max_tokens=self.max_tokens)


@dataclasses.dataclass(frozen=True)
class GroupRules:
    """How finished groups are post-processed and kept (module docstring).

    Attributes:
      success_key: the reward component that says a task was solved.
      hindsight: relabels groups that solved nothing (None: off).
      overlong: DAPO's overlong shaping (None: off).
      dynamic_sampling: keep only groups whose rewards differ, drawing again (sync).
      max_resample_rounds: extra draws dynamic sampling may make per step.
      log: where warnings go.
    """

    success_key: str
    hindsight: Hindsight | None = None
    overlong: Overlong | None = None
    dynamic_sampling: bool = False
    max_resample_rounds: int = 0
    log: Callable[[str], None] = print

    def finish(self, groups: Sequence[Group]) -> tuple[list[Group], int]:
        """(the groups relabeled and shaped, how many were relabeled). A group whose
        relabeling raises (a judge that gave no verdict, say) is kept as sampled, with a
        warning naming the error."""
        out, relabeled = [], 0
        for group in groups:
            new = None
            if self.hindsight is not None:
                try:
                    new = self.hindsight(group)
                except Exception as error:  # noqa: BLE001 — the sampled group is still good
                    self.log(f"warning: hindsight relabeling of task {group[0].task_id!r} "
                             f"failed, its group is kept as sampled: {describe_error(error)}")
            out.append(new or list(group))
            relabeled += new is not None
        if self.overlong is not None:
            self.overlong.apply([t for group in out for t in group])
        return out, relabeled

    def success(self, group: Group) -> float:
        """The fraction of the group's episodes that solved the task they were drawn for
        (what the curriculum sampler learns from)."""
        return float(np.mean([solved(t, self.success_key) for t in group]))

    def varied(self, groups: Sequence[Group], group_size: int) -> list[bool]:
        """Which groups dynamic sampling keeps: those whose rewards are not all equal
        (every group when it is off)."""
        if not self.dynamic_sampling:
            return [True] * len(groups)
        rewards = np.array([t.total_reward for g in groups for t in g], np.float32)
        keep = dynamic_sampling_keep(rewards, np.repeat(np.arange(len(groups)), group_size),
                                     len(groups))
        return [bool(k) for k in np.asarray(keep)[::group_size]]


def collect_groups(pool, sampler, rules: GroupRules,
                   sampling_of: Callable[[int], SamplingParams], *, prompts: int,
                   group_size: int) -> tuple[list[Group], dict[str, float]]:
    """One step's `prompts` groups of `group_size` episodes, numbered in order, and
    rollout metrics. `sampling_of(draw)` is the sampling of the step's draw-th
    collection. The curriculum sees each group's success before relabeling; with
    dynamic sampling, groups whose rewards are all equal are set aside and more tasks
    drawn until the batch is full, and if the rounds run out set-aside groups (zero
    advantage: no policy-gradient signal) fill it."""
    kept, set_aside, draws, relabeled = [], [], 0, 0
    while len(kept) < prompts:
        drawn = sampler.sample(prompts - len(kept))
        collected = pool.collect_sync(drawn, group_size, sampling=sampling_of(draws),
                                      first_group_id=0)
        sampler.update(drawn, [rules.success(g) for g in collected])
        collected, count = rules.finish(collected)
        relabeled += count
        for group, varied in zip(collected, rules.varied(collected, group_size)):
            (kept if varied else set_aside).append(group)
        draws += 1
        if draws > rules.max_resample_rounds:
            break
    groups = (kept + set_aside)[:prompts]
    number_groups(groups)
    info = {"rollout/rounds": draws, "rollout/kept_groups": len(kept)}
    if rules.hindsight is not None:
        info["rollout/hindsight_groups"] = relabeled
    return groups, info
