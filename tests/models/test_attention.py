"""Full-sequence attention: blockwise (custom VJP) and dense against a float64 reference
written from the formula; padding inside, packed segments, bf16, GQA, tile skipping,
the kernels' dispatch, splash in Pallas interpret mode, sharded vs single device."""
from __future__ import annotations

import dataclasses

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from agentjax.core import parallel
from agentjax.models import attention as att
from agentjax.models.decoder import (AUTO_REMAT_TOKENS, Decoder, positions_from_segments,
                                     remat_policy)
from flax import nnx
from tests.models.reference_decoder import TINY


def reference(q, k, v, segment_ids):
    """softmax(q k^T / sqrt(hd) + mask) v in float64, one (row, head) at a time; query t
    sees key s <= t of its own nonzero segment; padding rows give 0."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    b, t, h, hd = q.shape
    groups = h // k.shape[2]
    out = np.zeros_like(q)
    for row in range(b):
        ids = np.asarray(segment_ids[row])
        allowed = ((ids[:, None] == ids[None, :]) & (ids != 0)[:, None]
                   & (np.arange(t)[None, :] <= np.arange(t)[:, None]))
        for head in range(h):
            scores = q[row, :, head] @ k[row, :, head // groups].T / np.sqrt(hd)
            scores = np.where(allowed, scores, -np.inf)
            top = np.max(scores, axis=1, keepdims=True)
            weights = np.where(allowed, np.exp(scores - np.where(np.isfinite(top), top, 0)), 0)
            norm = weights.sum(axis=1, keepdims=True)
            out[row, :, head] = (weights / np.where(norm > 0, norm, 1)) @ v[row, :, head // groups]
    return out


def inputs(t: int, *, heads=4, kv_heads=2, hd=8, batch=2, dtype=jnp.float32, seed=0):
    rng = np.random.default_rng(seed)
    q, k, v = (jnp.asarray(rng.normal(size=(batch, t, n, hd)), dtype)
               for n in (heads, kv_heads, kv_heads))
    return q, k, v


def packed_ids(t: int) -> jnp.ndarray:
    """Row 0: one episode, right padding; row 1: left padding, then three packed
    episodes of uneven lengths."""
    ids = np.zeros((2, t), np.int32)
    ids[0, :t - t // 5] = 1
    cuts = [t // 7, t // 7 + t // 3, t - t // 4, t]
    for segment, (start, end) in enumerate(zip(cuts[:-1], cuts[1:]), start=1):
        ids[1, start:end] = segment
    return jnp.asarray(ids)


def real(segment_ids):
    return np.asarray(segment_ids != 0)[:, :, None, None]


@pytest.mark.parametrize("t,block", [(37, 8), (64, 16), (50, 64), (96, 32)])
@pytest.mark.parametrize("jit", [False, True])
def test_blockwise_and_dense_match_the_float64_reference(t, block, jit):
    """T not a multiple of the block (padded inside), a block larger than T, packed
    segments and padding: every real query row equals the formula's."""
    q, k, v = inputs(t)
    ids = packed_ids(t)
    expected = reference(q, k, v, ids)
    for impl in ("blockwise", "dense"):
        fn = lambda q, k, v, impl=impl: att.segment_attention(q, k, v, ids, impl=impl,  # noqa: E731
                                                              block=block)
        got = (jax.jit(fn) if jit else fn)(q, k, v)
        chex.assert_shape(got, q.shape)
        chex.assert_type(got, jnp.float32)
        np.testing.assert_allclose(np.where(real(ids), got, 0), np.where(real(ids), expected, 0),
                                   rtol=1e-5, atol=1e-5)
    # Padding rows of the blockwise path are exactly 0 (nothing attends from them).
    blockwise = att.blockwise_attention(q, k, v, ids, block=block)
    assert not np.any(np.where(real(ids), 0, blockwise))


