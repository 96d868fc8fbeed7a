"""KV cache: prefill + appended chunk + decode steps == one full forward, rows at
different lengths; padding is never written or counted; overflow is caught."""
import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from agentjax.models.cache import KVCache, cache_positions, init_cache, write_slots
from agentjax.models.decoder import Decoder, apply
from tests.models.reference_decoder import TINY, random_model

MAX_LEN = 24
_step = jax.jit(apply, static_argnums=0, donate_argnums=5)
_full = jax.jit(apply, static_argnums=0)


@pytest.fixture(scope="module")
def split():
    return nnx.split(random_model(lambda: Decoder(TINY, rngs=nnx.Rngs(0)), seed=2))


def _chunk(rows: list[list[int]], width: int, left_pad: bool = False):
    """tokens / segment ids [B, width] of per-row token lists, padded with segment 0."""
    tokens = np.zeros((len(rows), width), np.int32)
    segments = np.zeros((len(rows), width), np.int32)
    for b, row in enumerate(rows):
        cols = slice(width - len(row), width) if left_pad else slice(0, len(row))
        tokens[b, cols], segments[b, cols] = row, 1
    return jnp.asarray(tokens), jnp.asarray(segments)


def _run_cached(graphdef, params, cache, rows, width, left_pad=False):
    tokens, segments = _chunk(rows, width, left_pad)
    positions = cache_positions(cache.lengths, segments)
    hidden, cache = _step(graphdef, params, tokens, positions, segments, cache)
    real = np.asarray(segments) != 0
    return [np.asarray(hidden)[b][real[b]] for b in range(len(rows))], cache


def test_write_slots_skip_padding():
    lengths = jnp.array([0, 5, 2], jnp.int32)
    segments = jnp.array([[1, 1, 0], [0, 1, 1], [0, 0, 0]], jnp.int32)
    slots, new_lengths = write_slots(lengths, segments)
    np.testing.assert_array_equal(slots, [[0, 1, -1], [-1, 5, 6], [-1, -1, -1]])
    np.testing.assert_array_equal(new_lengths, [2, 7, 2])
    np.testing.assert_array_equal(cache_positions(lengths, segments), [[0, 1, 0], [0, 5, 6], [0, 0, 0]])


@pytest.mark.parametrize("left_pad_prefill", [False, True])
def test_prefill_append_decode_equals_full_forward(split, left_pad_prefill):
    graphdef, params = split
    rng = np.random.default_rng(0)
    draw = lambda n: rng.integers(0, TINY.vocab_size, n).tolist()  # noqa: E731
    prompts = [draw(5), draw(9), draw(2)]
    observations = [draw(3), [], draw(4)]   # row 1 gets nothing appended
    decoded = [draw(3) for _ in range(3)]   # three single-token steps per row

    cache = init_cache(TINY, batch=3, max_len=MAX_LEN, dtype=jnp.float32)
    outputs = [[] for _ in range(3)]
    pieces = [(prompts, 9, left_pad_prefill), (observations, 4, False)]
    pieces += [([d[i:i + 1] for d in decoded], 1, False) for i in range(3)]
    for rows, width, left_pad in pieces:
        hidden, cache = _run_cached(graphdef, params, cache, rows, width, left_pad)
        for b in range(3):
            outputs[b].extend(hidden[b])
    full_rows = [p + o + d for p, o, d in zip(prompts, observations, decoded)]
    np.testing.assert_array_equal(cache.lengths, [len(r) for r in full_rows])

    tokens, segments = _chunk(full_rows, MAX_LEN)
    positions = jnp.broadcast_to(jnp.arange(MAX_LEN, dtype=jnp.int32), tokens.shape)
    full_hidden, _ = _full(graphdef, params, tokens, positions, segments)
    for b, row in enumerate(full_rows):
        np.testing.assert_allclose(np.stack(outputs[b]), np.asarray(full_hidden)[b, :len(row)],
                                   rtol=1e-5, atol=1e-5)


def test_left_and_right_padded_prefill_write_the_same_cache(split):
    """Padding never lands in the cache: both layouts fill slots 0..n-1 identically."""
    graphdef, params = split
    prompts = [[3, 4, 5], [6, 7, 8, 9, 10], [11]]
    caches = []
    for left_pad in (True, False):
        cache = init_cache(TINY, batch=3, max_len=MAX_LEN, dtype=jnp.float32)
        caches.append(_run_cached(graphdef, params, cache, prompts, 9, left_pad)[1])
    left, right = caches
    for b, row in enumerate(prompts):
        n = len(row)
        np.testing.assert_allclose(left.k[:, b, :, :n], right.k[:, b, :, :n], rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(left.v[:, b, :, :n], right.v[:, b, :, :n], rtol=1e-6, atol=1e-6)
        np.testing.assert_array_equal(left.k[:, b, :, n:], 0.0)
        np.testing.assert_array_equal(right.v[:, b, :, n:], 0.0)


def test_cache_overflow_and_reset(split):
    graphdef, params = split
    model = nnx.merge(graphdef, params)
    cache = init_cache(TINY, batch=1, max_len=4)
    cache = cache.replace(lengths=jnp.array([2], jnp.int32))
    tokens = jnp.ones((1, 3), jnp.int32)
    segments = jnp.array([[1, 1, 1]], jnp.int32)
    with pytest.raises(ValueError, match="KV cache overflow"):
        model(tokens, cache_positions(cache.lengths, segments), segments, cache)
    cache = cache.reset(jnp.array([True]))
    np.testing.assert_array_equal(cache.lengths, [0])
    with pytest.raises(AssertionError):
        model(jnp.ones((2, 3), jnp.int32), jnp.zeros((2, 3), jnp.int32),
              jnp.ones((2, 3), jnp.int32), cache)  # batch 2 vs cache batch 1


def test_init_cache_shapes_and_axes():
    cache = init_cache(TINY, batch=2, max_len=8)
    chex.assert_shape([cache.k, cache.v], (TINY.num_layers, 2, TINY.num_kv_heads, 8, TINY.head_dim))
    chex.assert_type(cache.lengths, jnp.int32)
    assert cache.max_len == 8
    axes = KVCache.logical_axes()
    assert len(axes.k) == cache.k.ndim and len(axes.lengths) == cache.lengths.ndim
    with pytest.raises(ValueError, match="positive"):
        init_cache(TINY, batch=0, max_len=8)
