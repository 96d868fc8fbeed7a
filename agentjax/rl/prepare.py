"""Between rollout and update: log-probs, KL, values and advantages of a batch.

`build_prepare(logprob_fn, algo, ...)` returns the pure function (jit it)

    prepare(params, ref_params, critic_params, batch[, teacher_params]) -> (batch, metrics)

that adds to a collated batch everything the update's losses (`rl.objectives`) read:
`loss_mask`, `old_logp`, `ref_logp`, `advantages` (and with a critic `old_values`,
`returns`), `is_weights`, and with `algo.rollout_normalization` `rollout_tokens`
(rl/segments.py: a rollout cut into segments counts once). With a teacher
(`algo.distill_coef`) the advantages also carry its per-token signal
(rl/distillation.py). All advantages are computed
on the full batch before any minibatching, by the estimator `algo.advantage` names
(`advantages.ADVANTAGES`). The
model enters only through `logprob_fn` (and `value_fn` for a critic), so every branch can
be tested with fixed arrays; `model_logprob_fn` and `critic_value_fn` build them from
graphdefs.
"""
from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
from flax import nnx

from agentjax.rl import kl as kl_lib
from agentjax.rl import distillation, rollout_correction, segments, token_packing
from agentjax.rl.advantages import ADVANTAGES, needs_critic
from agentjax.rl.aggregation import masked_mean
from agentjax.rl.objectives import policy_logprobs
from agentjax.rl.offpolicy import importance_weights

# (params, batch, temperature) -> (logp, entropy), both [B, T] for batch["targets"].
LogprobFn = Callable[[Any, dict, jax.Array], tuple[jax.Array, jax.Array]]
# (critic_params, batch) -> values [B, T].
ValueFn = Callable[[Any, dict], jax.Array]


def model_logprob_fn(graphdef: nnx.GraphDef, *, chunk_size: int) -> LogprobFn:
    """The policy's `LogprobFn`: `objectives.policy_logprobs` with chunked logits."""

    def logprob_fn(params, batch, temperature):
        return policy_logprobs(graphdef, params, batch, chunk_size=chunk_size,
                               temperature=temperature)

    return logprob_fn


def critic_value_fn(critic_graphdef: nnx.GraphDef) -> ValueFn:
    """The critic's `ValueFn` (a `models.value.ValueModel` graphdef)."""

    def value_fn(critic_params, batch):
        critic = nnx.merge(critic_graphdef, critic_params)
        return token_packing.forward_rows(
            lambda rows: critic(rows["inputs"], rows["positions"], rows["segment_ids"]), batch)

    return value_fn


def loss_mask(batch: dict, *, loss_on_observations: bool) -> jax.Array:
    """Tokens that enter the loss: the action tokens, or — with `loss_on_observations`,
    the observation-masking ablation — every real token after the prompt, observations
    included."""
    if not loss_on_observations:
        return batch["action_mask"]
    return ((batch["turn_ids"] > 0) & (batch["segment_ids"] > 0)).astype(jnp.float32)


