"""The debug checklist of seed §9.4, computed every step, and §9.1 failure warnings.

`rollout_metrics(groups, batch)` summarizes what the policy did (rewards and their
components, lengths, truncation, tool calls, mask coverage, zero-variance groups);
`failure_warnings(metrics, config)` turns the numbers into the warnings a researcher
would want printed before a run silently collapses.
"""
from __future__ import annotations

from collections import Counter
from typing import Sequence

import numpy as np

from agentjax.rollout.trajectory import Trajectory


def _consecutive_duplicates(log) -> int:
    calls = [(t.tool_name, repr(t.tool_args)) for t in log.turns if t.tool_name]
    return sum(a == b for a, b in zip(calls, calls[1:]))


def rollout_metrics(groups: Sequence[Sequence[Trajectory]], batch: dict) -> dict[str, float]:
    """Checklist metrics of one step's episodes and their collated batch.

    Args:
      groups: the episodes, grouped by task.
      batch: the collated numpy batch (action_mask, segment_ids, turn_ids, truncated).
    """
    episodes = [t for group in groups for t in group]
    rewards = np.array([t.total_reward for t in episodes])
    m = {"reward/mean": rewards.mean(), "reward/std": rewards.std(),
         "reward/max": rewards.max(), "reward/min": rewards.min()}
    components = Counter()
    for t in episodes:
        components.update(t.metadata.get("reward_components", {}))
    for name, total in components.items():
        m[f"reward/{name}"] = total / len(episodes)
    group_std = [np.std([t.total_reward for t in group]) for group in groups]
    m["groups/zero_variance_frac"] = float(np.mean([s == 0 for s in group_std]))

    lengths = np.array([t.num_action_tokens for t in episodes])
    m.update({"length/response_mean": lengths.mean(), "length/response_max": lengths.max(),
              "length/response_p90": np.percentile(lengths, 90),
              "length/episode_tokens_mean": np.mean([t.num_tokens for t in episodes]),
              "length/turns_mean": np.mean([len(t.turns) for t in episodes])})
    stops = Counter(t.metadata.get("stop_reason") or "none" for t in episodes)
    for reason, count in stops.items():
        m[f"stop/{reason}"] = count / len(episodes)
    m["stop/failed"] = np.mean([bool(t.metadata.get("failed")) for t in episodes])
    m["truncated/collate_frac"] = float(np.mean(batch["truncated"][:len(episodes)]))
    m["truncated/turn_length_frac"] = np.mean([
        any(turn.finish_reason == "length" for turn in t.turns) for t in episodes])

    action = batch["action_mask"] > 0
    real = batch["segment_ids"] > 0
    m["mask/action_coverage"] = action.sum() / max(real.sum(), 1)
    # An action token on the prompt or on padding means the masks are broken.
    m["mask/leak"] = float((action & ((batch["turn_ids"] == 0) | ~real)).sum())

    logs = [t.metadata.get("env_log") for t in episodes]
    logs = [log for log in logs if log is not None]
    kinds = Counter(turn.kind for log in logs for turn in log.turns)
    turns = max(sum(kinds.values()), 1)
    for kind, count in kinds.items():
        m[f"tools/{kind}_frac"] = count / turns
    m["tools/invalid_rate"] = sum(not turn.valid for log in logs for turn in log.turns) / turns
    m["tools/duplicate_rate"] = sum(_consecutive_duplicates(log) for log in logs) / turns
    m["tools/calls_per_episode"] = np.mean([log.num_tool_calls for log in logs]) if logs else 0.
    return {k: float(v) for k, v in m.items()}


def failure_warnings(metrics: dict[str, float], *, max_response_tokens: int,
                     entropy_floor: float = 0.05, kl_ceiling: float = 1.0) -> list[str]:
    """Warnings for the §9.1 failure modes visible in one step's metrics."""
    warnings = []
    if metrics.get("entropy", 1.0) < entropy_floor:
        warnings.append(f"entropy collapse: mean entropy {metrics['entropy']:.3f} < "
                        f"{entropy_floor} (raise entropy_coef or temperature)")
    for key in ("approx_kl", "kl_ref"):
        if metrics.get(key, 0.0) > kl_ceiling:
            warnings.append(f"KL blow-up: {key}={metrics[key]:.3f} > {kl_ceiling} "
                            "(lower the learning rate or raise kl_coef)")
    # With every episode failed the variance is zero for that reason, reported apart.
    if metrics.get("groups/zero_variance_frac", 0.0) >= 1.0 and \
            metrics.get("stop/failed", 0.0) < 1.0:
        warnings.append("all groups have zero reward variance: no learning signal "
                        "(tasks too easy/hard; use dynamic sampling or a curriculum)")
    if metrics.get("length/response_mean", 0.0) > 0.8 * max_response_tokens or \
            metrics.get("stop/max_turns", 0.0) > 0.5:
        warnings.append("length explosion: responses near the budget or most episodes "
                        "stop at max turns (add a length penalty)")
    if metrics.get("mask/leak", 0.0) > 0:
        warnings.append(f"action-mask leak: {metrics['mask/leak']:.0f} prompt/padding "
                        "tokens marked as actions")
    return warnings
