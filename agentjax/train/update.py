"""The jitted update: `update(state, batch) -> (state, metrics)`.

One pure function does PPO epochs x minibatches x micro-batches:

    for epoch:                       shuffle rows (state.rng)
      for minibatch:                 one optimizer step
        norm = loss_norm(minibatch)  global denominators of the whole minibatch
        grads = sum over micro-batches of grad(loss)(params, micro, norm)

Because every micro-batch loss divides by the minibatch's global token / sequence
counts (`agentjax.rl.aggregation.LossNorm`), the summed gradient equals the
full-minibatch gradient exactly (up to float rounding), unlike dividing each micro-batch
by its own token count. The same machinery runs every `LossFn` of `agentjax.rl.objectives`:
the RL objective, the critic's value loss, the SFT loss and DPO on pairs (whose global
denominator is the pair count, `objectives.pair_norm`); only `loss_fn` (and `norm_fn`)
differ.

Micro-batches are either `micro_batches` equal row slices (`algo.microbatch_size`), or,
with a token budget `micro_tokens` (`algo.micro_tokens`), the minibatch's episodes packed
into micro-batches of micro_tokens // T rows of length T (`agentjax.rl.token_packing`:
first-fit decreasing, several episodes per row as separate segments, each whole in one
micro-batch), so short episodes stop paying for the longest one's padding. Their count
is static (ceil(rows / (micro_tokens // T))); those left empty are skipped (`lax.cond`)
and the `micro_batches` metric counts the others, `micro_fill` the fraction of their
positions holding tokens. The loss stays exact: the model's outputs go back to the rows
and the row losses run unchanged on the micro-batch's episodes, with the global norm.

With LoRA (models/lora.py) `TrainState.params` holds a frozen base and float32
adapters: gradients and optimizer state exist for the adapters only (the loss sees the
base as a constant), and `split_frozen` / `with_frozen` let the jitted update and the
checkpoints leave the base out (it is neither donated nor saved: whoever loaded it keeps
it, and a resumed run restores adapters onto the very base it trained over).

A batch is a dict of [B, T] / [B] arrays as `agentjax.core.trajectory.collate`
makes them, plus what `agentjax.rl.prepare` adds (old_logp, ref_logp, advantages, ...).
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import chex
import flax
import jax
import jax.numpy as jnp
import optax
from flax import nnx

from agentjax.models.lora import has_adapters, join_adapters, split_adapters
from agentjax.rl import token_packing
from agentjax.rl.aggregation import for_rows, loss_norm
from agentjax.rl.objectives import LossFn, NormFn


@flax.struct.dataclass
class TrainState:
    """Everything the update changes, as one pytree (checkpointed as a whole).

    Attributes:
      step: number of updates applied.
      params: policy params (`nnx.split(model)[1]`): the float32 master weights,
        whatever the model's compute dtype (the decoder casts them to `config.dtype`
        at use, as MaxText and levanter keep float32 masters under bfloat16 compute).
      opt_state: optax state of the policy optimizer (float32, like the params).
        With LoRA: the frozen base in the compute dtype and the float32 adapters.
      opt_state: optax state of the policy optimizer (float32, like the params; the
        adapters' only with LoRA).
      rng: PRNG key for shuffling minibatches (and anything else stochastic).
      critic_params / critic_opt_state: the PPO critic (None for critic-free methods).
        With LoRA, the critic's adapters and value head: its trunk is the policy's
        frozen base (`critic_join`).
      ref_params: the frozen reference policy of the KL term (None without KL, and with
        LoRA, whose reference is the base with the adapters off); kept in the state so a
        resumed run has it without knowing where it came from.
    """

    step: jax.Array
    params: Any
    opt_state: Any
    rng: jax.Array
    critic_params: Any = None
    critic_opt_state: Any = None
    ref_params: Any = None

    def split_frozen(self) -> tuple["TrainState", Any]:
        """(this state without the frozen LoRA base, the base); (self, None) without
        LoRA."""
        if not has_adapters(self.params):
            return self, None
        adapters, base = split_adapters(self.params)
        return self.replace(params=adapters), base

    def with_frozen(self, base: Any) -> "TrainState":
        """The inverse of `split_frozen`."""
        return self if base is None else self.replace(params=join_adapters(self.params, base))


def split_frozen(state: Any) -> tuple[Any, Any]:
    """(state, None) for any pytree, or a LoRA TrainState's (state without its frozen
    base, the base)."""
    split = getattr(state, "split_frozen", None)
    return (state, None) if split is None else split()


def with_frozen(state: Any, base: Any) -> Any:
    """The inverse of `split_frozen`."""
    return state if base is None else state.with_frozen(base)


def critic_join(critic_trainable: Any, base: Any) -> Any:
    """The state of a LoRA critic (models.value.ValueModel over the policy's decoder)
    from its trainable part (trunk adapters, value head) and the policy's frozen base."""
    return join_adapters(critic_trainable, {"trunk": base})


def critic_split(critic_state: Any) -> Any:
    """The trainable part of a LoRA critic's state: all but its trunk's frozen base."""
    trainable, _ = nnx.split_state(
        critic_state, nnx.Any(nnx.LoRAParam, nnx.Not(nnx.PathContains("trunk"))), ...)
    return trainable


def init_opt_state(optimizer: optax.GradientTransformation, params: Any) -> Any:
    """The optimizer state of `params`: the adapters' alone with LoRA."""
    return optimizer.init(split_adapters(params)[0] if has_adapters(params) else params)


def make_optimizer(lr: float, *, total_steps: int, warmup_steps: int = 0,
                   schedule: str = "constant", weight_decay: float = 0.0, b1: float = 0.9,
                   b2: float = 0.99, grad_clip: float = 0.0) -> optax.GradientTransformation:
    """AdamW with linear warmup, then constant or cosine decay, and global-norm clipping.

    Args:
      lr: peak learning rate.
      total_steps: optimizer steps of the run (cosine decays to 0 at the end).
      warmup_steps: linear warmup steps from 0.
      schedule: "constant" or "cosine".
      weight_decay: decoupled weight decay.
      b1, b2: Adam betas.
      grad_clip: clip the global gradient norm to this (0 disables).
    """
    if schedule == "cosine":
        # At least one step of decay after the (at least one) warmup step: optax refuses
        # a zero-length decay, which a one-step run would otherwise ask for.
        warmup = max(warmup_steps, 1)
        lr_schedule = optax.warmup_cosine_decay_schedule(
            0.0, lr, warmup, max(total_steps, warmup + 1))
    elif schedule == "constant":
        lr_schedule = optax.join_schedules(
            [optax.linear_schedule(0.0, lr, max(warmup_steps, 1)), optax.constant_schedule(lr)],
            [max(warmup_steps, 1)]) if warmup_steps else optax.constant_schedule(lr)
    else:
        raise ValueError(f"schedule must be 'constant' or 'cosine', got {schedule!r}")
    chain = [optax.clip_by_global_norm(grad_clip)] if grad_clip else []
    chain.append(optax.adamw(lr_schedule, b1=b1, b2=b2, weight_decay=weight_decay))
    return optax.chain(*chain)


def _rows(batch: dict, index: jax.Array) -> dict:
    return {k: jnp.asarray(v)[index] for k, v in batch.items()}


def _split(batch: dict, parts: int) -> dict:
    return {k: v.reshape(parts, v.shape[0] // parts, *v.shape[1:]) for k, v in batch.items()}


def _summed_grads(micro_grad, params: Any, xs):
    """Scans `micro_grad(x) -> ((loss, metrics), grads)` over xs: (loss, grads) summed,
    metrics stacked."""

    def body(total, x):
        (loss, metrics), grads = micro_grad(x)
        return jax.tree.map(jnp.add, total, (loss, grads)), metrics

    zeros = (jnp.zeros((), jnp.float32), jax.tree.map(jnp.zeros_like, params))
    return jax.lax.scan(body, zeros, xs)


def _combined_metrics(metrics: dict, ran: jax.Array) -> dict:
    """Stacked micro-batch metrics as one: loss terms carry global denominators and add
    up; the rest are means over the micro-batches that ran (`ran` [count] bool)."""
    weights = ran.astype(jnp.float32)
    runs = jnp.maximum(weights.sum(), 1.0)
    return {k: v.sum() if k.endswith("loss") else (v * weights).sum() / runs
            for k, v in metrics.items()}


def _token_micro_grads(grad_fn, params: Any, batch: dict, norm: Any, micro_tokens: int):
    """`accumulate_grads` over the minibatch's episodes packed into micro-batches of
    micro_tokens // T rows of its length T (module docstring)."""
    chex.assert_rank([batch["segment_ids"], batch["loss_mask"]], 2)
    plan = token_packing.token_micro_batches(batch, micro_tokens)
    micro, count, used = plan.micro, plan.count, plan.used
    skipped = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype),
                           jax.eval_shape(grad_fn, params, micro(0), norm))

    def micro_grad(index):
        return jax.lax.cond(index < used, lambda: grad_fn(params, micro(index), norm),
                            lambda: skipped)

    (loss, grads), metrics = _summed_grads(micro_grad, params, jnp.arange(count))
    metrics = _combined_metrics(metrics, jnp.arange(count) < used)
    tokens = (batch["segment_ids"] != 0).sum()
    positions = used * plan.rows_per_micro * batch["segment_ids"].shape[1]
    metrics.update(micro_batches=used.astype(jnp.float32),
                   micro_fill=tokens / jnp.maximum(positions, 1))
    return loss, grads, metrics


def accumulate_grads(loss_fn: LossFn, params: Any, batch: dict, *, micro_batches: int,
                     micro_tokens: int = 0, norm_constant: float | None = None,
                     norm_fn: NormFn | None = None):
    """Gradient of `batch`'s loss, summed over `micro_batches` equal row slices, or with
    `micro_tokens` over micro-batches of its episodes packed by that token budget.

    Every micro-batch is normalized by the global norm of the whole `batch` (`norm_fn`;
    None: the LossNorm of its loss_mask), so the result equals
    `grad(loss_fn)(params, batch, norm)` up to float rounding. Token micro-batches need a
    `loss_fn` that runs its model through `token_packing.forward_rows` and reads it only
    on `loss_mask` tokens (`objectives.rl_loss`, `objectives.value_loss_fn`), and a
    loss_mask of 0 on padding.

    Returns:
      (loss, grads, metrics): summed loss and grads; metrics named "*loss" summed (they
      are additive terms of the loss), the others averaged over micro-batches (token
      micro-batches: those that ran), plus `micro_batches` and `micro_fill` with tokens.
    """
    if micro_tokens and micro_batches != 1:
        raise ValueError(f"micro-batches by tokens (micro_tokens={micro_tokens}) or by rows "
                         f"(micro_batches={micro_batches}), not both")
    norm = (norm_fn(batch) if norm_fn is not None
            else loss_norm(batch["loss_mask"], constant=norm_constant,
                           rollout_tokens=batch.get("rollout_tokens")))
    # A micro-batch's rows read their own rollouts' token counts (rl/segments.py).
    value_and_grad = jax.value_and_grad(loss_fn, has_aux=True)

    def grad_fn(params, micro, norm):
        return value_and_grad(params, micro, for_rows(norm, micro))

    if micro_tokens:
        return _token_micro_grads(grad_fn, params, batch, norm, micro_tokens)
    if micro_batches == 1:
        (loss, metrics), grads = grad_fn(params, batch, norm)
        return loss, grads, metrics
    (loss, grads), metrics = _summed_grads(lambda micro: grad_fn(params, micro, norm), params,
                                           _split(batch, micro_batches))
    return loss, grads, _combined_metrics(metrics, jnp.ones((micro_batches,), bool))


def _global_norm(tree: Any) -> jax.Array:
    """sqrt of the sum of squares of every leaf, accumulated in float32 (a bfloat16 sum
    of squares would round away the small leaves)."""
    return jnp.sqrt(sum(jnp.sum(jnp.square(x.astype(jnp.float32)))
                        for x in jax.tree.leaves(tree)))


def _as_stored(x: jax.Array) -> jax.Array:
    """x's value as its dtype stores it, in (at least) float32. XLA may drop a
    float32 -> bfloat16 -> float32 conversion pair inside one program (excess precision
    is allowed by default), which would hide the rounding this measures; reduce_precision
    rounds explicitly (a no-op for float32)."""
    info = jnp.finfo(x.dtype)
    wide = x.astype(jnp.promote_types(x.dtype, jnp.float32))
    return jax.lax.reduce_precision(wide, exponent_bits=info.nexp, mantissa_bits=info.nmant)


def update_size_metrics(old: Any, new: Any, updates: Any) -> dict[str, jax.Array]:
    """How far one optimizer step moved the stored params, relative to their size.

    `update/rel_size` = ||new - old|| / ||old|| is what the step actually changed after
    the update was added to (and rounded into) the params' storage dtype;
    `update/intended_rel_size` = ||updates|| / ||old|| is what the optimizer asked for.
    The two agree while the update is well above the storage precision (half an ulp:
    2^-24 of a float32 weight, 2^-9 of a bfloat16 one); when the update rounds away
    (bfloat16 weights at lr 1e-6) rel_size drops far below the intended size, which
    `diagnostics.failure_warnings` reports. Global norms, so the cost is three
    reductions over the params, fused into the step.
    """
    size = jnp.maximum(_global_norm(old), jnp.finfo(jnp.float32).tiny)
    moved = jax.tree.map(lambda n, o: _as_stored(n) - _as_stored(o), new, old)
    return {"update/rel_size": _global_norm(moved) / size,
            "update/intended_rel_size": _global_norm(updates) / size}


def epoch_minibatch_steps(loss_fn: LossFn, optimizer: optax.GradientTransformation,
                          params: Any, opt_state: Any, batch: dict, rng: jax.Array, *,
                          epochs: int, minibatches: int, micro_batches: int,
                          micro_tokens: int = 0, norm_constant: float | None = None,
                          norm_fn: NormFn | None = None, shuffle: bool = True,
                          frozen: Any = None, join: Callable[[Any, Any], Any] | None = None):
    """Runs `epochs` passes over `batch` in `minibatches` optimizer steps each, each
    accumulated over micro-batches (`accumulate_grads`). With `join`, `params` are the
    trainable part and the loss sees `join(params, frozen)` (frozen: a constant, no
    gradient, no optimizer state).

    Returns:
      (params, opt_state, metrics) with metrics averaged over all optimizer steps,
      plus `grad_norm`, `loss`, the relative update sizes of `update_size_metrics` and
      `nonfinite_updates` (the fraction of optimizer steps not applied because their
      loss, gradient or new params were not finite).
    """
    rows = next(iter(batch.values())).shape[0]
    if join is not None:
        full_loss_fn = loss_fn

        def loss_fn(trainable, micro, norm):
            return full_loss_fn(join(trainable, frozen), micro, norm)

    def one_step(carry, index):
        params, opt_state = carry
        loss, grads, metrics = accumulate_grads(
            loss_fn, params, _rows(batch, index), micro_batches=micro_batches,
            micro_tokens=micro_tokens, norm_constant=norm_constant, norm_fn=norm_fn)
        updates, new_opt_state = optimizer.update(grads, opt_state, params)
        new_params = optax.apply_updates(params, updates)
        grad_norm = optax.tree.norm(grads)
        # A non-finite loss or gradient (or an update that overflows the weights) is
        # never applied: one bad batch must not turn every weight into NaN.
        finite = (jnp.isfinite(loss) & jnp.isfinite(grad_norm)
                  & jnp.isfinite(optax.tree.norm(new_params)))
        new_params, new_opt_state = jax.tree.map(
            lambda new, old: jnp.where(finite, new, old),
            (new_params, new_opt_state), (params, opt_state))
        metrics = {**metrics, "loss": loss, "grad_norm": grad_norm,
                   "nonfinite_updates": 1.0 - finite.astype(jnp.float32),
                   **update_size_metrics(params, new_params, updates)}
        return (new_params, new_opt_state), metrics

    def order(key):
        return jax.random.permutation(key, rows) if shuffle else jnp.arange(rows)

    keys = jax.random.split(rng, epochs)
    indices = jax.vmap(order)(keys).reshape(epochs * minibatches, rows // minibatches)
    (params, opt_state), metrics = jax.lax.scan(one_step, (params, opt_state), indices)
    return params, opt_state, jax.tree.map(jnp.mean, metrics)


def build_update(policy_loss_fn: LossFn, optimizer: optax.GradientTransformation, *,
                 epochs: int, minibatches: int, micro_batches: int, micro_tokens: int = 0,
                 norm_constant: float | None = None, critic_loss_fn: LossFn | None = None,
                 critic_optimizer: optax.GradientTransformation | None = None,
                 critic_warmup_steps: int = 0, norm_fn: NormFn | None = None,
                 shuffle: bool = True):
    """Returns the pure `update(state, batch) -> (state, metrics)` (jit it with shardings).

    `norm_fn` gives the policy loss's global denominators (default: the LossNorm of the
    batch's loss_mask, with `norm_constant`). Micro-batches: `micro_batches` row slices,
    or with `micro_tokens` > 0 packed episodes of that token budget (`accumulate_grads`).

    With a critic, the critic is updated on the same minibatch schedule; during the
    first `critic_warmup_steps` updates only the critic learns (the policy is frozen).
    Metrics: the policy's (loss terms, `grad_norm`, `update/rel_size`,
    `update/intended_rel_size`) and the critic's under `critic/`.

    With LoRA (state.params has adapters), only the policy's adapters train (the
    optimizer state is theirs, `init_opt_state`), over the base in state.params, and the
    critic's state is its trainable part (`critic_join`): sizes and norms are the
    adapters'.
    """
    steps = functools.partial(epoch_minibatch_steps, epochs=epochs, minibatches=minibatches,
                              micro_batches=micro_batches, micro_tokens=micro_tokens,
                              norm_constant=norm_constant, shuffle=shuffle)

    def update(state: TrainState, batch: dict):
        rng, policy_key, critic_key = jax.random.split(state.rng, 3)
        metrics = {}
        new_state = state.replace(step=state.step + 1, rng=rng)
        trained, base = state.split_frozen()
        lora = base is not None
        if critic_loss_fn is not None:
            critic_params, critic_opt, critic_metrics = steps(
                critic_loss_fn, critic_optimizer, state.critic_params,
                state.critic_opt_state, batch, critic_key, frozen=base,
                join=critic_join if lora else None)
            metrics.update({f"critic/{k}": v for k, v in critic_metrics.items()})
            new_state = new_state.replace(critic_params=critic_params,
                                          critic_opt_state=critic_opt)
        params, opt_state, policy_metrics = steps(
            policy_loss_fn, optimizer, trained.params, state.opt_state, batch, policy_key,
            norm_fn=norm_fn, frozen=base, join=join_adapters if lora else None)
        if critic_warmup_steps:
            frozen = state.step < critic_warmup_steps
            params = jax.tree.map(lambda new, old: jnp.where(frozen, old, new),
                                  params, trained.params)
            opt_state = jax.tree.map(lambda new, old: jnp.where(frozen, old, new),
                                     opt_state, state.opt_state)
            # A frozen policy neither moved nor was asked to.
            for key in ("update/rel_size", "update/intended_rel_size"):
                policy_metrics[key] = jnp.where(frozen, 0.0, policy_metrics[key])
        metrics.update(policy_metrics)
        new_state = new_state.replace(params=params, opt_state=opt_state)
        return new_state.with_frozen(base), metrics

    return update
