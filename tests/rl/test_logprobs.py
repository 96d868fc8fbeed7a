"""agentjax.rl.logprobs: chunked log-probs / entropy vs the float64 reference and the
full-logits path (values and gradients), memory, bf16 and a sharded batch."""
import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec

from agentjax.rl import logprobs
from tests import reference as ref

B, T, D, V = 8, 12, 8, 37
CHUNK = 5  # does not divide T: exercises the padding


def _inputs(seed, dtype=np.float32):
    rng = np.random.default_rng(seed)
    hidden = rng.standard_normal((B, T, D)).astype(dtype)
    lm_head = (rng.standard_normal((D, V)) / np.sqrt(D) * 2).astype(dtype)
    targets = rng.integers(0, V, (B, T)).astype(np.int32)
    return hidden, lm_head, targets


def _weighted_sum(fn, targets, w_logp, w_ent):
    """A scalar whose gradient exercises both outputs with arbitrary cotangents."""
    def objective(hidden, lm_head):
        logp, entropy = fn(hidden, lm_head, targets)
        return jnp.sum(logp * w_logp) + jnp.sum(entropy * w_ent)
    return objective


class ReferenceTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_values_match_float64_reference(self):
        hidden, lm_head, targets = _inputs(0)
        for temperature in (1.0, 0.7):
            fn = self.variant(functools.partial(
                logprobs.token_logprobs, chunk_size=CHUNK, temperature=temperature))
            logp, entropy = fn(hidden, lm_head, targets)
            chex.assert_shape((logp, entropy), (B, T))
            chex.assert_type((logp, entropy), jnp.float32)
            exp_logp, exp_entropy = ref.token_logprobs(hidden, lm_head, targets, temperature)
            np.testing.assert_allclose(logp, exp_logp, rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(entropy, exp_entropy, rtol=1e-5, atol=1e-5)

    @chex.variants(with_jit=True, without_jit=True)
    def test_gradients_match_full_logits_path(self):
        hidden, lm_head, targets = _inputs(1)
        rng = np.random.default_rng(2)
        w_logp, w_ent = rng.standard_normal((2, B, T)).astype(np.float32)
        chunked = functools.partial(logprobs.token_logprobs, chunk_size=CHUNK, temperature=0.7)
        full = functools.partial(logprobs.token_logprobs_full, temperature=0.7)
        grads = [
            self.variant(jax.grad(_weighted_sum(fn, targets, w_logp, w_ent), argnums=(0, 1)))(
                hidden, lm_head)
            for fn in (chunked, full)
        ]
        chex.assert_trees_all_close(grads[0], grads[1], rtol=1e-5, atol=1e-5)
        assert np.abs(np.asarray(grads[1][1])).max() > 0.1  # the check is not vacuous


def test_never_materializes_full_logits():
    # XLA's buffer assignment of the compiled program is exact: the chunked forward and
    # backward must need far less scratch than one [B, T, V] float32 logits array.
    b, t, d, v = 2, 64, 16, 1024
    hidden, lm_head = jnp.zeros((b, t, d)), jnp.zeros((d, v))
    targets = jnp.zeros((b, t), jnp.int32)
    logits_bytes = b * t * v * 4

    def temp_bytes(fn):
        compiled = jax.jit(fn).lower(hidden, lm_head).compile()
        return compiled.memory_analysis().temp_size_in_bytes

    chunked = functools.partial(logprobs.token_logprobs, chunk_size=4)
    forward = functools.partial(chunked, targets=targets)
    backward = jax.grad(_weighted_sum(chunked, targets, 1.0, 1.0), argnums=(0, 1))
    for fn in (forward, backward):
        assert temp_bytes(fn) < logits_bytes / 2
    # The measurement does see the logits of the full path.
    assert temp_bytes(lambda h, w: logprobs.token_logprobs_full(h, w, targets)) >= logits_bytes


def test_bfloat16_inputs():
    hidden, lm_head, targets = _inputs(3)
    hidden16, lm_head16 = jnp.bfloat16(hidden), jnp.bfloat16(lm_head)
    logp, entropy = logprobs.token_logprobs(hidden16, lm_head16, targets, chunk_size=CHUNK)
    chex.assert_type((logp, entropy), jnp.float32)
    full = logprobs.token_logprobs_full(hidden16, lm_head16, targets)
    chex.assert_trees_all_close((logp, entropy), full, rtol=1e-5, atol=1e-5)
    grads = jax.grad(_weighted_sum(functools.partial(logprobs.token_logprobs, chunk_size=CHUNK),
                                   targets, 1.0, 0.5), argnums=(0, 1))(hidden16, lm_head16)
    chex.assert_type(grads, jnp.bfloat16)
    full_grads = jax.grad(_weighted_sum(logprobs.token_logprobs_full, targets, 1.0, 0.5),
                          argnums=(0, 1))(hidden16, lm_head16)
    # bf16 gradients: one bf16 rounding (8 bits of mantissa) of the same float32 values.
    chex.assert_trees_all_close(grads, full_grads, rtol=2e-2, atol=2e-2)


def test_sharded_batch_matches_single_device(eight_devices):
    mesh = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Auto,), devices=eight_devices)
    rows = NamedSharding(mesh, PartitionSpec("data"))
    replicated = NamedSharding(mesh, PartitionSpec())
    hidden, lm_head, targets = _inputs(4)
    w_logp = np.random.default_rng(5).standard_normal((B, T)).astype(np.float32)
    chunked = functools.partial(logprobs.token_logprobs, chunk_size=CHUNK)

    @jax.jit
    def outputs_and_grads(hidden, lm_head, targets):
        objective = _weighted_sum(chunked, targets, w_logp, 0.3)
        return chunked(hidden, lm_head, targets), jax.grad(objective, argnums=(0, 1))(
            hidden, lm_head)

    single = outputs_and_grads(*(jax.device_put(x, eight_devices[0])
                                 for x in (hidden, lm_head, targets)))
    sharded = outputs_and_grads(jax.device_put(hidden, rows), jax.device_put(lm_head, replicated),
                                jax.device_put(targets, rows))
    assert sharded[0][0].sharding.is_equivalent_to(rows, 2)
    chex.assert_trees_all_close(sharded, single, rtol=1e-5, atol=1e-6)


