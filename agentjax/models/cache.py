"""The stacked KV cache of `Decoder.__call__`, with a write offset per row, so the rows
of one batch may be at different lengths. (The rollout engine keeps its keys and values
in a page pool instead: `models/paged.py`.)

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
jit). Callers keep `lengths + new_tokens <= max_len`; eager (non-jit) model calls check
it and raise.

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
