"""agentjax.rl.rollout_correction and the sequence-level weights of rl.offpolicy: hand
values, the float64 references (tests/reference.py), with and without jit, sharded vs
one device, the identity when the engine agrees with the trainer, and the corrected
objective's value and gradient."""
import dataclasses
import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentjax.config.algorithms import apply_rollout_correction
from agentjax.config.schema import default_config
from agentjax.rl import losses, offpolicy, rollout_correction
from agentjax.rl.rollout_correction import MASKS, Thresholds
from tests import reference as ref
from tests.rl._inputs import B, CLIPS, T, edge_mask, floats, kind_params
from tests.sharding import assert_rows_sharded_match_one_device

TOL = dict(rtol=1e-5, atol=1e-6)
TH = Thresholds()
ALL = MASKS.names()


def _inputs(seed):
    """(logp, proximal, behavior, advantages [B], action): per row a mismatch of its own
    size (1e-3 .. 0.8 nats a token), so every mask keeps some rows and rejects others;
    row 7 has a token the engine found 30 nats less likely (clamped to 20)."""
    rng = np.random.default_rng(seed)
    action = edge_mask(rng)
    logp = floats(rng, (B, T), 0.5) - 1.0
    proximal = logp + floats(rng, (B, T), 0.2)
    scale = np.array([0.001, 0.002, 0.004, 0.3, 0.002, 0.8, 0.003, 0.05], np.float32)
    behavior = proximal - scale[:, None] * floats(rng, (B, T))
    behavior[7, 2] = proximal[7, 2] - 30.0
    behavior[~action] = np.nan  # the engine has no log-prob of an observation token
    advantages = floats(rng, (B,))
    advantages[[2, 4, 6]] = [-1.0, -0.5, 0.7]
    return logp, proximal, behavior.astype(np.float32), advantages, action


def _keep(masks, inputs, thresholds=TH):
    _, proximal, behavior, adv, action = inputs
    return ref.rollout_correction_keep(proximal, behavior, action, adv, masks,
                                       dataclasses.asdict(thresholds))


def test_masks_hand_computed():
    # Five rows of 4 action tokens and an observation (NaN engine log-prob): the engine's
    # log-probs are the trainer's (0) minus log rho.
    rho = np.array([[1.0, 1.0, 1.0, 1.0],      # on-policy: kept by every mask
                    [0.4, 1.0, 1.0, 1.0],      # one token far below, A < 0
                    [1.2, 1.2, 1.2, 1.2],      # every token a little above
                    [0.999, 0.999, 1.0, 1.0],  # slightly below, A < 0: only OPSM rejects
                    [0.999, 0.999, 1.0, 1.0]])  # the same with A > 0
    trainer = jnp.zeros((5, 5))
    behavior = jnp.concatenate([-jnp.log(jnp.asarray(rho)), jnp.full((5, 1), jnp.nan)], 1)
    action = jnp.array([[1, 1, 1, 1, 0]] * 5, jnp.float32)
    adv = jnp.array([1.0, -1.0, 1.0, -1.0, 1.0])
    # Rejected rows per mask (token: only row 1's first token). geometric: 0.4^(1/4) = 0.80
    # and 1.2 outside [0.99, 1.01]; product: 0.4 and 1.2^4 = 2.07 outside [0.5, 2]; mean
    # k3: (0.4 - 1 - log 0.4) / 4 = 0.079 and 1.2 - 1 - log 1.2 = 0.018 above 0.01; max
    # k3: 0.316 above 0.3 (0.018 is not); OPSM: mean log(mu / pi) = -log(0.4) / 4 = 0.23
    # and -log(0.999) / 2 = 5e-4 above 1e-4 with A < 0.
    rejected_rows = {"geometric": [1, 2], "product": [1, 2], "seq_mean_kl": [1, 2],
                     "seq_max_kl": [1], "opsm": [1, 3]}
    for name, rows in rejected_rows.items():
        mask, metrics = rollout_correction.rejection_mask(trainer, behavior, action, action,
                                                          adv, masks=[name])
        expected = np.array(action)
        expected[rows] = 0
        np.testing.assert_array_equal(mask, expected, err_msg=name)
        np.testing.assert_allclose(metrics["rollout_correction/masked_tokens"],
                                   len(rows) / 5, rtol=1e-6, err_msg=name)
        np.testing.assert_allclose(metrics["rollout_correction/masked_seqs"],
                                   len(rows) / 5, rtol=1e-6, err_msg=name)
    mask, metrics = rollout_correction.rejection_mask(trainer, behavior, action, action, adv,
                                                      masks=["token"])
    np.testing.assert_array_equal(mask[1], [0, 1, 1, 1, 0])
    assert float(metrics["rollout_correction/masked_tokens"]) == pytest.approx(1 / 20)
    assert float(metrics["rollout_correction/masked_seqs"]) == pytest.approx(1 / 5)
    # ANDed: rows 1, 2 and 3 go; with observations in the loss a rejected row loses them
    # too (OPSM: a token with A < 0), IcePop's token mask never touches them.
    loss_mask = jnp.ones((5, 5))
    mask, metrics = rollout_correction.rejection_mask(trainer, behavior, action, loss_mask,
                                                      adv, masks=ALL)
    np.testing.assert_array_equal(mask, [[1] * 5, [0] * 5, [0] * 5, [0] * 5, [1] * 5])
    np.testing.assert_allclose(metrics["rollout_correction/masked_tokens"], 12 / 20)
    np.testing.assert_allclose(metrics["rollout_correction/token_masked_tokens"], 1 / 20)
    mask, _ = rollout_correction.rejection_mask(trainer, behavior, action, loss_mask, adv,
                                                masks=["token"])
    np.testing.assert_array_equal(mask[1], [0, 1, 1, 1, 1])