def test_bad_arguments_name_the_argument():
    hidden, lm_head, targets = _inputs(6)
    call = functools.partial(logprobs.token_logprobs, chunk_size=4)
    with pytest.raises(ValueError, match="lm_head"):
        call(hidden, lm_head.T, targets)
    with pytest.raises(ValueError, match="targets"):
        call(hidden, lm_head, targets[:, :-1])
    with pytest.raises(ValueError, match="targets"):
        call(hidden, lm_head, targets.astype(np.float32))
    with pytest.raises(ValueError, match="hidden"):
        call(hidden[0], lm_head, targets)
    with pytest.raises(ValueError, match="chunk_size"):
        logprobs.token_logprobs(hidden, lm_head, targets, chunk_size=0)
    with pytest.raises(ValueError, match="temperature"):
        call(hidden, lm_head, targets, temperature=0.0)


class MaskedTest(chex.TestCase):
    """masked_token_logprobs: the lm-head at the mask's positions only equals the
    float64 reference there (0 elsewhere), in values and gradients, on both of its
    paths: every row within the budget (gathered) and a row over it (every position)."""

    @chex.variants(with_jit=True, without_jit=True)
    def test_values_and_gradients_equal_the_reference_at_the_masked_positions(self):
        hidden, lm_head, targets = _inputs(3)
        rng = np.random.default_rng(4)
        mask = (rng.random((B, T)) < 0.3).astype(np.float32)
        mask[0] = 0.0  # a row with nothing to read
        w_logp, w_ent = rng.standard_normal((2, B, T)).astype(np.float32)
        most = int(mask.sum(1).max())
        exp_logp, exp_entropy = ref.token_logprobs(hidden, lm_head, targets, 0.7)
        full = functools.partial(logprobs.token_logprobs_full, temperature=0.7)
        exp_grads = jax.grad(_weighted_sum(full, targets, w_logp * mask, w_ent * mask),
                             argnums=(0, 1))(hidden, lm_head)
        for positions in (most, most - 1):  # gathered; a row over the budget: everywhere
            masked = functools.partial(logprobs.masked_token_logprobs, mask=mask,
                                       chunk_size=CHUNK, positions=positions, temperature=0.7)
            grad = jax.grad(_weighted_sum(masked, targets, w_logp, w_ent), argnums=(0, 1))
            # One program for the values and the gradients.
            (logp, entropy), grads = self.variant(
                lambda h, w, grad=grad, masked=masked: (masked(h, w, targets), grad(h, w)))(
                    hidden, lm_head)
            chex.assert_shape((logp, entropy), (B, T))
            chex.assert_type((logp, entropy), jnp.float32)
            np.testing.assert_allclose(logp, exp_logp * mask, rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(entropy, exp_entropy * mask, rtol=1e-5, atol=1e-5)
            chex.assert_trees_all_close(grads, exp_grads, rtol=1e-5, atol=1e-5)
