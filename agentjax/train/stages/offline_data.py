"""Training data from the agent's own rollouts: RFT sets and DPO pairs.

    groups = pool.collect_sync(tasks, group_size, sampling=...)
    kept = rft_set(groups, min_reward=1.0)                      rejection sampling
    pairs, info = preference_pairs(pool, groups, levels=("trajectory", "turn"),
                                   branches=4, ...)             DPO pairs

An episode is successful when its total reward reaches `min_reward`, failed when it
does not; an episode the rollout flagged broken (`metadata["failed"]`: an engine, env or
reward error, a timeout) is neither, since its outcome says nothing about the policy's
choices. RFT (rejection-sampling fine-tuning, the expert iteration of Anthony et al.
2017 and ReST-EM, Singh et al. 2023, arXiv 2312.06585) keeps the successful episodes,
each token sequence once. A trajectory-level pair is a successful and a failed episode
of one task; a turn-level pair is two episodes that share a prefix token for token and
take different actions at the turn after it (the step-level preference of AgentQ, Putta
et al. 2024, arXiv 2408.07199): the branch rollouts of `agents/branching.py` replay a
base episode up to that turn and sample on. In a turn-level pair the shared turns are
not trained (mask 0): both sides took them, so only the divergent actions carry the
preference.
"""
from __future__ import annotations

import dataclasses
import itertools
from typing import Sequence

import numpy as np

from agentjax.data.offline_jsonl import PreferencePair
from agentjax.agents.branching import branch_rollouts, prefix_length, shares_prefix
from agentjax.engine.protocol import SamplingParams
from agentjax.agents.pool import RolloutPool
from agentjax.core.trajectory import Trajectory


def usable(traj: Trajectory) -> bool:
    """Not broken by an engine, env or reward error or a timeout."""
    return not traj.metadata.get("failed")


def successful(traj: Trajectory, min_reward: float) -> bool:
    return usable(traj) and traj.total_reward >= min_reward


def episode_key(traj: Trajectory) -> tuple:
    """What makes two episodes the same training example: ids and action mask."""
    return tuple(traj.token_ids.tolist()), tuple(traj.action_mask.tolist())


def rft_set(groups: Sequence[Sequence[Trajectory]], *, min_reward: float,
            seen: set | None = None) -> list[Trajectory]:
    """The successful episodes of `groups`, in order, each (token ids, action mask) once;
    `seen` holds the keys of episodes kept before (updated in place)."""
    seen = set() if seen is None else seen
    kept = []
    for traj in (t for group in groups for t in group):
        if successful(traj, min_reward) and episode_key(traj) not in seen:
            seen.add(episode_key(traj))
            kept.append(traj)
    return kept


def _pick(candidates: list[tuple[Trajectory, Trajectory]], per_task: int,
          rng: np.random.Generator) -> list[tuple[Trajectory, Trajectory]]:
    """Up to `per_task` distinct (chosen, rejected) pairs, a seeded choice."""
    unique = list({(episode_key(c), episode_key(r)): (c, r) for c, r in candidates}.values())
    order = rng.permutation(len(unique))[:per_task]
    return [unique[i] for i in sorted(order)]


def trajectory_pairs(groups: Sequence[Sequence[Trajectory]], *, min_reward: float,
                     per_task: int, rng: np.random.Generator) -> list[PreferencePair]:
    """Per group (one task), up to `per_task` pairs of a successful (chosen) and a failed
    (rejected) episode."""
    pairs = []
    for group in groups:
        chosen = [t for t in group if successful(t, min_reward)]
        rejected = [t for t in group if usable(t) and not successful(t, min_reward)]
        for c, r in _pick(list(itertools.product(chosen, rejected)), per_task, rng):
            pairs.append(PreferencePair(c, r, task_id=c.task_id, level="trajectory"))
    return pairs


