"""agentjax.rl.losses (and the policy term of agentjax.rl.policy_losses) against
tests/reference.py: values, gradients, masking, micro-batching and sharding."""
import functools

import chex
import hypothesis.extra.numpy as hnp
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentjax.config.choices import AGGREGATIONS
from agentjax.rl import losses
from agentjax.rl.aggregation import loss_norm
from agentjax.rl.policy_losses import POLICY_LOSSES, policy_loss
from tests import reference as ref
from tests.rl._inputs import B, CLIPS, T, floats, kind_params, policy_inputs
from tests.sharding import assert_rows_sharded_match_one_device

TOL = dict(rtol=1e-5, atol=1e-6)


class ReferenceTest(chex.TestCase):
    """Loss values and d loss / d logp vs the float64 reference, with and without jit."""

    def setUp(self):
        super().setUp()
        self.logp, self.old_logp, self.adv, self.mask = policy_inputs(0)

    @chex.variants(with_jit=True, without_jit=True)
    def test_rl_objective_every_term(self):
        """policy loss on TIS-weighted advantages + kl_coef * KL - entropy_coef * entropy,
        one aggregation for all: value and gradients in logp and entropy."""
        rng = np.random.default_rng(2)
        ref_logp = self.logp + floats(rng, (B, T), 0.2)
        entropy = np.abs(floats(rng, (B, T)))
        is_weights = np.exp(floats(rng, (B, T), 0.3)).astype(np.float32)
        cases = [("ppo", "seq-mean-token-mean", 3.0, "k3"), ("gspo", "token-mean", None, "k1"),
                 ("cispo", "seq-mean-token-sum-norm", None, "k2")]
        for kind, agg, dual_clip, kl_kind in cases:
            def objective(logp, entropy, kind=kind, agg=agg, dual_clip=dual_clip,
                          kl_kind=kl_kind):
                return losses.rl_objective(
                    logp, self.old_logp, self.adv, self.mask, ref_logp=ref_logp,
                    entropy=entropy, is_weights=is_weights, kind=kind, agg=agg, kl_coef=0.1,
                    kl_kind=kl_kind, entropy_coef=0.01, **kind_params(kind, dual_clip))

            fn = self.variant(jax.value_and_grad(objective, argnums=(0, 1), has_aux=True))
            (loss, metrics), (grad_logp, grad_entropy) = fn(self.logp, entropy)
            weighted_adv = self.adv * is_weights
            token_args = (self.logp, self.old_logp, weighted_adv, self.mask, kind)
            weights = ref.aggregate_weights(self.mask, agg)
            pg = ref.aggregate(ref.policy_token_loss(*token_args, **CLIPS, dual_clip=dual_clip),
                               self.mask, agg)
            kl = ref.aggregate(ref.kl(self.logp, ref_logp, kl_kind), self.mask, agg)
            bonus = ref.aggregate(entropy, self.mask, agg)
            msg = f"{kind} {agg}"
            np.testing.assert_allclose(loss, pg + 0.1 * kl - 0.01 * bonus, **TOL, err_msg=msg)
            np.testing.assert_allclose(metrics["pg_loss"], pg, **TOL, err_msg=msg)
            np.testing.assert_allclose(metrics["kl_loss"], kl, **TOL, err_msg=msg)
            np.testing.assert_allclose(metrics["entropy"], entropy[self.mask].mean(), **TOL,
                                       err_msg=msg)
            expected_grad = weights * (
                ref.policy_token_grad(*token_args, **CLIPS, dual_clip=dual_clip)
                + 0.1 * ref.kl_grad(self.logp, ref_logp, kl_kind))
            np.testing.assert_allclose(grad_logp, expected_grad, **TOL, err_msg=msg)
            np.testing.assert_allclose(grad_entropy, -0.01 * weights, **TOL, err_msg=msg)

    @chex.variants(with_jit=True, without_jit=True)
    def test_rl_objective_kl_in_reward_and_no_entropy_bonus(self):
        """With the KL in the reward (or kl_coef 0) and entropy_coef 0 the objective is the
        policy loss alone; the entropy is still reported."""
        entropy = np.abs(floats(np.random.default_rng(3), (B, T)))
        policy = self.variant(functools.partial(policy_loss, **CLIPS))
        pg, pg_metrics = policy(self.logp, self.old_logp, self.adv, self.mask)
        for knobs in (dict(kl_coef=0.1, kl_in_reward=True), dict(kl_coef=0.0)):
            objective = self.variant(functools.partial(losses.rl_objective, **knobs, **CLIPS))
            loss, metrics = objective(self.logp, self.old_logp, self.adv, self.mask,
                                      entropy=entropy)
            np.testing.assert_array_equal(loss, pg)
            assert "kl" not in metrics and "kl_loss" not in metrics
            np.testing.assert_allclose(metrics["entropy"], entropy[self.mask].mean(), **TOL)
            chex.assert_trees_all_equal({k: metrics[k] for k in pg_metrics}, pg_metrics)

    @chex.variants(with_jit=True, without_jit=True)
    def test_grpo_value_kl_entropy(self):
        rng = np.random.default_rng(1)
        ref_logp = self.logp + floats(rng, (B, T), 0.2)
        seq_adv = floats(rng, (B,))
        agg = "seq-mean-token-mean"
        grpo = self.variant(functools.partial(losses.grpo_loss, kl_coef=0.1, agg=agg, **CLIPS))
        loss, metrics = grpo(self.logp, self.old_logp, ref_logp, seq_adv, self.mask)
        token_adv = np.broadcast_to(seq_adv[:, None], (B, T))
        pg = ref.aggregate(ref.policy_token_loss(self.logp, self.old_logp, token_adv, self.mask,
                                                 "ppo", **CLIPS), self.mask, agg)
        kl = ref.aggregate(ref.kl(self.logp, ref_logp, "k3"), self.mask, agg)
        np.testing.assert_allclose(loss, pg + 0.1 * kl, **TOL)
        np.testing.assert_allclose(metrics["pg_loss"], pg, **TOL)
        np.testing.assert_allclose(metrics["kl_loss"], kl, **TOL)

        values, returns = floats(rng, (B, T)), floats(rng, (B, T))
        old_values = values + floats(rng, (B, T), 0.3)
        for clip in (None, 0.2):
            fn = self.variant(functools.partial(losses.value_loss, clip=clip))
            loss, metrics = fn(values, old_values, returns, self.mask)
            expected = ref.aggregate(
                ref.value_token_loss(values, old_values, returns, self.mask, clip), self.mask,
                "token-mean")
            np.testing.assert_allclose(loss, expected, **TOL)

        entropy = np.abs(floats(rng, (B, T)))
        value, metrics = self.variant(losses.entropy_bonus)(entropy, self.mask)
        np.testing.assert_allclose(value, ref.aggregate(entropy, self.mask, "token-mean"), **TOL)
        np.testing.assert_allclose(metrics["entropy"], entropy[self.mask].mean(), **TOL)


