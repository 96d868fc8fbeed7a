"""Per-token KL estimators between the policy and a reference, and entropy from logits.

Estimators of KL(pi || pi_ref) from the sampled token's log-probs (Schulman, "Approximating
KL divergence", 2020), with d = logp - ref_logp:
  k1 = d,  k2 = d^2 / 2,  k3 = exp(-d) + d - 1  (>= 0, low variance).
k3 clamps -d to [-20, 20] and the result to [-10, 10] like the PyTorch frameworks, so
garbage log-probs (e.g. at padding) stay finite. The "+" variants (`k1+`, `k3+`) have the
value of k1/k3 and the gradient of k2 (straight-through; the log-ratio is clamped to
[-20, 20] there too), which is an unbiased gradient of the KL when the tokens are sampled
from pi.
"""
from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from agentjax.config.choices import KL_KINDS
from agentjax.rl import _common
from agentjax.rl._common import as_float

# Clamps of k3, as in verl's kl_penalty ("low_var_kl").
K3_LOG_RATIO_CLAMP = 20.0
K3_VALUE_CLAMP = 10.0


def _k1(logp, ref_logp):
    return logp - ref_logp


def _k2(logp, ref_logp):
    return 0.5 * jnp.square(logp - ref_logp)


def _k3(logp, ref_logp):
    log_ratio = jnp.clip(ref_logp - logp, -K3_LOG_RATIO_CLAMP, K3_LOG_RATIO_CLAMP)
    return jnp.clip(jnp.exp(log_ratio) - log_ratio - 1.0, -K3_VALUE_CLAMP, K3_VALUE_CLAMP)


_ESTIMATORS = {"k1": _k1, "k2": _k2, "k3": _k3}


def kl(logp, ref_logp, kind):
    """Per-token KL estimate between the policy and the reference policy.

    Args:
      logp: [...] float log-probs of the sampled tokens under the policy being trained.
      ref_logp: same shape, log-probs of the same tokens under the reference policy.
      kind: one of "k1", "k2", "k3", "k1+", "k3+" (see module docstring).

    Returns:
      Array of the common shape with the per-token estimate. No mask is applied: reduce
      it with `agentjax.rl.aggregation.aggregate` (or `losses.kl_penalty`) so that only
      action tokens count.
    """
    _common.check_choice("kind", kind, KL_KINDS)
    _common.check_same_shape(logp=logp, ref_logp=ref_logp)
    logp, ref_logp = as_float(logp, ref_logp)
    value = _ESTIMATORS[kind.rstrip("+")](logp, ref_logp)
    if kind.endswith("+"):
        # Written as value + (k2 - sg(k2)) so the value is bit-exact; k2 uses the k3 clamp
        # so infinite log-probs give a finite (zero) gradient instead of inf - inf.
        log_ratio = jnp.clip(logp - ref_logp, -K3_LOG_RATIO_CLAMP, K3_LOG_RATIO_CLAMP)
        surrogate = 0.5 * jnp.square(log_ratio)
        value = lax.stop_gradient(value) + (surrogate - lax.stop_gradient(surrogate))
    return value


def entropy_from_logits(logits):
    """Entropy of softmax(logits) along the last axis: logsumexp(z) - sum(softmax(z) * z).

    Args:
      logits: [..., V] unnormalized log-probabilities (any float dtype; computed in at
        least float32); -inf entries are allowed.

    Returns:
      [...] float entropy in nats.
    """
    if jnp.ndim(logits) < 1:
        raise ValueError(f"logits must have a vocabulary axis, got shape {jnp.shape(logits)}")
    (z,) = as_float(logits)
    # Entropy is shift-invariant; shifting by the max keeps lse - E_p[z] from cancelling
    # two large numbers on peaked distributions.
    z = z - lax.stop_gradient(jnp.max(z, axis=-1, keepdims=True))
    lse = jnp.log(jnp.sum(jnp.exp(z), axis=-1))
    probs = jnp.exp(z - lse[..., None])
    # -inf logits (banned tokens) have probability 0 and contribute 0, not 0 * -inf (the
    # inner where keeps the gradient finite as well).
    return lse - jnp.sum(probs * jnp.where(probs > 0, z, 0.0), axis=-1)
