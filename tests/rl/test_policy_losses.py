"""agentjax.rl.policy_losses: every kind against tests/reference.py, the registry of kinds
and their hyperparameters."""
import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentjax.config import choices
from agentjax.rl import policy_losses as pl
from agentjax.config.choices import AGGREGATIONS
from tests import reference as ref
from tests.rl._inputs import CLIPS, kind_params, policy_inputs

TOL = dict(rtol=1e-5, atol=1e-6)


def test_every_policy_loss_choice_is_registered_and_vice_versa():
    assert set(pl.POLICY_LOSSES) == set(choices.POLICY_LOSSES)


def test_kinds_hyperparameters_and_their_defaults():
    assert pl.policy_loss_hyperparameters("ppo") == ("clip_low", "clip_high", "dual_clip")
    assert pl.policy_loss_hyperparameters("gspo") == ("clip_low", "clip_high")
    assert pl.policy_loss_hyperparameters("cispo") == ("clip_low", "clip_high")
    assert pl.policy_loss_hyperparameters("reinforce") == ()
    assert pl.policy_loss_kind("ppo") == pl.PPO(clip_low=0.2, clip_high=0.2, dual_clip=None)
    assert pl.policy_loss_kind("gspo", clip_high=4e-4) == pl.GSPO(0.2, 4e-4)
    with pytest.raises(ValueError, match=r"'reinforce' has no hyperparameter clip_low"):
        pl.policy_loss_kind("reinforce", clip_low=0.2)
    with pytest.raises(ValueError, match="unknown policy loss kind 'trpo'"):
        pl.policy_loss_kind("trpo")


class ReferenceTest(chex.TestCase):
    """Loss values and d loss / d logp vs the float64 reference, with and without jit."""

    def setUp(self):
        super().setUp()
        self.logp, self.old_logp, self.adv, self.mask = policy_inputs(0)

    def _check_policy(self, fn, kind, agg, dual_clip=None):
        loss, grad = fn(self.logp, self.old_logp, self.adv, self.mask)
        token_args = (self.logp, self.old_logp, self.adv, self.mask, kind)
        expected = ref.aggregate(ref.policy_token_loss(*token_args, **CLIPS, dual_clip=dual_clip),
                                 self.mask, agg)
        np.testing.assert_allclose(loss, expected, **TOL)
        expected_grad = ref.policy_token_grad(*token_args, **CLIPS, dual_clip=dual_clip)
        expected_grad = expected_grad * ref.aggregate_weights(self.mask, agg)
        np.testing.assert_allclose(grad, expected_grad, **TOL)

    @chex.variants(with_jit=True, without_jit=True)
    def test_policy_loss_kinds_and_modes(self):
        cases = [(kind, "token-mean", None) for kind in pl.POLICY_LOSSES]
        cases += [("ppo", mode, 3.0) for mode in AGGREGATIONS]
        for kind, agg, dual_clip in cases:
            def loss_fn(logp, old_logp, adv, mask, kind=kind, agg=agg, dual_clip=dual_clip):
                return pl.policy_loss(logp, old_logp, adv, mask, kind=kind, agg=agg,
                                      **kind_params(kind, dual_clip))[0]

            fn = self.variant(jax.value_and_grad(loss_fn))
            self._check_policy(fn, kind, agg, dual_clip)

    @chex.variants(with_jit=True, without_jit=True)
    def test_dual_clip_zero_is_off_bit_for_bit(self):
        """The config's dual_clip=0 ("off") is the loss without a dual clip, exactly."""
        def loss(**params):
            fn = self.variant(jax.value_and_grad(
                lambda lp: pl.policy_loss(lp, self.old_logp, self.adv, self.mask, **params,
                                          **CLIPS), has_aux=True))
            return fn(self.logp)

        (off, off_metrics), off_grad = loss()
        for dual_clip in (None, 0.0, 0):
            (value, metrics), grad = loss(dual_clip=dual_clip)
            np.testing.assert_array_equal(value, off)
            np.testing.assert_array_equal(grad, off_grad)
            chex.assert_trees_all_equal(metrics, off_metrics)
        assert "clipfrac_dual" not in off_metrics


def test_ppo_hand_computed_and_metrics():
    # ratios 1.5 (A=+1, clipped high -> -1.2), 0.5 (A=-1, clipped low -> 0.8),
    # 4 (A=-1, dual-clipped -> 3), 1 (A=+1 -> -1); a masked token with ratio 100.
    ratio = jnp.array([[1.5, 0.5, 4.0, 1.0, 100.0]])
    logp = jnp.full((1, 5), -1.0)
    old_logp = logp - jnp.log(ratio)
    adv = jnp.array([[1.0, -1.0, -1.0, 1.0, 1.0]])
    mask = jnp.array([[1, 1, 1, 1, 0]])
    loss, m = pl.policy_loss(logp, old_logp, adv, mask, dual_clip=3.0)
    np.testing.assert_allclose(loss, (-1.2 + 0.8 + 3.0 - 1.0) / 4, rtol=1e-6)
    expected = dict(clipfrac=0.5, clipfrac_high=0.25, clipfrac_low=0.25, clipfrac_dual=0.25,
                    ratio_max=4.0, ratio_min=0.5, ratio_mean=1.75, num_tokens=4.0,
                    advantage_mean=0.0, approx_kl=-np.log([1.5, 0.5, 4.0, 1.0]).mean())
    for key, value in expected.items():
        np.testing.assert_allclose(m[key], value, rtol=1e-5, atol=1e-7, err_msg=key)


def test_bad_arguments_name_the_argument():
    x = jnp.zeros((2, 3))
    with pytest.raises(ValueError, match="kind"):
        pl.policy_loss(x, x, x, x, kind="trpo")
    with pytest.raises(ValueError, match="agg"):
        pl.policy_loss(x, x, x, x, agg="sum")
    with pytest.raises(ValueError, match="old_logp"):
        pl.policy_loss(x, jnp.zeros((2, 4)), x, x)
    with pytest.raises(ValueError, match="advantages"):
        pl.policy_loss(x, x, jnp.zeros(3), x)
    with pytest.raises(ValueError, match="dual_clip"):
        pl.policy_loss(x, x, x, x, kind="gspo", dual_clip=3.0)
    with pytest.raises(ValueError, match="dual_clip"):
        pl.policy_loss(x, x, x, x, dual_clip=1.0)
    with pytest.raises(ValueError, match="clip_low"):
        pl.policy_loss(x, x, x, x, clip_low=-0.1)
    with pytest.raises(ValueError, match="clip_hgih"):
        pl.policy_loss(x, x, x, x, clip_hgih=0.3)