# --------------------------------------------------------------------------- properties

_AGG = "seq-mean-token-mean"


def _loss_fns(kind):
    """name -> f(logp, other, adv, mask, norm) -> scalar, differentiable in logp."""
    def policy(logp, other, adv, mask, norm):
        dual = 3.0 if kind == "ppo" else None
        return policy_loss(logp, other, adv, mask, kind=kind, agg=_AGG, norm=norm,
                           **kind_params(kind, dual))[0]
    return policy


_ALL_LOSSES = {
    **{f"policy-{kind}": _loss_fns(kind) for kind in POLICY_LOSSES},
    "grpo": lambda logp, other, adv, mask, norm: losses.grpo_loss(
        logp, other, other - 0.1, adv, mask, kl_coef=0.5, agg=_AGG, norm=norm)[0],
    "objective": lambda logp, other, adv, mask, norm: losses.rl_objective(
        logp, other, adv, mask, ref_logp=other - 0.1, entropy=logp, is_weights=other * 0.5,
        kind="gspo", kl_coef=0.5, entropy_coef=0.1, agg=_AGG, norm=norm)[0],
    "value": lambda logp, other, adv, mask, norm: losses.value_loss(
        logp, other, adv, mask, clip=0.2, agg=_AGG, norm=norm)[0],
    "kl-k3+": lambda logp, other, adv, mask, norm: losses.kl_penalty(
        logp, other, mask, kind="k3+", agg=_AGG, norm=norm)[0],
    "entropy": lambda logp, other, adv, mask, norm: losses.entropy_bonus(
        logp, mask, agg=_AGG, norm=norm)[0],
}


@functools.partial(jax.jit, static_argnames="name")
def _loss_and_grad(name, logp, other, adv, mask, norm=None):
    return jax.value_and_grad(_ALL_LOSSES[name])(logp, other, adv, mask, norm)


_token_floats = hnp.arrays(np.float32, (B, T), elements=st.floats(-2, 2, width=32))


@settings(max_examples=12, deadline=None, derandomize=True)
@given(logp=_token_floats, other=_token_floats, adv=_token_floats,
       mask=hnp.arrays(np.bool_, (B, T)))
def test_no_gradient_or_value_reaches_masked_tokens(logp, other, adv, mask):
    # Garbage (NaN / inf) at masked positions must neither leak into the loss nor give a
    # gradient there; action-token gradients must equal those of a clean batch.
    dirty = [np.where(mask, x, bad) for x, bad in ((logp, np.nan), (other, np.inf), (adv, np.nan))]
    for name in _ALL_LOSSES:
        loss, grad = _loss_and_grad(name, *dirty, mask)
        clean_loss, clean_grad = _loss_and_grad(name, logp, other, adv, mask)
        assert np.isfinite(loss), name
        assert np.all(np.asarray(grad)[~mask] == 0.0), name
        np.testing.assert_allclose(loss, clean_loss, rtol=1e-6, err_msg=name)
        np.testing.assert_allclose(grad, clean_grad, rtol=1e-6, atol=1e-7, err_msg=name)


