"""KV caches: prefill + appended chunk + decode steps == one full forward, rows at
different lengths, for the stacked KVCache (`Decoder.__call__`) and the engine's page pool
(`LayerwiseWeights.forward`, pages of 4 slots so rows cross pages); padding is never
written or counted; overflow is caught."""
import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from agentjax.models.cache import KVCache, cache_positions, init_cache, write_slots
from agentjax.models.decoder import Decoder, apply
from agentjax.models.paged import (AttentionItems, PagedKVCache, build_items,
                                   init_paged_cache)
from tests.models.reference_decoder import TINY, random_model

MAX_LEN = 24
_step = jax.jit(apply, static_argnums=0, donate_argnums=5)
_full = jax.jit(apply, static_argnums=0)
_layerwise_weights = jax.jit(lambda graphdef, params: nnx.merge(graphdef, params)
                             .layerwise_weights(), static_argnums=0)


def _forward_layerwise(weights, tokens, slots, write, cache, items):
    return weights.forward(tokens, slots, write, cache, items)


_layer_step = jax.jit(_forward_layerwise, donate_argnums=4)
PAGE = 4


class _PagedRows:
    """A page pool whose row b holds pages b * pages_per_row, ...: the bookkeeping the
    engine's page table does, for a fixed set of rows."""

    def __init__(self, batch: int, max_len: int):
        self.per_row = -(-max_len // PAGE)
        self.pool = init_paged_cache(TINY, batch * self.per_row, PAGE, jnp.float32)
        self.lengths = np.zeros(batch, np.int32)

    def pages(self, b: int) -> list[int]:
        return list(range(b * self.per_row, (b + 1) * self.per_row))

    def flat(self, b: int, slot: int) -> int:
        return self.pages(b)[slot // PAGE] * PAGE + slot % PAGE

    def inputs(self, segments: np.ndarray):
        """(slots, write, items) of appending the real tokens of `segments` [B, T]."""
        slots = np.full(segments.shape, -1, np.int32)
        write = np.full(segments.shape, -1, np.int32)
        for b in range(segments.shape[0]):
            for i, t in enumerate(np.flatnonzero(segments[b])):
                slots[b, t] = self.lengths[b] + i
                write[b, t] = self.flat(b, slots[b, t])
        spans = (self.lengths + (segments != 0).sum(axis=1)).tolist()
        rows = len(spans)
        items = build_items([self.pages(b) for b in range(rows)], spans, rows, PAGE,
                            -(-rows * self.per_row // 8) * 8)
        self.lengths = np.asarray(spans, np.int32)
        return (jnp.asarray(slots), jnp.asarray(write),
                AttentionItems(*(jnp.asarray(x) for x in (items.row, items.page,
                                                          items.first_slot))))

    def slot(self, cache: PagedKVCache, layer: int, b: int, s: int):
        """(key [K, hd], value [K, hd]) of row b's slot s."""
        page, off = self.pages(b)[s // PAGE], s % PAGE
        return np.asarray(cache.k[layer])[page, :, :, off], np.asarray(cache.v[layer])[page, :, off]


@pytest.fixture(scope="module")
def split():
    return nnx.split(random_model(lambda: Decoder(TINY, rngs=nnx.Rngs(0)), seed=2))


def _empty(layout: str, batch: int, max_len: int = MAX_LEN):
    if layout == "stacked":
        return init_cache(TINY, batch=batch, max_len=max_len, dtype=jnp.float32)
    return _PagedRows(batch, max_len)


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
    A `_PagedRows` runs `LayerwiseWeights.forward` (eagerly unless jit) and keeps its
    updated pool."""
    tokens, segments = _chunk(rows, width, left_pad)
    if isinstance(cache, KVCache):
        positions = cache_positions(cache.lengths, segments)
        hidden, cache = _step(graphdef, params, tokens, positions, segments, cache)
    else:
        weights = _layerwise_weights(graphdef, params)
        run = _layer_step if jit else _forward_layerwise
        slots, write, items = cache.inputs(np.asarray(segments))
        hidden, cache.pool = run(weights, tokens, slots, write, cache.pool, items)
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
    ("stacked", False), ("stacked", True), ("paged", False), ("paged", True)])
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
    np.testing.assert_array_equal(cache.lengths, [len(r) for r in full_rows])  # both kinds

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
    for layout, left_pad in (("stacked", True), ("stacked", False), ("paged", True)):
        caches.append(_run_cached(graphdef, params, _empty(layout, 3), prompts, 9, left_pad)[1])
    left, right, layerwise = caches
    # The two paddings are programs of their own, which round the float32 sums in their
    # own order: within a few float32 ulps of the cache values' scale of each other.
    k_bound, v_bound = (8 * np.finfo(np.float32).eps * float(np.abs(x).max())
                        for x in (left.k, left.v))
    for b, row in enumerate(prompts):
        n = len(row)
        np.testing.assert_allclose(left.k[:, b, :, :n], right.k[:, b, :, :n], rtol=0,
                                   atol=k_bound)
        np.testing.assert_allclose(left.v[:, b, :, :n], right.v[:, b, :, :n], rtol=0,
                                   atol=v_bound)
        np.testing.assert_array_equal(left.k[:, b, :, n:], 0.0)
        np.testing.assert_array_equal(right.v[:, b, :, n:], 0.0)
        # Another attention formulation feeds layer 1: the cached-vs-full tolerance.
        for layer in range(TINY.num_layers):
            for slot in range(n):
                key, value = layerwise.slot(layerwise.pool, layer, b, slot)
                np.testing.assert_allclose(key, left.k[layer, b, :, slot], rtol=1e-5,
                                           atol=1e-5)
                np.testing.assert_allclose(value, left.v[layer, b, :, slot], rtol=1e-5,
                                           atol=1e-5)
    written = {layerwise.flat(b, s) for b, row in enumerate(prompts) for s in range(len(row))}
    flat_values = np.moveaxis(np.asarray(layerwise.pool.v[0]), 2, 1).reshape(
        -1, TINY.num_kv_heads, TINY.head_dim)
    unwritten = sorted(set(range(flat_values.shape[0])) - written)
    np.testing.assert_array_equal(flat_values[unwritten], 0.0)


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
    """Without jit: the same result as jitted; a pool with the wrong layer count raises."""
    graphdef, params = split
    weights = _layerwise_weights(graphdef, params)
    hidden, cache = _run_cached(graphdef, params, _empty("paged", 1, 4), [[5, 6, 7]], 3,
                                jit=False)
    jit_hidden, jit_cache = _run_cached(graphdef, params, _empty("paged", 1, 4),
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
    v_bound = 16 * np.finfo(np.float32).eps * float(np.abs(jit_cache.pool.v[1]).max())
    np.testing.assert_allclose(cache.pool.v[1], jit_cache.pool.v[1], rtol=0, atol=v_bound)
    one_layer = PagedKVCache(k=cache.pool.k[:1], v=cache.pool.v[:1])
    slots, write, items = cache.inputs(np.ones((1, 1), np.int32))
    with pytest.raises(ValueError, match="cache has 1 layers"):
        weights.forward(jnp.ones((1, 1), jnp.int32), slots, write, one_layer, items)


def test_init_cache_shapes_and_axes():
    cache = init_cache(TINY, batch=2, max_len=8)
    chex.assert_shape([cache.k, cache.v], (TINY.num_layers, 2, TINY.num_kv_heads, 8, TINY.head_dim))
    chex.assert_type(cache.lengths, jnp.int32)
    assert cache.max_len == 8
    axes = KVCache.logical_axes()
    assert len(axes.k) == cache.k.ndim and len(axes.lengths) == cache.lengths.ndim
    with pytest.raises(ValueError, match="positive"):
        init_cache(TINY, batch=0, max_len=8)
    pool = init_paged_cache(TINY, num_pages=3, page_size=PAGE)
    assert len(pool.k) == len(pool.v) == TINY.num_layers
    chex.assert_shape(list(pool.k), (3, TINY.num_kv_heads, TINY.head_dim, PAGE))
    chex.assert_shape(list(pool.v), (3, TINY.num_kv_heads, PAGE, TINY.head_dim))
    axes = PagedKVCache.logical_axes(TINY.num_layers)
    assert all(len(a) == x.ndim for a, x in zip(axes.k + axes.v, pool.k + pool.v))
