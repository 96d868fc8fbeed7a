"""Off-policy correction of the policy loss: per-token importance weights between the
policy that sampled each token and the policy the PPO clip is centred on.

Three policies meet at every action token t. Everything is per token, because in an
asynchronous run the tokens of one sequence may come from different weight versions
(an episode interrupted by a weight update continues under the new version):
  mu_t       behavior: the engine's log-prob of the sampled token, under the weight
             version that sampled it;
  pi_prox_t  proximal: the learner's weights when the batch is prepared (the log-probs
             `rl/prepare.py` recomputes); a constant of the update;
  pi_t       the policy being optimized.

Decoupled PPO (Hilton et al. 2021, arXiv 2110.00641; AReaL, arXiv 2505.24298):
  L = agg_t[ w_t * max(-A_t r_t, -A_t clip(r_t, 1 - clip_low, 1 + clip_high)) ]
  r_t = pi_t / pi_prox_t   (trust region around the proximal policy)
  w_t = bound(rho_t),  rho_t = pi_prox_t / mu_t = exp(clamp(log pi_prox_t - log mu_t, +-20))
with `bound`, for a cap C:
  truncate: w = min(rho, C)              truncated IS (IMPALA's rho-bar, arXiv 1802.01561;
                                         verl's token-level TIS)
  mask:     w = rho if rho <= C else 0   AReaL's behav_imp_weight_cap
                                         (areal/utils/functional.py: ppo_actor_loss_fn):
                                         a token that far off-policy leaves the gradient

w_t >= 0 is a constant of the update, so it factors through the max (and the dual clip's
min, and is linear in the gspo / cispo / reinforce losses): the decoupled objective is
`losses.rl_objective(logp, log pi_prox, A, mask, is_weights=w)`, the advantage weighted by
w being the token's loss weighted by w. Its other forms:
  - Truncated IS on the standard objective (verl's TIS: the clip centred on the trainer's
    recomputed log-probs, their ratio to the engine's as the weight) is this formula with
    pi_prox recomputed at the weights that sampled; a synchronous run is that case.
  - mu = pi_prox (and C >= 1): w = 1 exactly and L is the standard PPO loss, bit for bit.
  - Sequence level (verl rollout_corr_helper.py: compute_rollout_correction_weights,
    rollout_is="sequence"; SkyRL off_policy_correction_utils.py: compute_tis_ratio,
    "sequence"): one weight per row, w_i = bound(exp(clamp(sum_t log rho_t, +-20))), on
    every action token of the row: the product of the token ratios, the unbiased (and
    high-variance) correction of a whole trajectory's likelihood.
  - No proximal policy (verl's "bypass" policy gradient with token TIS):
    L = agg_t[ -sg(min(pi_t / mu_t, C)) A_t log pi_t ], which is kind="cispo" with
    old_logp = log mu, clip_low = 1 and clip_high = C - 1.
"""
from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from agentjax.config.choices import IS_BOUNDS, IS_LEVELS
from agentjax.rl import _common
from agentjax.rl._common import as_float
from agentjax.rl.aggregation import masked_extreme, masked_mean
from agentjax.rl.policy_losses import LOG_RATIO_CLAMP


def _truncate(ratio, cap):
    return jnp.minimum(ratio, cap)


def _mask(ratio, cap):
    return jnp.where(ratio <= cap, ratio, 0.0)


_BOUND_FNS = {"truncate": _truncate, "mask": _mask}


def importance_weights(proximal_logp, behavior_logp, mask, *, cap, bound="truncate",
                       level="token"):
    """Importance weights w = bound(pi_prox / mu) of the decoupled objective, per token or
    per sequence.

    Args:
      proximal_logp: [B, T] log-probs of the taken tokens under the proximal policy (the
        clip centre: `old_logp` of `losses.rl_objective`).
      behavior_logp: [B, T] log-probs under the policy that sampled each token (the
        engine's; tokens of one row may come from different weight versions).
      mask: [B, T] action mask (non-zero = action token); other positions may hold
        anything, even NaN.
      cap: C > 0, the bound of the weights (C >= 1 keeps on-policy tokens at weight 1).
      bound: one of IS_BOUNDS: "truncate" (min(rho, C)) or "mask" (0 where rho > C).
      level: one of IS_LEVELS: "token" (rho_t per token) or "sequence" (rho = the
        product of the row's token ratios, on each of its action tokens).

    Returns:
      (weights, metrics): weights [B, T] (constants: gradient stopped; exactly 1 at mask-0
      positions) and scalars over the action tokens: is_ratio_mean / is_ratio_max (rho
      before the bound; 1 without action tokens), is_weight_mean (w) and is_clipfrac (the
      fraction with rho > C, truncated or masked); at sequence level each row's rho
      counts once per action token.
    """
    _common.check_choice("bound", bound, IS_BOUNDS)
    _common.check_choice("level", level, IS_LEVELS)
    _common.check_range("cap", cap, low=0.0, low_open=True)
    _common.check_tokens(proximal_logp=proximal_logp, behavior_logp=behavior_logp, mask=mask)
    proximal_logp, behavior_logp = as_float(proximal_logp, behavior_logp)
    valid = mask.astype(bool)
    log_ratio = jnp.where(valid, proximal_logp - behavior_logp, 0.0)
    if level == "sequence":
        log_ratio = jnp.broadcast_to(log_ratio.sum(axis=1, keepdims=True), log_ratio.shape)
    ratio = jnp.exp(jnp.clip(log_ratio, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    weights = lax.stop_gradient(jnp.where(valid, _BOUND_FNS[bound](ratio, cap), 1.0))
    metrics = {
        "is_ratio_mean": jnp.where(valid.any(), masked_mean(ratio, valid), 1.0),
        "is_ratio_max": masked_extreme(ratio, valid, jnp.max, 1.0),
        "is_weight_mean": jnp.where(valid.any(), masked_mean(weights, valid), 1.0),
        "is_clipfrac": masked_mean(ratio > cap, valid),
    }
    return weights, lax.stop_gradient(metrics)
