"""Masked policy / value / KL / entropy losses and their aggregation over a batch.

Conventions (all functions):
- Per-token arrays are [B, T] with a `mask` that is 1 on action tokens. Positions with
  mask 0 contribute exactly nothing to the loss value and receive exactly zero gradient,
  whatever is stored there (the log-ratio is masked *inside* the exponent, so a garbage
  log-prob at an observation token can never reach exp()).
- `old_logp`, `ref_logp`, `advantages`, `returns`, `old_values` are constants of the
  update: they are wrapped in `stop_gradient`.
- Scalars are reduced by `aggregate` with global denominators carried by a `LossNorm`.
  Build it once from the whole batch with `loss_norm(full_mask)` and pass it to every
  micro-batch: the micro-batch losses (and gradients) then sum exactly to the full-batch
  loss (and gradient). `norm=None` means "this call sees the full batch".
- Every loss returns `(loss, metrics)`; metrics are scalars over this call's action tokens
  only (means over its own tokens, not over the global batch), for logging.

`rl_objective` composes the policy objective the trainer optimizes,
  policy_loss(...) + kl_coef * kl_penalty(...) - entropy_coef * entropy_bonus(...),
from arrays and the algorithm's knobs; `grpo_loss` is its GRPO preset.

Over 450 lines because every term of `rl_objective` (the policy-loss kinds, value
loss, KL penalty, entropy bonus) follows the masking and global-denominator conventions
above, written and enforced once here; the file is the loss reference the float64
tests mirror.
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from agentjax.config.choices import AGGREGATIONS, POLICY_LOSSES
from agentjax.rl import _common
from agentjax.rl import kl as kl_lib
from agentjax.rl._common import as_float

# exp() of the per-token log-ratio is taken after clamping to this range (verl).
LOG_RATIO_CLAMP = 20.0
# Upper clamp of GSPO's log sequence ratio (verl).
GSPO_LOG_RATIO_MAX = 10.0


class LossNorm(NamedTuple):
    """Global denominators of `aggregate`, computed once for the whole batch.

    A pytree of scalars: pass it through jit / shard_map like any other array argument.
    """

    num_tokens: jax.Array  # action tokens in the full batch (>= 1)
    num_seqs: jax.Array  # sequences with at least one action token in the full batch (>= 1)
    constant: jax.Array  # Dr.GRPO length constant of seq-mean-token-sum-norm


def loss_norm(mask, *, constant=None) -> LossNorm:
    """Global denominators for `aggregate` from the mask of the *full* batch.

    Args:
      mask: [B, T] action mask of the whole batch (all micro-batches, all data shards; under
        jit a sharded mask gives global counts).
      constant: the Dr.GRPO constant of "seq-mean-token-sum-norm" (e.g. the maximum
        response length); defaults to T.

    Returns:
      LossNorm with counts clamped to >= 1, so an all-masked batch aggregates to 0.
    """
    _common.check_rank("mask", mask, 2)
    if constant is None:
        constant = mask.shape[1]
    _common.check_range("constant", constant, low=0.0, low_open=True)
    per_seq = mask.astype(bool).sum(axis=1)
    return LossNorm(
        num_tokens=jnp.maximum(per_seq.sum(), 1).astype(jnp.float32),
        num_seqs=jnp.maximum((per_seq > 0).sum(), 1).astype(jnp.float32),
        constant=jnp.asarray(constant, jnp.float32),
    )


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
        row_count = jnp.maximum(valid.sum(axis=1), 1).astype(x.dtype)
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


def _ppo(logp, log_ratio, advantages, valid, *, clip_low, clip_high, dual_clip):
    """PPO clip with asymmetric (clip-higher) bounds and optional dual clip for A < 0."""
    del logp
    ratio = jnp.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high)
    loss = jnp.maximum(unclipped, clipped)
    clip_active = clipped > unclipped
    metrics = {
        "clipfrac": masked_mean(clip_active, valid),
        "clipfrac_high": masked_mean(clip_active & (advantages > 0), valid),
        "clipfrac_low": masked_mean(clip_active & (advantages < 0), valid),
    }
    if dual_clip is not None:
        dual_bound = -advantages * dual_clip
        negative = advantages < 0
        metrics["clipfrac_dual"] = masked_mean(negative & (loss > dual_bound), valid)
        loss = jnp.where(negative, jnp.minimum(loss, dual_bound), loss)
    return loss, metrics


def _gspo(logp, log_ratio, advantages, valid, *, clip_low, clip_high, dual_clip):
    """GSPO: sequence ratio exp(mean_t log-ratio) as value, per-token gradient (GSPO-token)."""
    del dual_clip
    count = jnp.maximum(valid.sum(axis=1, keepdims=True), 1)
    seq_log_ratio = log_ratio.sum(axis=1, keepdims=True) / count
    token_log_ratio = logp - lax.stop_gradient(logp) + lax.stop_gradient(seq_log_ratio)
    ratio = jnp.exp(jnp.minimum(token_log_ratio, GSPO_LOG_RATIO_MAX))
    unclipped = -advantages * ratio
    clipped = -advantages * jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high)
    clip_active = clipped > unclipped
    metrics = {
        "clipfrac": masked_mean(clip_active, valid),
        "clipfrac_high": masked_mean(clip_active & (advantages > 0), valid),
        "clipfrac_low": masked_mean(clip_active & (advantages < 0), valid),
        "seq_ratio_mean": masked_mean(ratio, valid),
    }
    return jnp.maximum(unclipped, clipped), metrics


def _cispo(logp, log_ratio, advantages, valid, *, clip_low, clip_high, dual_clip):
    """CISPO: -sg(clip(ratio, 1 - clip_low, 1 + clip_high)) * A * logp; no token is dropped."""
    del dual_clip
    ratio = jnp.exp(log_ratio)
    weight = lax.stop_gradient(jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high))
    metrics = {
        "clipfrac_high": masked_mean(ratio > 1.0 + clip_high, valid),
        "clipfrac_low": masked_mean(ratio < 1.0 - clip_low, valid),
    }
    return -weight * advantages * logp, metrics


def _reinforce(logp, log_ratio, advantages, valid, *, clip_low, clip_high, dual_clip):
    """On-policy REINFORCE / GPG: -A * logp."""
    del log_ratio, valid, clip_low, clip_high, dual_clip
    return -advantages * logp, {}


_POLICY_LOSS_FNS = {"ppo": _ppo, "gspo": _gspo, "cispo": _cispo, "reinforce": _reinforce}


def _token_advantages(advantages, mask):
    _common.check_rank("advantages", advantages, {1, 2})
    if advantages.ndim == 1:
        if advantages.shape[0] != mask.shape[0]:
            raise ValueError(
                f"advantages has {advantages.shape[0]} rows but mask has {mask.shape[0]}"
            )
        advantages = jnp.broadcast_to(advantages[:, None], mask.shape)
    _common.check_same_shape(mask=mask, advantages=advantages)
    return advantages


def policy_loss(
    logp,
    old_logp,
    advantages,
    mask,
    *,
    kind="ppo",
    clip_low=0.2,
    clip_high=0.2,
    dual_clip=None,
    agg="token-mean",
    norm=None,
):
    """Policy-gradient loss on action tokens, aggregated with global denominators.

    The per-token log-ratio logp - old_logp is set to 0 at mask-0 positions before the
    exponent and clamped to [-20, 20], so ratio = 1 there and no clip decision or metric
    ever sees an observation token.

    Kinds:
      ppo:       max(-A r, -A clip(r, 1 - clip_low, 1 + clip_high)); with dual_clip=c,
                 tokens with A < 0 use min(that, -A c) (dual-clip PPO). DAPO's
                 clip-higher is clip_high > clip_low (e.g. 0.2 / 0.28).
      gspo:      the PPO clip on the sequence ratio s = exp(mean_t log r) (value) with the
                 per-token gradient of GSPO-token; use agg="seq-mean-token-mean" and
                 small clips (3e-4 / 4e-4) as in the paper.
      cispo:     -sg(clip(r, 1 - clip_low, 1 + clip_high)) A logp (MiniMax-M1); every token
                 keeps its gradient; pass a large clip_low to leave the lower side open.
      reinforce: -A logp (on-policy REINFORCE / GPG); old_logp only feeds metrics.

    Args:
      logp: [B, T] float log-probs of the taken tokens under the current policy.
      old_logp: [B, T] float log-probs under the behaviour policy that sampled them.
      advantages: [B, T] per-token or [B] per-sequence advantages.
      mask: [B, T] action mask (non-zero = action token).
      kind: one of POLICY_LOSSES.
      clip_low: lower clip epsilon (ratio >= 1 - clip_low), >= 0.
      clip_high: upper clip epsilon (ratio <= 1 + clip_high), >= 0.
      dual_clip: None, or the dual-clip bound c > 1 (typically 3.0); only for kind="ppo".
      agg: aggregation mode, one of AGGREGATIONS.
      norm: LossNorm of the full batch (see `loss_norm`); None = this is the full batch.

    Returns:
      (loss, metrics): float32 scalar and a dict of scalars over this call's action tokens:
      approx_kl (k1 estimate of KL(old || new)), approx_kl_k3, ratio_mean / ratio_min /
      ratio_max, advantage_mean, num_tokens, and per kind the clip fractions (clipfrac,
      clipfrac_low, clipfrac_high, clipfrac_dual; for cispo the fractions of clipped IS
      weights; for gspo also seq_ratio_mean).
    """
    _common.check_choice("kind", kind, POLICY_LOSSES)
    _common.check_choice("agg", agg, AGGREGATIONS)
    _common.check_tokens(logp=logp, old_logp=old_logp, mask=mask)
    advantages = _token_advantages(advantages, mask)
    _common.check_range("clip_low", clip_low, low=0.0)
    _common.check_range("clip_high", clip_high, low=0.0)
    if dual_clip is not None:
        if kind != "ppo":
            raise ValueError(f"dual_clip is only defined for kind='ppo', got kind={kind!r}")
        _common.check_range("dual_clip", dual_clip, low=1.0, low_open=True)

    logp, old_logp, advantages = as_float(logp, old_logp, advantages)
    valid = mask.astype(bool)
    logp = jnp.where(valid, logp, 0.0)
    old_logp = lax.stop_gradient(jnp.where(valid, old_logp, 0.0))
    advantages = lax.stop_gradient(jnp.where(valid, advantages, 0.0))
    log_ratio = jnp.clip(logp - old_logp, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)

    token_loss, kind_metrics = _POLICY_LOSS_FNS[kind](
        logp, log_ratio, advantages, valid,
        clip_low=clip_low, clip_high=clip_high, dual_clip=dual_clip,
    )
    loss = aggregate(token_loss, mask, agg, norm=norm)

    ratio = jnp.exp(log_ratio)
    metrics = {
        "approx_kl": masked_mean(-log_ratio, valid),
        "approx_kl_k3": masked_mean(ratio - 1.0 - log_ratio, valid),
        "ratio_mean": masked_mean(ratio, valid),
        "ratio_min": masked_extreme(ratio, valid, jnp.min, 1.0),
        "ratio_max": masked_extreme(ratio, valid, jnp.max, 1.0),
        "advantage_mean": masked_mean(advantages, valid),
        "num_tokens": valid.sum().astype(jnp.float32),
        **kind_metrics,
    }
    return loss, lax.stop_gradient(metrics)


def value_loss(values, old_values, returns, mask, *, clip=None, agg="token-mean", norm=None):
    """Clipped critic loss 0.5 * max((V - R)^2, (V_clip - R)^2) on action tokens.

    V_clip = old_values + clip(values - old_values, -clip, clip) (PPO value clipping);
    without `clip` the loss is 0.5 * (V - R)^2.

    Args:
      values: [B, T] float current critic predictions.
      old_values: [B, T] float predictions at rollout time (used only when clip is set).
      returns: [B, T] float targets (e.g. from `gae`).
      mask: [B, T] action mask.
      clip: None or the value clip range (> 0).
      agg: aggregation mode, one of AGGREGATIONS.
      norm: LossNorm of the full batch; None = this is the full batch.

    Returns:
      (loss, metrics) with metrics value_mean, return_mean, value_mse, explained_variance
      (1 - Var[R - V] / Var[R] over action tokens, 0 when Var[R] = 0) and, with clip,
      value_clipfrac.
    """
    _common.check_choice("agg", agg, AGGREGATIONS)
    _common.check_tokens(values=values, old_values=old_values, returns=returns, mask=mask)
    if clip is not None:
        _common.check_range("clip", clip, low=0.0, low_open=True)
    values, old_values, returns = as_float(values, old_values, returns)
    valid = mask.astype(bool)
    values = jnp.where(valid, values, 0.0)
    old_values = lax.stop_gradient(jnp.where(valid, old_values, 0.0))
    returns = lax.stop_gradient(jnp.where(valid, returns, 0.0))

    sq_err = jnp.square(values - returns)
    metrics = {}
    if clip is not None:
        clipped_values = old_values + jnp.clip(values - old_values, -clip, clip)
        clipped_sq_err = jnp.square(clipped_values - returns)
        metrics["value_clipfrac"] = masked_mean(clipped_sq_err > sq_err, valid)
        sq_err = jnp.maximum(sq_err, clipped_sq_err)
    loss = 0.5 * aggregate(sq_err, mask, agg, norm=norm)

    def masked_var(x):
        return masked_mean(jnp.square(x - masked_mean(x, valid)), valid)

    return_var = masked_var(returns)
    explained = 1.0 - masked_var(returns - values) / jnp.where(return_var > 0, return_var, 1.0)
    metrics.update(
        value_mean=masked_mean(values, valid),
        return_mean=masked_mean(returns, valid),
        value_mse=masked_mean(jnp.square(values - returns), valid),
        explained_variance=jnp.where(return_var > 0, explained, 0.0),
    )
    return loss, lax.stop_gradient(metrics)


def kl_penalty(logp, ref_logp, mask, *, kind="k3", agg="token-mean", norm=None):
    """Per-token KL to the reference policy on action tokens, as a loss term to add.

    Args:
      logp: [B, T] float log-probs of the taken tokens under the current policy.
      ref_logp: [B, T] float log-probs under the frozen reference policy (constant).
      mask: [B, T] action mask; KL never reaches observation tokens.
      kind: KL estimator, one of agentjax.config.choices.KL_KINDS (k3 as in GRPO).
      agg: aggregation mode, one of AGGREGATIONS.
      norm: LossNorm of the full batch; None = this is the full batch.

    Returns:
      (kl_loss, metrics) with metrics kl (mean estimate over this call's action tokens) and
      kl_max. Add `kl_coef * kl_loss` to the objective.
    """
    _common.check_tokens(logp=logp, ref_logp=ref_logp, mask=mask)
    valid = mask.astype(bool)
    logp = jnp.where(valid, logp, 0.0)
    ref_logp = lax.stop_gradient(jnp.where(valid, ref_logp, 0.0))
    per_token = kl_lib.kl(logp, ref_logp, kind)
    metrics = {
        "kl": masked_mean(per_token, valid),
        "kl_max": masked_extreme(per_token, valid, jnp.max, 0.0),
    }
    return aggregate(per_token, mask, agg, norm=norm), lax.stop_gradient(metrics)


def entropy_bonus(entropy, mask, *, agg="token-mean", norm=None):
    """Aggregated policy entropy on action tokens, as a bonus to subtract from the loss.

    Args:
      entropy: [B, T] float per-token entropy (e.g. from `token_logprobs`), differentiable.
      mask: [B, T] action mask.
      agg: aggregation mode, one of AGGREGATIONS.
      norm: LossNorm of the full batch; None = this is the full batch.

    Returns:
      (entropy_value, metrics) with metric entropy (mean over this call's action tokens).
      Use `loss - entropy_coef * entropy_value`.
    """
    _common.check_tokens(entropy=entropy, mask=mask)
    valid = mask.astype(bool)
    metrics = {"entropy": masked_mean(entropy, valid)}
    return aggregate(entropy, mask, agg, norm=norm), lax.stop_gradient(metrics)


def rl_objective(
    logp,
    old_logp,
    advantages,
    mask,
    *,
    ref_logp=None,
    entropy=None,
    is_weights=None,
    kind="ppo",
    clip_low=0.2,
    clip_high=0.2,
    dual_clip=None,
    agg="token-mean",
    kl_coef=0.0,
    kl_kind="k3",
    kl_in_reward=False,
    entropy_coef=0.0,
    norm=None,
):
    """The policy objective the trainer optimizes, from arrays and the algorithm's knobs.

    The knobs are static Python values (they choose the terms at trace time).

    L = policy_loss(logp, old_logp, A * w)              (kind, clips, dual clip, agg)
        + kl_coef * kl_penalty(logp, ref_logp)          unless kl_coef = 0 or kl_in_reward
        - entropy_coef * entropy_bonus(entropy)         unless entropy_coef = 0
    with one aggregation `agg` and one `norm` for every term, so micro-batch losses add up
    to the full-batch loss. w are the importance-sampling weights of the policy-gradient
    term (1 when `is_weights` is None): with `old_logp` the proximal policy's log-probs and
    w = `offpolicy.importance_weights(old_logp, behavior_logp)` this is the decoupled PPO
    objective of asynchronous RL (agentjax/rl/offpolicy.py). With kl_in_reward the KL
    already shaped the rewards (and so the advantages) and is not a loss term; `ref_logp`
    is then not read.

    Args:
      logp: [B, T] float log-probs of the taken tokens under the current policy.
      old_logp: [B, T] float log-probs under the policy the ratio is taken against.
      advantages: [B, T] per-token or [B] per-sequence advantages.
      mask: [B, T] action mask (non-zero = token in the loss).
      ref_logp: [B, T] reference-policy log-probs; required when the KL is a loss term.
      entropy: [B, T] per-token policy entropy, or None. When given, its mean is reported
        (metric entropy) even with entropy_coef = 0; required when entropy_coef > 0.
      is_weights: [B, T] importance weights multiplying the advantages, or None.
      kind, clip_low, clip_high, dual_clip: the policy loss, see `policy_loss`.
      agg: aggregation mode of every term, one of AGGREGATIONS.
      kl_coef: weight of the KL term (>= 0).
      kl_kind: KL estimator, one of agentjax.config.choices.KL_KINDS.
      kl_in_reward: True when the KL penalty is in the rewards instead of the loss.
      entropy_coef: weight of the entropy bonus (>= 0).
      norm: LossNorm of the full batch (see `loss_norm`); None = this is the full batch.

    Returns:
      (loss, metrics): float32 scalar and the `policy_loss` metrics plus pg_loss (the
      policy-gradient term), with the KL term kl, kl_max and kl_loss (the unweighted KL
      term), with `entropy` the entropy metric.
    """
    _common.check_choice("kl_kind", kl_kind, kl_lib.KL_KINDS)
    _common.check_range("kl_coef", kl_coef, low=0.0)
    _common.check_range("entropy_coef", entropy_coef, low=0.0)
    kl_as_loss = kl_coef > 0 and not kl_in_reward
    if kl_as_loss and ref_logp is None:
        raise ValueError("ref_logp is required when the KL is a loss term "
                         f"(kl_coef={kl_coef}, kl_in_reward={kl_in_reward})")
    if entropy_coef and entropy is None:
        raise ValueError(f"entropy is required with entropy_coef={entropy_coef}")
    if is_weights is not None:
        _common.check_tokens(mask=mask, is_weights=is_weights)
        advantages = _token_advantages(advantages, mask) * is_weights

    loss, metrics = policy_loss(
        logp, old_logp, advantages, mask, kind=kind, clip_low=clip_low, clip_high=clip_high,
        dual_clip=dual_clip, agg=agg, norm=norm)
    metrics["pg_loss"] = loss
    if kl_as_loss:
        kl_term, kl_metrics = kl_penalty(logp, ref_logp, mask, kind=kl_kind, agg=agg, norm=norm)
        loss = loss + kl_coef * kl_term
        metrics.update(kl_metrics, kl_loss=kl_term)
    if entropy is not None:
        entropy_term, entropy_metrics = entropy_bonus(entropy, mask, agg=agg, norm=norm)
        metrics.update(entropy_metrics)
        if entropy_coef:
            loss = loss - entropy_coef * entropy_term
    return loss, lax.stop_gradient(metrics)


def grpo_loss(
    logp,
    old_logp,
    ref_logp,
    advantages,
    mask,
    *,
    clip_low=0.2,
    clip_high=0.2,
    dual_clip=None,
    kl_coef=0.001,
    kl_kind="k3",
    agg="seq-mean-token-mean",
    norm=None,
):
    """GRPO's objective (DeepSeekMath, arXiv 2402.03300): `rl_objective` with the PPO clip
    and the KL to the reference policy as a loss term, no entropy bonus.

    L = -(1/G) sum_i (1/|m_i|) sum_t m_it [min(r A_i, clip(r) A_i) - beta KL_it]
    with the inside-ratio mask and the per-token k3 KL on action tokens only. With
    agg="seq-mean-token-mean" (default) this is exactly the paper's formula; DAPO
    (arXiv 2503.14476) uses "token-mean" and clip_high=0.28.

    Args:
      logp: [B, T] float log-probs of the taken tokens under the current policy.
      old_logp: [B, T] float log-probs under the behaviour policy.
      ref_logp: [B, T] float log-probs under the reference policy.
      advantages: [B] per-sequence (e.g. from `grpo`) or [B, T] per-token advantages,
        computed on the full batch before any micro-batching.
      mask: [B, T] action mask.
      clip_low: lower clip epsilon.
      clip_high: upper clip epsilon.
      dual_clip: None or the dual-clip bound c > 1.
      kl_coef: beta, weight of the KL term (Search-R1 / R1-Zero use 0.001; 0 disables).
      kl_kind: KL estimator, one of agentjax.config.choices.KL_KINDS.
      agg: aggregation mode for both terms.
      norm: LossNorm of the full batch; None = this is the full batch.

    Returns:
      (loss, metrics): the policy_loss metrics plus pg_loss and, unless kl_coef = 0, kl,
      kl_max and kl_loss.
    """
    return rl_objective(
        logp, old_logp, advantages, mask, ref_logp=ref_logp, kind="ppo", clip_low=clip_low,
        clip_high=clip_high, dual_clip=dual_clip, agg=agg, kl_coef=kl_coef, kl_kind=kl_kind,
        norm=norm)
