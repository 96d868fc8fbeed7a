"""Preference losses on multi-turn trajectories: DPO and its IPO / hinge variants.

A pair p holds two trajectories of one task, chosen (w) and rejected (l), each as per-token
log-probs [P, T] with its action mask. A trajectory's log-prob counts its action tokens
only: prompt, observation (tool output) and padding tokens are not the policy's choices.
  log pi(y) = sum_t m_t log pi(y_t | y_<t)                        (`sequence_logprobs`)
  h(y)      = log pi(y) - log pi_ref(y)                           (log-ratio to the reference)
  h(y)      = (log pi(y) - log pi_ref(y)) / n(y)                  with length_normalized,
where n(y) is y's number of action tokens: the per-token average log-ratio of TRL's
"sigmoid_norm" and "ipo" (trl/trainer/dpo_trainer.py), Tulu 3's length-normalized DPO
(arXiv 2411.15124); SimPO (arXiv 2405.14734) uses the same average without the reference.
Normalizing by the agent's own tokens, not the whole trajectory, keeps a long tool output
from diluting the preference. With r(y) = beta h(y) (the implicit reward, Rafailov et al.
2023, arXiv 2305.18290) and z_p = h(y_w) - h(y_l), the loss of a pair is, by kind:
  sigmoid: -(1 - eps) log sigmoid(beta z) - eps log sigmoid(-beta z)     DPO; eps > 0 is
           conservative DPO (cDPO, Mitchell 2023, "A note on DPO with noisy
           preferences"), the `label_smoothing` of TRL's sigmoid loss until its DPO
           refactor (TRL #3906). With L(z) = -log sigmoid(beta z) this is
           (1 - eps) L(z) + eps L(-z). TRL's "robust" loss is another one: rDPO
           (Chowdhury et al. 2024, "Provably Robust DPO", arXiv 2403.00409),
           ((1 - eps) L(z) - eps L(-z)) / (1 - 2 eps), whose eps term has the opposite
           sign; both are plain DPO at eps = 0 (tests/rl/test_preference.py)
  ipo:     (z - 1 / (2 beta))^2      IPO (Azar et al. 2023, arXiv 2310.12036, Eq. 17; beta
           is its tau). TRL's "ipo" always averages per token: here length_normalized=True;
           the paper's sequence sums are length_normalized=False.
  hinge:   max(0, 1 - beta z)        SLiC-HF (Zhao et al. 2023, arXiv 2305.10425)
and L = sum_p c_p loss_p / N. A pair counts (c_p = 1) when both of its trajectories have
an action token; N is the number of counting pairs in the *full* batch (`count_pairs`),
so micro-batch losses and gradients add up to the full batch's, as the global
denominators of `aggregation.aggregate` do. Padding pairs (no action tokens) count for
nothing.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from agentjax.config.choices import DPO_KINDS
from agentjax.rl import _common
from agentjax.rl._common import as_float
from agentjax.rl.aggregation import masked_mean


def sequence_logprobs(token_logp, mask):
    """Sum of the per-token log-probs over the action tokens of each row.

    Args:
      token_logp: [B, T] log-probs of the taken tokens (e.g. `logprobs.token_logprobs`);
        mask-0 positions may hold anything, even NaN, and get exactly zero gradient.
      mask: [B, T] action mask (non-zero = action token).

    Returns:
      [B] float sequence log-probs (0 for a row without action tokens).
    """
    _common.check_tokens(token_logp=token_logp, mask=mask)
    (token_logp,) = as_float(token_logp)
    return jnp.where(mask.astype(bool), token_logp, 0.0).sum(axis=1)


def _pairs_counted(chosen_mask, rejected_mask):
    return chosen_mask.astype(bool).any(axis=1) & rejected_mask.astype(bool).any(axis=1)


def count_pairs(chosen_mask, rejected_mask):
    """N of `dpo_loss` from the masks of the *full* batch: the pairs whose chosen and
    rejected trajectories both have an action token, clamped to >= 1 (float32 scalar)."""
    _common.check_rank("chosen_mask", chosen_mask, 2)
    _common.check_rank("rejected_mask", rejected_mask, 2)
    return jnp.maximum(_pairs_counted(chosen_mask, rejected_mask).sum(), 1).astype(jnp.float32)


def _sigmoid(z, beta, label_smoothing):
    return (-(1.0 - label_smoothing) * jax.nn.log_sigmoid(beta * z)
            - label_smoothing * jax.nn.log_sigmoid(-beta * z))


def _ipo(z, beta, label_smoothing):
    del label_smoothing
    return jnp.square(z - 1.0 / (2.0 * beta))


def _hinge(z, beta, label_smoothing):
    del label_smoothing
    return jax.nn.relu(1.0 - beta * z)


_DPO_LOSS_FNS = {"sigmoid": _sigmoid, "ipo": _ipo, "hinge": _hinge}


def _log_ratio(policy, ref, mask, length_normalized):
    """h(y) per row: policy minus reference sequence log-prob, per action token if asked."""
    h = sequence_logprobs(policy, mask) - lax.stop_gradient(sequence_logprobs(ref, mask))
    if length_normalized:
        h = h / jnp.maximum(mask.astype(bool).sum(axis=1), 1).astype(h.dtype)
    return h


def dpo_loss(
    policy_chosen,
    policy_rejected,
    ref_chosen,
    ref_rejected,
    chosen_mask,
    rejected_mask,
    *,
    beta,
    kind="sigmoid",
    label_smoothing=0.0,
    length_normalized=False,
    num_pairs=None,
):
    """Preference loss of P pairs of trajectories from their per-token log-probs.

    Args:
      policy_chosen: [P, T] log-probs of the chosen trajectories' tokens under the policy.
      policy_rejected: [P, T'] the same for the rejected trajectories (T' may differ).
      ref_chosen: [P, T] log-probs under the frozen reference policy (constant).
      ref_rejected: [P, T'] the same for the rejected trajectories.
      chosen_mask: [P, T] action mask of the chosen trajectories.
      rejected_mask: [P, T'] action mask of the rejected trajectories.
      beta: > 0, the KL strength (IPO's tau).
      kind: one of DPO_KINDS (formulas in the module docstring).
      label_smoothing: eps in [0, 0.5], the assumed probability that a label is flipped
        (conservative DPO); only for kind="sigmoid".
      length_normalized: divide each trajectory's log-ratio by its action-token count.
      num_pairs: N of the full batch (`count_pairs`); None = this call is the full batch.

    Returns:
      (loss, metrics): float32 scalar and scalars over this call's counting pairs:
      reward_chosen / reward_rejected (mean r(y)), reward_margin (mean r(y_w) - r(y_l)),
      reward_accuracy (fraction with r(y_w) > r(y_l)), logp_chosen / logp_rejected (mean
      policy sequence log-probs, never normalized) and num_pairs.
    """
    _common.check_choice("kind", kind, DPO_KINDS)
    _common.check_range("beta", beta, low=0.0, low_open=True)
    _common.check_range("label_smoothing", label_smoothing, low=0.0, high=0.5)
    if label_smoothing and kind != "sigmoid":
        raise ValueError(f"label_smoothing is only defined for kind='sigmoid', got kind={kind!r}"
                         f" with label_smoothing={label_smoothing}")
    _common.check_tokens(policy_chosen=policy_chosen, ref_chosen=ref_chosen,
                         chosen_mask=chosen_mask)
    _common.check_tokens(policy_rejected=policy_rejected, ref_rejected=ref_rejected,
                         rejected_mask=rejected_mask)
    if jnp.shape(policy_chosen)[0] != jnp.shape(policy_rejected)[0]:
        raise ValueError(f"policy_chosen has {jnp.shape(policy_chosen)[0]} pairs but "
                         f"policy_rejected has {jnp.shape(policy_rejected)[0]}")
    if num_pairs is None:
        num_pairs = count_pairs(chosen_mask, rejected_mask)
    _common.check_range("num_pairs", num_pairs, low=0.0, low_open=True)

    h_chosen = _log_ratio(policy_chosen, ref_chosen, chosen_mask, length_normalized)
    h_rejected = _log_ratio(policy_rejected, ref_rejected, rejected_mask, length_normalized)
    counted = _pairs_counted(chosen_mask, rejected_mask)
    pair_loss = _DPO_LOSS_FNS[kind](h_chosen - h_rejected, beta, label_smoothing)
    loss = jnp.where(counted, pair_loss, 0.0).sum() / num_pairs

    reward_chosen, reward_rejected = beta * h_chosen, beta * h_rejected
    metrics = {
        "reward_chosen": masked_mean(reward_chosen, counted),
        "reward_rejected": masked_mean(reward_rejected, counted),
        "reward_margin": masked_mean(reward_chosen - reward_rejected, counted),
        "reward_accuracy": masked_mean(reward_chosen > reward_rejected, counted),
        "logp_chosen": masked_mean(sequence_logprobs(policy_chosen, chosen_mask), counted),
        "logp_rejected": masked_mean(sequence_logprobs(policy_rejected, rejected_mask),
                                     counted),
        "num_pairs": counted.sum().astype(jnp.float32),
    }
    return loss, lax.stop_gradient(metrics)