@pytest.mark.parametrize("t,block", [(37, 8), (96, 32)])
def test_blockwise_gradients_equal_dense_gradients(t, block):
    """The custom VJP against autodiff through the dense softmax, float32, every input,
    a cotangent that is zero on padding (what a masked loss gives)."""
    q, k, v = inputs(t)
    ids = packed_ids(t)
    weights = jnp.asarray(np.random.default_rng(1).normal(size=q.shape), jnp.float32) * real(ids)

    def loss(impl):
        return lambda q, k, v: jnp.sum(
            att.segment_attention(q, k, v, ids, impl=impl, block=block) * weights)

    dense = jax.grad(loss("dense"), argnums=(0, 1, 2))(q, k, v)
    blockwise = jax.jit(jax.grad(loss("blockwise"), argnums=(0, 1, 2)))(q, k, v)
    for name, want, got in zip("qkv", dense, blockwise):
        scale = np.abs(want).max()
        np.testing.assert_allclose(got / scale, want / scale, atol=1e-5, err_msg=name)


def test_blockwise_gradients_match_finite_differences_in_float64():
    """The backward formula itself, independent of any other attention: float64
    directional derivatives."""
    with jax.enable_x64(True):
        q, k, v = inputs(21, dtype=jnp.float64)
        ids = packed_ids(21)
        weights = jnp.asarray(np.random.default_rng(2).normal(size=q.shape)) * real(ids)

        def loss(q, k, v):
            return jnp.sum(att.blockwise_attention(q, k, v, ids, block=8) * weights)

        grads = jax.grad(loss, argnums=(0, 1, 2))(q, k, v)
        rng = np.random.default_rng(3)
        for index, grad in enumerate(grads):
            direction = jnp.asarray(rng.normal(size=grad.shape))
            args = [q, k, v]
            eps = 1e-6
            plus, minus = list(args), list(args)
            plus[index] = args[index] + eps * direction
            minus[index] = args[index] - eps * direction
            numeric = (loss(*plus) - loss(*minus)) / (2 * eps)
            np.testing.assert_allclose(jnp.vdot(grad, direction), numeric, rtol=1e-7)


def test_bfloat16_blockwise_is_as_close_to_the_reference_as_dense():
    """bf16 compute (float32 scores and accumulation): the blockwise error is of the
    dense path's size, and the output is bfloat16."""
    t = 64
    q, k, v = inputs(t, dtype=jnp.bfloat16)
    ids = packed_ids(t)
    expected = reference(q.astype(jnp.float32), k.astype(jnp.float32),
                         v.astype(jnp.float32), ids)
    errors = {}
    for impl in ("dense", "blockwise"):
        got = att.segment_attention(q, k, v, ids, impl=impl, block=16)
        assert got.dtype == jnp.bfloat16
        errors[impl] = np.abs(np.where(real(ids), np.asarray(got, np.float64) - expected, 0)).max()
    assert errors["blockwise"] < 2 * errors["dense"] + 1e-3, errors
    assert errors["blockwise"] < 0.05, errors


def test_segments_never_attend_across_each_other():
    """Changing one packed episode (its queries, keys and values) leaves every other
    episode's output bit-identical: the test that must fail if a tile leaked."""
    t = 48
    q, k, v = inputs(t)
    ids = packed_ids(t)
    other = np.asarray(ids) == 2
    noise = jnp.asarray(np.random.default_rng(4).normal(size=q.shape) * 5, jnp.float32)
    change = jnp.asarray(other[:, :, None, None])
    before = att.blockwise_attention(q, k, v, ids, block=8)
    after = att.blockwise_attention(jnp.where(change, q + noise, q),
                                    jnp.where(change, k + noise[:, :, :2], k),
                                    jnp.where(change, v + noise[:, :, 2:], v), ids, block=8)
    untouched = real(ids) & ~other[:, :, None, None]
    np.testing.assert_array_equal(np.where(untouched, before, 0), np.where(untouched, after, 0))
    assert np.abs(np.where(other[:, :, None, None], before - after, 0)).max() > 0.1


