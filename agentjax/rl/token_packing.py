"""Micro-batches by token budget: a minibatch's episodes packed into rows, inside jit.

A minibatch [b, T] holds one episode per row (`core.trajectory.collate`: its real tokens,
segment_ids != 0, are one contiguous run; padding may be on either side), every row
padded to the longest episode T. Micro-batches of rows then run b x T positions through
the model however short the episodes are: one 32k-token episode among a hundred of 300
tokens costs 101 x 32k. Packing instead places the episodes first-fit decreasing into
packed rows of length T, several per row as segments 1, 2, ... (every token keeps its
RoPE position), which the decoder keeps apart (a token attends only within its segment),
so each episode's outputs are those of its own row. Micro-batch k is packed rows
[k R, (k + 1) R) for R = rows_per_micro:

    plan = plan_packing(minibatch["segment_ids"])            where each episode goes
    packed = pack(minibatch, plan, rows=count * R)            [count * R, T] model inputs
    micro = micro_batch(minibatch, packed, plan, k, R)       the minibatch's rows with the
                                                             loss_mask of micro-batch k's
                                                             episodes and its packed rows
    logp, entropy = forward_rows(forward, micro)             model outputs back in [b, T]

The losses then run unchanged on the [b, T] rows: each episode lies whole in one
micro-batch and the global denominators (`aggregation.LossNorm`) are the minibatch's, so
the micro-batch losses, sequence-level terms included (seq-mean-token-mean, GSPO's
sequence ratio), add up to the minibatch's. Shapes are static: `count` is an upper bound
(ceil(b / R)) and `plan.num_rows` says how many packed rows hold episodes (a prefix:
first fit opens rows in order).
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from agentjax.rl import _common

# The model's inputs: what a packed micro-batch carries for the forward pass.
MODEL_KEYS = ("inputs", "positions", "segment_ids", "targets")
# The key of a micro-batch's `PackedMicro`; a batch without it is in row layout.
PACKED = "packed"


class PackPlan(NamedTuple):
    """Where each episode (row) of a [b, T] minibatch goes in the packed rows.

    Row i's token t lands in packed row `rows[i]`, column `t + shift[i]`, as segment
    `segments[i]` of that row. Empty rows (no real token) place nothing.
    """

    rows: jax.Array  # [b] int32
    shift: jax.Array  # [b] int32
    segments: jax.Array  # [b] int32, from 1 within each packed row
    num_rows: jax.Array  # int32 scalar: packed rows holding at least one episode


class PackedMicro(NamedTuple):
    """One micro-batch's packed model inputs and the way back to the minibatch's rows.

    `tokens` [b, T] marks the real tokens of the episodes in this micro-batch (in row
    layout); such a token of row i is at packed row `rows[i]`, column t + `shift[i]`.
    """

    inputs: dict  # MODEL_KEYS -> [R, T] int32
    rows: jax.Array  # [b] int32, in [0, R)
    shift: jax.Array  # [b] int32
    tokens: jax.Array  # [b, T] bool


def plan_packing(segment_ids: jax.Array) -> PackPlan:
    """First-fit decreasing packing of a minibatch's episodes into rows of its length T.

    Longest first (a stable sort, so equal lengths keep row order), each episode goes to
    the first packed row with room for it; long episodes placed first leave the gaps
    that short ones fill. b packed rows always suffice (each episode fits one).

    Args:
      segment_ids: [b, T] int; nonzero on each row's episode, one contiguous run.

    Returns:
      the PackPlan.
    """
    _common.check_rank("segment_ids", segment_ids, 2)
    _common.check_integer("segment_ids", segment_ids)
    rows, length = segment_ids.shape
    real = segment_ids != 0
    sizes = real.sum(axis=1, dtype=jnp.int32)
    starts = jnp.argmax(real, axis=1).astype(jnp.int32)  # 0 for an empty row
    order = jnp.argsort(-sizes, stable=True)

    def place(carry, size):
        fill, count = carry
        target = jnp.argmax(fill + size <= length)  # the first row with room
        segment = count[target] + 1
        carry = (fill.at[target].add(size), count.at[target].add((size > 0).astype(jnp.int32)))
        return carry, (target.astype(jnp.int32), fill[target], segment)

    empty = jnp.zeros((rows,), jnp.int32)
    (fill, _), placed = lax.scan(place, (empty, empty), sizes[order])
    # Back from longest-first order to row order.
    target, offset, segment = (x[jnp.argsort(order)] for x in placed)
    return PackPlan(rows=target, shift=offset - starts, segments=segment,
                    num_rows=(fill > 0).sum(dtype=jnp.int32))


def pack(batch: dict, plan: PackPlan, *, rows: int) -> dict:
    """The model inputs (`MODEL_KEYS`) of `batch` [b, T] packed into [rows, T] by `plan`.

    Positions are kept (RoPE sees each token where it was); segment_ids become each
    episode's segment in its packed row; unfilled positions are 0 (padding). A batch's
    `loss_mask` is packed too.

    Args:
      batch: the minibatch, with MODEL_KEYS [b, T] int arrays.
      plan: `plan_packing(batch["segment_ids"])`.
      rows: packed rows to build (>= plan.num_rows; the rest stay padding).
    """
    _common.check_tokens(**{k: batch[k] for k in MODEL_KEYS})
    segment_ids = batch["segment_ids"]
    length = segment_ids.shape[1]
    # Padding goes to row `rows`, out of range: the scatter drops it.
    dest_row = jnp.where(segment_ids != 0, plan.rows[:, None], rows)
    dest_col = jnp.arange(length, dtype=jnp.int32)[None, :] + plan.shift[:, None]

    def scatter(x):
        return jnp.zeros((rows, length), x.dtype).at[dest_row, dest_col].set(x, mode="drop")

    packed = {k: scatter(batch[k]) for k in MODEL_KEYS}
    packed["segment_ids"] = scatter(
        jnp.broadcast_to(plan.segments[:, None], segment_ids.shape).astype(segment_ids.dtype))
    if "loss_mask" in batch:  # where a loss reads the outputs (rl.logprobs: the lm-head)
        packed["loss_mask"] = scatter(batch["loss_mask"])
    return packed


def micro_batch(batch: dict, packed: dict, plan: PackPlan, index: jax.Array,
                rows_per_micro: int) -> dict:
    """Micro-batch `index`: `batch`'s rows with `loss_mask` kept on the episodes of
    packed rows [index R, (index + 1) R) only, and those rows as `batch[PACKED]`.

    Args:
      batch: the minibatch [b, T], with segment_ids and loss_mask.
      packed: `pack(batch, plan, rows=...)`.
      plan: the minibatch's PackPlan.
      index: int32 scalar (may be traced) micro-batch index.
      rows_per_micro: R, packed rows per micro-batch (static).
    """
    _common.check_tokens(segment_ids=batch["segment_ids"], loss_mask=batch["loss_mask"])
    first = index * rows_per_micro
    local = plan.rows - first
    inside = (local >= 0) & (local < rows_per_micro)
    tokens = (batch["segment_ids"] != 0) & inside[:, None]
    micro = PackedMicro(
        inputs={k: lax.dynamic_slice_in_dim(v, first, rows_per_micro) for k, v in packed.items()},
        rows=jnp.where(inside, local, 0), shift=plan.shift, tokens=tokens)
    return {**batch, "loss_mask": batch["loss_mask"] * tokens.astype(batch["loss_mask"].dtype),
            PACKED: micro}


def unpack(y: jax.Array, micro: PackedMicro) -> jax.Array:
    """Per-token outputs [R, T] of a micro-batch's packed rows in row layout [b, T]
    (0 outside the micro-batch's episodes)."""
    _common.check_rank("y", y, 2)
    length = y.shape[1]
    cols = jnp.clip(jnp.arange(length, dtype=jnp.int32)[None, :] + micro.shift[:, None],
                    0, length - 1)
    return jnp.where(micro.tokens, y[micro.rows[:, None], cols], 0)


class TokenMicroBatches(NamedTuple):
    """A minibatch's micro-batches by token budget: `micro(k)` for k < `count` (static),
    of which the first `used` (traced) hold episodes."""

    micro: Callable[[jax.Array], dict]
    count: int
    used: jax.Array
    rows_per_micro: int


def token_micro_batches(batch: dict, micro_tokens: int) -> TokenMicroBatches:
    """Plans and packs `batch` [b, T] into micro-batches of micro_tokens // T packed rows
    (module docstring). An episode must fit one micro-batch: micro_tokens >= T."""
    _common.check_rank("segment_ids", batch["segment_ids"], 2)
    rows, length = batch["segment_ids"].shape
    if micro_tokens < length:
        raise ValueError(f"micro_tokens={micro_tokens} is less than the batch length "
                         f"{length}: an episode must fit one micro-batch")
    # More packed rows than the minibatch has would only add padding.
    rows_per_micro = min(micro_tokens // length, rows)
    count = -(-rows // rows_per_micro)
    plan = plan_packing(batch["segment_ids"])
    packed = pack(batch, plan, rows=count * rows_per_micro)
    return TokenMicroBatches(
        micro=lambda index: micro_batch(batch, packed, plan, index, rows_per_micro),
        count=count, used=-(-plan.num_rows // rows_per_micro), rows_per_micro=rows_per_micro)


def map_token_micro_batches(fn: Callable[[dict], object], batch: dict, micro_tokens: int):
    """fn(batch) -> per-token outputs [b, T] (a pytree), computed micro-batch by
    micro-batch (`fn` must run its model through `forward_rows`, which leaves 0 outside
    a micro-batch's episodes): the forward passes of `rl.prepare` (old and reference
    log-probs, values) within the same token budget as the update."""
    plan = token_micro_batches(batch, micro_tokens)
    zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype),
                         jax.eval_shape(fn, plan.micro(jnp.int32(0))))

    def add(total, index):
        out = lax.cond(index < plan.used, lambda: fn(plan.micro(index)), lambda: zeros)
        return jax.tree.map(jnp.add, total, out), None

    total, _ = lax.scan(add, zeros, jnp.arange(plan.count))
    return total


def forward_rows(forward: Callable[[dict], object], batch: dict):
    """`forward(model_inputs)` -> a pytree of per-token outputs [rows, T], in `batch`'s
    row layout: run on the packed rows when `batch` is a token micro-batch (it has
    `PACKED`) and unpacked, else on `batch` itself."""
    micro = batch.get(PACKED)
    if micro is None:
        return forward(batch)
    return jax.tree.map(lambda y: unpack(y, micro), forward(micro.inputs))
