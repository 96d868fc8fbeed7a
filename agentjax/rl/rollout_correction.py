"""Rollout-trainer mismatch: its measure, and the rejection masks that correct it.

The engine samples a token with log-prob log mu_t (its kernels, its precision, and in an
asynchronous run an older weight version); the trainer recomputes log pi_t for the same
token when the batch is prepared (`rl/prepare.py`). Their per-token log-ratio

  delta_t = log pi_t - log mu_t      (rho_t = exp(delta_t) = pi_t / mu_t)

is 0 when the two agree. The importance *weights* built on rho (token- or
sequence-level truncated IS) are `rl/offpolicy.py: importance_weights`; this module
measures the mismatch and builds the *masks*: a rejected token leaves the loss (and its
denominators), a rejected sequence leaves it whole. Every mask takes delta on action
tokens only (observations have no engine log-prob: delta is 0 there, which every bound
keeps); a statistic over a row's action tokens uses its n action tokens. The registered
masks (`MASKS`), each `keep` on a condition with inclusive bounds:

  token       IcePop (Ring-1T's "IcePop", ringtech.notion.site/icepop; SkyRL
              off_policy_correction_utils.py: compute_token_mask; verl
              rollout_corr_helper.py: compute_rollout_rejection_mask, "token_k1"):
              token t kept iff token_low <= rho_t <= token_high.
  geometric   SkyRL's geometric sequence mask (compute_sequence_mask, "geometric"; verl's
              "seq_mean_k1", Geo-RS): row kept iff
              geo_low <= exp(mean_t delta_t) <= geo_high.
  product     SkyRL's "product" sequence mask (verl's "seq_sum_k1", the RS of Seq-MIS):
              row kept iff product_low <= exp(sum_t delta_t) <= product_high.
  seq_mean_kl verl's "seq_mean_k2" / "seq_mean_k3": row kept iff
              mean_t k(delta_t) <= seq_mean_kl.
  seq_max_kl  verl's "seq_max_k2" / "seq_max_k3": row kept iff
              max_t k(delta_t) <= seq_max_kl.
  opsm        DeepSeek-V3.2's off-policy sequence masking (arXiv 2512.02556;
              slime utils/ppo_utils.py: compute_opsm_mask): token t kept unless
              A_t < 0 and mean_t (log mu_t - log pi_t) > opsm_delta, i.e. a sequence the
              trainer finds less likely than the engine did is not pushed down further.
with k2 = delta^2 / 2 and k3 = exp(delta) - 1 - delta, the estimators of
KL(mu || pi) verl's rejection uses (delta clamped to [-20, 20] before the exponent,
verl's SAFETY_BOUND; no clamp of the value, unlike `rl/kl.py`'s k3 for the loss, so a
mean decides on the true size of an outlier).

Masks combine by AND (verl's comma-separated `rollout_rs`, SkyRL's stacked masks): the
loss mask is multiplied by each one's keep. DeepSeek evaluates OPSM against the policy
being optimized; here every mask is computed once, when the batch is prepared, from the
trainer's log-probs then (the policy of the first minibatch; the PPO clip bounds later
ones).
"""
from __future__ import annotations

import dataclasses
import math

import jax.numpy as jnp
from jax import lax

from agentjax.config.choices import KL_MASK_ESTIMATORS
from agentjax.core.registry import Registry
from agentjax.rl import _common
from agentjax.rl._common import as_float
from agentjax.rl.aggregation import masked_extreme, masked_mean
from agentjax.rl.policy_losses import LOG_RATIO_CLAMP