def test_tile_kinds_skip_masked_tiles_and_drop_masks_inside_one_segment():
    """Hand-checked: 4 blocks of 4 tokens; row 0 one episode over all 16, row 1 episode
    1 in blocks 0-1 and episode 2 in blocks 2-3."""
    ids = np.array([[1] * 16, [1] * 8 + [2] * 8], np.int32)
    kinds = np.asarray(att._tile_kinds(jnp.asarray(ids.reshape(2, 4, 4).transpose(1, 0, 2))))
    S, M, F = att.SKIP, att.MASKED_TILE, att.FULL_TILE
    # Row 1 makes (2, 0), (3, 1) masked rather than skipped (row 0 needs them), and
    # keeps the below-diagonal tiles from being FULL where its segments differ.
    np.testing.assert_array_equal(kinds, [[M, S, S, S],
                                          [F, M, S, S],
                                          [M, M, M, S],
                                          [M, M, F, M]])
    # One row of two episodes alone: cross-episode tiles are skipped.
    alone = np.asarray(att._tile_kinds(jnp.asarray(ids[1:].reshape(1, 4, 4).transpose(1, 0, 2))))
    np.testing.assert_array_equal(alone, [[M, S, S, S], [F, M, S, S], [S, S, M, S], [S, S, F, M]])
    # Padding-only blocks are skipped.
    padded = np.array([[0] * 4 + [1] * 12], np.int32)
    kinds = np.asarray(att._tile_kinds(jnp.asarray(padded.reshape(1, 4, 4).transpose(1, 0, 2))))
    assert (kinds[0] == S).all() and (kinds[:, 0] == S).all()


def test_choose_impl_by_backend_length_and_dtype():
    long = att.DENSE_MAX_TOKENS + 1
    choose = att.choose_impl
    assert choose("auto", seq_len=att.DENSE_MAX_TOKENS, dtype=jnp.bfloat16, head_dim=64,
                  backend="gpu") == "dense"
    assert choose("auto", seq_len=long, dtype=jnp.float32, head_dim=64, backend="cpu") == "blockwise"
    assert choose("auto", seq_len=long, dtype=jnp.bfloat16, head_dim=64, backend="gpu") == "cudnn"
    # cuDNN's constraints: half precision, head_dim <= 128 and a multiple of 8.
    assert choose("auto", seq_len=long, dtype=jnp.float32, head_dim=64, backend="gpu") == "blockwise"
    assert choose("auto", seq_len=long, dtype=jnp.bfloat16, head_dim=256, backend="gpu") == "blockwise"
    assert choose("auto", seq_len=long, dtype=jnp.bfloat16, head_dim=60, backend="gpu") == "blockwise"
    assert choose("auto", seq_len=long, dtype=jnp.float32, head_dim=64, backend="tpu") == "splash"
    assert choose("dense", seq_len=long, dtype=jnp.float32, head_dim=64, backend="cpu") == "dense"
    with pytest.raises(ValueError, match="model.attention='cudnn' needs a GPU"):
        choose("cudnn", seq_len=long, dtype=jnp.bfloat16, head_dim=64, backend="cpu")
    with pytest.raises(ValueError, match="model.attention='cudnn'.*float32"):
        choose("cudnn", seq_len=long, dtype=jnp.float32, head_dim=64, backend="gpu")
    with pytest.raises(ValueError, match="'splash' is a TPU kernel"):
        choose("splash", seq_len=long, dtype=jnp.float32, head_dim=64, backend="cpu")


def test_cudnn_runs_only_on_rows_of_one_segment_from_the_start():
    """cuDNN's causal mask with per-row lengths is right only for right-padded rows of
    one episode; anything else (packing, left padding) takes the blockwise path."""
    assert bool(att.one_segment_per_row(jnp.asarray([[1, 1, 1, 0], [3, 3, 0, 0]])))
    assert not bool(att.one_segment_per_row(jnp.asarray([[1, 1, 2, 0], [1, 1, 0, 0]])))
    assert not bool(att.one_segment_per_row(jnp.asarray([[0, 1, 1, 1], [1, 1, 0, 0]])))
    assert not bool(att.one_segment_per_row(jnp.asarray([[1, 0, 1, 0]])))


def test_splash_kernel_in_interpret_mode_matches_the_reference():
    """The TPU kernel's wrapper (GQA as one multi-query kernel per kv head, padding to
    its block, segment ids) run by the Pallas interpreter on CPU."""
    t = 200
    q, k, v = inputs(t, hd=64, batch=1)
    ids = packed_ids(t)[1:]
    got = att.splash_attention(q, k, v, ids, block=128, interpret=True)
    np.testing.assert_allclose(np.where(real(ids), got, 0),
                               np.where(real(ids), reference(q, k, v, ids), 0), atol=1e-5)


