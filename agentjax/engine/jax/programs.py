"""The JaxEngine's device side: its jitted programs, its copy of the weights, its page
pool placement and the count of the programs' compilations.

Static shapes, so XLA compiles a bounded set of programs once:
- A pool of fixed-size KV pages shared by every sequence (`models/paged.py`). The host
  decides which pages each sequence holds; a call gets flat write indices and a work
  list of (row, page) attention items, padded to a bucketed length, so its attention
  costs the tokens its rows hold. The programs run the model's layers unrolled over the
  engine's per-layer copy of the weights (`Decoder.layerwise_weights`): on CPU, slicing
  a layer out of stacked weights inside a layer scan copies it.
- `prefill` writes a right-padded [R, C] chunk of each row's context into its pages.
  It samples nothing: a sequence's last context token is fed by its first decode step
  (as every sampled token is fed by the next one), whose logits give the first sample.
- `decode` runs `num_steps` single-token steps in a `lax.scan`; rows stop on device at a
  stop id or their token budget, so the host syncs once per `num_steps` tokens. With the
  pure-JAX attention it gathers its rows' pages once (`paged.gather_view`), the steps
  attend over that view, and the tokens they wrote are copied to the pool at the end.
  It also returns a `DecodeCarry` (each row's last token and whether it may go on), so
  the next call can be dispatched before the host has read this one's tokens: its rows
  take their last token and liveness from the carry (`src`).

The programs are module-level jitted functions, shared by every engine with the same
model and shapes. Their compilations are counted by `core/compiles.py`, each under its
shape bucket (rows, chunk width, attention items, decode steps), read from the
arguments of the call that compiled it.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from agentjax.core import compiles
from agentjax.models.config import ModelConfig
from agentjax.models.decoder import LayerwiseWeights
from agentjax.models.paged import (AttentionItems, PagedKVCache, ViewItems, copy_slots,
                                   gather_view, init_paged_cache, view_index)
from agentjax.engine.jax.sampling import sample

# The engine's programs: their compilations so far by name, process-wide (a recompile
# for new argument shardings or committedness counts too).
PROGRAMS = ("prefill", "decode", "copy_pages")
COMPILE_COUNTS = compiles.FunctionCounts(PROGRAMS)


def _bucketed(fields: Callable[..., dict]):
    """The jitted program's calls counted under the bucket `fields` gives for the
    call's arguments (`compiles.bucket`)."""
    def wrap(program):
        @functools.wraps(program)
        def call(*args, **kwargs):
            with compiles.bucket(**fields(*args, **kwargs)):
                return program(*args, **kwargs)
        return call
    return wrap


def _item_count(items) -> int:
    """Attention items of a call; 0 with block tables (their width is fixed)."""
    return items.row.shape[0] if isinstance(items, AttentionItems) else 0


@functools.partial(jax.jit, static_argnames=("graphdef",))
def engine_weights(graphdef: nnx.GraphDef, params: Any) -> LayerwiseWeights:
    """The engine's copy of the weights: the layer stack split per layer, cast to the
    compute dtype (`Decoder.layerwise_weights`; float32 master params make a bfloat16
    copy, half their size). Every leaf is a fresh buffer, even one the program would
    pass through unchanged, so the caller may donate `params` afterwards."""
    return jax.tree.map(jnp.copy, nnx.merge(graphdef, params).layerwise_weights())


@_bucketed(lambda weights, cache, tokens, slots, write, items: dict(
    rows=tokens.shape[0], chunk=tokens.shape[1], items=_item_count(items)))
@functools.partial(jax.jit, donate_argnames=("cache",))
def prefill(weights: LayerwiseWeights, cache: PagedKVCache, tokens, slots, write,
            items: AttentionItems) -> PagedKVCache:
    """Writes a right-padded chunk per row (tokens, slots and write indices [R, C]; -1
    marks padding) into the pool; returns the pool."""
    _, cache = weights.forward(tokens, slots, write, cache, items)
    return cache


class DecodeCarry(NamedTuple):
    """What a decode call leaves for the next one, per row of a [max_slots] table (a
    call's row r at index r): its last token, and `live` — it was active and did not
    sample a stop id (so it goes on if the host gives it a budget)."""

    last: jax.Array  # [max_slots] int32
    live: jax.Array  # [max_slots] bool

    @classmethod
    def empty(cls, max_slots: int) -> "DecodeCarry":
        return cls(np.zeros(max_slots, np.int32), np.zeros(max_slots, bool))


@_bucketed(lambda weights, cache, lengths, last_tokens, active, write, items, *args,
           num_steps: dict(rows=lengths.shape[0], items=_item_count(items), steps=num_steps))
