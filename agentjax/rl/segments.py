"""Rollouts cut into segments: one advantage and one sequence's weight per rollout.

A rollout whose context was rewritten between model calls (an agent that summarized its
history, a compacted context) trains as several rows of a batch, its segments, which
share a `rollout_ids` entry (`core.trajectory.collate`), its group and its reward (the
sum of its rows' rewards: the outcome sits on its last segment). With
`algo.rollout_normalization` the rollout counts once wherever a batch counts sequences:

  advantages: a per-sequence estimator (`config.choices.PER_ROLLOUT_ADVANTAGES`) sees one
    row per rollout, its lead row (the first with an action token), scored with the
    rollout's total reward S_r = sum_{b in r} sum_t rewards[b, t]; every other row of
    the rollout is out of the group statistics (group id -1, mask 0) and gets the lead
    row's advantage on each of its action tokens. So group means and stds are over
    rollouts, not segments. (reinforce_pp_baseline whitens over its lead rows' tokens.)
  the loss: `rollout_tokens` n_r = sum_{b in r} n_b (n_b: loss tokens of row b) goes
    with each row into `aggregation.loss_norm` / `aggregate`: the sequence count is
    sum_b n_b / n_r and seq-mean-token-mean divides row b's sum by n_r. The weight of a
    loss token of rollout r is then, for B_R rollouts and N tokens in the batch,
      token-mean 1 / N; seq-mean-token-mean 1 / (n_r B_R); seq-mean-token-sum 1 / B_R;
      seq-mean-token-sum-norm 1 / (B_R C)
    exactly those of the same tokens in one row. A batch of unsegmented rollouts
    (n_r = n_b) gives the numbers it gives without rollout normalization, bit for bit.

Env-agnostic: all it reads is the [B] `rollout_ids` (-1 on padding rows).
"""
from __future__ import annotations

from typing import Any, Mapping

import jax
import jax.numpy as jnp

from agentjax.config.choices import PER_ROLLOUT_ADVANTAGES
from agentjax.rl import _common
from agentjax.rl._common import as_float
from agentjax.rl.advantages import AdvantageEstimate, AdvantageFn


def _slots(rollout_ids):
    """Segment index of each row for [B + 1] segment sums: padding rows go to slot B."""
    rows = rollout_ids.shape[0]
    return jnp.where((rollout_ids >= 0) & (rollout_ids < rows), rollout_ids, rows), rows + 1


def rollout_tokens(mask, rollout_ids):
    """n_r of each row: the mask tokens of all the rows of its rollout; float32 [B].

    Args:
      mask: [B, T] loss mask (non-zero = counted).
      rollout_ids: [B] int rollout of each row (ids in [0, B); -1 on padding rows, which
        keep their own count).
    """
    _common.check_rank("mask", mask, 2)
    _common.check_rank("rollout_ids", rollout_ids, 1)
    _common.check_integer("rollout_ids", rollout_ids)
    per_row = mask.astype(bool).sum(axis=1).astype(jnp.float32)
    slots, count = _slots(rollout_ids)
    totals = jax.ops.segment_sum(per_row, slots, count)
    return jnp.where(slots < count - 1, totals[slots], per_row)


def lead_rows(mask, rollout_ids):
    """[B] bool: the row that stands for each rollout (its first row with a mask token, or
    its first row when none has one); False on padding rows."""
    rows = rollout_ids.shape[0]
    slots, count = _slots(rollout_ids)
    index = jnp.arange(rows)
    key = jnp.where(mask.astype(bool).any(axis=1), index, rows + index)
    first = jax.ops.segment_min(key, slots, count)[slots]
    return (slots < count - 1) & (first % rows == index)


def per_rollout_advantages(estimator: AdvantageFn, rewards, mask, group_ids, rollout_ids,
                           *, num_groups: int, params: Mapping[str, Any]) -> AdvantageEstimate:
    """A per-sequence `estimator`'s advantages with one score per rollout (module
    docstring): [B, T], every action token of a rollout's rows its rollout's advantage.

    Args:
      estimator: an AdvantageFn of `PER_ROLLOUT_ADVANTAGES` (no critic).
      rewards: [B, T] per-token rewards (a row's score is their sum).
      mask: [B, T] loss mask.
      group_ids: [B] int group of each row (-1 on padding).
      rollout_ids: [B] int rollout of each row (-1 on padding).
      num_groups: static number of groups.
      params: the algo section the estimator reads.
    """
    _common.check_tokens(rewards=rewards, mask=mask)
    _common.check_same_shape(group_ids=group_ids, rollout_ids=rollout_ids)
    (rewards,) = as_float(rewards)
    lead = lead_rows(mask, rollout_ids)
    slots, count = _slots(rollout_ids)
    row_score = rewards.sum(axis=1)
    score = jax.ops.segment_sum(row_score, slots, count)[slots]
    # The lead row carries the rest of its rollout's reward on its last position (a
    # per-sequence estimator reads only the row's sum).
    extra = jnp.where(lead, score - row_score, 0.0)
    rewards = rewards.at[:, -1].add(extra)
    lead_mask = jnp.where(lead[:, None], mask, 0)
    estimate = estimator(rewards, lead_mask, jnp.where(lead, group_ids, -1), None,
                         num_groups=num_groups, params=params)
    # The lead row's advantage is one value on its action tokens: read it at the first.
    first = jnp.argmax(lead_mask.astype(bool), axis=1)
    value = jnp.take_along_axis(estimate.advantages, first[:, None], axis=1)[:, 0]
    rollout_value = jax.ops.segment_sum(jnp.where(lead, value, 0.0), slots, count)[slots]
    return AdvantageEstimate(jnp.where(mask.astype(bool) & (slots < count - 1)[:, None],
                                       rollout_value[:, None], 0.0))


def is_per_rollout(advantage: str) -> bool:
    """Whether estimator `advantage` gives one value per sequence (module docstring)."""
    return advantage in PER_ROLLOUT_ADVANTAGES
