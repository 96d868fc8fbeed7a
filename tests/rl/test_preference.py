"""agentjax.rl.preference: sequence log-probs over action tokens and the DPO family against
hand-computed values and the float64 reference (values, gradients, metrics), masking,
micro-batching and sharding."""
import functools
import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentjax.rl import logprobs, preference
from tests import reference as ref
from tests.rl._inputs import B, T, edge_mask, floats
from tests.sharding import assert_rows_sharded_match_one_device

TOL = dict(rtol=1e-5, atol=1e-6)
BETA = 0.5
T_REJECTED = 10  # rejected trajectories are bucketed to another length than chosen ones


def _pairs(seed):
    """(policy_c, policy_r, ref_c, ref_r, mask_c, mask_r) of B pairs: pair 0 is padding (no
    action token on either side), pair 2 has an empty rejected trajectory (not counted),
    pair 3 is strongly preferred (hinge inactive)."""
    rng = np.random.default_rng(seed)
    mask_c, mask_r = edge_mask(rng), edge_mask(rng, length=T_REJECTED)
    mask_r[2] = False
    policy_c = floats(rng, (B, T), 0.5) - 1.0
    policy_r = floats(rng, (B, T_REJECTED), 0.5) - 1.0
    ref_c = policy_c + floats(rng, (B, T), 0.3)
    ref_r = policy_r + floats(rng, (B, T_REJECTED), 0.3)
    ref_c[3] = policy_c[3] - 1.0
    ref_r[3] = policy_r[3] + 1.0
    return policy_c, policy_r, ref_c, ref_r, mask_c, mask_r


def test_sequence_logprobs_sum_action_tokens_only():
    logp = jnp.array([[-1.0, -2.0, np.nan, -4.0], [np.inf, -0.5, -0.25, 0.0], [np.nan] * 4])
    mask = jnp.array([[1, 1, 0, 1], [0, 1, 1, 0], [0, 0, 0, 0]])
    np.testing.assert_array_equal(preference.sequence_logprobs(logp, mask), [-7.0, -0.75, 0.0])
    grad = jax.grad(lambda x: preference.sequence_logprobs(x, mask).sum())(logp)
    np.testing.assert_array_equal(grad, mask)


def test_dpo_hand_computed():
    # Pair 0: chosen log-ratio h = (-1 + 1.5) + (-2 + 2.5) = 1 over 2 action tokens,
    # rejected h = (-1 + 0.5) + (-1 + 0.5) = -1 over 2: z = 2 (z = 0.5 + 0.5 = 1 per token).
    # Pair 1: h = 0 on both sides (1 and 3 tokens): z = 0. Pair 2 is padding (NaN, no mask).
    nan = np.nan
    policy_c = jnp.array([[-1.0, -2.0, nan], [-1.0, nan, nan], [nan] * 3])
    ref_c = jnp.array([[-1.5, -2.5, 7.0], [-1.0, nan, nan], [nan] * 3])
    policy_r = jnp.array([[-1.0, 9.0, -1.0], [-1.0, -1.0, -1.0], [nan] * 3])
    ref_r = jnp.array([[-0.5, 0.0, -0.5], [-1.0, -1.0, -1.0], [nan] * 3])
    mask_c = jnp.array([[1, 1, 0], [1, 0, 0], [0, 0, 0]])
    mask_r = jnp.array([[1, 0, 1], [1, 1, 1], [0, 0, 0]])
    log2 = math.log(2.0)
    expected = {  # (kind, label_smoothing, length_normalized) -> mean over the 2 pairs
        ("sigmoid", 0.0, False): (math.log1p(math.exp(-1.0)) + log2) / 2,
        ("sigmoid", 0.1, False): (0.9 * math.log1p(math.exp(-1.0))
                                  + 0.1 * math.log1p(math.exp(1.0)) + log2) / 2,
        ("sigmoid", 0.0, True): (math.log1p(math.exp(-0.5)) + log2) / 2,
        ("ipo", 0.0, False): ((2.0 - 1.0) ** 2 + (0.0 - 1.0) ** 2) / 2,  # 1 / (2 beta) = 1
        ("ipo", 0.0, True): ((1.0 - 1.0) ** 2 + (0.0 - 1.0) ** 2) / 2,
        ("hinge", 0.0, False): (max(0.0, 1 - BETA * 2) + 1.0) / 2,
    }
    for (kind, smoothing, normalized), value in expected.items():
        loss, metrics = preference.dpo_loss(
            policy_c, policy_r, ref_c, ref_r, mask_c, mask_r, beta=BETA, kind=kind,
            label_smoothing=smoothing, length_normalized=normalized)
        msg = f"{kind} {smoothing} {normalized}"
        chex.assert_shape(loss, ())
        np.testing.assert_allclose(loss, value, rtol=1e-6, err_msg=msg)
        # Rewards beta * h per pair: (0.5, -0.5) and (0, 0); per token (0.25, -0.25).
        scale = 0.5 if normalized else 1.0
        np.testing.assert_allclose(metrics["reward_chosen"], 0.25 * scale, rtol=1e-6)
        np.testing.assert_allclose(metrics["reward_rejected"], -0.25 * scale, rtol=1e-6)
        np.testing.assert_allclose(metrics["reward_margin"], 0.5 * scale, rtol=1e-6)
        assert metrics["reward_accuracy"] == 0.5 and metrics["num_pairs"] == 2.0, msg
        np.testing.assert_allclose(metrics["logp_chosen"], (-3.0 - 1.0) / 2, rtol=1e-6)
        np.testing.assert_allclose(metrics["logp_rejected"], (-2.0 - 3.0) / 2, rtol=1e-6)


