"""KV caches with a write offset per row, so the rows of one batch may be at different
lengths (each row is one multi-turn session of a rollout engine).

Two layouts of the same contents:
- `KVCache`: every layer stacked in one [L, ...] array; `Decoder.__call__` runs the layers
  under `lax.scan` and takes it.
- `LayerKVCache`: one buffer per layer, keys stored transposed; `LayerwiseWeights.forward`
  (the rollout engine's path) runs the layers unrolled and takes it. Inside a scan a
  layer's slice of a stacked array is a copy of the whole layer on CPU (as is each
  layer's slice of the stacked weights), and on a single-token step those copies cost
  about as much as the layer's matmuls; per-layer buffers are updated in place and read
  where they lie.

    cache = init_cache(config, batch=8, max_len=2048)            # lengths all 0
    positions = cache_positions(cache.lengths, segment_ids)      # continue each row
    hidden, cache = model(tokens, positions, segment_ids, cache)  # prefill / decode /
                                                                  # append a chunk
A forward call with a cache writes the new tokens of each row at that row's offset and
lets them attend to the row's cached slots causally. Tokens with segment id 0 are
padding: they are neither written nor counted, so a right-padded (or left-padded) chunk
advances each row by its number of real tokens only. With a cache a row holds ONE
sequence: every nonzero segment id of a row means "this row's sequence".

Capacity: tokens that would land past `max_len` are dropped (XLA cannot raise inside
jit). Callers keep `lengths + new_tokens <= max_len` — the engine knows both on the host;
eager (non-jit) model calls check it and raise.

Slots at or past `lengths[b]` may hold stale values from a longer earlier session of the
row; they are never attended because a query at slot s only sees slots <= s, all written
by the current session.
"""
from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
from flax import struct

from agentjax.models.config import ModelConfig


@struct.dataclass
class KVCache:
    """Keys and values of every layer plus the valid length of each row.

    Attributes:
      k: [num_layers, batch, num_kv_heads, max_len, head_dim] keys (RoPE applied).
      v: [num_layers, batch, num_kv_heads, max_len, head_dim] values.
      lengths: [batch] int32, slots filled per row = where the next token is written.
    """

    k: jax.Array
    v: jax.Array
    lengths: jax.Array

    @property
    def max_len(self) -> int:
        """Slots per row."""
        return self.k.shape[3]

    @staticmethod
    def logical_axes() -> "KVCache":
        """Logical axis names of each field (for `parallel.tree_shardings`)."""
        kv = ("layers", "batch", "kv_heads", "cache_seq", "head_dim")
        return KVCache(k=kv, v=kv, lengths=("batch",))

    def reset(self, rows: jax.Array) -> "KVCache":
        """Empties the rows where `rows` ([batch] bool) is true (a new session starts)."""
        chex.assert_shape(rows, self.lengths.shape)
        return self.replace(lengths=jnp.where(rows, 0, self.lengths))


def init_cache(config: ModelConfig, batch: int, max_len: int, dtype=None) -> KVCache:
    """An empty cache.

    Args:
      config: the model's config (layers, KV heads, head_dim).
      batch: rows (concurrent sequences).
      max_len: slots per row (prompt + every appended chunk + generated tokens).
      dtype: key/value dtype (default: the model's compute dtype).
    """
    _check_size(batch, max_len)
    # Slots next to head_dim: a decode step reads [B, K, S, hd] with no transpose.
    shape = (config.num_layers, batch, config.num_kv_heads, max_len, config.head_dim)
    dtype = config.dtype if dtype is None else dtype
    return KVCache(k=jnp.zeros(shape, dtype), v=jnp.zeros(shape, dtype),
                   lengths=jnp.zeros((batch,), jnp.int32))


# Logical axes of one layer's buffers in a LayerKVCache.
_LAYER_K_AXES = ("batch", "kv_heads", "head_dim", "cache_seq")
_LAYER_V_AXES = ("batch", "kv_heads", "cache_seq", "head_dim")


