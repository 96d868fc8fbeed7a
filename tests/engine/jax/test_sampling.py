"""Sampling: the kept set and log-probs against a float64 numpy reference."""
import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentjax.engine.jax.sampling import (filter_logits, first_argmax, fold_in_data, gumbel_noise,
                                       prng_key_data, sample, threefry_2x32)
from tests.engine.reference import reference_logp


_ROWS = [  # (temperature, top_k, top_p)
    (1.0, -1, 1.0), (0.7, -1, 1.0), (1.0, 5, 1.0), (1.0, -1, 0.8), (1.3, 7, 0.6),
    (0.0, -1, 1.0), (0.5, 1, 1.0), (1.0, -1, 0.05)]


def _batch(vocab=32, seed=0):
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(len(_ROWS), vocab)).astype(np.float32) * 2.0
    temperature = np.array([r[0] for r in _ROWS], np.float32)
    top_k = np.array([r[1] for r in _ROWS], np.int32)
    top_p = np.array([r[2] for r in _ROWS], np.float32)
    return logits, temperature, top_k, top_p


_JIT = pytest.mark.parametrize("transform", [jax.jit, lambda f: f], ids=["jit", "nojit"])


@_JIT
def test_filter_logits_keeps_the_reference_set(transform):
    logits, temperature, top_k, top_p = _batch()
    scaled = logits / np.where(temperature > 0, temperature, 1.0)[:, None]
    kept = np.isfinite(np.asarray(transform(filter_logits)(scaled, top_k, top_p)))
    for row, (t, k, p) in enumerate(_ROWS):
        if t > 0:
            np.testing.assert_array_equal(
                kept[row], np.isfinite(reference_logp(logits[row], t, k, p)), err_msg=str(row))
    assert kept[2].sum() == 5 and kept[6].sum() == 1 and kept[7].sum() == 1


@_JIT
def test_sample_logprobs_are_those_of_the_sampling_distribution(transform):
    logits, temperature, top_k, top_p = _batch()
    keys = jax.random.split(jax.random.PRNGKey(0), len(_ROWS))  # raw uint32 [B, 2]
    fn = transform(sample)
    for step in range(3):
        steps = np.full(len(_ROWS), step, np.int32)
        tokens, logprobs = fn(logits, keys, steps, temperature, top_k, top_p)
        chex.assert_shape([tokens, logprobs], (len(_ROWS),))
        assert tokens.dtype == jnp.int32 and logprobs.dtype == jnp.float32
        for row, (t, k, p) in enumerate(_ROWS):
            ref = reference_logp(logits[row], t, k, p)
            token = int(tokens[row])
            assert np.isfinite(ref[token]), f"row {row} sampled a token outside its set"
            np.testing.assert_allclose(logprobs[row], ref[token], atol=1e-5, err_msg=str(row))
    assert int(tokens[5]) == int(np.argmax(logits[5]))  # greedy row


def test_sampling_frequencies_follow_pi_and_are_batch_independent():
    vocab, draws = 6, 6000
    logits = np.log(np.array([[0.4, 0.25, 0.15, 0.1, 0.06, 0.04]], np.float32))
    row_key = jax.random.PRNGKey(3)[None]

    @jax.jit
    def many(logits, temperature, top_k, top_p):
        one = lambda s: sample(logits, row_key, s[None], temperature, top_k, top_p)[0][0]
        return jax.vmap(one)(jnp.arange(draws, dtype=jnp.int32))

    for t, k, p in [(1.0, -1, 1.0), (0.8, 3, 1.0), (1.0, -1, 0.7)]:
        args = (np.array([t], np.float32), np.array([k], np.int32), np.array([p], np.float32))
        counts = np.bincount(np.asarray(many(logits, *args)), minlength=vocab) / draws
        pi = np.exp(reference_logp(logits[0], t, k, p))
        # 5 standard errors of a binomial frequency.
        np.testing.assert_allclose(counts, pi, atol=5 * np.sqrt(0.25 / draws) + 1e-9)
    # The same row key and step give the same token whatever else is in the batch.
    logits8, temperature, top_k, top_p = _batch(vocab=16, seed=1)
    keys = np.asarray(jax.random.split(jax.random.PRNGKey(5), len(_ROWS)))
    steps = np.arange(len(_ROWS), dtype=np.int32)
    full, _ = jax.jit(sample)(logits8, keys, steps, temperature, top_k, top_p)
    for row in (0, 3, 4):
        alone, _ = sample(logits8[row:row + 1], keys[row:row + 1], steps[row:row + 1],
                          temperature[row:row + 1], top_k[row:row + 1], top_p[row:row + 1])
        assert int(alone[0]) == int(full[row])


def test_first_argmax_and_gumbel_noise_match_jax():
    """first_argmax is jnp.argmax (first of tied maxima, -inf entries); the noise hash is
    jax's Threefry-2x32 bit for bit (odd sizes too) and the noise -log(-log(u)) of its
    23-bit uniforms (float64 reference)."""
    from jax.extend.random import threefry_2x32 as jax_threefry

    rng = np.random.default_rng(2)
    x = rng.integers(-3, 4, size=(64, 40)).astype(np.float32)  # many ties
    x[::5, :7] = -np.inf
    np.testing.assert_array_equal(jax.jit(first_argmax)(x), np.argmax(x, axis=-1))
    np.testing.assert_array_equal(first_argmax(x[:1]), np.argmax(x[:1], axis=-1))
    keys = np.asarray(jax.random.split(jax.random.PRNGKey(4), 3))
    for size in (64, 7):
        noise = np.asarray(jax.jit(gumbel_noise, static_argnums=1)(keys, size), np.float64)
        for row, key in enumerate(keys):
            bits = np.asarray(jax_threefry(key, jnp.arange(size, dtype=jnp.uint32)))
            uniform = (bits >> 9).astype(np.float64) / 2.0 ** 23
            uniform = np.maximum(uniform, np.finfo(np.float32).tiny)
            np.testing.assert_allclose(noise[row], -np.log(-np.log(uniform)), rtol=1e-6,
                                       atol=1e-6)
    x0, x1 = (np.asarray(rng.integers(0, 2 ** 32, size=(3, 5)), np.uint32) for _ in range(2))
    y0, y1 = threefry_2x32(keys, x0, x1)
    for row, key in enumerate(keys):
        expected = np.asarray(jax_threefry(key, np.concatenate([x0[row], x1[row]])))
        np.testing.assert_array_equal(np.concatenate([y0[row], y1[row]]), expected)


def test_host_keys_are_jax_random_keys_bit_for_bit():
    """prng_key_data / fold_in_data (numpy, no dispatch) equal jax.random.PRNGKey and
    fold_in for seeds and counters across the uint32 range; out-of-range data raises."""
    for seed in (0, 1, 7, 2**31 - 1, 2**31, 2**32 - 1, 2**40):
        np.testing.assert_array_equal(prng_key_data(seed), np.asarray(jax.random.PRNGKey(seed)))
        key = prng_key_data(seed)
        for data in (0, 1, 3, 2**31 + 5, 2**32 - 1):
            np.testing.assert_array_equal(
                fold_in_data(key, data), np.asarray(jax.random.fold_in(key, data)))
            assert fold_in_data(key, data).dtype == np.uint32
    with pytest.raises(ValueError, match="uint32"):
        fold_in_data(prng_key_data(0), 2**32)


def test_sample_rejects_bad_shapes():
    logits, temperature, top_k, top_p = _batch()
    with pytest.raises(AssertionError):
        sample(logits[0], np.zeros((8, 2), np.uint32), np.zeros(8, np.int32),
               temperature, top_k, top_p)