def branch_bases(groups: Sequence[Sequence[Trajectory]],
                 rng: np.random.Generator) -> list[tuple[Trajectory, int]]:
    """Per group, a seeded choice of one usable episode with at least two turns and of a
    turn after its first to branch at: (episode, turn index >= 1). Groups without such
    an episode give none."""
    bases = []
    for group in groups:
        multi_turn = [t for t in group if usable(t) and len(t.turns) >= 2]
        if multi_turn:
            base = multi_turn[rng.integers(len(multi_turn))]
            bases.append((base, int(rng.integers(1, len(base.turns)))))
    return bases


def _without_turns_before(traj: Trajectory, turn: int) -> Trajectory:
    """`traj` with its turns before `turn` not trained (shared by both sides of a pair)."""
    turns = [dataclasses.replace(t, trainable=False) if i < turn else t
             for i, t in enumerate(traj.turns)]
    return dataclasses.replace(traj, turns=turns)


def turn_pairs(bases: Sequence[tuple[Trajectory, int]],
               branched: Sequence[Sequence[Trajectory] | None], *, min_reward: float,
               per_task: int, rng: np.random.Generator) -> tuple[list[PreferencePair], int]:
    """Turn-level pairs from each base episode and its branches (`branch_rollouts`):
    up to `per_task` pairs of a successful and a failed episode among those sharing the
    base's prefix before the branch turn whose actions at that turn differ.

    Returns (pairs, branches that did not share the prefix: their env answered the
    replayed actions differently)."""
    pairs, off_prefix = [], 0
    for (base, turn), branches in zip(bases, branched):
        if branches is None:
            continue
        on_prefix = [b for b in branches if shares_prefix(b, base, turn)]
        off_prefix += len(branches) - len(on_prefix)
        episodes = [base] + on_prefix
        chosen = [t for t in episodes if successful(t, min_reward)]
        rejected = [t for t in episodes if usable(t) and not successful(t, min_reward)]
        candidates = [(c, r) for c, r in itertools.product(chosen, rejected)
                      if c.turns[turn].action_ids != r.turns[turn].action_ids]
        shared = prefix_length(base, turn)
        for c, r in _pick(candidates, per_task, rng):
            pairs.append(PreferencePair(
                _without_turns_before(c, turn), _without_turns_before(r, turn),
                task_id=base.task_id, level="turn", shared_tokens=shared))
    return pairs, off_prefix


def collection_info(groups: Sequence[Sequence[Trajectory]], min_reward: float) -> dict:
    """How a collection went: episodes, the fraction successful and broken."""
    episodes = [t for group in groups for t in group]
    return {"data/episodes": len(episodes),
            "data/successful": float(np.mean([successful(t, min_reward) for t in episodes])),
            "data/broken": float(np.mean([not usable(t) for t in episodes]))}


def preference_pairs(pool: RolloutPool, groups: Sequence[Sequence[Trajectory]], *,
                     levels: Sequence[str], branches: int, branch_sampling: SamplingParams,
                     min_reward: float, per_task: int, seed: int
                     ) -> tuple[list[PreferencePair], dict]:
    """The pairs of `levels` (PAIR_LEVELS) from `groups`, turn-level ones from
    `branches` branch rollouts per task sampled with `branch_sampling`; (pairs, info)."""
    rng = np.random.default_rng(seed)
    pairs, info = [], {}
    if "trajectory" in levels:
        found = trajectory_pairs(groups, min_reward=min_reward, per_task=per_task, rng=rng)
        pairs += found
        info["data/trajectory_pairs"] = len(found)
    if "turn" in levels:
        bases = branch_bases(groups, rng)
        branched = branch_rollouts(pool, bases, branches, sampling=branch_sampling)
        found, off_prefix = turn_pairs(bases, branched, min_reward=min_reward,
                                       per_task=per_task, rng=rng)
        pairs += found
        info.update({"data/turn_pairs": len(found),
                     "data/branch_episodes": sum(len(g) for g in branched if g),
                     "data/branches_off_prefix": off_prefix})
    return pairs, info