@struct.dataclass
class LayerKVCache:
    """Keys and values as one buffer per layer, plus the valid length of each row.

    Keys are stored with the slots last, so both attention products
    (`decoder.layer_cache_attention`) are plain [G*T, hd] x [hd, S] and [G*T, S] x [S, hd]
    matmuls per (row, kv head): with keys [S, hd] the score product ran 2-3x slower on
    XLA:CPU (measured at 160 and 576 slots). Row and slot helpers
    (`take_rows`, `window`, ...) let an engine run a program on some rows or on the first
    slots only without knowing the layout.

    Attributes:
      k: per layer, keys [batch, num_kv_heads, head_dim, max_len] (RoPE applied).
      v: per layer, values [batch, num_kv_heads, max_len, head_dim].
      lengths: [batch] int32, slots filled per row = where the next token is written.
    """

    k: tuple[jax.Array, ...]
    v: tuple[jax.Array, ...]
    lengths: jax.Array

    @property
    def max_len(self) -> int:
        """Slots per row."""
        return self.v[0].shape[_LAYER_V_AXES.index("cache_seq")]

    @staticmethod
    def logical_axes(num_layers: int) -> "LayerKVCache":
        """Logical axis names of each field (for `parallel.tree_shardings`)."""
        return LayerKVCache(k=(_LAYER_K_AXES,) * num_layers, v=(_LAYER_V_AXES,) * num_layers,
                            lengths=("batch",))

    def _map(self, axis: str, fn, *others: "LayerKVCache"):
        """(keys, values): `fn(index of axis in the buffer, buffer, the matching buffers of
        others...)` for every key buffer, then every value buffer."""
        k_axis, v_axis = _LAYER_K_AXES.index(axis), _LAYER_V_AXES.index(axis)
        k = tuple(fn(k_axis, *xs) for xs in zip(self.k, *(o.k for o in others)))
        v = tuple(fn(v_axis, *xs) for xs in zip(self.v, *(o.v for o in others)))
        return k, v

    def take_rows(self, rows: jax.Array) -> "LayerKVCache":
        """The rows `rows` [R] int32 as a cache of R rows. Out-of-range entries (padding
        rows of a batch) read as empty rows: zeros, length 0."""
        chex.assert_rank(rows, 1)
        take = lambda axis, x: jnp.take(x, rows, axis=axis, mode="fill", fill_value=0)
        k, v = self._map("batch", take)
        return LayerKVCache(k=k, v=v, lengths=take(0, self.lengths))

    def put_rows(self, rows: jax.Array, sub: "LayerKVCache") -> "LayerKVCache":
        """Writes the rows of `sub` (as returned by `take_rows(rows)`) back at `rows`;
        out-of-range entries are dropped, duplicate ones must hold equal values."""
        def put(axis, x, y):
            return x.at[(slice(None),) * axis + (rows,)].set(y, mode="drop")
        k, v = self._map("batch", put, sub)
        return LayerKVCache(k=k, v=v, lengths=put(0, self.lengths, sub.lengths))

    def window(self, span: int) -> "LayerKVCache":
        """The first `span` slots of every row (same lengths): a cache with max_len span."""
        k, v = self._map("cache_seq", lambda axis, x: jax.lax.slice_in_dim(x, 0, span,
                                                                         axis=axis))
        return LayerKVCache(k=k, v=v, lengths=self.lengths)

    def put_window(self, window: "LayerKVCache", starts: jax.Array,
                   count: int) -> "LayerKVCache":
        """Writes back what a `window` of this cache appended: slots [starts[b],
        starts[b] + count) of each row b (those at or past the window's span are
        skipped); lengths become the window's. Copies count slots per row, not the
        window.

        Args:
          window: `self.window(span)` after appending at most `count` tokens per row.
          starts: [batch] int32, each row's length when the window was taken.
          count: slots to copy per row (static).
        """
        chex.assert_shape(starts, self.lengths.shape)
        span = window.max_len
        rows = jnp.arange(starts.shape[0])[:, None]
        slots = starts[:, None] + jnp.arange(count, dtype=starts.dtype)[None, :]  # [B, count]
        inside = jnp.minimum(slots, span - 1)
        target = jnp.where(slots < span, slots, self.max_len)  # out of bounds: dropped

        def put(axis, x, w):
            index = lambda at: (rows,) + (slice(None),) * (axis - 1) + (at,)
            return x.at[index(target)].set(w[index(inside)], mode="drop")

        assert _LAYER_K_AXES.index("batch") == _LAYER_V_AXES.index("batch") == 0
        k, v = self._map("cache_seq", put, window)
        return LayerKVCache(k=k, v=v, lengths=window.lengths)


def init_layer_cache(config: ModelConfig, batch: int, max_len: int,
                     dtype=None) -> LayerKVCache:
    """An empty LayerKVCache: `init_cache`'s arguments, one buffer per layer."""
    _check_size(batch, max_len)
    dtype = config.dtype if dtype is None else dtype
    sizes = {"batch": batch, "kv_heads": config.num_kv_heads, "head_dim": config.head_dim,
             "cache_seq": max_len}
    zeros = lambda axes: jnp.zeros(tuple(sizes[a] for a in axes), dtype)
    return LayerKVCache(k=tuple(zeros(_LAYER_K_AXES) for _ in range(config.num_layers)),
                        v=tuple(zeros(_LAYER_V_AXES) for _ in range(config.num_layers)),
                        lengths=jnp.zeros((batch,), jnp.int32))


def _check_size(batch: int, max_len: int) -> None:
    if batch <= 0 or max_len <= 0:
        raise ValueError(f"batch and max_len must be positive, got {batch}, {max_len}")


def write_slots(lengths: jax.Array, segment_ids: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Cache slot of each new token and the new row lengths.

    Real tokens (segment id != 0) of row b take slots lengths[b], lengths[b]+1, ... in
    order; padding gets slot -1 (never written, never attended).

    Args:
      lengths: [B] int32 current row lengths.
      segment_ids: [B, T] int32 segment ids of the new chunk (0 = padding).

    Returns:
      slots [B, T] int32 and new lengths [B] int32.
    """
    chex.assert_rank([lengths, segment_ids], [1, 2])
    real = segment_ids != 0
    count = jnp.cumsum(real, axis=1, dtype=jnp.int32)
    slots = jnp.where(real, lengths[:, None] + count - 1, -1)
    return slots, lengths + count[:, -1]


def cache_positions(lengths: jax.Array, segment_ids: jax.Array) -> jax.Array:
    """RoPE positions that continue each row of a cache: the token's slot (0 for padding).

    Args:
      lengths: [B] int32 current row lengths (`cache.lengths`).
      segment_ids: [B, T] int32 segment ids of the new chunk (0 = padding).
    """
    slots, _ = write_slots(lengths, segment_ids)
    return jnp.maximum(slots, 0)