def test_sequence_weights_hand_computed():
    # Row 0: rho 0.5, 2, 3 -> product 3; row 1: 1.5 and an observation; row 2: no actions.
    log_rho = jnp.log(jnp.array([[0.5, 2.0, 3.0], [1.5, 9.0, 9.0], [9.0, 9.0, 9.0]]))
    proximal = jnp.zeros((3, 3))
    mask = jnp.array([[1, 1, 1], [1, 0, 0], [0, 0, 0]])
    for bound, row0 in (("truncate", 2.5), ("mask", 0.0)):
        w, m = offpolicy.importance_weights(proximal, proximal - log_rho, mask, cap=2.5,
                                            bound=bound, level="sequence")
        np.testing.assert_allclose(w, [[row0] * 3, [1.5, 1, 1], [1, 1, 1]], rtol=1e-6)
        np.testing.assert_allclose(m["is_ratio_mean"], (3 * 3.0 + 1.5) / 4, rtol=1e-6)
        np.testing.assert_allclose(m["is_clipfrac"], 3 / 4, rtol=1e-6)


def test_mismatch_metrics_hand_computed():
    trainer = jnp.array([[-1.0, -2.0, -3.0], [-1.0, -1.0, 0.0]])
    behavior = jnp.array([[-1.5, -1.0, jnp.nan], [-1.0, -31.0, 0.0]])
    action = jnp.array([[1, 1, 0], [1, 1, 0]])
    m = rollout_correction.mismatch_metrics(trainer, behavior, action)
    # log-ratios 0.5, -1, 0, 30 (clamped to 20 for the ratio only).
    np.testing.assert_allclose(m["logp_mismatch_k1"], -(0.5 - 1.0 + 30.0) / 4, rtol=1e-6)
    rho = [np.exp(0.5), np.exp(-1.0), 1.0, np.exp(20.0)]
    np.testing.assert_allclose(m["logp_mismatch_ratio_mean"], np.mean(rho), rtol=1e-6)
    np.testing.assert_allclose(m["logp_mismatch_ratio_min"], np.exp(-1.0), rtol=1e-6)
    np.testing.assert_allclose(m["logp_mismatch_ratio_max"], np.exp(20.0), rtol=1e-6)
    empty = rollout_correction.mismatch_metrics(trainer, behavior, jnp.zeros_like(action))
    assert {k: float(v) for k, v in empty.items()} == {
        "logp_mismatch_k1": 0.0, "logp_mismatch_ratio_mean": 1.0,
        "logp_mismatch_ratio_min": 1.0, "logp_mismatch_ratio_max": 1.0}


