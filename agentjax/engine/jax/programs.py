"""The JaxEngine's device side: its jitted programs, its copy of the weights, its KV cache
placement and the count of the programs' compilations.

Static shapes, so XLA compiles a bounded set of programs once:
- A cache of `max_slots` rows x `max_len` slots (`models.cache.LayerKVCache`: one buffer
  per layer, a write offset per row). Each in-flight sequence owns one row. The programs
  run the model's layers unrolled over the engine's per-layer copy of the weights
  (`Decoder.layerwise_weights`): on CPU, slicing a layer out of stacked weights or a
  stacked cache inside a layer scan copies it, which on a decode step cost about as much
  as the matmuls.
- Gathered rows: a program call computes only the rows it needs: they are gathered from
  the cache into a smaller batch, run, and scattered back (padding rows point past the
  last row: they read zeros and their writes are dropped); without gathering a call
  runs over every row.
- `prefill` appends a right-padded [P, C] chunk per row; the last real token's logits
  give the first sampled token. `decode` runs `num_steps` single-token steps in a
  `lax.scan`; rows stop on device at a stop id, their token budget or a full cache, so
  the host syncs once per `num_steps` tokens.
- Attention spans: decode attends only to the first `span` cache slots, so short
  contexts do not pay for max_len (decode reads every cached key/value once per token;
  prefill reads them once per chunk, so it always attends over the whole row). A call
  copies its span out once and writes back only the slots it appended.

The programs are module-level jitted functions, shared by every engine with the same
model and shapes; their XLA compilations are counted from JAX's compile events
(`COMPILE_COUNTS`).
"""
from __future__ import annotations

import collections
import functools
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from agentjax.models.cache import LayerKVCache, cache_positions, init_layer_cache
from agentjax.models.config import ModelConfig
from agentjax.models.decoder import LayerwiseWeights
from agentjax.engine.jax.sampling import sample

# XLA compilations of the engine's jitted programs, by program name ("prefill",
# "decode"), counted from JAX's backend-compile events (a retrace and a recompilation
# for new argument shardings / committedness both count).
COMPILE_COUNTS: collections.Counter = collections.Counter()
_PROGRAMS = {"jit(prefill)": "prefill", "jit(decode)": "decode"}


def _count_compilations(event: str, duration: float, **kwargs) -> None:
    program = _PROGRAMS.get(kwargs.get("fun_name"))
    if event == "/jax/core/compile/backend_compile_duration" and program is not None:
        COMPILE_COUNTS[program] += 1


jax.monitoring.register_event_duration_secs_listener(_count_compilations)


@functools.partial(jax.jit, static_argnames=("graphdef",))
def engine_weights(graphdef: nnx.GraphDef, params: Any) -> LayerwiseWeights:
    """The engine's copy of the weights: the layer stack split per layer, cast to the
    compute dtype (`Decoder.layerwise_weights`; float32 master params make a bfloat16
    copy, half their size). Every leaf is a fresh buffer, even one the program would
    pass through unchanged, so the caller may donate `params` afterwards."""
    return jax.tree.map(jnp.copy, nnx.merge(graphdef, params).layerwise_weights())


@functools.partial(jax.jit, static_argnames=("gather",), donate_argnames=("cache",))
def prefill(weights, cache, lengths, rows, tokens, segment_ids, keys, steps, temperature,
            top_k, top_p, *, gather):
    """Appends a right-padded chunk to the cache rows `rows` (gathered into a smaller
    batch when `gather`, else every row); samples after each row's last real token.
    Returns (cache, tokens [P], logprobs [P]).

    Prefill attends over the whole row (no span): its key/value reads are shared by the
    chunk's C queries, so a span would save little and multiply the programs to compile."""
    cache = cache.replace(lengths=lengths)
    sub = cache.take_rows(rows) if gather else cache
    positions = cache_positions(sub.lengths, segment_ids)
    hidden, sub = weights.forward(tokens, positions, segment_ids, sub)
    last = jnp.maximum(jnp.sum(segment_ids != 0, axis=1) - 1, 0)
    hidden_last = jnp.take_along_axis(hidden, last[:, None, None], axis=1)
    new_tokens, logprobs = sample(weights.logits(hidden_last)[:, 0], keys, steps, temperature,
                                  top_k, top_p)
    return (cache.put_rows(rows, sub) if gather else sub), new_tokens, logprobs


@functools.partial(jax.jit, static_argnames=("gather", "num_steps", "span"),
                   donate_argnames=("cache",))
def decode(weights, cache, lengths, rows, last_tokens, active, keys, steps, budget, stop_ids,
           temperature, top_k, top_p, *, gather, num_steps, span):
    """`num_steps` single-token steps over the cache rows `rows` (gathered into a smaller
    batch when `gather`, else every row). A row is fed while active; it stops after
    sampling a stop id, exhausting its budget or filling its cache row.

    Only the first `span` cache slots are attended (the host picks a span that holds every
    active row's length plus num_steps): attention cost follows the live context, not
    max_len. The span is sliced out once per call; only the slots the call appended are
    written back.

    Returns (cache, tokens [R, num_steps], logprobs [R, num_steps], emitted [R, num_steps]
    bool — whether the row was active and sampled at that step)."""
    max_len = cache.max_len
    cache = cache.replace(lengths=lengths)
    full = cache.take_rows(rows) if gather else cache
    window = full.window(span) if span < max_len else full

    def step(carry, _):
        window, tokens, active, steps, budget = carry
        segment_ids = active.astype(jnp.int32)[:, None]
        positions = cache_positions(window.lengths, segment_ids)
        hidden, window = weights.forward(tokens[:, None], positions, segment_ids, window)
        new, logprobs = sample(weights.logits(hidden)[:, 0], keys, steps, temperature, top_k,
                               top_p)
        emitted = active
        budget = budget - emitted
        hit_stop = jnp.any(new[:, None] == stop_ids, axis=1)
        active = active & ~hit_stop & (budget > 0) & (window.lengths < max_len)
        tokens = jnp.where(emitted, new, tokens)
        return (window, tokens, active, steps + emitted, budget), (new, logprobs, emitted)

    carry = (window, last_tokens, active, steps, budget)
    (window, *_), (tokens, logprobs, emitted) = jax.lax.scan(step, carry, length=num_steps)
    full = full.put_window(window, full.lengths, num_steps) if span < max_len else window
    return (cache.put_rows(rows, full) if gather else full), tokens.T, logprobs.T, emitted.T


def new_cache(weights: LayerwiseWeights, config: ModelConfig, rows: int, max_len: int,
              dtype) -> LayerKVCache:
    """An empty cache of `rows` x `max_len` slots, placed beside the weights: on their
    mesh by the rules their model was sharded with (so the programs take keys and values
    where the weights' shardings produce them), else on their device."""
    cache = init_layer_cache(config, rows, max_len, dtype)
    placement = mesh_and_rules(weights)
    if placement is None:
        device = next(iter(jax.tree.leaves(weights)[0].sharding.device_set))
        return jax.device_put(cache, device)
    from agentjax.core.parallel import tree_shardings
    axes = LayerKVCache.logical_axes(config.num_layers)
    return jax.device_put(cache, tree_shardings(axes, cache, *placement))


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
