"""agentjax.rl.offpolicy and the decoupled PPO objective it feeds (`rl_objective` with the
proximal policy as clip centre and its importance weights): values, gradients and metrics
against float64 references, the exact reduction to today's loss when the behavior policy
is the proximal one, micro-batching and sharding."""
import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentjax.rl import losses, offpolicy
from agentjax.rl.aggregation import loss_norm
from tests import reference as ref
from tests.rl._inputs import B, CLIPS, T, edge_mask, floats, kind_params
from tests.sharding import assert_rows_sharded_match_one_device

TOL = dict(rtol=1e-5, atol=1e-6)
CAP = 2.0


def _inputs(seed):
    """(logp, proximal, behavior, advantages, mask): the behavior policy is a mix of weight
    versions (row 5's first half far older), so some weights pass the cap."""
    rng = np.random.default_rng(seed)
    mask = edge_mask(rng)
    logp = floats(rng, (B, T), 0.5) - 1.0
    proximal = logp + floats(rng, (B, T), 0.3)
    behavior = proximal + floats(rng, (B, T), 0.6)
    behavior[5, :T // 2] = proximal[5, :T // 2] - 1.5  # rho ~ 4.5 > CAP
    proximal[4, :3] = logp[4, :3] + 1.5  # r ~ 0.22 with A = -1: the dual clip binds
    advantages = floats(rng, (B, T))
    advantages[4, :3] = -1.0
    return logp, proximal, behavior, advantages, mask


def _decoupled(logp, proximal, behavior, adv, mask, *, bound, kind="ppo", agg="token-mean",
               dual_clip=None, norm=None):
    weights, is_metrics = offpolicy.importance_weights(proximal, behavior, mask, cap=CAP,
                                                       bound=bound)
    loss, metrics = losses.rl_objective(logp, proximal, adv, mask, is_weights=weights,
                                        kind=kind, agg=agg, norm=norm,
                                        **kind_params(kind, dual_clip))
    return loss, {**metrics, **is_metrics}


def test_weights_per_token_hand_computed():
    # One sequence whose tokens were sampled by different weight versions: rho = pi_prox /
    # mu is 0.5, 1, 1.5, 3 and exp(30) (clamped to exp(20)); the last token is an
    # observation with a NaN behavior log-prob.
    rho = np.array([0.5, 1.0, 1.5, 3.0])
    proximal = jnp.full((1, 6), -1.0)
    behavior = jnp.array([[*(-1.0 - np.log(rho)), -31.0, np.nan]])
    mask = jnp.array([[1, 1, 1, 1, 1, 0]])
    expected = {"truncate": ([0.5, 1.0, 1.5, 2.0, 2.0, 1.0], 7.0 / 5),
                "mask": ([0.5, 1.0, 1.5, 0.0, 0.0, 1.0], 3.0 / 5)}
    for bound, (weights, weight_mean) in expected.items():
        w, m = offpolicy.importance_weights(proximal, behavior, mask, cap=CAP, bound=bound)
        chex.assert_shape(w, (1, 6))
        chex.assert_type(w, jnp.float32)
        np.testing.assert_allclose(w, [weights], rtol=1e-6, err_msg=bound)
        np.testing.assert_allclose(m["is_weight_mean"], weight_mean, rtol=1e-6, err_msg=bound)
        np.testing.assert_allclose(m["is_ratio_mean"], (6.0 + np.exp(20.0)) / 5, rtol=1e-5)
        np.testing.assert_allclose(m["is_ratio_max"], np.exp(20.0), rtol=1e-5)
        np.testing.assert_allclose(m["is_clipfrac"], 2 / 5, rtol=1e-6)
    # Without action tokens every weight is 1 and the metrics are those of on-policy data.
    w, m = offpolicy.importance_weights(proximal, behavior, jnp.zeros_like(mask), cap=CAP)
    np.testing.assert_array_equal(w, np.ones((1, 6)))
    assert {k: float(v) for k, v in m.items()} == {
        "is_ratio_mean": 1.0, "is_ratio_max": 1.0, "is_weight_mean": 1.0, "is_clipfrac": 0.0}


class ReferenceTest(chex.TestCase):
    """Weights, the decoupled loss and d loss / d logp vs the float64 references, where the
    reference weights the token's *loss* (AReaL's form) and the library its advantage."""

    def setUp(self):
        super().setUp()
        self.logp, self.proximal, self.behavior, self.adv, self.mask = _inputs(0)

    @chex.variants(with_jit=True, without_jit=True)
    def test_decoupled_objective(self):
        cases = [("ppo", "seq-mean-token-mean", 3.0, "truncate"),
                 ("ppo", "token-mean", None, "mask"),
                 ("gspo", "token-mean", None, "truncate"),
                 ("cispo", "seq-mean-token-sum-norm", None, "mask")]
        for kind, agg, dual_clip, bound in cases:
            msg = f"{kind} {agg} {bound}"
            fn = self.variant(jax.value_and_grad(functools.partial(
                _decoupled, bound=bound, kind=kind, agg=agg, dual_clip=dual_clip),
                has_aux=True))
            (loss, metrics), grad = fn(self.logp, self.proximal, self.behavior, self.adv,
                                       self.mask)
            w = ref.importance_weights(self.proximal, self.behavior, self.mask, CAP, bound)
            token_args = (self.logp, self.proximal, self.adv, self.mask, kind)
            token_loss = w * ref.policy_token_loss(*token_args, **CLIPS, dual_clip=dual_clip)
            np.testing.assert_allclose(loss, ref.aggregate(token_loss, self.mask, agg), **TOL,
                                       err_msg=msg)
            expected_grad = (ref.aggregate_weights(self.mask, agg) * w
                             * ref.policy_token_grad(*token_args, **CLIPS, dual_clip=dual_clip))
            np.testing.assert_allclose(grad, expected_grad, **TOL, err_msg=msg)
            on_tokens = self.mask.astype(bool)
            rho = np.exp(self.proximal.astype(np.float64) - self.behavior)[on_tokens]
            np.testing.assert_allclose(metrics["is_weight_mean"], w[on_tokens].mean(), **TOL)
            np.testing.assert_allclose(metrics["is_ratio_mean"], rho.mean(), **TOL)
            np.testing.assert_allclose(metrics["is_ratio_max"], rho.max(), **TOL)
            np.testing.assert_allclose(metrics["is_clipfrac"], (rho > CAP).mean(), **TOL)
            assert 0 < metrics["is_clipfrac"] < 1, msg  # the cap binds on some tokens only

    def test_behavior_equal_to_proximal_is_todays_loss_exactly(self):
        # mu = pi_prox on action tokens (garbage elsewhere), cap 1 (the tightest that keeps
        # on-policy tokens): every weight is exactly 1 and value, gradient and metrics equal
        # the loss without weights bit for bit, for both bounds.
        behavior = np.where(self.mask, self.proximal, np.nan).astype(np.float32)

        def objective(logp, bound):
            weights, is_metrics = (None, {}) if bound == "none" else offpolicy.importance_weights(
                self.proximal, behavior, self.mask, cap=1.0, bound=bound)
            loss, metrics = losses.rl_objective(
                logp, self.proximal, self.adv, self.mask, is_weights=weights,
                ref_logp=self.proximal - 0.1, kl_coef=0.1, dual_clip=3.0, **CLIPS)
            return loss, (metrics, is_metrics, weights)

        @jax.jit
        def every_bound(logp):
            return {bound: jax.value_and_grad(functools.partial(objective, bound=bound),
                                              has_aux=True)(logp)
                    for bound in ("none", *offpolicy.IS_BOUNDS)}

        results = every_bound(self.logp)
        (base_loss, (base_metrics, _, _)), base_grad = results.pop("none")
        for bound, ((loss, (metrics, is_metrics, weights)), grad) in results.items():
            np.testing.assert_array_equal(weights, np.ones((B, T)), err_msg=bound)
            np.testing.assert_array_equal(loss, base_loss, err_msg=bound)
            np.testing.assert_array_equal(grad, base_grad, err_msg=bound)
            chex.assert_trees_all_equal(metrics, base_metrics)
            assert is_metrics["is_clipfrac"] == 0 and is_metrics["is_ratio_max"] == 1, bound


def test_truncated_is_policy_gradient_is_cispo_on_the_behavior_policy():
    # No proximal policy: L = agg[-sg(min(pi / mu, C)) A log pi], the CISPO kind with the
    # ratio taken against mu, no lower clip (clip_low = 1) and clip_high = C - 1.
    logp, _, behavior, adv, mask = _inputs(1)
    agg = "seq-mean-token-mean"

    def loss_fn(logp):
        return losses.rl_objective(logp, behavior, adv, mask, kind="cispo", clip_low=1.0,
                                   clip_high=CAP - 1.0, agg=agg)[0]

    loss, grad = jax.jit(jax.value_and_grad(loss_fn))(logp)
    weights = np.minimum(np.exp(logp.astype(np.float64) - behavior), CAP)
    assert (weights == CAP).any() and (weights < CAP).any()
    np.testing.assert_allclose(loss, ref.aggregate(-weights * adv * logp, mask, agg), **TOL)
    np.testing.assert_allclose(grad, ref.aggregate_weights(mask, agg) * -weights * adv, **TOL)


@functools.partial(jax.jit, static_argnames=("bound", "kind", "agg"))
def _decoupled_loss_and_grad(logp, proximal, behavior, adv, mask, norm, bound, kind, agg):
    return jax.value_and_grad(lambda lp: _decoupled(
        lp, proximal, behavior, adv, mask, bound=bound, kind=kind, agg=agg, norm=norm)[0])(logp)


def test_micro_batches_sum_to_the_full_batch():
    # The weights are per token, so a micro-batch's are the full batch's rows.
    arrays = _inputs(2)
    norm = loss_norm(arrays[-1], constant=20.0)
    for bound, kind, agg in [("truncate", "ppo", "seq-mean-token-sum-norm"),
                             ("mask", "gspo", "seq-mean-token-mean")]:
        full_loss, full_grad = _decoupled_loss_and_grad(*arrays, norm, bound, kind, agg)
        parts = [_decoupled_loss_and_grad(*(x[i:i + 2] for x in arrays), norm, bound, kind, agg)
                 for i in range(0, B, 2)]
        msg = f"{bound} {kind} {agg}"
        np.testing.assert_allclose(sum(p[0] for p in parts), full_loss, rtol=1e-6, atol=1e-6,
                                   err_msg=msg)
        np.testing.assert_allclose(np.concatenate([p[1] for p in parts]), full_grad, rtol=1e-6,
                                   atol=1e-6, err_msg=msg)


def test_sharded_matches_single_device(eight_devices):
    assert_rows_sharded_match_one_device(
        functools.partial(_decoupled, bound="mask", dual_clip=3.0), _inputs(3), eight_devices)


def test_bad_arguments_name_the_argument():
    x = jnp.zeros((2, 3))
    with pytest.raises(ValueError, match="bound"):
        offpolicy.importance_weights(x, x, x, cap=CAP, bound="clip")
    with pytest.raises(ValueError, match="cap"):
        offpolicy.importance_weights(x, x, x, cap=0.0)
    with pytest.raises(ValueError, match="behavior_logp"):
        offpolicy.importance_weights(x, jnp.zeros((2, 4)), x, cap=CAP)
