"""The debug checklist computed every RL step, and the warnings drawn from it.

`rollout_metrics(groups, batch)` summarizes what the policy did (rewards and their
components, lengths, truncation, tool calls, mask coverage, zero-variance groups, the
share of context ids the engine took from its cache);
`failure_warnings(metrics, max_action_tokens=...)` turns the numbers into the warnings a
researcher would want printed before a run silently collapses (entropy collapse, KL
blow-up, no learning signal, length explosion, broken masks, rounded-away updates).
"""
from __future__ import annotations

from collections import Counter
from typing import Sequence

import numpy as np

from agentjax.core.trajectory import Trajectory, truncated_rollouts


def _consecutive_duplicates(log) -> int:
    calls = [(t.tool_name, repr(t.tool_args)) for t in log.turns if t.tool_name]
    return sum(a == b for a, b in zip(calls, calls[1:]))


def cached_token_frac(episodes: Sequence[Trajectory]) -> float | None:
    """Of the context ids the engine was sent, turn after turn, the fraction it took from
    its cache rather than computing them (SGLang's cache hit rate); None when no turn
    reports `cached_tokens`."""
    cached = sent = 0
    for t in episodes:
        context = len(t.prompt_ids)
        for turn in t.turns:
            if turn.cached_tokens is not None:
                cached, sent = cached + turn.cached_tokens, sent + context
            context += len(turn.action_ids) + len(turn.observation_ids)
    return cached / sent if sent else None


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

    lengths = np.array([t.rollout_action_tokens for t in episodes])
    m.update({"length/response_mean": lengths.mean(), "length/response_max": lengths.max(),
              "length/response_p90": np.percentile(lengths, 90),
              "length/episode_tokens_mean": np.mean([t.num_tokens for t in episodes]),
              "length/turns_mean": np.mean([len(t.turns) for t in episodes])})
    stops = Counter(t.metadata.get("stop_reason") or "none" for t in episodes)
    for reason, count in stops.items():
        m[f"stop/{reason}"] = count / len(episodes)
    m["stop/failed"] = np.mean([bool(t.metadata.get("failed")) for t in episodes])
    # The engine's weight versions that sampled this batch (a server pool reports the
    # version each server held; an older one means a server missed an update).
    versions = [turn.weight_version for t in episodes for turn in t.turns
                if isinstance(turn.weight_version, int)]
    if versions:
        m["rollout/weight_version_min"] = min(versions)
        m["rollout/weight_version_max"] = max(versions)
    cached = cached_token_frac(episodes)
    if cached is not None:
        m["rollout/cached_token_frac"] = cached
    native = [t for t in episodes if "rerendered_turns" in t.metadata]
    if native:
        # Native tool calling: turns whose chat template renders the history otherwise
        # than the policy saw it (models/chat.py: the prefix property); the trajectory
        # keeps the sampled tokens either way.
        m["tools/rerendered_turn_frac"] = (sum(t.metadata["rerendered_turns"] for t in native)
                                           / max(sum(len(t.turns) for t in native), 1))
    m["truncated/collate_frac"] = float(np.mean(batch["truncated"][batch["rollout_ids"] >= 0]))
    # Rollouts cut short (core/trajectory.py: the context limit, or a row cut by collate),
    # what algo.truncated_rollouts acts on.
    m["truncated/rollout_frac"] = float(np.mean(truncated_rollouts(episodes, batch)))
    m.update(segment_metrics(episodes, batch["rollout_ids"]))
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


def segment_metrics(episodes: Sequence[Trajectory], rollout_ids) -> dict[str, float]:
    """Rollouts cut into segments (core/trajectory.py) and, for an agent's rollouts
    (envs/openai_agent), how its model calls merged.

    rollout/segments_mean: segments per rollout; rollout/segments_dropped: segments past
    rollout.max_segments, left out of the batch (`rollout_ids`: each row's rollout);
    rollout/compactions_mean: the agent loop's context compactions per episode
    (env.compact_at_tokens);
    agent/prompt_extends_frac: of the calls after a rollout's first, the fraction whose
    prompt extends the previous call's prompt and completion token for token (so merged
    into one segment); agent/merge_reused_tokens_mean: per rollout, the context tokens
    those calls re-used rather than starting a segment."""
    segments = np.array([1 + len(t.segments) for t in episodes])
    kept = np.bincount(np.asarray(rollout_ids)[np.asarray(rollout_ids) >= 0],
                       minlength=len(episodes))[:len(episodes)]
    m = {"rollout/segments_mean": segments.mean(),
         "rollout/segments_dropped": float((segments - kept).sum())}
    compacted = [t.metadata["compactions"] for t in episodes if "compactions" in t.metadata]
    if compacted:
        m["rollout/compactions_mean"] = np.mean(compacted)
    agents = [t.metadata for t in episodes if "calls" in t.metadata]
    if agents:
        later = sum(max(meta["calls"] - 1, 0) for meta in agents)
        m["agent/calls_mean"] = np.mean([meta["calls"] for meta in agents])
        m["agent/prompt_extends_frac"] = (sum(meta["calls_extended"] for meta in agents)
                                          / max(later, 1))
        m["agent/merge_reused_tokens_mean"] = np.mean([meta["merge_reused_tokens"]
                                                       for meta in agents])
    return m


