"""KV caches: prefill + appended chunk + decode steps == one full forward, rows at
different lengths, for the stacked KVCache (`Decoder.__call__`) and the per-layer
LayerKVCache (`LayerwiseWeights.forward`); padding is never written or counted; overflow
is caught; the LayerKVCache row / slot helpers move exactly the right entries."""
import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from agentjax.models.cache import (KVCache, LayerKVCache, cache_positions, init_cache,
                                   init_layer_cache, write_slots)
from agentjax.models.decoder import Decoder, apply
from tests.models.reference_decoder import TINY, random_model

MAX_LEN = 24
_step = jax.jit(apply, static_argnums=0, donate_argnums=5)
_full = jax.jit(apply, static_argnums=0)
_layerwise_weights = jax.jit(lambda graphdef, params: nnx.merge(graphdef, params)
                             .layerwise_weights(), static_argnums=0)


def _forward_layerwise(weights, tokens, positions, segments, cache):
    return weights.forward(tokens, positions, segments, cache)


_layer_step = jax.jit(_forward_layerwise, donate_argnums=4)


@pytest.fixture(scope="module")
def split():
    return nnx.split(random_model(lambda: Decoder(TINY, rngs=nnx.Rngs(0)), seed=2))


def _empty(layout: str, batch: int, max_len: int = MAX_LEN):
    make = init_cache if layout == "stacked" else init_layer_cache
    return make(TINY, batch=batch, max_len=max_len, dtype=jnp.float32)


def _chunk(rows: list[list[int]], width: int, left_pad: bool = False):
    """tokens / segment ids [B, width] of per-row token lists, padded with segment 0."""
    tokens = np.zeros((len(rows), width), np.int32)
    segments = np.zeros((len(rows), width), np.int32)
    for b, row in enumerate(rows):
        cols = slice(width - len(row), width) if left_pad else slice(0, len(row))
        tokens[b, cols], segments[b, cols] = row, 1
    return jnp.asarray(tokens), jnp.asarray(segments)


def _run_cached(graphdef, params, cache, rows, width, left_pad=False, jit=True):
    """Appends per-row token lists to the cache; returns each row's real hidden states.
    A LayerKVCache runs `LayerwiseWeights.forward` (eagerly unless jit)."""
    tokens, segments = _chunk(rows, width, left_pad)
    positions = cache_positions(cache.lengths, segments)
    if isinstance(cache, KVCache):
        hidden, cache = _step(graphdef, params, tokens, positions, segments, cache)
    else:
        weights = _layerwise_weights(graphdef, params)
        run = _layer_step if jit else _forward_layerwise
        hidden, cache = run(weights, tokens, positions, segments, cache)
    real = np.asarray(segments) != 0
    return [np.asarray(hidden)[b][real[b]] for b in range(len(rows))], cache


def test_write_slots_skip_padding():
    lengths = jnp.array([0, 5, 2], jnp.int32)
    segments = jnp.array([[1, 1, 0], [0, 1, 1], [0, 0, 0]], jnp.int32)
    slots, new_lengths = write_slots(lengths, segments)
    np.testing.assert_array_equal(slots, [[0, 1, -1], [-1, 5, 6], [-1, -1, -1]])
    np.testing.assert_array_equal(new_lengths, [2, 7, 2])
    np.testing.assert_array_equal(cache_positions(lengths, segments), [[0, 1, 0], [0, 5, 6], [0, 0, 0]])


@pytest.mark.parametrize("layout,left_pad_prefill", [
    ("stacked", False), ("stacked", True), ("layerwise", False), ("layerwise", True)])