def build_prepare(logprob_fn: LogprobFn, algo: Any, *, num_groups: int,
                  loss_on_observations: bool = False, value_fn: ValueFn | None = None,
                  offpolicy_metrics: bool = False, ref_logprob_fn: LogprobFn | None = None,
                  teacher_logprob_fn: LogprobFn | None = None):
    """Returns `prepare(params, ref_params, critic_params, batch, teacher_params=None)
    -> (batch, metrics)`.

    Args:
      logprob_fn: (params, batch, temperature) -> (logp, entropy) [B, T] of
        batch["targets"]; the reference policy is `logprob_fn` at `ref_params`.
      algo: the `config.algo` section (a Mapping; the estimator `algo.advantage` reads
        its own hyperparameters from it).
      num_groups: static number of groups (prompts) per batch; padding rows carry group
        id -1 and get zero advantage.
      loss_on_observations: True puts observation tokens into the loss (ablation).
      value_fn: (critic_params, batch) -> values [B, T]; required for an estimator with
        a critic (`advantages.needs_critic`: "gae").
      offpolicy_metrics: also return the importance weights' metrics (is_ratio_mean,
        is_ratio_max, is_weight_mean, is_clipfrac: `rl.offpolicy.importance_weights`)
        when old_logp="recompute" and tis_cap > 0 (asynchronous runs log them).
      ref_logprob_fn: the reference's LogprobFn at `ref_params` (default `logprob_fn`;
        LoRA's is the base model's over the policy's own params).
      teacher_logprob_fn: on-policy distillation's teacher (algo.distill_coef > 0): its
        LogprobFn at `teacher_params`, another model of the same vocabulary; the
        advantages become algo.distill_task_weight x the estimator's plus
        algo.distill_coef x (log pi_teacher - log pi_student) on action tokens
        (rl/distillation.py), before the rejection masks read them.

    The batch must hold `temperature` [B]: the rollout temperature, so recomputed
    log-probs describe the distribution the engine sampled from.

    Rollout-trainer mismatch (`algo.rollout_correction`, rl/rollout_correction.py): the
    tis_cap weight per token or per sequence (is_level), and the rejection masks, which
    take their tokens and sequences out of `loss_mask` once the advantages are computed.

    Metrics: logp_mismatch_abs, logp_mismatch_kl (k3 of KL(behavior || current)),
    logp_mismatch_k1 and logp_mismatch_ratio_mean / _min / _max (of pi_current /
    pi_behavior) over action tokens; rollout_correction/masked_tokens, /masked_seqs and
    per mask /<mask>_masked_tokens (0 without masks); kl_ref (KL(old || ref) over loss
    tokens) with a KL term; value_mean with a critic; advantage_abs_mean over loss tokens;
    the estimator's own (`AdvantageEstimate.metrics`, e.g. gigpo/step_grouped_frac);
    with a teacher distill/kl_k1, distill/kl_k3 and distill/scored_frac.
    """
    estimator = ADVANTAGES.get(algo.advantage)
    micro_tokens = algo.get("micro_tokens", 0)

    def per_token(fn, batch):
        """fn(batch) -> [B, T] outputs, within the update's token budget when it has one
        (one 32k-token episode among a hundred short ones must not become a [101, 32k]
        forward pass here either)."""
        if not micro_tokens:
            return fn(batch)
        return token_packing.map_token_micro_batches(fn, batch, micro_tokens)

    critic = needs_critic(algo.advantage)
    if critic and value_fn is None:
        raise ValueError(f"advantage={algo.advantage!r} needs a critic: pass value_fn")
    need_ref = algo.kl_coef > 0
    masks, thresholds = rollout_correction.from_config(algo.rollout_correction)
    # A rollout of several rows (segments) counts once: rl/segments.py.
    per_rollout = algo.get("rollout_normalization", False)
    ref_logprob_fn = ref_logprob_fn or logprob_fn
    distill_coef = algo.get("distill_coef", 0.0)
    if distill_coef and teacher_logprob_fn is None:
        raise ValueError(f"algo.distill_coef={distill_coef} needs the teacher: pass "
                         "teacher_logprob_fn")

    def prepare(params, ref_params, critic_params, batch, teacher_params=None):
        batch = dict(batch)
        mask = loss_mask(batch, loss_on_observations=loss_on_observations)
        batch["loss_mask"] = mask
        action = batch["action_mask"]
        temperature = batch["temperature"][0]
        metrics = {}
        current, _ = per_token(lambda b: logprob_fn(params, b, temperature), batch)
        current = jax.lax.stop_gradient(current)
        behavior = batch["behavior_logp"]
        # Off-policy gap between the engine's sampling and the trainer's numerics.
        metrics["logp_mismatch_abs"] = masked_mean(jnp.abs(current - behavior), action)
        metrics["logp_mismatch_kl"] = masked_mean(kl_lib.kl(behavior, current, "k3"), action)
        metrics.update(rollout_correction.mismatch_metrics(current, behavior, action))
        if algo.old_logp == "behavior":
            old = jnp.where(action > 0, behavior, current)
        else:
            old = current
            if algo.tis_cap:
                batch["is_weights"], is_metrics = importance_weights(
                    current, behavior, action, cap=algo.tis_cap, bound=algo.tis_bound,
                    level=algo.rollout_correction.is_level)
                if offpolicy_metrics:
                    metrics.update(is_metrics)
        batch["old_logp"] = old
        token_rewards = batch["rewards"]
        if need_ref:
            ref, _ = per_token(lambda b: ref_logprob_fn(ref_params, b, temperature), batch)
            batch["ref_logp"] = jax.lax.stop_gradient(ref)
            kl_tokens = jnp.where(mask > 0, kl_lib.kl(old, batch["ref_logp"], algo.kl_kind), 0.)
            metrics["kl_ref"] = masked_mean(kl_tokens, mask)
            if algo.kl_in_reward:
                token_rewards = token_rewards - algo.kl_coef * kl_tokens
        values = None
        if critic:
            values = jax.lax.stop_gradient(
                per_token(lambda b: value_fn(critic_params, b), batch))
            batch["old_values"] = values
            metrics["value_mean"] = masked_mean(values, mask)
        turns = {}
        if estimator.needs_turns:
            if "anchor_ids" not in batch:
                raise ValueError(f"advantage={algo.advantage!r} reads the batch's anchor_ids "
                                 "(core.anchors.anchor_ids): add them after collate")
            turns = dict(turn_ids=batch["turn_ids"], anchor_ids=batch["anchor_ids"])
        # Without rollout_ids every row is its own rollout: the same numbers either way.
        per_rollout_batch = per_rollout and "rollout_ids" in batch
        if per_rollout_batch and segments.is_per_rollout(algo.advantage):
            estimate = segments.per_rollout_advantages(
                estimator, token_rewards, mask, batch["group_ids"], batch["rollout_ids"],
                num_groups=num_groups, params=algo)
        else:
            estimate = estimator(token_rewards, mask, batch["group_ids"], values,
                                 num_groups=num_groups, params=algo, **turns)
        batch["advantages"] = estimate.advantages
        if estimate.returns is not None:
            batch["returns"] = estimate.returns
        metrics.update(estimate.metrics or {})
        if distill_coef:
            teacher, _ = per_token(
                lambda b: teacher_logprob_fn(teacher_params, b, temperature), batch)
            teacher = jax.lax.stop_gradient(teacher)
            signal = distillation.distill_advantages(teacher, current, action)
            batch["advantages"] = distillation.combine(
                batch["advantages"], signal, mask, coef=distill_coef,
                task_weight=algo.distill_task_weight)
            metrics.update(distillation.distill_metrics(teacher, current, action))
        metrics["advantage_abs_mean"] = masked_mean(jnp.abs(batch["advantages"]), mask)
        batch["loss_mask"], mask_metrics = rollout_correction.rejection_mask(
            current, behavior, action, mask, batch["advantages"], masks=masks,
            thresholds=thresholds)
        metrics.update(mask_metrics)
        if per_rollout_batch:  # the tokens the loss reads: after the rejection masks
            batch["rollout_tokens"] = segments.rollout_tokens(batch["loss_mask"],
                                                              batch["rollout_ids"])
        return batch, metrics

    return prepare