def test_conservative_dpo_is_not_trls_robust_dpo():
    # agentjax's label smoothing is conservative DPO (cDPO): (1 - eps) L(z) + eps L(-z),
    # L(z) = -log sigmoid(beta z). TRL's "robust" loss is rDPO (Chowdhury et al. 2024):
    # ((1 - eps) L(z) - eps L(-z)) / (1 - 2 eps). They differ by the sign of the eps term
    # and the 1 / (1 - 2 eps) factor, not by the factor alone; both are DPO at eps = 0.
    def loss(z, eps, flip=False):  # one pair of one action token each: h_w = z, h_l = 0
        chosen, rejected = jnp.array([[z]]), jnp.zeros((1, 1))
        if flip:
            chosen, rejected = rejected, chosen
        mask = jnp.ones((1, 1))
        return float(preference.dpo_loss(chosen, rejected, jnp.zeros((1, 1)),
                                         jnp.zeros((1, 1)), mask, mask, beta=BETA,
                                         label_smoothing=eps)[0])

    def dpo64(z):  # float64 numpy, from the formula
        return np.logaddexp(0.0, -BETA * np.float64(z))

    def cdpo64(z, eps):
        return (1.0 - eps) * dpo64(z) + eps * dpo64(-z)

    def rdpo64(z, eps):
        return ((1.0 - eps) * dpo64(z) - eps * dpo64(-z)) / (1.0 - 2.0 * eps)

    for z in (-3.0, -0.7, 0.0, 0.4, 1.5, 4.0):
        plain, plain_flipped = loss(z, 0.0), loss(z, 0.0, flip=True)  # L(z), L(-z)
        np.testing.assert_allclose(plain, dpo64(z), **TOL)
        np.testing.assert_allclose(plain_flipped, dpo64(-z), **TOL)
        np.testing.assert_allclose(rdpo64(z, 0.0), plain, **TOL)  # eps = 0: both are DPO
        np.testing.assert_allclose(cdpo64(z, 0.0), plain, **TOL)
        for eps in (0.1, 0.25, 0.4):
            conservative = loss(z, eps)
            np.testing.assert_allclose(conservative, cdpo64(z, eps), **TOL)
            robust = ((1 - eps) * plain - eps * plain_flipped) / (1 - 2 * eps)
            np.testing.assert_allclose(robust, rdpo64(z, eps), **TOL)
            # (1 - 2 eps) rDPO + 2 eps L(-z) = cDPO: the eps term's sign, then the factor.
            np.testing.assert_allclose((1 - 2 * eps) * rdpo64(z, eps) + 2 * eps * plain_flipped,
                                       conservative, **TOL)
            # Not cDPO / (1 - 2 eps): that is 2 eps L(-z) / (1 - 2 eps) > 0 above rDPO.
            gap = conservative / (1 - 2 * eps) - rdpo64(z, eps)
            np.testing.assert_allclose(gap, 2 * eps * dpo64(-z) / (1 - 2 * eps), **TOL)
            assert gap > 1e-3
            # Why rDPO flips the sign: under labels flipped with probability eps its
            # expectation is the clean loss (unbiased); cDPO's is not (but at z = 0).
            np.testing.assert_allclose((1 - eps) * rdpo64(z, eps) + eps * rdpo64(-z, eps),
                                       dpo64(z), rtol=1e-12)
            cdpo_expected = (1 - eps) * cdpo64(z, eps) + eps * cdpo64(-z, eps)
            assert z == 0.0 or abs(cdpo_expected - dpo64(z)) > 1e-3