# An update counts as rounded away when the params moved by less than this fraction of
# what the optimizer asked for (`step.update_size_metrics`).
ROUNDED_AWAY_FRACTION = 0.5


def rounding_warnings(metrics: dict[str, float]) -> list[str]:
    """Warnings for optimizer steps that rounded away in the params' storage dtype.

    Adding an update u to a weight w stores round(w + u): every element whose |u| is
    under half an ulp of w (2^-24 |w| in float32, 2^-9 |w| in bfloat16) keeps its old
    value. With float32 master weights the applied relative update (`update/rel_size`)
    equals the intended one (`update/intended_rel_size`, ~lr / rms(w) for Adam: ~5e-5
    at lr 1e-6, three decades above float32's 6e-8) to within ~2^-24 / intended; at lr
    1e-6 bfloat16 weights keep ~99.8% of their values and the applied size drops to a
    few percent of the intended one. The rule compares the two rather than rel_size with
    a fixed floor, so zero-lr steps (warmup start, the end of a cosine decay) and a
    frozen policy (critic warmup), which ask for no change, never warn.
    """
    warnings = []
    for prefix, who in (("", "policy"), ("critic/", "critic")):
        applied = metrics.get(f"{prefix}update/rel_size")
        intended = metrics.get(f"{prefix}update/intended_rel_size", 0.0)
        if applied is None or not metrics.get(f"{prefix}grad_norm", 0.0) > 0:
            continue
        if intended > 0 and applied < ROUNDED_AWAY_FRACTION * intended:
            warnings.append(
                f"{who} update rounded away: the params moved by {applied:.2e} of their "
                f"norm, the optimizer asked for {intended:.2e} (gradient norm "
                f"{metrics[f'{prefix}grad_norm']:.2e} > 0): the learning rate is below the "
                "params' storage precision (keep float32 params or raise the lr)")
    return warnings


def failure_warnings(metrics: dict[str, float], *, max_action_tokens: int,
                     entropy_floor: float = 0.05, kl_ceiling: float = 1.0,
                     rejected_ceiling: float = 0.5,
                     truncated_ceiling: float = 0.5) -> list[str]:
    """Warnings for the failure modes visible in one step's metrics (and updates lost to
    rounding, `rounding_warnings`).

    Args:
      metrics: one step's metrics row (`rollout_metrics` plus the update's).
      max_action_tokens: the most action tokens an episode can generate (max turns x
        new tokens per turn, within the context): responses near it are exploding.
      rejected_ceiling: more than this fraction of episodes rejected by the rollout
        correction's masks is a failure.
      truncated_ceiling: more than this fraction of rollouts cut at the context limit is
        one (any row cut by collate is).
    """
    warnings = rounding_warnings(metrics)
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
    if metrics.get("length/response_mean", 0.0) > 0.8 * max_action_tokens or \
            metrics.get("stop/max_turns", 0.0) > 0.5:
        warnings.append("length explosion: responses near the budget or most episodes "
                        "stop at max turns (add a length penalty)")
    if metrics.get("mask/leak", 0.0) > 0:
        warnings.append(f"action-mask leak: {metrics['mask/leak']:.0f} prompt/padding "
                        "tokens marked as actions")
    # Most episodes out of the loss: the engine's log-probs are far from the trainer's
    # (another distribution, rl/rollout_correction.py), or the bounds are too tight.
    if metrics.get("rollout_correction/masked_seqs", 0.0) > rejected_ceiling:
        warnings.append(
            f"rollout correction rejected {metrics['rollout_correction/masked_seqs']:.0%} of "
            f"the episodes (logp_mismatch_kl={metrics.get('logp_mismatch_kl', 0.0):.3g}): "
            "check that the engine's log-probs are of the sampling distribution, or widen "
            "algo.rollout_correction's bounds")
    if metrics.get("truncated/collate_frac", 0.0) > 0:
        warnings.append(
            f"{metrics['truncated/collate_frac']:.0%} of the batch rows were cut at the "
            "largest collate bucket (rollout.max_tokens): their tail is not trained "
            "(algo.truncated_rollouts says what the loss does with the rest)")
    if metrics.get("truncated/rollout_frac", 0.0) > truncated_ceiling:
        warnings.append(
            f"{metrics['truncated/rollout_frac']:.0%} of the rollouts were cut short at the "
            "context limit: raise rollout.max_tokens, compact the context "
            "(env.compact_at_tokens) or take them out of the loss "
            "(algo.truncated_rollouts='mask')")
    return warnings
