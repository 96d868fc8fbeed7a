"""Sampling: the kept set and log-probs against a float64 numpy reference."""
import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentjax.rollout.sampling import filter_logits, first_argmax, sample
from tests.rollout.reference import reference_logp


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


def test_first_argmax_and_draws_match_jax():
    """first_argmax is jnp.argmax (first of tied maxima, -inf entries); sampled rows draw
    what jax.random.categorical draws from the same fold_in(key, step)."""
    rng = np.random.default_rng(2)
    x = rng.integers(-3, 4, size=(64, 40)).astype(np.float32)  # many ties
    x[::5, :7] = -np.inf
    np.testing.assert_array_equal(jax.jit(first_argmax)(x), np.argmax(x, axis=-1))
    np.testing.assert_array_equal(first_argmax(x[:1]), np.argmax(x[:1], axis=-1))
    logits, temperature, top_k, top_p = _batch(vocab=64, seed=3)
    keys = np.asarray(jax.random.split(jax.random.PRNGKey(4), len(_ROWS)))
    steps = np.arange(len(_ROWS), dtype=np.int32) * 7
    tokens, _ = jax.jit(sample)(logits, keys, steps, np.ones_like(temperature),
                                np.full_like(top_k, -1), np.ones_like(top_p))
    for row in range(len(_ROWS)):
        key = jax.random.fold_in(keys[row], steps[row])
        assert int(tokens[row]) == int(jax.random.categorical(key, logits[row]))


def test_sample_rejects_bad_shapes():
    logits, temperature, top_k, top_p = _batch()
    with pytest.raises(AssertionError):
        sample(logits[0], np.zeros((8, 2), np.uint32), np.zeros(8, np.int32),
               temperature, top_k, top_p)
