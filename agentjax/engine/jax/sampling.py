"""Per-row token sampling with the log-prob of the distribution actually sampled from.

Each row has its own temperature, top-k and top-p (a batch mixes requests). The sampling
distribution of a row is built in this order, as HF `generate` and vLLM/SGLang do:

  1. temperature: z = logits / temperature;
  2. top-k (k > 0): keep the k largest z (ties broken by token id order of a stable sort);
  3. top-p (p < 1): over the top-k distribution renormalized, keep the smallest prefix of
     tokens sorted by probability whose mass reaches p (a token is kept when the mass
     strictly before it is < p, so the most likely token is always kept);
  4. renormalize over the kept tokens: pi(t) = exp(z_t) / sum_kept exp(z).

The returned log-prob is log pi(sampled token) — the behavior log-prob an off-policy
correction needs. Greedy rows (temperature 0) take the argmax and report the untempered
log_softmax(logits) of it (the point mass would report 0, which no trainer can use;
the untempered value is what a trainer recomputes at temperature 1).

Randomness is per row: a row's token is drawn by Gumbel-max with noise keyed by
`fold_in(row_key, step)` (the engine passes the token's absolute position as `step`), so
a seeded request draws the same noise whatever else shares its batch or which slot it
lands in (`gumbel_noise`).
"""
from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np

# Threefry-2x32 rotation constants (Salmon et al. 2011, "Parallel random numbers: as easy
# as 1, 2, 3"), alternating every 4 rounds, and the key schedule's parity constant.
_THREEFRY_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_THREEFRY_PARITY = np.uint32(0x1BD11BDA)


def filter_logits(scaled: jax.Array, top_k: jax.Array, top_p: jax.Array) -> jax.Array:
    """Sets the logits outside each row's top-k / top-p set to -inf.

    Args:
      scaled: temperature-scaled logits, float [B, V].
      top_k: int32 [B]; k <= 0 or k >= V disables top-k for that row.
      top_p: float [B]; p >= 1 disables top-p for that row.
    """
    chex.assert_rank(scaled, 2)
    chex.assert_shape([top_k, top_p], (scaled.shape[0],))
    vocab = scaled.shape[-1]
    order = jnp.argsort(-scaled, axis=-1, stable=True)
    sorted_z = jnp.take_along_axis(scaled, order, axis=-1)
    rank = jnp.arange(vocab)[None, :]
    k = jnp.where(top_k > 0, jnp.minimum(top_k, vocab), vocab)[:, None]
    in_top_k = rank < k
    probs = jax.nn.softmax(jnp.where(in_top_k, sorted_z, -jnp.inf), axis=-1)
    mass_before = jnp.cumsum(probs, axis=-1) - probs
    keep_sorted = in_top_k & ((mass_before < top_p[:, None]) | (top_p[:, None] >= 1.0))
    # Scatter the sorted keep-flags back to vocabulary order.
    keep = jnp.zeros_like(keep_sorted).at[jnp.arange(scaled.shape[0])[:, None], order].set(
        keep_sorted)
    return jnp.where(keep, scaled, -jnp.inf)


def first_argmax(x: jax.Array) -> jax.Array:
    """`jnp.argmax(x, axis=-1)` (the first index of the maximum; int32) as two plain
    reductions, which XLA:CPU vectorizes: its fused (value, index) argmax reduction was
    measured ~10x slower, ~1.5 ms of a 13 ms decode step at batch 32 x 2048 ids.
    A row without a maximum (NaN) gets the last index."""
    top = jnp.max(x, axis=-1, keepdims=True)
    ids = jax.lax.broadcasted_iota(jnp.int32, x.shape, x.ndim - 1)
    size = x.shape[-1]
    return jnp.minimum(jnp.min(jnp.where(x == top, ids, size), axis=-1), size - 1)


