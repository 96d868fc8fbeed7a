"""The policy-gradient term of the RL objective: `policy_loss` and its kinds.

The per-token log-ratio logp - old_logp is masked (0 at mask-0 positions, so ratio = 1
there) and clamped before the exponent; the advantages and old log-probs are constants
of the update (`stop_gradient`); the per-token loss of the kind is reduced by
`aggregation.aggregate` with the full batch's denominators (`norm`).

Each kind is registered in `POLICY_LOSSES` as a frozen dataclass (`PolicyLossKind`):
its fields are its hyperparameters with their defaults, checked in `__post_init__`, and
`token_loss` is its per-token loss. A field `x` is the config key `algo.x`:
`objectives.rl_loss` reads the configured kind's fields from the algo section and passes
them, by name, through `losses.rl_objective` and `policy_loss` to the kind. A name
shared by kinds is one knob (clip_low, clip_high). The kinds:
  ppo:       PPO's clip (Schulman et al. 2017, arXiv 1707.06347) with asymmetric bounds
             (DAPO's clip-higher, arXiv 2503.14476) and the dual clip of Ye et al. 2020
             ("Mastering Complex Control in MOBA Games with Deep RL");
  gspo:      GSPO's sequence ratio (Zheng et al. 2025, "Group Sequence Policy
             Optimization"), GSPO-token gradient;
  cispo:     CISPO's clipped, stop-gradient IS weight on every token (MiniMax-M1, 2025);
  reinforce: on-policy REINFORCE / GPG, -A logp.
"""
from __future__ import annotations

import dataclasses

import jax.numpy as jnp
from jax import lax

from agentjax.config.choices import AGGREGATIONS
from agentjax.core.registry import Registry
from agentjax.rl import _common
from agentjax.rl._common import as_float
from agentjax.rl.aggregation import aggregate, masked_extreme, masked_mean

# exp() of the per-token log-ratio is taken after clamping to this range (verl).
LOG_RATIO_CLAMP = 20.0
# Upper clamp of GSPO's log sequence ratio (verl).
GSPO_LOG_RATIO_MAX = 10.0


@dataclasses.dataclass(frozen=True)
class PolicyLossKind:
    """A policy-loss kind: its dataclass fields are its hyperparameters (config keys
    `algo.<field>`), checked in `__post_init__`."""

    def token_loss(self, logp, log_ratio, advantages, valid):
        """(per-token loss [B, T], metrics) of the current log-probs `logp`, the clamped
        log-ratio to the old policy and the advantages, all 0 where `valid` is False (the
        action mask as bool); metrics are scalars over the valid tokens."""
        raise NotImplementedError


POLICY_LOSSES: Registry[type[PolicyLossKind]] = Registry("policy loss kind")


def policy_loss_hyperparameters(kind: str) -> tuple[str, ...]:
    """The names of policy-loss kind `kind`'s hyperparameters (its fields)."""
    return tuple(field.name for field in dataclasses.fields(POLICY_LOSSES.get(kind)))


def policy_loss_kind(kind: str, **params) -> PolicyLossKind:
    """The registered kind `kind` with hyperparameters `params` (the others at their
    defaults); a name that is not one of its hyperparameters raises naming it."""
    names = policy_loss_hyperparameters(kind)
    unknown = sorted(set(params) - set(names))
    if unknown:
        raise ValueError(f"policy loss kind {kind!r} has no hyperparameter "
                         f"{', '.join(unknown)}; its hyperparameters: {names}")
    return POLICY_LOSSES.get(kind)(**params)


def _is_set(value) -> bool:
    """An optional bound is off when None or 0 (the config's "0 disables")."""
    return value is not None and not (isinstance(value, (int, float)) and value == 0)


def _clip_fractions(unclipped, clipped, advantages, valid):
    clip_active = clipped > unclipped
    return {
        "clipfrac": masked_mean(clip_active, valid),
        "clipfrac_high": masked_mean(clip_active & (advantages > 0), valid),
        "clipfrac_low": masked_mean(clip_active & (advantages < 0), valid),
    }


@dataclasses.dataclass(frozen=True)
class _Clipped(PolicyLossKind):
    """The ratio is clipped to [1 - clip_low, 1 + clip_high]."""

    clip_low: float = 0.2
    clip_high: float = 0.2

    def __post_init__(self):
        _common.check_range("clip_low", self.clip_low, low=0.0)
        _common.check_range("clip_high", self.clip_high, low=0.0)


@POLICY_LOSSES.register("ppo")
@dataclasses.dataclass(frozen=True)
class PPO(_Clipped):
    """max(-A r, -A clip(r, 1 - clip_low, 1 + clip_high)); with dual_clip = c, tokens with
    A < 0 use min(that, -A c). DAPO's clip-higher is clip_high > clip_low (0.2 / 0.28)."""

    dual_clip: float | None = None  # None or 0: off; else the bound c > 1 (typically 3)

    def __post_init__(self):
        super().__post_init__()
        if _is_set(self.dual_clip):
            _common.check_range("dual_clip", self.dual_clip, low=1.0, low_open=True)

    def token_loss(self, logp, log_ratio, advantages, valid):
        ratio = jnp.exp(log_ratio)
        unclipped = -advantages * ratio
        clipped = -advantages * jnp.clip(ratio, 1.0 - self.clip_low, 1.0 + self.clip_high)
        loss = jnp.maximum(unclipped, clipped)
        metrics = _clip_fractions(unclipped, clipped, advantages, valid)
        if _is_set(self.dual_clip):
            dual_bound = -advantages * self.dual_clip
            negative = advantages < 0
            metrics["clipfrac_dual"] = masked_mean(negative & (loss > dual_bound), valid)
            loss = jnp.where(negative, jnp.minimum(loss, dual_bound), loss)
        return loss, metrics


