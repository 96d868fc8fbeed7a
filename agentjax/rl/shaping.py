"""Reward shaping on lengths and the DAPO dynamic-sampling group filter.

All functions work on per-sequence [N] arrays and are pure / jittable.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from agentjax.rl import _common
from agentjax.rl.advantages import group_stats
from agentjax.rl._common import as_float

LENGTH_PENALTY_KINDS = ("linear", "sigmoid")


def overlong_penalty(lengths, *, max_len, buffer, factor):
    """DAPO soft overlong punishment, a reward term to add (always <= 0).

    With exceed = length - (max_len - buffer): 0 while exceed <= 0, then
    -exceed / buffer * factor, reaching -factor at length = max_len; longer sequences
    (truncated ones) get -factor, as in the DAPO paper.

    Args:
      lengths: [N] response lengths in tokens (int or float).
      max_len: maximum response length L_max (Python number).
      buffer: length of the punishment interval L_cache, 0 < buffer <= max_len.
      factor: penalty magnitude at and beyond max_len (>= 0).

    Returns:
      [N] float penalties in [-factor, 0].
    """
    _common.check_rank("lengths", lengths, 1)
    _common.check_range("buffer", buffer, low=0.0, low_open=True)
    _common.check_range("max_len", max_len, low=buffer)
    _common.check_range("factor", factor, low=0.0)
    (lengths,) = as_float(lengths)
    exceed = lengths - (max_len - buffer)
    return jnp.clip(-exceed / buffer * factor, -factor, 0.0)


def length_penalty(rewards, lengths, *, target, kind="linear", coef=None, tau=None):
    """Length-penalized reward.

    linear:  r - coef * max(0, length - target)
    sigmoid: r * sigmoid(-(length - target) / tau)   (note: halves r at length = target)

    Args:
      rewards: [N] float rewards to adjust.
      lengths: [N] lengths (tokens, steps or turns - the same unit as `target`).
      target: the target length T_target.
      kind: "linear" or "sigmoid".
      coef: lambda >= 0 of the linear penalty (required for kind="linear").
      tau: temperature > 0 of the sigmoid (required for kind="sigmoid").

    Returns:
      [N] float adjusted rewards.
    """
    _common.check_choice("kind", kind, LENGTH_PENALTY_KINDS)
    _common.check_rank("rewards", rewards, 1)
    _common.check_same_shape(rewards=rewards, lengths=lengths)
    rewards, lengths = as_float(rewards, lengths)
    excess = lengths - target
    if kind == "linear":
        if coef is None:
            raise ValueError("coef is required for kind='linear'")
        _common.check_range("coef", coef, low=0.0)
        return rewards - coef * jnp.maximum(excess, 0.0)
    if tau is None:
        raise ValueError("tau is required for kind='sigmoid'")
    _common.check_range("tau", tau, low=0.0, low_open=True)
    return rewards * jax.nn.sigmoid(-excess / tau)


def dynamic_sampling_keep(scores, group_ids, num_groups):
    """DAPO dynamic-sampling filter: keep the rows of groups whose scores are not all equal.

    Groups with std 0 (all correct, all wrong, or a single member) carry no group-relative
    signal; the trainer drops them and samples more prompts until the batch is full.

    Args:
      scores: [N] float per-sequence scores.
      group_ids: [N] int group ids; rows outside [0, num_groups) are never kept.
      num_groups: static Python int, number of groups.

    Returns:
      [N] bool, True for rows to keep.
    """
    stats = group_stats(scores, group_ids, num_groups)
    in_range = (group_ids >= 0) & (group_ids < num_groups)
    return in_range & ~stats.constant[jnp.clip(group_ids, 0, num_groups - 1)]