@functools.partial(jax.jit, static_argnames=("kind", "agg"))
def _policy_loss_and_grad(logp, old_logp, adv, mask, norm, kind, agg):
    def loss_fn(lp):
        if kind == "objective":  # every term, old_logp doubling as reference and weights
            return losses.rl_objective(
                lp, old_logp, adv, mask, ref_logp=old_logp, entropy=lp,
                is_weights=jnp.exp(old_logp), kl_coef=0.5, entropy_coef=0.1, agg=agg,
                norm=norm, **CLIPS)[0]
        return policy_loss(lp, old_logp, adv, mask, kind=kind, agg=agg, norm=norm,
                           **kind_params(kind))[0]
    return jax.value_and_grad(loss_fn)(logp)


_MICRO = 2  # rows per micro-batch


@settings(max_examples=10, deadline=None, derandomize=True)
@given(logp=_token_floats, old_logp=_token_floats, adv=_token_floats,
       mask=hnp.arrays(np.bool_, (B, T)))
def test_micro_batches_sum_to_the_full_batch(logp, old_logp, adv, mask):
    # The split is exact algebra, so it is checked in float64: in float32 the full batch
    # and its micro-batches sum up to ~100 terms of size up to |A| e^4 in different orders
    # (rounding of 1e-5 with cancellation), which would hide a real 1e-6 error.
    with jax.enable_x64(True):
        _check_micro_batches_sum(*(x.astype(np.float64) for x in (logp, old_logp, adv)), mask)


def _check_micro_batches_sum(logp, old_logp, adv, mask):
    norm = loss_norm(mask, constant=20.0)
    cases = [("ppo", mode) for mode in AGGREGATIONS]
    cases += [(kind, "seq-mean-token-mean")
              for kind in ("gspo", "cispo", "reinforce", "objective")]
    for kind, agg in cases:
        full_loss, full_grad = _policy_loss_and_grad(logp, old_logp, adv, mask, norm, kind, agg)
        parts = [
            _policy_loss_and_grad(logp[i:i + _MICRO], old_logp[i:i + _MICRO], adv[i:i + _MICRO],
                                  mask[i:i + _MICRO], norm, kind, agg)
            for i in range(0, B, _MICRO)
        ]
        assert full_loss.dtype == jnp.float64, full_loss.dtype
        np.testing.assert_allclose(sum(p[0] for p in parts), full_loss, rtol=1e-12,
                                   atol=1e-12, err_msg=f"{kind} {agg}")
        np.testing.assert_allclose(np.concatenate([p[1] for p in parts]), full_grad,
                                   rtol=1e-12, atol=1e-12, err_msg=f"{kind} {agg}")


def test_sharded_matches_single_device(eight_devices):
    logp, old_logp, adv, mask = policy_inputs(3)
    seq_adv = adv[:, 0]
    ref_logp = old_logp - 0.1

    def objective(logp, old_logp, ref_logp, seq_adv, mask):
        loss, metrics = losses.grpo_loss(logp, old_logp, ref_logp, seq_adv, mask, agg=_AGG,
                                         kl_coef=0.05, **CLIPS)
        gspo, _ = policy_loss(logp, old_logp, seq_adv, mask, kind="gspo", agg=_AGG)
        return loss + gspo, metrics

    assert_rows_sharded_match_one_device(
        objective, (logp, old_logp, ref_logp, seq_adv, mask), eight_devices)


def test_bad_arguments_name_the_argument():
    x = jnp.zeros((2, 3))
    with pytest.raises(ValueError, match="returns"):
        losses.value_loss(x, x, jnp.zeros(3), x)
    with pytest.raises(ValueError, match="clip"):
        losses.value_loss(x, x, x, x, clip=0.0)
    with pytest.raises(ValueError, match="ref_logp"):
        losses.kl_penalty(x, jnp.zeros((3, 3)), x)
    with pytest.raises(ValueError, match="kl_kind"):
        losses.grpo_loss(x, x, x, x, x, kl_kind="k5")
    with pytest.raises(ValueError, match="ref_logp"):
        losses.rl_objective(x, x, x, x, kl_coef=0.1)
    with pytest.raises(ValueError, match="entropy"):
        losses.rl_objective(x, x, x, x, entropy_coef=0.1)
    with pytest.raises(ValueError, match="is_weights"):
        losses.rl_objective(x, x, x, x, is_weights=jnp.zeros((2, 4)))
    with pytest.raises(ValueError, match="dual_clip"):
        losses.rl_objective(x, x, x, x, kind="cispo", dual_clip=3.0)
