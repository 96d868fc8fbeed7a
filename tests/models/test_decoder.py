"""Decoder forward against the float64 reference; packing, remat, dtypes, bad input."""
import dataclasses

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from agentjax.models.decoder import Decoder, apply, positions_from_segments
from tests.models.reference_decoder import TINY, numpy_params, random_model, reference_hidden

B, T = 3, 10
# Row 0 packs two sequences and ends with padding, row 1 is left padded, row 2 is full.
SEGMENTS = np.array([
    [1, 1, 1, 1, 2, 2, 2, 2, 0, 0],
    [0, 0, 0, 1, 1, 1, 1, 1, 1, 1],
    [1, 1, 1, 1, 1, 1, 1, 1, 1, 1],
], np.int32)


@pytest.fixture(scope="module")
def model():
    return random_model(lambda: Decoder(TINY, rngs=nnx.Rngs(0)), seed=1)


@pytest.fixture(scope="module")
def split(model):
    return nnx.split(model)


_forward = jax.jit(apply, static_argnums=0)


def _tokens(seed=0, shape=(B, T)):
    return jnp.asarray(np.random.default_rng(seed).integers(0, TINY.vocab_size, shape), jnp.int32)


def test_positions_from_segments_restart_per_segment():
    expected = np.array([
        [0, 1, 2, 3, 0, 1, 2, 3, 0, 0],
        [0, 0, 0, 0, 1, 2, 3, 4, 5, 6],
        [0, 1, 2, 3, 4, 5, 6, 7, 8, 9],
    ])
    np.testing.assert_array_equal(positions_from_segments(jnp.asarray(SEGMENTS)), expected)


@pytest.mark.parametrize("jit", [True, False])
def test_forward_matches_float64_reference(model, split, jit):
    tokens, segments = _tokens(), jnp.asarray(SEGMENTS)
    positions = positions_from_segments(segments)
    graphdef, params = split
    if jit:
        hidden, cache = _forward(graphdef, params, tokens, positions, segments)
    else:
        hidden, cache = model(tokens, positions, segments)
    assert cache is None
    chex.assert_shape(hidden, (B, T, TINY.hidden_size))
    chex.assert_type(hidden, jnp.float32)
    expected = reference_hidden(TINY, numpy_params(model), tokens, positions, segments)
    real = SEGMENTS != 0
    np.testing.assert_allclose(np.asarray(hidden)[real], expected[real], rtol=1e-5, atol=1e-5)
    logits = model.logits(hidden)
    chex.assert_shape(logits, (B, T, TINY.vocab_size))
    expected_logits = expected @ numpy_params(model)["lm_head"]
    np.testing.assert_allclose(np.asarray(logits)[real], expected_logits[real], rtol=1e-4, atol=1e-4)


def test_packed_row_equals_separate_rows(split):
    graphdef, params = split
    tokens = np.asarray(_tokens(seed=3))
    packed_segments = SEGMENTS[:1]
    # The two packed sequences of row 0, each in its own row (right padded).
    separate_tokens = np.zeros((B, T), np.int32)
    separate_segments = np.zeros((B, T), np.int32)
    separate_tokens[0, :4], separate_segments[0, :4] = tokens[0, :4], 1
    separate_tokens[1, :4], separate_segments[1, :4] = tokens[0, 4:8], 1
    batch_tokens = np.concatenate([tokens[:1], separate_tokens[:2]])
    batch_segments = np.concatenate([packed_segments, separate_segments[:2]])
    segments = jnp.asarray(batch_segments)
    hidden, _ = _forward(graphdef, params, jnp.asarray(batch_tokens),
                         positions_from_segments(segments), segments)
    hidden = np.asarray(hidden)
    np.testing.assert_allclose(hidden[0, :4], hidden[1, :4], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(hidden[0, 4:8], hidden[2, :4], rtol=1e-5, atol=1e-6)


def test_tied_lm_head_is_transposed_embedding():
    cfg = dataclasses.replace(TINY, tie_embeddings=True)
    model = random_model(lambda: Decoder(cfg, rngs=nnx.Rngs(0)), seed=0)
    assert not hasattr(model, "lm_head")
    np.testing.assert_array_equal(model.lm_head_weight(), model.embed[...].T)
    chex.assert_shape(model.lm_head_weight(), (cfg.hidden_size, cfg.vocab_size))


def _loss(graphdef, params, tokens, positions, segments):
    hidden, _ = apply(graphdef, params, tokens, positions, segments)
    model = nnx.merge(graphdef, params)
    logp = jax.nn.log_softmax(model.logits(hidden))
    target_logp = jnp.take_along_axis(logp[:, :-1], tokens[:, 1:, None], axis=-1)[..., 0]
    mask = (segments[:, 1:] != 0) & (segments[:, 1:] == segments[:, :-1])
    return -(target_logp * mask).sum() / mask.sum()


def test_remat_policies_give_identical_gradients():
    # float64, so that only a real difference (not fusion-order rounding) can show.
    grads = {}
    with jax.enable_x64(True):
        tokens, segments = _tokens(seed=4), jnp.asarray(SEGMENTS)
        positions = positions_from_segments(segments)
        for remat in ("none", "full"):
            cfg = dataclasses.replace(TINY, remat=remat, param_dtype="float64", dtype="float64")
            model = random_model(lambda: Decoder(cfg, rngs=nnx.Rngs(0)), seed=1)
            graphdef, params = nnx.split(model)
            grads[remat] = jax.jit(jax.grad(_loss, argnums=1), static_argnums=0)(
                graphdef, params, tokens, positions, segments)
    leaves_none = jax.tree.leaves(grads["none"])
    assert all(np.abs(np.asarray(g)).max() > 0 for g in leaves_none)
    for a, b in zip(leaves_none, jax.tree.leaves(grads["full"])):
        assert a.dtype == np.float64
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-13)


def test_bfloat16_params_and_compute_track_float32(model):
    cfg = dataclasses.replace(TINY, param_dtype="bfloat16", dtype="bfloat16")
    bf16 = nnx.eval_shape(lambda: Decoder(cfg, rngs=nnx.Rngs(0)))
    nnx.update(bf16, jax.tree.map(lambda x: x.astype(jnp.bfloat16), nnx.state(model)))
    assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(nnx.state(bf16)))
    tokens, segments = _tokens(seed=5), jnp.asarray(SEGMENTS)
    positions = positions_from_segments(segments)
    hidden16, _ = bf16(tokens, positions, segments)
    hidden32, _ = model(tokens, positions, segments)
    chex.assert_type(hidden16, jnp.bfloat16)
    chex.assert_type(bf16.logits(hidden16), jnp.float32)
    real = SEGMENTS != 0
    # bf16 keeps 8 mantissa bits: hidden states (unit RMS) agree to a few 1e-2.
    err = np.abs(np.asarray(hidden16, np.float32) - np.asarray(hidden32))[real]
    assert err.mean() < 3e-2, err.mean()


def test_bad_inputs_raise_clear_errors(model):
    segments = jnp.asarray(SEGMENTS)
    positions = positions_from_segments(segments)
    with pytest.raises(ValueError, match=r"tokens must be in \[0, 128\)"):
        model(jnp.full((B, T), TINY.vocab_size, jnp.int32), positions, segments)
    with pytest.raises(AssertionError):
        model(_tokens()[0], positions[0], segments[0])  # rank 1
    with pytest.raises(AssertionError):
        model(_tokens().astype(jnp.float32), positions, segments)
    with pytest.raises(AssertionError):
        model(_tokens(), positions[:, :-1], segments)