class ReferenceTest(chex.TestCase):
    """Value, d loss / d token log-probs of both sides and the metrics vs the reference."""

    @chex.variants(with_jit=True, without_jit=True)
    def test_kinds_against_reference(self):
        arrays = _pairs(0)
        cases = [("sigmoid", 0.0, False), ("sigmoid", 0.1, True), ("ipo", 0.0, False),
                 ("ipo", 0.0, True), ("hinge", 0.0, False)]
        for kind, smoothing, normalized in cases:
            msg = f"{kind} {smoothing} {normalized}"
            loss_fn = functools.partial(preference.dpo_loss, beta=BETA, kind=kind,
                                        label_smoothing=smoothing, length_normalized=normalized)
            fn = self.variant(jax.value_and_grad(loss_fn, argnums=(0, 1), has_aux=True))
            (loss, metrics), (grad_c, grad_r) = fn(*arrays)
            exp_loss, exp_grad_c, exp_grad_r, rewards_c, rewards_r, counted = ref.dpo(
                *arrays, BETA, kind, smoothing, normalized)
            np.testing.assert_allclose(loss, exp_loss, **TOL, err_msg=msg)
            np.testing.assert_allclose(grad_c, exp_grad_c, **TOL, err_msg=msg)
            np.testing.assert_allclose(grad_r, exp_grad_r, **TOL, err_msg=msg)
            assert list(counted) == [False, True, False] + [True] * (B - 3)
            assert metrics["num_pairs"] == B - 2
            margins = (rewards_c - rewards_r)[counted]
            np.testing.assert_allclose(metrics["reward_margin"], margins.mean(), **TOL)
            np.testing.assert_allclose(metrics["reward_chosen"], rewards_c[counted].mean(),
                                       **TOL)
            np.testing.assert_allclose(metrics["reward_rejected"], rewards_r[counted].mean(),
                                       **TOL)
            np.testing.assert_allclose(metrics["reward_accuracy"], (margins > 0).mean(), **TOL)
            if kind == "hinge":  # both sides of the kink occur
                assert (margins > 1).any() and (margins < 1).any()


# Every kind once, with and without length normalization (shared compilations).
_CASES = (("sigmoid", True), ("hinge", False), ("ipo", True))


@functools.partial(jax.jit, static_argnames=("kind", "normalized"))
def _loss_and_grads(policy_c, policy_r, ref_c, ref_r, mask_c, mask_r, num_pairs, kind,
                    normalized):
    def loss_fn(policy_c, policy_r):
        smoothing = 0.1 if kind == "sigmoid" else 0.0
        return preference.dpo_loss(policy_c, policy_r, ref_c, ref_r, mask_c, mask_r, beta=BETA,
                                   kind=kind, label_smoothing=smoothing,
                                   length_normalized=normalized, num_pairs=num_pairs)[0]
    return jax.value_and_grad(loss_fn, argnums=(0, 1))(policy_c, policy_r)


def test_masked_tokens_get_no_value_and_no_gradient():
    # NaN / inf at mask-0 positions of any input must not reach the loss, and the gradient
    # there is exactly zero, for every kind.
    policy_c, policy_r, ref_c, ref_r, mask_c, mask_r = clean = _pairs(1)
    dirty = (np.where(mask_c, policy_c, np.nan), np.where(mask_r, policy_r, -np.inf),
             np.where(mask_c, ref_c, np.inf), np.where(mask_r, ref_r, np.nan), mask_c, mask_r)
    num_pairs = preference.count_pairs(mask_c, mask_r)
    for kind, normalized in _CASES:
        loss, (grad_c, grad_r) = _loss_and_grads(*dirty, num_pairs, kind, normalized)
        clean_loss, clean_grads = _loss_and_grads(*clean, num_pairs, kind, normalized)
        msg = f"{kind} {normalized}"
        assert np.isfinite(loss), msg
        assert np.all(np.asarray(grad_c)[~mask_c] == 0.0), msg
        assert np.all(np.asarray(grad_r)[~mask_r] == 0.0), msg
        np.testing.assert_array_equal(loss, clean_loss, err_msg=msg)
        chex.assert_trees_all_equal((grad_c, grad_r), clean_grads)