def test_the_icepop_preset_weights_by_its_calibration_function():
    # IcePop's M(rho) = rho inside [0.5, 5], 0 outside: the preset's token TIS times its
    # token mask, as prepare builds them from the config.
    algo = apply_rollout_correction(default_config(), "icepop").algo
    masks, thresholds = rollout_correction.from_config(algo.rollout_correction)
    rho = np.array([[0.4, 0.6, 1.0, 4.9, 5.5, 60.0]])
    trainer = jnp.zeros(rho.shape)
    behavior = -jnp.log(jnp.asarray(rho, jnp.float32))
    action = jnp.ones(rho.shape)
    w, _ = offpolicy.importance_weights(trainer, behavior, action, cap=algo.tis_cap,
                                        bound=algo.tis_bound,
                                        level=algo.rollout_correction.is_level)
    kept, _ = rollout_correction.rejection_mask(trainer, behavior, action, action,
                                                jnp.ones((1,)), masks=masks,
                                                thresholds=thresholds)
    np.testing.assert_allclose(w * kept, [[0.0, 0.6, 1.0, 4.9, 0.0, 0.0]], rtol=1e-6)


def _corrected(logp, proximal, behavior, adv, action, *, masks, level, bound="truncate",
               cap=2.0, kind="ppo", agg="token-mean", thresholds=TH):
    """The decoupled objective with the rollout correction, as prepare and rl_loss build
    it: the tis_cap weight at `level`, the loss mask ANDed with the masks."""
    weights, is_metrics = offpolicy.importance_weights(proximal, behavior, action, cap=cap,
                                                       bound=bound, level=level)
    loss_mask, mask_metrics = rollout_correction.rejection_mask(
        proximal, behavior, action, action, adv, masks=masks, thresholds=thresholds)
    loss, metrics = losses.rl_objective(logp, proximal, adv, loss_mask, is_weights=weights,
                                        kind=kind, agg=agg, **kind_params(kind))
    return loss, {**metrics, **is_metrics, **mask_metrics}