def test_prefill_append_decode_equals_full_forward(split, layout, left_pad_prefill):
    graphdef, params = split
    rng = np.random.default_rng(0)
    draw = lambda n: rng.integers(0, TINY.vocab_size, n).tolist()  # noqa: E731
    prompts = [draw(5), draw(9), draw(2)]
    observations = [draw(3), [], draw(4)]   # row 1 gets nothing appended
    decoded = [draw(3) for _ in range(3)]   # three single-token steps per row

    cache = _empty(layout, batch=3)
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
    """Padding never lands in the cache: both paddings fill slots 0..n-1 identically, and
    the per-layer cache holds the same keys (transposed) and values."""
    graphdef, params = split
    prompts = [[3, 4, 5], [6, 7, 8, 9, 10], [11]]
    caches = []
    for layout, left_pad in (("stacked", True), ("stacked", False), ("layerwise", True)):
        caches.append(_run_cached(graphdef, params, _empty(layout, 3), prompts, 9, left_pad)[1])
    left, right, layerwise = caches
    for b, row in enumerate(prompts):
        n = len(row)
        np.testing.assert_allclose(left.k[:, b, :, :n], right.k[:, b, :, :n], rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(left.v[:, b, :, :n], right.v[:, b, :, :n], rtol=1e-6, atol=1e-6)
        np.testing.assert_array_equal(left.k[:, b, :, n:], 0.0)
        np.testing.assert_array_equal(right.v[:, b, :, n:], 0.0)
        # Another attention formulation feeds layer 1: the cached-vs-full tolerance.
        for layer in range(TINY.num_layers):
            np.testing.assert_allclose(layerwise.k[layer][b].transpose(0, 2, 1),
                                       left.k[layer, b], rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(layerwise.v[layer][b], left.v[layer, b], rtol=1e-5,
                                       atol=1e-5)


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


def _float64_forward(graphdef, params, rows):
    """The uncached forward of `rows` with every float parameter in float64."""
    with jax.enable_x64(True):
        wide = jax.tree.map(lambda x: np.asarray(x, np.float64)
                            if np.issubdtype(x.dtype, np.floating) else x, params)
        tokens = jnp.asarray(rows, jnp.int32)
        positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
        hidden, _ = nnx.merge(graphdef, wide)(tokens, positions, jnp.ones_like(tokens))
        return np.asarray(hidden, np.float64)


def test_layerwise_forward_eager_and_bad_caches(split):
    """Without jit: the same result as jitted, overflow and a wrong layer count raise."""
    graphdef, params = split
    weights = _layerwise_weights(graphdef, params)
    tokens = jnp.array([[5, 6, 7]], jnp.int32)
    segments = jnp.array([[1, 1, 1]], jnp.int32)
    hidden, cache = _run_cached(graphdef, params, _empty("layerwise", 1, 4), [[5, 6, 7]], 3,
                                jit=False)
    jit_hidden, jit_cache = _run_cached(graphdef, params, _empty("layerwise", 1, 4),
                                        [[5, 6, 7]], 3)
    # Eager and jitted XLA:CPU programs round differently (fusion reorders the float32
    # sums): both lie within a few float32 ulps of the outputs' scale of the float64
    # forward, and so within twice that of each other.
    bound = 8 * np.finfo(np.float32).eps * float(np.abs(jit_hidden[0]).max())
    reference = _float64_forward(graphdef, params, [[5, 6, 7]])
    for result in (hidden[0], jit_hidden[0]):
        np.testing.assert_allclose(np.asarray(result, np.float64), reference[0], rtol=0,
                                   atol=bound)
    np.testing.assert_allclose(hidden[0], jit_hidden[0], rtol=0, atol=2 * bound)
    # Layer 1's values are projections of layer 0's rounded output: the same bound, at
    # their own scale.
    v_bound = 16 * np.finfo(np.float32).eps * float(np.abs(jit_cache.v[1]).max())
    np.testing.assert_allclose(cache.v[1], jit_cache.v[1], rtol=0, atol=v_bound)
    cache = cache.replace(lengths=jnp.array([2], jnp.int32))
    with pytest.raises(ValueError, match="KV cache overflow"):
        weights.forward(tokens, cache_positions(cache.lengths, segments), segments, cache)
    one_layer = cache.replace(k=cache.k[:1], v=cache.v[:1])
    with pytest.raises(ValueError, match="cache has 1 layers"):
        weights.forward(tokens[:, :1], jnp.zeros((1, 1), jnp.int32), segments[:, :1], one_layer)


def test_layer_cache_row_and_slot_helpers():
    """take_rows / put_rows / window / put_window against numpy indexing."""
    rng = np.random.default_rng(3)
    cache = _empty("layerwise", 4, max_len=6)
    cache = LayerKVCache(
        k=tuple(jnp.asarray(rng.normal(size=x.shape), jnp.float32) for x in cache.k),
        v=tuple(jnp.asarray(rng.normal(size=x.shape), jnp.float32) for x in cache.v),
        lengths=jnp.array([1, 2, 3, 4], jnp.int32))
    rows = jnp.array([2, 0, 2, 4], jnp.int32)  # a duplicate row and a padding row (4)
    sub = cache.take_rows(rows)
    np.testing.assert_array_equal(sub.lengths, [3, 1, 3, 0])
    for x, y in zip(cache.k + cache.v, sub.k + sub.v):
        np.testing.assert_array_equal(y[:3], np.asarray(x)[[2, 0, 2]])
        np.testing.assert_array_equal(y[3], 0.0)
    changed = sub.replace(k=tuple(x + 1.0 for x in sub.k), v=tuple(x - 1.0 for x in sub.v),
                          lengths=jnp.array([5, 6, 5, 6], jnp.int32))
    put = cache.put_rows(rows, changed)
    np.testing.assert_array_equal(put.lengths, [6, 2, 5, 4])
    for old, new, delta in [(cache.k[0], put.k[0], 1.0), (cache.v[1], put.v[1], -1.0)]:
        old, new = np.asarray(old), np.asarray(new)
        np.testing.assert_array_equal(new[[0, 2]], old[[0, 2]] + delta)
        np.testing.assert_array_equal(new[[1, 3]], old[[1, 3]])

    window = cache.window(4)
    assert window.max_len == 4
    np.testing.assert_array_equal(window.k[1], np.asarray(cache.k[1])[..., :4])
    np.testing.assert_array_equal(window.v[1], np.asarray(cache.v[1])[:, :, :4])
    # The window appended up to 2 slots per row from lengths 1, 2, 3, 4; those slots are
    # written back, except the ones at or past the span (4).
    window = window.replace(k=tuple(x * 0 for x in window.k), v=tuple(x * 0 for x in window.v),
                            lengths=jnp.array([3, 4, 4, 4], jnp.int32))
    back = cache.put_window(window, cache.lengths, 2)
    assert back.max_len == 6
    np.testing.assert_array_equal(back.lengths, [3, 4, 4, 4])
    written = np.zeros((4, 6), bool)
    for row, (start, stop) in enumerate([(1, 3), (2, 4), (3, 4), (4, 4)]):
        written[row, start:stop] = True
    for old, new, axis in [(cache.k[0], back.k[0], 3), (cache.v[1], back.v[1], 2)]:
        old, new = np.moveaxis(np.asarray(old), axis, 1), np.moveaxis(np.asarray(new), axis, 1)
        np.testing.assert_array_equal(new[written], 0.0)
        np.testing.assert_array_equal(new[~written], old[~written])


def test_init_cache_shapes_and_axes():
    cache = init_cache(TINY, batch=2, max_len=8)
    chex.assert_shape([cache.k, cache.v], (TINY.num_layers, 2, TINY.num_kv_heads, 8, TINY.head_dim))
    chex.assert_type(cache.lengths, jnp.int32)
    assert cache.max_len == 8
    axes = KVCache.logical_axes()
    assert len(axes.k) == cache.k.ndim and len(axes.lengths) == cache.lengths.ndim
    with pytest.raises(ValueError, match="positive"):
        init_cache(TINY, batch=0, max_len=8)


def test_init_layer_cache_shapes_and_axes():
    cache = init_layer_cache(TINY, batch=2, max_len=8)
    assert len(cache.k) == len(cache.v) == TINY.num_layers
    chex.assert_shape(list(cache.k), (2, TINY.num_kv_heads, TINY.head_dim, 8))
    chex.assert_shape(list(cache.v), (2, TINY.num_kv_heads, 8, TINY.head_dim))
    chex.assert_type(cache.lengths, jnp.int32)
    assert cache.max_len == 8
    axes = LayerKVCache.logical_axes(TINY.num_layers)
    for names, x in zip(axes.k + axes.v, cache.k + cache.v):
        assert len(names) == x.ndim
        sizes = dict(zip(names, x.shape))
        assert sizes["cache_seq"] == 8 and sizes["head_dim"] == TINY.head_dim
    with pytest.raises(ValueError, match="positive"):
        init_layer_cache(TINY, batch=2, max_len=0)