@functools.partial(jax.jit, static_argnames=("num_steps",), donate_argnames=("cache",))
def decode(weights: LayerwiseWeights, cache: PagedKVCache, lengths, last_tokens, active,
           write, items: AttentionItems, keys, steps, budget, stop_ids, temperature,
           top_k, top_p, carry: DecodeCarry, src, *, num_steps):
    """`num_steps` single-token steps. An active row feeds its last token at slot
    lengths[r] (flat pool index write[r, i] at its i-th step) and samples the next; it
    stops after sampling a stop id or exhausting its budget (the host keeps budgets
    within the pages it gave the row and its max_len). A row with src[r] >= 0 continues
    row src[r] of the previous call: its last token is carry.last[src[r]] (last_tokens
    is ignored) and it is active only if carry.live[src[r]].

    Returns (pool, tokens [R, num_steps], logprobs [R, num_steps], emitted [R, num_steps]
    bool — whether the row was active and sampled at that step —, the DecodeCarry)."""
    continued = src >= 0
    from_carry = jnp.maximum(src, 0)
    last_tokens = jnp.where(continued, carry.last[from_carry], last_tokens)
    active = active & (budget > 0) & jnp.where(continued, carry.live[from_carry], True)

    # The pure-JAX attention reads the rows' pages from a view gathered once per call;
    # the steps write into the view, and the new tokens go to the pool at the end.
    pool, first_lengths = cache, lengths
    on_view = isinstance(items, AttentionItems)
    if on_view:
        cache, items = gather_view(pool, items), ViewItems.of(items, lengths.shape[0])

    def step(state, write_now):
        cache, lengths, tokens, active, stopped, steps, budget = state
        slots = jnp.where(active, lengths, -1)[:, None]
        write_now = (view_index(items, slots, cache.page_size) if on_view
                     else jnp.where(active, write_now, -1)[:, None])
        hidden, cache = weights.forward(tokens[:, None], slots, write_now, cache, items)
        new, logprobs = sample(weights.logits(hidden)[:, 0], keys, steps, temperature, top_k,
                               top_p)
        emitted = active
        budget = budget - emitted
        hit_stop = emitted & jnp.any(new[:, None] == stop_ids, axis=1)
        lengths = lengths + emitted
        tokens = jnp.where(emitted, new, tokens)
        active = active & ~hit_stop & (budget > 0)
        state = (cache, lengths, tokens, active, stopped | hit_stop, steps + emitted, budget)
        return state, (new, logprobs, emitted)

    state = (cache, lengths, last_tokens, active, jnp.zeros_like(active), steps, budget)
    (cache, _, last, _, stopped, *_), (tokens, logprobs, emitted) = jax.lax.scan(
        step, state, write.T, length=num_steps)
    rows = lengths.shape[0]
    carry = DecodeCarry(last=carry.last.at[:rows].set(last),
                        live=jnp.zeros_like(carry.live).at[:rows].set(active & ~stopped))
    tokens, logprobs, emitted = tokens.T, logprobs.T, emitted.T
    if on_view:  # a row's emitted steps are a prefix: step i wrote slot lengths + i
        slots = jnp.where(emitted, first_lengths[:, None] + jnp.arange(num_steps)[None], -1)
        cache = copy_slots(cache, view_index(items, slots, cache.page_size), pool,
                           jnp.where(emitted, write, -1))
    return cache, tokens, logprobs, emitted, carry


@_bucketed(lambda cache, src, dst: dict(copies=src.shape[0]))
@functools.partial(jax.jit, donate_argnames=("cache",))
def copy_pages(cache: PagedKVCache, src, dst) -> PagedKVCache:
    """Copy-on-write: pages src[i] -> dst[i] (dst out of range: skipped)."""
    return cache.copy_pages(src, dst)


def new_cache(weights: LayerwiseWeights, config: ModelConfig, num_pages: int,
              page_size: int, dtype, key_layout: str = "hd_page") -> PagedKVCache:
    """An empty pool placed beside the weights: on their mesh by the rules their model
    was sharded with (so the programs take keys and values where the weights' shardings
    produce them), else on their device."""
    cache = init_paged_cache(config, num_pages, page_size, dtype, key_layout)
    placement = mesh_and_rules(weights)
    if placement is None:
        sharding = jax.tree.leaves(weights)[0].sharding
        if not isinstance(sharding, jax.sharding.NamedSharding):
            return jax.device_put(cache, next(iter(sharding.device_set)))
        # Weights on a one-device mesh (`create_sharded`, `load_hf(mesh=...)`): the
        # programs return the pool with a sharding on that mesh, so it starts there too
        # (on a plain device the second call would compile every program again).
        placement = (sharding.mesh, None)
    from agentjax.core.parallel import tree_shardings
    axes = PagedKVCache.logical_axes(config.num_layers, key_layout)
    return jax.device_put(cache, tree_shardings(axes, cache, *placement))


def carry_sharding(cache: PagedKVCache) -> jax.sharding.Sharding:
    """Where a DecodeCarry lives: replicated on the pool's mesh, or on its device."""
    sharding = jax.tree.leaves(cache)[0].sharding
    if isinstance(sharding, jax.sharding.NamedSharding):
        return jax.sharding.NamedSharding(sharding.mesh, jax.sharding.PartitionSpec())
    return jax.sharding.SingleDeviceSharding(next(iter(sharding.device_set)))


def mesh_and_rules(weights: LayerwiseWeights):
    """(mesh, rules) of weights that span a multi-device mesh, else None.

    The model's own LogicalSharding (set by `parallel.shard_model`, `create_sharded` and
    `load_hf(mesh=...)`) gives the rules its params were placed by; weights put on a mesh
    without one (`parallel.shard_params` alone) are taken to follow the default rules
    (None). Every leaf is looked at, not only the first.
    """
    model_sharding = weights.activation_sharding
    if model_sharding is not None and model_sharding.mesh.size > 1:
        return model_sharding.mesh, model_sharding.rules
    for leaf in jax.tree.leaves(weights):
        sharding = getattr(leaf, "sharding", None)
        if isinstance(sharding, jax.sharding.NamedSharding) and sharding.mesh.size > 1:
            return sharding.mesh, None
    return None
