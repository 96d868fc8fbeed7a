"""The RL objective: its value / KL / entropy terms and `rl_objective`, their sum.

Conventions (all functions):
- Per-token arrays are [B, T] with a `mask` that is 1 on action tokens. Positions with
  mask 0 contribute exactly nothing to the loss value and receive exactly zero gradient,
  whatever is stored there.
- `ref_logp`, `returns`, `old_values` (and the policy term's `old_logp`, `advantages`)
  are constants of the update: they are wrapped in `stop_gradient`.
- Scalars are reduced by `aggregation.aggregate` with the global denominators of a
  `LossNorm` (`norm`; None means "this call sees the full batch"), so micro-batch losses
  and gradients add up to the full batch's.
- Every loss returns `(loss, metrics)`; metrics are scalars over this call's action tokens
  only (means over its own tokens, not over the global batch), for logging.

`rl_objective` composes the policy objective the trainer optimizes,
  policy_loss(...) + kl_coef * kl_penalty(...) - entropy_coef * entropy_bonus(...),
from arrays and the algorithm's knobs (`policy_losses.policy_loss` is the first term);
`grpo_loss` is its GRPO preset; `value_loss` is the PPO critic's loss.
"""
from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from agentjax.config.choices import AGGREGATIONS
from agentjax.rl import _common
from agentjax.rl import kl as kl_lib
from agentjax.rl._common import as_float
from agentjax.rl.aggregation import aggregate, masked_extreme, masked_mean
from agentjax.rl.policy_losses import policy_loss, token_advantages


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
    agg="token-mean",
    kl_coef=0.0,
    kl_kind="k3",
    kl_in_reward=False,
    entropy_coef=0.0,
    norm=None,
    **params,
):
    """The policy objective the trainer optimizes, from arrays and the algorithm's knobs.

    The knobs are static Python values (they choose the terms at trace time).

    L = policy_loss(logp, old_logp, A * w)              (kind and its params, agg)
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
      kind: the policy-loss kind, see `policy_loss`.
      agg: aggregation mode of every term, one of AGGREGATIONS.
      kl_coef: weight of the KL term (>= 0).
      kl_kind: KL estimator, one of agentjax.config.choices.KL_KINDS.
      kl_in_reward: True when the KL penalty is in the rewards instead of the loss.
      entropy_coef: weight of the entropy bonus (>= 0).
      norm: LossNorm of the full batch (see `aggregation.loss_norm`); None = this is the
        full batch.
      **params: the kind's hyperparameters (e.g. clip_low, clip_high, dual_clip), passed
        to `policy_loss`.

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
        advantages = token_advantages(advantages, mask) * is_weights

    loss, metrics = policy_loss(
        logp, old_logp, advantages, mask, kind=kind, agg=agg, norm=norm, **params)
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