def test_sharded_blockwise_equals_single_device(eight_devices):
    """Rows over data x fsdp, heads over tensor, as the trainer shards activations:
    outputs and gradients equal the unsharded ones. In float64, so that the float32
    rounding of per-device fusions (a few ulp, 1e-6 on gradients of order 1) cannot hide
    or fake a sharding error."""
    t = 40
    with jax.enable_x64(True):
        q, k, v = inputs(t, heads=4, kv_heads=2, batch=4, dtype=jnp.float64)
        ids = jnp.concatenate([packed_ids(t), packed_ids(t)[::-1]])
        mesh = parallel.make_mesh({"data": 2, "fsdp": 2, "tensor": 2}, devices=eight_devices)
        heads = NamedSharding(mesh, P(("data", "fsdp"), None, "tensor", None))
        rows = NamedSharding(mesh, P(("data", "fsdp"), None))

        def loss(q, k, v, ids):
            out = att.blockwise_attention(q, k, v, ids, block=16)
            return jnp.sum(jnp.where((ids != 0)[:, :, None, None], out, 0) ** 2)

        fn = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))
        want = fn(q, k, v, ids)
        got = fn(*(jax.device_put(x, heads) for x in (q, k, v)), jax.device_put(ids, rows))
        for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(got)):
            assert b.dtype == jnp.float64
            np.testing.assert_allclose(b, a, rtol=1e-12, atol=1e-12)


def test_decoder_blockwise_equals_dense_with_remat():
    """The whole decoder on a packed batch: hidden states and parameter gradients of
    attention='blockwise' with remat 'full_save_attention' equal
    dense attention without remat."""
    ids = packed_ids(24)
    tokens = jnp.asarray(np.random.default_rng(5).integers(0, TINY.vocab_size, ids.shape),
                         jnp.int32)
    positions = positions_from_segments(ids)
    weights = jnp.asarray(np.random.default_rng(6).normal(size=(*ids.shape, TINY.hidden_size)),
                          jnp.float32) * np.asarray(ids != 0)[:, :, None]

    def run(cfg):
        graphdef, params = nnx.split(Decoder(cfg, rngs=nnx.Rngs(0)))

        def loss(params):
            hidden, _ = nnx.merge(graphdef, params)(tokens, positions, ids)
            return jnp.sum(hidden * weights)

        return jax.jit(jax.value_and_grad(loss))(params)

    dense = run(dataclasses.replace(TINY, attention="dense", remat="none"))
    blockwise = run(dataclasses.replace(TINY, attention="blockwise", attention_block=8,
                                        remat="full_save_attention"))
    for a, b in zip(jax.tree.leaves(dense), jax.tree.leaves(blockwise)):
        scale = max(np.abs(a).max(), 1e-30)
        np.testing.assert_allclose(b / scale, a / scale, atol=2e-6)


def test_full_remat_keeps_the_attention_residuals():
    """remat 'full_save_attention' saves the blockwise output and log-sum-exp (named
    ATTENTION_RESIDUALS): its gradient program has as many loops as the one without
    remat, where 'full' (nothing saved) runs the attention's forward loop again."""
    ids = jnp.ones((1, 16), jnp.int32)

    def loops(remat):
        cfg = dataclasses.replace(TINY, attention="blockwise", attention_block=8, remat=remat)
        graphdef, params = nnx.split(Decoder(cfg, rngs=nnx.Rngs(0)))

        def loss(params):
            hidden, _ = nnx.merge(graphdef, params)(ids, positions_from_segments(ids), ids)
            return jnp.sum(hidden)

        return jax.jit(jax.grad(loss)).lower(params).as_text().count("stablehlo.while")

    assert loops("full_save_attention") == loops("none") < loops("full")
    assert remat_policy("auto", AUTO_REMAT_TOKENS - 1) is None
    assert remat_policy("auto", AUTO_REMAT_TOKENS) is not None