@dataclasses.dataclass(frozen=True)
class Thresholds:
    """The masks' bounds (config keys algo.rollout_correction.<field>), checked here."""

    token_low: float = 0.5
    token_high: float = 5.0
    geo_low: float = 0.99
    geo_high: float = 1.01
    product_low: float = 0.5
    product_high: float = 2.0
    kl_estimator: str = "k3"
    seq_mean_kl: float = 0.01
    seq_max_kl: float = 0.3
    opsm_delta: float = 1e-4

    def __post_init__(self):
        # A bound pair must keep on-policy data (rho = 1): a mask that rejects it is a bug.
        for name in ("token", "geo", "product"):
            _common.check_range(f"{name}_low", getattr(self, f"{name}_low"), low=0.0,
                                high=1.0, low_open=True)
            _common.check_range(f"{name}_high", getattr(self, f"{name}_high"), low=1.0)
        _common.check_choice("kl_estimator", self.kl_estimator, KL_MASK_ESTIMATORS)
        for name in ("seq_mean_kl", "seq_max_kl", "opsm_delta"):
            _common.check_range(name, getattr(self, name), low=0.0, low_open=True)


@dataclasses.dataclass(frozen=True)
class Rows:
    """What a mask reads, each [B, T] (stat [B, 1] per row): `delta` the clamped
    log-ratio (0 off action tokens), `action` the action tokens (bool), `advantages`,
    and `n` each row's action-token count (>= 1)."""

    delta: jnp.ndarray
    action: jnp.ndarray
    advantages: jnp.ndarray
    n: jnp.ndarray

    def row_sum(self, x):
        return jnp.where(self.action, x, 0.0).sum(axis=1, keepdims=True)

    def row_mean(self, x):
        return self.row_sum(x) / self.n


def _kl_estimate(delta, kind):
    """k2 / k3 of KL(mu || pi) per token from delta = log pi - log mu (samples of mu)."""
    if kind == "k2":
        return 0.5 * jnp.square(delta)
    return jnp.exp(delta) - 1.0 - delta


def _within(x, low, high):
    return (x >= math.log(low)) & (x <= math.log(high))


# name -> keep(rows, thresholds): bool [B, T] (a token mask) or [B, 1] (a row mask).
MASKS: Registry = Registry("rollout correction mask")


@MASKS.register("token")
def _token(rows: Rows, th: Thresholds):
    return _within(rows.delta, th.token_low, th.token_high)


@MASKS.register("geometric")
def _geometric(rows: Rows, th: Thresholds):
    return _within(rows.row_mean(rows.delta), th.geo_low, th.geo_high)


@MASKS.register("product")
def _product(rows: Rows, th: Thresholds):
    return _within(rows.row_sum(rows.delta), th.product_low, th.product_high)


@MASKS.register("seq_mean_kl")
def _seq_mean_kl(rows: Rows, th: Thresholds):
    return rows.row_mean(_kl_estimate(rows.delta, th.kl_estimator)) <= th.seq_mean_kl


@MASKS.register("seq_max_kl")
def _seq_max_kl(rows: Rows, th: Thresholds):
    k = jnp.where(rows.action, _kl_estimate(rows.delta, th.kl_estimator), 0.0)
    return k.max(axis=1, keepdims=True) <= th.seq_max_kl


@MASKS.register("opsm")
def _opsm(rows: Rows, th: Thresholds):
    seq_kl = -rows.row_mean(rows.delta)  # mean_t (log mu_t - log pi_t)
    return ~((rows.advantages < 0) & (seq_kl > th.opsm_delta))


