"""On-policy distillation: a teacher's log-probs on the student's own samples as a dense
per-token advantage.

    A_t = task_weight * A_task_t + coef * (log pi_teacher(y_t | y_<t) - log pi_student(y_t | y_<t))

on action tokens (0 on observations, the prompt and padding), with no discount: each
token's distillation term is its own, never a sum over the tokens after it. This is
Thinking Machines' "On-Policy Distillation" (Lu et al., Oct 2025): the per-token reverse
KL log pi_student - log pi_teacher of the student's sample, negated, is the advantage
of an importance-sampled policy gradient with discount 0, so its expectation is the
gradient of -KL(pi_student || pi_teacher) per token. prime-rl adds it to the task
advantage the same way (src/prime_rl/trainer/rl/loss.py, its default loss: `adv_tau`
times the advantages plus `teacher_tau` times the detached teacher_logprobs -
trainer_logprobs, zeroed where the teacher's value is not finite, as a token the
teacher did not score is here), slime subtracts
`--opd-kl-coef` times it from any estimator's advantage
(docs/en/advanced/on-policy-distillation.md); TRL's GKDTrainer instead minimizes a
generalized JSD between the full distributions (`generalized_jsd_loss`, beta = 1 its
reverse KL), which needs both models' logits in the loss, not only the sampled tokens'.

The student's log-probs here are the trainer's (`prepare`'s recomputed `current`), the
same numerics as the teacher's forward pass, so the rollout engine's mismatch never
leaks into the signal; both are taken at the rollout temperature (at 1, the usual for
distillation, the plain formula). The term is a constant of the update
(stop_gradient), so it enters every policy loss as an advantage does
(rl/policy_losses.py).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from agentjax.rl import _common
from agentjax.rl import kl as kl_lib
from agentjax.rl.aggregation import masked_mean


def scored_tokens(teacher_logp: jax.Array, mask: jax.Array) -> jax.Array:
    """[B, T] float: the action tokens (`mask` > 0) the teacher gave a finite log-prob;
    a token it did not score (a non-finite value) gets no distillation term."""
    return ((mask > 0) & jnp.isfinite(teacher_logp)).astype(jnp.float32)


def distill_advantages(teacher_logp: jax.Array, student_logp: jax.Array,
                       mask: jax.Array) -> jax.Array:
    """[B, T] log pi_teacher - log pi_student on scored tokens, 0 elsewhere (module
    docstring; a constant of the update)."""
    _common.check_tokens(teacher_logp=teacher_logp, student_logp=student_logp, mask=mask)
    scored = scored_tokens(teacher_logp, mask) > 0
    return jax.lax.stop_gradient(jnp.where(scored, teacher_logp - student_logp, 0.))


def combine(task_advantages: jax.Array, signal: jax.Array, mask: jax.Array, *,
            coef: float, task_weight: float) -> jax.Array:
    """[B, T] task_weight * A_task + coef * signal on `mask` tokens (the loss's), 0
    elsewhere: `signal` is `distill_advantages`, the task advantage per token or per
    sequence ([B], broadcast over its tokens)."""
    _common.check_range("coef", coef, low=0.0)
    _common.check_range("task_weight", task_weight, low=0.0)
    _common.check_tokens(signal=signal, mask=mask)
    task = jnp.asarray(task_advantages, jnp.float32)
    if task.ndim == 1:
        task = task[:, None]
    task = jnp.broadcast_to(task, mask.shape)
    return jnp.where(mask > 0, task_weight * task + coef * signal, 0.)


def distill_metrics(teacher_logp: jax.Array, student_logp: jax.Array,
                    action_mask: jax.Array) -> dict[str, jax.Array]:
    """The teacher-student reverse KL KL(student || teacher) per scored action token,
    estimated on the student's samples: distill/kl_k1 (mean log pi_student - log
    pi_teacher) and distill/kl_k3 (mean r - 1 - log r, r = pi_teacher / pi_student:
    non-negative, lower variance; rl/kl.py), and distill/scored_frac (scored action
    tokens / action tokens)."""
    scored = scored_tokens(teacher_logp, action_mask)
    teacher = jnp.where(scored > 0, teacher_logp, 0.)
    student = jnp.where(scored > 0, student_logp, 0.)
    actions = jnp.sum(action_mask > 0)
    return {"distill/kl_k1": masked_mean(kl_lib.kl(student, teacher, "k1"), scored),
            "distill/kl_k3": masked_mean(kl_lib.kl(student, teacher, "k3"), scored),
            "distill/scored_frac": jnp.sum(scored) / jnp.maximum(actions, 1)}