@POLICY_LOSSES.register("gspo")
@dataclasses.dataclass(frozen=True)
class GSPO(_Clipped):
    """The PPO clip on the sequence ratio s = exp(mean_t log r) as value, with the
    per-token gradient of GSPO-token; the paper uses agg="seq-mean-token-mean" and clips
    3e-4 / 4e-4."""

    def token_loss(self, logp, log_ratio, advantages, valid):
        count = jnp.maximum(valid.sum(axis=1, keepdims=True), 1)
        seq_log_ratio = log_ratio.sum(axis=1, keepdims=True) / count
        token_log_ratio = logp - lax.stop_gradient(logp) + lax.stop_gradient(seq_log_ratio)
        ratio = jnp.exp(jnp.minimum(token_log_ratio, GSPO_LOG_RATIO_MAX))
        unclipped = -advantages * ratio
        clipped = -advantages * jnp.clip(ratio, 1.0 - self.clip_low, 1.0 + self.clip_high)
        metrics = {**_clip_fractions(unclipped, clipped, advantages, valid),
                   "seq_ratio_mean": masked_mean(ratio, valid)}
        return jnp.maximum(unclipped, clipped), metrics


@POLICY_LOSSES.register("cispo")
@dataclasses.dataclass(frozen=True)
class CISPO(_Clipped):
    """-sg(clip(r, 1 - clip_low, 1 + clip_high)) A logp: every token keeps its gradient;
    a large clip_low leaves the lower side open."""

    def token_loss(self, logp, log_ratio, advantages, valid):
        ratio = jnp.exp(log_ratio)
        weight = lax.stop_gradient(jnp.clip(ratio, 1.0 - self.clip_low, 1.0 + self.clip_high))
        metrics = {
            "clipfrac_high": masked_mean(ratio > 1.0 + self.clip_high, valid),
            "clipfrac_low": masked_mean(ratio < 1.0 - self.clip_low, valid),
        }
        return -weight * advantages * logp, metrics


@POLICY_LOSSES.register("reinforce")
@dataclasses.dataclass(frozen=True)
class Reinforce(PolicyLossKind):
    """On-policy REINFORCE / GPG: -A logp; the old log-probs only feed the metrics."""

    def token_loss(self, logp, log_ratio, advantages, valid):
        return -advantages * logp, {}


def token_advantages(advantages, mask):
    """[B, T] advantages from [B, T] or per-sequence [B] ones (broadcast over T)."""
    _common.check_rank("advantages", advantages, {1, 2})
    if advantages.ndim == 1:
        if advantages.shape[0] != mask.shape[0]:
            raise ValueError(
                f"advantages has {advantages.shape[0]} rows but mask has {mask.shape[0]}"
            )
        advantages = jnp.broadcast_to(advantages[:, None], mask.shape)
    _common.check_same_shape(mask=mask, advantages=advantages)
    return advantages


def policy_loss(logp, old_logp, advantages, mask, *, kind="ppo", agg="token-mean", norm=None,
                **params):
    """Policy-gradient loss on action tokens, aggregated with global denominators.

    The per-token log-ratio logp - old_logp is set to 0 at mask-0 positions before the
    exponent and clamped to [-20, 20], so ratio = 1 there and no clip decision or metric
    ever sees an observation token. The per-token loss is the kind's (`POLICY_LOSSES`):
      ppo:       max(-A r, -A clip(r, 1 - clip_low, 1 + clip_high)), dual_clip optional
      gspo:      the PPO clip on the sequence ratio, per-token gradient (GSPO-token)
      cispo:     -sg(clip(r, 1 - clip_low, 1 + clip_high)) A logp
      reinforce: -A logp

    Args:
      logp: [B, T] float log-probs of the taken tokens under the current policy.
      old_logp: [B, T] float log-probs under the behaviour policy that sampled them.
      advantages: [B, T] per-token or [B] per-sequence advantages.
      mask: [B, T] action mask (non-zero = action token).
      kind: a registered policy-loss kind.
      agg: aggregation mode, one of AGGREGATIONS.
      norm: LossNorm of the full batch (see `aggregation.loss_norm`); None = this is the
        full batch.
      **params: the kind's hyperparameters (`policy_loss_hyperparameters(kind)`; ppo,
        gspo, cispo: clip_low, clip_high >= 0; ppo also dual_clip: None / 0, or c > 1);
        omitted ones take the kind's defaults, others raise.

    Returns:
      (loss, metrics): float32 scalar and a dict of scalars over this call's action tokens:
      approx_kl (k1 estimate of KL(old || new)), approx_kl_k3, ratio_mean / ratio_min /
      ratio_max, advantage_mean, num_tokens, and per kind the clip fractions (clipfrac,
      clipfrac_low, clipfrac_high, clipfrac_dual; for cispo the fractions of clipped IS
      weights; for gspo also seq_ratio_mean).
    """
    loss_kind = policy_loss_kind(kind, **params)
    _common.check_choice("agg", agg, AGGREGATIONS)
    _common.check_tokens(logp=logp, old_logp=old_logp, mask=mask)
    advantages = token_advantages(advantages, mask)

    logp, old_logp, advantages = as_float(logp, old_logp, advantages)
    valid = mask.astype(bool)
    logp = jnp.where(valid, logp, 0.0)
    old_logp = lax.stop_gradient(jnp.where(valid, old_logp, 0.0))
    advantages = lax.stop_gradient(jnp.where(valid, advantages, 0.0))
    log_ratio = jnp.clip(logp - old_logp, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)

    token_loss, kind_metrics = loss_kind.token_loss(logp, log_ratio, advantages, valid)
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