class ReferenceTest(chex.TestCase):
    """Masks, their metrics, and the corrected objective's value and d loss / d logp vs
    the float64 references."""

    def setUp(self):
        super().setUp()
        self.inputs = _inputs(0)

    @chex.variants(with_jit=True, without_jit=True)
    def test_masks_against_the_reference(self):
        _, proximal, behavior, adv, action = self.inputs
        k2 = Thresholds(kl_estimator="k2", seq_mean_kl=0.02)
        cases = [(TH, (name,)) for name in ALL] + [(k2, ("seq_mean_kl",)), (k2, ALL)]
        for thresholds, masks in cases:
            fn = self.variant(functools.partial(
                rollout_correction.rejection_mask, masks=masks, thresholds=thresholds))
            mask, metrics = fn(proximal, behavior, action.astype(np.float32),
                               action.astype(np.float32), adv)
            chex.assert_shape(mask, (B, T))
            chex.assert_type(mask, jnp.float32)
            keep = _keep(masks, self.inputs, thresholds)
            np.testing.assert_array_equal(mask, action & keep, err_msg=str(masks))
            rejected = action & ~keep
            has_actions = action.any(axis=1)
            np.testing.assert_allclose(metrics["rollout_correction/masked_tokens"],
                                       rejected.sum() / action.sum(), **TOL)
            np.testing.assert_allclose(metrics["rollout_correction/masked_seqs"],
                                       rejected.any(axis=1).sum() / has_actions.sum(),
                                       **TOL)
            if len(masks) == 1:  # the inputs exercise both sides of every mask
                assert 0 < rejected.any(axis=1).sum() < has_actions.sum(), masks

    @chex.variants(with_jit=True, without_jit=True)
    def test_corrected_objective_value_and_gradient(self):
        logp, proximal, behavior, adv, action = self.inputs
        adv_tokens = np.repeat(adv[:, None], T, axis=1)
        cases = [(("geometric", "opsm"), "token", "truncate", "ppo", "seq-mean-token-mean"),
                 (("token", "product", "seq_max_kl"), "sequence", "mask", "gspo",
                  "token-mean"),
                 (ALL, "sequence", "truncate", "cispo", "seq-mean-token-sum-norm")]
        for masks, level, bound, kind, agg in cases:
            msg = f"{masks} {level} {bound} {kind} {agg}"
            fn = self.variant(jax.value_and_grad(functools.partial(
                _corrected, masks=masks, level=level, bound=bound, kind=kind, agg=agg),
                has_aux=True))
            (loss, _), grad = fn(logp, proximal, behavior, adv, action)
            kept = action & _keep(masks, self.inputs)
            w = ref.importance_weights(proximal, behavior, action, 2.0, bound, level)
            token_args = (logp, proximal, adv_tokens, kept, kind)
            token_loss = w * ref.policy_token_loss(*token_args, **CLIPS)
            np.testing.assert_allclose(loss, ref.aggregate(token_loss, kept, agg), **TOL,
                                       err_msg=msg)
            expected_grad = (ref.aggregate_weights(kept, agg) * w
                             * ref.policy_token_grad(*token_args, **CLIPS))
            np.testing.assert_allclose(grad, expected_grad, **TOL, err_msg=msg)
            assert (grad[action & ~kept] == 0).all(), msg  # a rejected token has no gradient

    def test_engine_agreeing_with_the_trainer_changes_nothing(self):
        # mu = pi_trainer on action tokens (NaN elsewhere): every weight is exactly 1 at
        # either level (cap 1: the tightest that keeps on-policy tokens), no mask rejects
        # anything, and value, gradient and policy metrics equal the uncorrected loss's bit
        # for bit.
        logp, proximal, _, adv, action = self.inputs
        behavior = np.where(action, proximal, np.nan).astype(np.float32)

        def objective(logp, level):
            if level == "none":
                return losses.rl_objective(logp, proximal, adv, action, **CLIPS)
            return _corrected(logp, proximal, behavior, adv, action, masks=ALL, level=level,
                              cap=1.0)

        @jax.jit
        def every_level(logp):
            return {level: jax.value_and_grad(functools.partial(objective, level=level),
                                              has_aux=True)(logp)
                    for level in ("none", "token", "sequence")}

        results = every_level(logp)
        (base_loss, base_metrics), base_grad = results.pop("none")
        for level, ((loss, metrics), grad) in results.items():
            np.testing.assert_array_equal(loss, base_loss, err_msg=level)
            np.testing.assert_array_equal(grad, base_grad, err_msg=level)
            for key, value in base_metrics.items():
                np.testing.assert_array_equal(metrics[key], value, err_msg=f"{level} {key}")
            assert metrics["rollout_correction/masked_tokens"] == 0, level
            assert metrics["is_weight_mean"] == 1 and metrics["is_clipfrac"] == 0, level
        masked, _ = rollout_correction.rejection_mask(proximal, behavior, action,
                                                      action.astype(np.float32), adv,
                                                      masks=ALL)
        np.testing.assert_array_equal(masked, action)


def test_sharded_matches_single_device(eight_devices):
    assert_rows_sharded_match_one_device(
        functools.partial(_corrected, masks=ALL, level="sequence", bound="mask",
                          agg="seq-mean-token-mean"),
        _inputs(3), eight_devices)


def test_bad_arguments_name_the_argument():
    x = jnp.zeros((2, 3))
    with pytest.raises(ValueError, match="unknown rollout correction mask 'icepop'"):
        rollout_correction.rejection_mask(x, x, x, x, x, masks=["icepop"])
    with pytest.raises(ValueError, match="behavior_logp"):
        rollout_correction.rejection_mask(x, jnp.zeros((2, 4)), x, x, x, masks=["token"])
    with pytest.raises(ValueError, match="level"):
        offpolicy.importance_weights(x, x, x, cap=2.0, level="segment")
    for field, value in [("geo_low", 1.5), ("token_high", 0.9), ("kl_estimator", "k1"),
                         ("opsm_delta", 0.0)]:
        with pytest.raises(ValueError, match=field):
            Thresholds(**{field: value})