def log_ratio(trainer_logp, behavior_logp, action):
    """delta = log pi - log mu clamped to [-20, 20] on action tokens, 0 elsewhere (where
    the behavior log-prob may be anything, even NaN)."""
    trainer_logp, behavior_logp = as_float(trainer_logp, behavior_logp)
    delta = jnp.where(action, trainer_logp - behavior_logp, 0.0)
    return jnp.clip(delta, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


def mismatch_metrics(trainer_logp, behavior_logp, action_mask):
    """How far the engine's log-probs are from the trainer's, over action tokens (verl
    rollout_corr_helper.py: compute_offpolicy_metrics "kl" and "k3_kl").

    Returns scalars: logp_mismatch_k1 = mean (log mu - log pi) (k1 of KL(mu || pi), the
    log-ratio not clamped), logp_mismatch_ratio_mean / _min / _max of rho = pi / mu
    (exp of the log-ratio clamped to [-20, 20]; 1 without action tokens).
    The k3 estimate and mean |delta| are `prepare`'s logp_mismatch_kl and
    logp_mismatch_abs.
    """
    _common.check_tokens(trainer_logp=trainer_logp, behavior_logp=behavior_logp,
                         action_mask=action_mask)
    action = action_mask.astype(bool)
    trainer_logp, behavior_logp = as_float(trainer_logp, behavior_logp)
    rho = jnp.exp(log_ratio(trainer_logp, behavior_logp, action))
    return lax.stop_gradient({
        "logp_mismatch_k1": masked_mean(behavior_logp - trainer_logp, action),
        "logp_mismatch_ratio_mean": jnp.where(action.any(), masked_mean(rho, action), 1.0),
        "logp_mismatch_ratio_min": masked_extreme(rho, action, jnp.min, 1.0),
        "logp_mismatch_ratio_max": masked_extreme(rho, action, jnp.max, 1.0),
    })


def rejection_mask(trainer_logp, behavior_logp, action_mask, loss_mask, advantages, *,
                   masks, thresholds=Thresholds()):
    """The loss mask with the rejected tokens and sequences removed.

    Args:
      trainer_logp: [B, T] the trainer's log-probs of the sampled tokens.
      behavior_logp: [B, T] the engine's (anything off action tokens).
      action_mask: [B, T] the action tokens: where delta is defined.
      loss_mask: [B, T] the tokens in the loss (the action tokens, or more with
        env.loss_on_observations): a row mask rejects the whole row, OPSM each token with
        a negative advantage, IcePop's only action tokens (delta is 0 elsewhere).
      advantages: [B, T] or [B] advantages (OPSM reads their sign).
      masks: names of `MASKS`, combined by AND (empty: the loss mask unchanged).
      thresholds: their bounds.

    Returns:
      (loss_mask * keep [B, T] in loss_mask's dtype, metrics): scalars over the rows with
      action tokens — rollout_correction/masked_tokens (the fraction of action tokens
      rejected), rollout_correction/masked_seqs (of rows, those with any action token
      rejected), and per mask rollout_correction/<name>_masked_tokens.
    """
    masks = tuple(masks)
    for name in masks:
        MASKS.get(name)
    _common.check_tokens(trainer_logp=trainer_logp, behavior_logp=behavior_logp,
                         action_mask=action_mask, loss_mask=loss_mask)
    action = action_mask.astype(bool)
    (advantages,) = as_float(advantages)
    if advantages.ndim == 1:
        advantages = advantages[:, None]
    rows = Rows(delta=log_ratio(trainer_logp, behavior_logp, action), action=action,
                advantages=jnp.broadcast_to(advantages, action.shape),
                n=jnp.maximum(action.sum(axis=1, keepdims=True), 1).astype(jnp.float32))
    keep = jnp.ones(action.shape, bool)
    metrics = {}
    for name in masks:
        kept = jnp.broadcast_to(MASKS.get(name)(rows, thresholds), action.shape)
        metrics[f"rollout_correction/{name}_masked_tokens"] = masked_mean(~kept, action)
        keep = keep & kept
    rejected = ~keep & action
    has_actions = action.any(axis=1)
    metrics["rollout_correction/masked_tokens"] = masked_mean(rejected, action)
    metrics["rollout_correction/masked_seqs"] = masked_mean(rejected.any(axis=1), has_actions)
    new_mask = jnp.where(keep, loss_mask, jnp.zeros_like(loss_mask))
    return lax.stop_gradient(new_mask), lax.stop_gradient(metrics)


def from_config(section) -> tuple[tuple[str, ...], Thresholds]:
    """(masks, thresholds) of the `config.algo.rollout_correction` section."""
    masks = tuple(part.strip() for part in section.masks.split(",")) if section.masks else ()
    return masks, Thresholds(**{field.name: section[field.name]
                                for field in dataclasses.fields(Thresholds)})
