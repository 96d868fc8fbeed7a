"""The losses the update optimizes, built from a model: `loss_fn(params, batch, norm)`.

Each builder closes over a graphdef (and the config section it reads) and returns a
`LossFn` for `train.update.build_update`: `rl_loss` (the RL objective
`losses.rl_objective` of `config.algo`), `value_loss_fn` (the PPO critic's
`losses.value_loss`), `sft_loss` (masked next-token cross-entropy) and `dpo_loss` (the
preference loss of `rl.preference` on [P, 2, T] pairs, whose global denominator is the
pair count `pair_norm`). `norm` is the minibatch's global denominators (an
`aggregation.LossNorm`, or `pair_norm`'s count), the same for every micro-batch, so
micro-batch losses and gradients add up to the minibatch's. The model runs through
`token_packing.forward_rows`, so `rl_loss` and `value_loss_fn` also take a micro-batch
of episodes packed by token budget (`train.update`, `algo.micro_tokens`).
"""
from __future__ import annotations

import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
from flax import nnx

from agentjax.rl import preference, token_packing
from agentjax.rl.aggregation import aggregate, masked_mean
from agentjax.rl.logprobs import masked_token_logprobs, token_logprobs
from agentjax.rl.losses import rl_objective, value_loss
from agentjax.rl.policy_losses import policy_loss_hyperparameters

# (params, batch, norm) -> (loss, metrics): a scalar loss and scalar metrics.
LossFn = Callable[[Any, dict, Any], tuple[jax.Array, dict]]
# The global denominators of a batch a LossFn divides by (a LossNorm, or DPO's pair
# count), computed once for a whole minibatch.
NormFn = Callable[[dict], Any]


def policy_logprobs(graphdef: nnx.GraphDef, params: Any, batch: dict, *, chunk_size: int,
                    temperature: jax.Array | float = 1.0, positions_frac: float = 1.0):
    """(logp, entropy) [B, T] of `batch["targets"]` under the policy, at a temperature.

    Logits never materialize whole (`rl.logprobs.token_logprobs` chunks them); the
    temperature divides the hidden states (logits are linear in them), so a temperature
    schedule does not recompile. A token micro-batch runs on its packed rows
    (`token_packing.forward_rows`). `positions_frac` < 1: the lm-head runs only at
    `batch["loss_mask"]` positions, up to that share of a row
    (`rl.logprobs.masked_token_logprobs`; the same values there, 0 elsewhere).
    """

    def forward(rows):
        model = nnx.merge(graphdef, params)
        hidden, _ = model(rows["inputs"], rows["positions"], rows["segment_ids"])
        hidden = hidden / jnp.asarray(temperature, hidden.dtype)
        if positions_frac < 1:
            return masked_token_logprobs(
                hidden, model.lm_head_weight(), rows["targets"], rows["loss_mask"],
                chunk_size=chunk_size,
                positions=max(1, math.ceil(positions_frac * hidden.shape[1])))
        return token_logprobs(hidden, model.lm_head_weight(), rows["targets"],
                              chunk_size=chunk_size)

    return token_packing.forward_rows(forward, batch)


def sft_loss(graphdef: nnx.GraphDef, *, chunk_size: int,
             positions_frac: float = 1.0) -> LossFn:
    """Masked next-token cross-entropy on `batch["loss_mask"]` tokens (token-mean);
    `positions_frac` as `policy_logprobs`'."""

    def loss_fn(params, batch, norm):
        logp, entropy = policy_logprobs(graphdef, params, batch, chunk_size=chunk_size,
                                        positions_frac=positions_frac)
        mask = batch["loss_mask"]
        loss = aggregate(-logp, mask, "token-mean", norm=norm)
        return loss, {"nll": masked_mean(-logp, mask), "entropy": masked_mean(entropy, mask)}

    return loss_fn