def threefry_2x32(key: jax.Array, x0: jax.Array,
                  x1: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The Threefry-2x32 hash (20 rounds) of counter pairs (x0, x1) under `key`.

    jax.random's own hash (`jax.extend.random.threefry_2x32`), written as plain uint32 ops so
    that XLA fuses the 20 rounds into one elementwise loop: its CPU lowering runs them
    as a while loop over whole arrays, ~3x slower on a decode step's [B, V] noise.

    Args:
      key: uint32 [..., 2]; key[..., 0:1] and key[..., 1:2] broadcast against the
        counters (e.g. keys [B, 2] with counters [B, N]).
      x0, x1: uint32 counters of equal shape [..., N].
    Returns:
      The two uint32 output words, shaped like the counters.
    """
    k0, k1 = key[..., 0:1], key[..., 1:2]
    schedule = (k0, k1, k0 ^ k1 ^ _THREEFRY_PARITY)
    x0, x1 = x0 + schedule[0], x1 + schedule[1]
    for block in range(5):
        for rotation in _THREEFRY_ROTATIONS[block % 2]:
            x0 = x0 + x1
            x1 = ((x1 << np.uint32(rotation)) | (x1 >> np.uint32(32 - rotation))) ^ x0
        x0 = x0 + schedule[(block + 1) % 3]
        x1 = x1 + schedule[(block + 2) % 3] + np.uint32(block + 1)
    return x0, x1


def prng_key_data(seed: int) -> np.ndarray:
    """`jax.random.PRNGKey(seed)`'s raw key data (uint32 [2]), made on the host: JAX
    calls per request cost device dispatches on the thread that takes requests (~28% of
    a rollout server's request-thread samples under py-spy when JaxEngine used them)."""
    if 0 <= seed < 2**32:
        return np.array([0, seed], np.uint32)  # threefry_seed of a 32-bit seed
    return np.asarray(jax.random.PRNGKey(seed), np.uint32)


def fold_in_data(key: np.ndarray, data: int) -> np.ndarray:
    """`jax.random.fold_in(key, data)` on raw key data (uint32 [2]), made on the host:
    threefry_2x32 of the counter pair (0, data)."""
    if not 0 <= data < 2**32:
        raise ValueError(f"fold_in data must be a uint32, got {data}")
    x0, x1 = threefry_2x32(np.asarray(key, np.uint32), np.zeros(1, np.uint32),
                           np.array([data], np.uint32))
    return np.concatenate([x0, x1])


def gumbel_noise(keys: jax.Array, size: int) -> jax.Array:
    """Standard Gumbel noise float32 [B, size], row b from the bits
    `jax.extend.random.threefry_2x32(keys[b], arange(size))` (a 23-bit uniform u per
    entry, as jax.random.uniform makes it, then -log(-log(u)), u >= the smallest normal).

    Args:
      keys: uint32 [B, 2] raw PRNG keys, one per row.
      size: entries per row.
    """
    chex.assert_shape(keys, (None, 2))
    half = (size + 1) // 2
    counters = jax.lax.broadcasted_iota(jnp.uint32, (keys.shape[0], half), 1)
    # Counter pairs (i, i + half), an odd size padded with counter 0, as jax does.
    upper = jnp.where(counters + half < size, counters + np.uint32(half), np.uint32(0))
    bits = jnp.concatenate(threefry_2x32(keys.astype(jnp.uint32), counters, upper),
                           axis=1)[:, :size]
    mantissa = (bits >> np.uint32(9)) | np.uint32(0x3F800000)  # a float in [1, 2)
    uniform = jax.lax.bitcast_convert_type(mantissa, jnp.float32) - 1.0
    uniform = jnp.maximum(uniform, jnp.finfo(jnp.float32).tiny)
    return -jnp.log(-jnp.log(uniform))


def sample(
    logits: jax.Array,
    keys: jax.Array,
    steps: jax.Array,
    temperature: jax.Array,
    top_k: jax.Array,
    top_p: jax.Array,
) -> tuple[jax.Array, jax.Array]:
    """Samples one token per row; returns (tokens int32 [B], logprobs float32 [B]).

    Args:
      logits: float [B, V].
      keys: per-row PRNG keys, uint32 [B, 2] (raw `jax.random.PRNGKey` data).
      steps: int32 [B], folded into the row key (the engine passes the absolute position
        of the token being sampled).
      temperature: float [B]; 0 means greedy.
      top_k: int32 [B]; <= 0 disables.
      top_p: float [B]; >= 1 disables.
    """
    chex.assert_rank([logits, keys, steps, temperature, top_k, top_p], [2, 2, 1, 1, 1, 1])
    batch = logits.shape[0]
    chex.assert_shape([steps, temperature, top_k, top_p], (batch,))
    logits = logits.astype(jnp.float32)
    greedy = temperature <= 0.0
    scaled = logits / jnp.where(greedy, 1.0, temperature)[:, None]
    needs_filter = jnp.any(~greedy & (((top_k > 0) & (top_k < logits.shape[-1])) | (top_p < 1.0)))
    scaled = jax.lax.cond(needs_filter, filter_logits, lambda z, k, p: z, scaled, top_k, top_p)
    row_keys = jax.vmap(jax.random.fold_in)(keys, steps)
    drawn = first_argmax(scaled + gumbel_noise(row_keys, scaled.shape[1]))  # Gumbel-max
    tokens = jnp.where(greedy, first_argmax(logits), drawn)
    # The log-prob under what the row sampled from: pi for sampled rows, the untempered
    # unfiltered softmax for greedy rows.
    z = jnp.where(greedy[:, None], logits, scaled)
    z = z - jnp.max(z, axis=-1, keepdims=True)  # log_softmax's shift, for its precision
    chosen = jnp.take_along_axis(z, tokens[:, None], axis=-1)[:, 0]
    return tokens, chosen - jnp.log(jnp.sum(jnp.exp(z), axis=-1))