def test_gradient_through_chunked_logprobs_stays_on_action_tokens():
    # Per-token log-probs from the chunked path: a non-action position's hidden state gets
    # exactly zero gradient, an action position's does not.
    rng = np.random.default_rng(2)
    pairs, length, width, vocab = 4, 6, 8, 16
    hidden = floats(rng, (2 * pairs, length, width))
    lm_head = floats(rng, (width, vocab), 0.5)
    targets = rng.integers(0, vocab, (2 * pairs, length)).astype(np.int32)
    mask = edge_mask(rng, 2 * pairs, length)
    ref_logp = floats(rng, (2 * pairs, length)) - 2.0

    def loss_fn(hidden):
        logp, _ = logprobs.token_logprobs(hidden, lm_head, targets, chunk_size=4)
        return preference.dpo_loss(logp[:pairs], logp[pairs:], ref_logp[:pairs],
                                   ref_logp[pairs:], mask[:pairs], mask[pairs:], beta=BETA,
                                   length_normalized=True)[0]

    grad = np.abs(np.asarray(jax.jit(jax.grad(loss_fn))(hidden))).sum(axis=-1)
    assert np.all(grad[~mask] == 0.0)
    counted = mask[:pairs].any(axis=1) & mask[pairs:].any(axis=1)
    on_counted = mask & np.concatenate([counted, counted])[:, None]
    assert np.all(grad[on_counted] > 0.0)


def test_micro_batches_sum_to_the_full_batch():
    arrays = _pairs(3)
    num_pairs = preference.count_pairs(arrays[4], arrays[5])
    for kind, normalized in _CASES:
        full_loss, full_grads = _loss_and_grads(*arrays, num_pairs, kind, normalized)
        parts = [_loss_and_grads(*(x[i:i + 2] for x in arrays), num_pairs, kind, normalized)
                 for i in range(0, B, 2)]
        msg = f"{kind} {normalized}"
        np.testing.assert_allclose(sum(p[0] for p in parts), full_loss, rtol=1e-6, atol=1e-7,
                                   err_msg=msg)
        for side in (0, 1):
            np.testing.assert_allclose(np.concatenate([p[1][side] for p in parts]),
                                       full_grads[side], rtol=1e-6, atol=1e-8, err_msg=msg)


def test_sharded_matches_single_device(eight_devices):
    assert_rows_sharded_match_one_device(
        functools.partial(preference.dpo_loss, beta=BETA, label_smoothing=0.1,
                          length_normalized=True), _pairs(4), eight_devices, argnums=(0, 1))


def test_bad_arguments_name_the_argument():
    x, y = jnp.zeros((2, 3)), jnp.zeros((2, 4))
    with pytest.raises(ValueError, match="kind"):
        preference.dpo_loss(x, y, x, y, x, y, beta=BETA, kind="kto")
    with pytest.raises(ValueError, match="beta"):
        preference.dpo_loss(x, y, x, y, x, y, beta=0.0)
    with pytest.raises(ValueError, match="label_smoothing"):
        preference.dpo_loss(x, y, x, y, x, y, beta=BETA, label_smoothing=0.6)
    with pytest.raises(ValueError, match="label_smoothing"):
        preference.dpo_loss(x, y, x, y, x, y, beta=BETA, kind="ipo", label_smoothing=0.1)
    with pytest.raises(ValueError, match="ref_rejected"):
        preference.dpo_loss(x, y, x, x, x, y, beta=BETA)
    with pytest.raises(ValueError, match="pairs"):
        preference.dpo_loss(x, jnp.zeros((3, 4)), x, jnp.zeros((3, 4)), x, jnp.zeros((3, 4)),
                            beta=BETA)
    with pytest.raises(ValueError, match="num_pairs"):
        preference.dpo_loss(x, y, x, y, x, y, beta=BETA, num_pairs=0)
    with pytest.raises(ValueError, match="mask"):
        preference.sequence_logprobs(x, y)