def rl_loss(graphdef: nnx.GraphDef, algo: Any, *, chunk_size: int,
            positions_frac: float = 1.0) -> LossFn:
    """The policy objective `rl.losses.rl_objective` on the model's log-probs.

    Args:
      graphdef: the policy graphdef.
      algo: the `config.algo` section: the loss kind `algo.loss` and its hyperparameters
        (`algo.<name>` for each of `policy_loss_hyperparameters(algo.loss)`), agg,
        kl / entropy coefs, ...
      chunk_size: log-prob chunk length.
      positions_frac: as `policy_logprobs`' (the loss reads loss_mask positions only).

    The batch carries `loss_mask`, `old_logp`, `advantages` [B, T], `temperature` [B]
    (all rows equal), `ref_logp` when the KL is a loss term and `is_weights` [B, T] when
    truncated importance sampling corrects behavior-policy log-probs.
    """
    kind_params = {name: algo[name] for name in policy_loss_hyperparameters(algo.loss)}

    def loss_fn(params, batch, norm):
        logp, entropy = policy_logprobs(graphdef, params, batch, chunk_size=chunk_size,
                                        temperature=batch["temperature"][0],
                                        positions_frac=positions_frac)
        return rl_objective(
            logp, batch["old_logp"], batch["advantages"], batch["loss_mask"],
            ref_logp=batch.get("ref_logp"), entropy=entropy,
            is_weights=batch.get("is_weights"), kind=algo.loss, agg=algo.agg,
            kl_coef=algo.kl_coef, kl_kind=algo.kl_kind, kl_in_reward=algo.kl_in_reward,
            entropy_coef=algo.entropy_coef, norm=norm, **kind_params)

    return loss_fn


PAIR_KEYS = token_packing.MODEL_KEYS


def pair_logprobs(graphdef: nnx.GraphDef, params: Any, batch: dict, *,
                  chunk_size: int) -> jax.Array:
    """[P, 2, T] log-probs of pairs' tokens: batch arrays [P, 2, T] (chosen, rejected)
    run through the model as 2P rows at once."""
    shape = batch["targets"].shape
    rows = {k: batch[k].reshape(-1, shape[-1]) for k in PAIR_KEYS}
    logp, _ = policy_logprobs(graphdef, params, rows, chunk_size=chunk_size)
    return logp.reshape(shape)


def pair_norm(batch: dict) -> jax.Array:
    """DPO's global denominator: the counted pairs of the whole minibatch."""
    return preference.count_pairs(batch["loss_mask"][:, 0], batch["loss_mask"][:, 1])


def dpo_loss(graphdef: nnx.GraphDef, dpo: Any, *, chunk_size: int) -> LossFn:
    """The preference loss `rl.preference.dpo_loss` of `dpo.kind` on pairs.

    The batch holds [P, 2, T] arrays, index 0 the chosen and 1 the rejected trajectory:
    the model inputs, `loss_mask` (their action tokens) and `ref_logp` (the frozen
    reference's log-probs); the norm is `pair_norm` of the whole minibatch.
    """

    def loss_fn(params, batch, num_pairs):
        logp, ref, mask = (pair_logprobs(graphdef, params, batch, chunk_size=chunk_size),
                           batch["ref_logp"], batch["loss_mask"])
        loss, metrics = preference.dpo_loss(
            logp[:, 0], logp[:, 1], ref[:, 0], ref[:, 1], mask[:, 0], mask[:, 1],
            beta=dpo.beta, kind=dpo.kind, label_smoothing=dpo.label_smoothing,
            length_normalized=dpo.length_normalized, num_pairs=num_pairs)
        # Counts of a micro-batch would be averaged over micro-batches: left out.
        del metrics["num_pairs"]
        return loss, {f"dpo/{k}": v for k, v in metrics.items()}

    return loss_fn


def value_loss_fn(critic_graphdef: nnx.GraphDef, algo: Any) -> LossFn:
    """Clipped value loss of the critic on `loss_mask` tokens."""

    def loss_fn(critic_params, batch, norm):
        critic = nnx.merge(critic_graphdef, critic_params)
        values = token_packing.forward_rows(
            lambda rows: critic(rows["inputs"], rows["positions"], rows["segment_ids"]),
            batch)
        return value_loss(values, batch["old_values"], batch["returns"], batch["loss_mask"],
                          clip=algo.value_clip or None, agg=algo.agg, norm=norm)

    return loss_fn
