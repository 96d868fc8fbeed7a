"""Micro-batch-exact reduction of per-token values to a loss: global denominators.

`aggregate` divides by counts of the *full* batch, carried by a `LossNorm`: build it once
from the whole batch with `loss_norm(full_mask)` and pass it to every micro-batch; the
micro-batch losses (and gradients) then sum exactly to the full-batch loss (and
gradient), unlike dividing each micro-batch by its own token count. `norm=None` means
"this call sees the full batch". The modes are verl's `loss_agg_mode`s
(`trainer/ppo/core_algos.py: agg_loss`) and Dr.GRPO's constant normalizer
(arXiv 2503.20783).

With rollout normalization (`rl/segments.py`: a rollout cut into several rows, its
segments) the sequences counted are rollouts: `loss_norm(..., rollout_tokens=n_r)` takes
each row's rollout's action-token count n_r, counts row b as n_b / n_r of a sequence (a
rollout's rows add up to one), and "seq-mean-token-mean" divides a row by n_r instead of
n_b, so every mode gives a segmented rollout the weight of one row with its tokens.

`masked_mean` / `masked_extreme` are the metrics' reductions over a mask (0 / `empty`
when it is all zero).
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from agentjax.config.choices import AGGREGATIONS
from agentjax.rl import _common
from agentjax.rl._common import as_float


class LossNorm(NamedTuple):
    """Global denominators of `aggregate`, computed once for the whole batch.

    A pytree of scalars: pass it through jit / shard_map like any other array argument.
    """

    num_tokens: jax.Array  # action tokens in the full batch (>= 1)
    num_seqs: jax.Array  # sequences with at least one action token in the full batch (>= 1)
    constant: jax.Array  # Dr.GRPO length constant of seq-mean-token-sum-norm
    # [B] action tokens of each row's rollout (rollout normalization), for the rows being
    # aggregated (`for_rows` rebinds it to a micro-batch's); None: each row is a sequence.
    rollout_tokens: jax.Array | None = None


def loss_norm(mask, *, constant=None, rollout_tokens=None) -> LossNorm:
    """Global denominators for `aggregate` from the mask of the *full* batch.

    Args:
      mask: [B, T] action mask of the whole batch (all micro-batches, all data shards; under
        jit a sharded mask gives global counts).
      constant: the Dr.GRPO constant of "seq-mean-token-sum-norm" (e.g. the maximum
        response length); defaults to T.
      rollout_tokens: [B] action tokens (of `mask`) of each row's rollout
        (`segments.rollout_tokens`); the sequence count is then sum_b n_b / n_r (module
        docstring). None: every row is its own sequence.

    Returns:
      LossNorm with counts clamped to >= 1, so an all-masked batch aggregates to 0.
    """
    _common.check_rank("mask", mask, 2)
    if constant is None:
        constant = mask.shape[1]
    _common.check_range("constant", constant, low=0.0, low_open=True)
    per_seq = mask.astype(bool).sum(axis=1)
    if rollout_tokens is None:
        num_seqs = (per_seq > 0).sum().astype(jnp.float32)
    else:
        _common.check_rank("rollout_tokens", rollout_tokens, 1)
        num_seqs = (per_seq / jnp.maximum(rollout_tokens, 1.0)).sum().astype(jnp.float32)
    return LossNorm(
        num_tokens=jnp.maximum(per_seq.sum(), 1).astype(jnp.float32),
        num_seqs=jnp.maximum(num_seqs, 1.0),
        constant=jnp.asarray(constant, jnp.float32),
        rollout_tokens=rollout_tokens,
    )


def for_rows(norm, batch: dict):
    """`norm` for the rows of `batch` (a micro-batch of the batch `norm` was built from):
    its rollout_tokens rebound to theirs. Any other norm (DPO's pair count) is returned
    as it is."""
    if isinstance(norm, LossNorm) and norm.rollout_tokens is not None:
        return norm._replace(rollout_tokens=batch["rollout_tokens"])
    return norm


def aggregate(x, mask, mode, *, norm=None):
    """Reduce per-token values to a scalar loss over the action tokens.

    Modes (B_g, N_g: sequences with >= 1 action token / action tokens in the full batch,
    n_b: action tokens of row b, C: norm.constant):
      token-mean:              sum_b sum_t m x / N_g
      seq-mean-token-mean:     sum_b (sum_t m x / n_b) / B_g      (rows with n_b = 0 add 0)
      seq-mean-token-sum:      sum_b sum_t m x / B_g
      seq-mean-token-sum-norm: sum_b sum_t m x / (B_g * C)        (Dr.GRPO)
    Each is linear in x with fixed denominators, so the sum over micro-batches (split along
    B, each given the full batch's `norm`) equals the full-batch value and gradient.

    Args:
      x: [B, T] float per-token values (may hold anything, even NaN, at mask-0 positions).
      mask: [B, T] action mask (non-zero = action token).
      mode: one of AGGREGATIONS.
      norm: LossNorm of the full batch; None computes it from `mask` (full batch here).

    Returns:
      float32 scalar.
    """
    _common.check_choice("mode", mode, AGGREGATIONS)
    _common.check_tokens(x=x, mask=mask)
    if norm is None:
        norm = loss_norm(mask)
    (x,) = as_float(x)
    valid = mask.astype(bool)
    row_sum = jnp.where(valid, x, 0.0).sum(axis=1)
    if mode == "token-mean":
        return row_sum.sum() / norm.num_tokens
    if mode == "seq-mean-token-mean":
        counts = valid.sum(axis=1) if norm.rollout_tokens is None else norm.rollout_tokens
        _common.check_same_shape(row_sum=row_sum, rollout_tokens=counts)
        row_count = jnp.maximum(counts, 1).astype(x.dtype)
        return (row_sum / row_count).sum() / norm.num_seqs
    if mode == "seq-mean-token-sum":
        return row_sum.sum() / norm.num_seqs
    return row_sum.sum() / (norm.num_seqs * norm.constant)


def masked_mean(x, mask):
    """Mean of `x` over the positions where `mask` is non-zero; 0 when there are none.

    Args:
      x: array of values (anything, even NaN, at mask-0 positions).
      mask: array of x's shape, bool or numeric (non-zero = counted).

    Returns:
      float scalar (float32 unless x is float64).
    """
    valid = mask.astype(bool)
    return jnp.where(valid, x, 0.0).sum() / jnp.maximum(valid.sum(), 1)


def masked_extreme(x, valid, reduce, empty):
    """`reduce` (jnp.max or jnp.min) of `x` where `valid`; `empty` when nothing is valid."""
    fill = -jnp.inf if reduce is jnp.max else jnp.inf
    return jnp.where(valid.any(), reduce(jnp.where(valid, x, fill)), empty)
