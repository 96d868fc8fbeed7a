"""agentjax.rl.prepare without a model: a fake log-prob function returns fixed arrays, so
every branch (loss mask, old log-probs, TIS weights, KL in the reward or the loss, GAE
with a critic, each advantage estimator, padding rows, metrics) has hand-computed
expectations.

The batch: 4 episodes in 2 groups plus one padding row (group id -1). Positions 0-1 are
the prompt, 2-5 the response; action tokens are marked 1, the other response tokens are
observations.
"""
import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentjax.config.schema import default_config
from agentjax.rl import losses
from agentjax.rl.prepare import build_prepare
from tests import reference as ref

B, T = 5, 6
NUM_GROUPS = 2
TOL = dict(rtol=1e-6, atol=1e-6)

ACTION = np.array([
    [0, 0, 1, 1, 0, 1],
    [0, 0, 1, 0, 0, 1],
    [0, 0, 1, 1, 0, 0],
    [0, 0, 1, 1, 0, 1],
    [0, 0, 0, 0, 0, 0],  # padding
], np.float32)
# Every real token after the prompt: the loss mask with loss_on_observations.
RESPONSE = np.array([[0, 0, 1, 1, 1, 1]] * 4 + [[0] * 6], np.float32)
GROUP_IDS = np.array([0, 0, 1, 1, -1], np.int32)
# Scores 1, 0 | 2, 0.5 | 3 (the padding row's reward must be ignored).
REWARDS = np.zeros((B, T), np.float32)
REWARDS[0, 5], REWARDS[2, 3], REWARDS[3, 5], REWARDS[4, 5] = 1.0, 2.0, 0.5, 3.0

# The trainer's log-probs (at temperature 1) everywhere, and the engine's on action
# tokens: CURRENT - LOG_RATIO, so exp(LOG_RATIO) is pi_trainer / pi_engine per token.
CURRENT = (-0.1 * np.arange(1, B * T + 1, dtype=np.float32)).reshape(B, T)
_RATIOS = [0.5, 1.5, 3.0, 1.0, None, 1.5, 0.5, 1.0, 1.0, 2.0]  # None: log-ratio 30
LOG_RATIO = np.zeros((B, T), np.float32)
LOG_RATIO[ACTION > 0] = [30.0 if r is None else np.log(r) for r in _RATIOS]
BEHAVIOR = np.where(ACTION > 0, CURRENT - LOG_RATIO, 0.0).astype(np.float32)
# The reference policy is 1 nat below the current one on every token: k1(current, ref) = 1.
REF = CURRENT - 1.0


def fake_logprob_fn(params, batch, temperature):
    chex.assert_shape(batch["targets"], (B, T))
    logp = params / temperature
    return logp, jnp.zeros_like(logp)


def make_batch(temperature=1.0):
    return dict(
        targets=np.zeros((B, T), np.int32),
        segment_ids=np.array([[1] * T] * 4 + [[0] * T], np.int32),
        turn_ids=np.array([[0, 0, 1, 1, 1, 1]] * 4 + [[0] * T], np.int32),
        action_mask=ACTION, behavior_logp=BEHAVIOR, rewards=REWARDS, group_ids=GROUP_IDS,
        temperature=np.full((B,), temperature, np.float32))


def make_algo(**overrides):
    algo = default_config().algo
    algo.advantage = "dr_grpo"  # scores minus the group mean: hand-computable
    algo.old_logp = "recompute"
    algo.tis_cap = 0.0
    for key, value in overrides.items():
        setattr(algo, key, value)
    return algo


@pytest.fixture(params=[False, True], ids=["eager", "jit"])
def run(request):
    """run(algo, batch=None, loss_on_observations=False, value_fn=None, critic_params=None,
    offpolicy_metrics=False)."""

    def run(algo, batch=None, *, loss_on_observations=False, value_fn=None,
            critic_params=None, offpolicy_metrics=False):
        prepare = build_prepare(fake_logprob_fn, algo, num_groups=NUM_GROUPS,
                                loss_on_observations=loss_on_observations, value_fn=value_fn,
                                offpolicy_metrics=offpolicy_metrics)
        if request.param:
            prepare = jax.jit(prepare)
        out, metrics = prepare(jnp.asarray(CURRENT), jnp.asarray(REF), critic_params,
                               make_batch() if batch is None else batch)
        chex.assert_shape([out["loss_mask"], out["old_logp"], out["advantages"]], (B, T))
        return jax.device_get(out), jax.device_get(metrics)

    return run


def per_row(values, mask):
    return np.asarray(values, np.float32)[:, None] * mask


# Dr.GRPO advantages of the scores 1, 0 | 2, 0.5 (group means 0.5 and 1.25).
DR_GRPO = [0.5, -0.5, 0.75, -0.75, 0.0]


def test_loss_on_observations(run):
    out, _ = run(make_algo())
    np.testing.assert_array_equal(out["loss_mask"], ACTION)
    np.testing.assert_allclose(out["advantages"], per_row(DR_GRPO, ACTION), **TOL)

    out, metrics = run(make_algo(), loss_on_observations=True)
    np.testing.assert_array_equal(out["loss_mask"], RESPONSE)
    # Observation tokens enter the loss with their episode's advantage...
    np.testing.assert_allclose(out["advantages"], per_row(DR_GRPO, RESPONSE), **TOL)
    np.testing.assert_allclose(metrics["advantage_abs_mean"],
                               (4 * 0.5 + 4 * 0.5 + 4 * 0.75 + 4 * 0.75) / 16, **TOL)
    # ...but the engine/trainer mismatch is still measured on action tokens only.
    np.testing.assert_allclose(metrics["logp_mismatch_abs"],
                               np.abs(LOG_RATIO[ACTION > 0]).mean(), **TOL)


def test_old_logp_behavior_and_recompute(run):
    out, _ = run(make_algo(old_logp="behavior"), loss_on_observations=True)
    # The engine's log-probs on action tokens, the trainer's on observation tokens.
    np.testing.assert_allclose(out["old_logp"], np.where(ACTION > 0, BEHAVIOR, CURRENT), **TOL)
    assert "is_weights" not in out

    out, _ = run(make_algo(old_logp="recompute", tis_cap=0.0))
    np.testing.assert_allclose(out["old_logp"], CURRENT, **TOL)
    assert "is_weights" not in out  # tis_cap 0 disables the weights


def test_recomputed_log_probs_use_the_rollout_temperature(run):
    out, _ = run(make_algo(), make_batch(temperature=0.5))
    np.testing.assert_allclose(out["old_logp"], CURRENT / 0.5, **TOL)


def test_truncated_importance_weights(run):
    out, _ = run(make_algo(old_logp="recompute", tis_cap=2.0), loss_on_observations=True)
    # min(pi_trainer / pi_engine, 2) per action token: 3 and exp(30) are capped at 2.
    expected = np.ones((B, T), np.float32)
    expected[ACTION > 0] = [0.5, 1.5, 2.0, 1.0, 2.0, 1.5, 0.5, 1.0, 1.0, 2.0]
    np.testing.assert_allclose(out["is_weights"], expected, **TOL)
    np.testing.assert_allclose(out["old_logp"], CURRENT, **TOL)


def test_masked_importance_weights_and_their_metrics(run):
    """AReaL's bound: a token whose ratio exceeds the cap gets weight 0; the weights'
    metrics come back when asked for (asynchronous runs), over action tokens."""
    out, metrics = run(make_algo(tis_cap=2.5, tis_bound="mask"), offpolicy_metrics=True)
    weights = [0.5, 1.5, 0.0, 1.0, 0.0, 1.5, 0.5, 1.0, 1.0, 2.0]  # 3 and exp(30) masked
    expected = np.ones((B, T), np.float32)
    expected[ACTION > 0] = weights
    np.testing.assert_allclose(out["is_weights"], expected, **TOL)
    ratios = [np.exp(20.0) if r is None else r for r in _RATIOS]  # log-ratio clamped at 20
    np.testing.assert_allclose(metrics["is_ratio_mean"], np.mean(ratios), rtol=1e-5)
    np.testing.assert_allclose(metrics["is_ratio_max"], np.exp(20.0), rtol=1e-5)
    np.testing.assert_allclose(metrics["is_weight_mean"], np.mean(weights), **TOL)
    np.testing.assert_allclose(metrics["is_clipfrac"], 0.2, **TOL)
    _, metrics = run(make_algo(tis_cap=2.5, tis_bound="mask"))
    assert not any(key.startswith("is_") for key in metrics)


def test_sequence_level_importance_weights(run):
    algo = make_algo(tis_cap=2.5)
    algo.rollout_correction.is_level = "sequence"
    out, _ = run(algo, loss_on_observations=True)
    # Each row's product of ratios on its action tokens, capped at 2.5: 0.5 * 1.5 * 3 =
    # 2.25 | 1 * exp(20) | 1.5 * 0.5 | 1 * 1 * 2; 1 on observation and padding tokens.
    expected = np.where(ACTION > 0, np.array([[2.25], [2.5], [0.75], [2.0], [1.0]]), 1.0)
    np.testing.assert_allclose(out["is_weights"], expected, **TOL)


def _masking_algo():
    """Token TIS capped at 2.5, IcePop's token mask in [0.6, 2.5] and the sequence mask on
    the max per-token k3 at 0.35."""
    algo = make_algo(tis_cap=2.5)
    correction = algo.rollout_correction
    correction.masks = "token,seq_max_kl"
    correction.token_low, correction.token_high, correction.seq_max_kl = 0.6, 2.5, 0.35
    return algo


# The loss mask _masking_algo leaves: the token mask rejects ratios 0.5, 3 and exp(30);
# the max k3 rejects rows 0 (k3 of 3 = 0.90) and 1 (k3 of exp(20)), keeps rows 2 (0.19)
# and 3 (k3 of 2 = 0.31).
KEPT = np.zeros((B, T), np.float32)
KEPT[2, 2] = KEPT[3, 2] = KEPT[3, 3] = KEPT[3, 5] = 1.0


def test_rejection_masks(run):
    out, metrics = run(_masking_algo())
    np.testing.assert_array_equal(out["loss_mask"], KEPT)
    # The advantages were computed before the masks: a rejected episode is still a sample
    # of its group.
    np.testing.assert_allclose(out["advantages"], per_row(DR_GRPO, ACTION), **TOL)
    np.testing.assert_allclose(metrics["rollout_correction/masked_tokens"], 6 / 10, **TOL)
    np.testing.assert_allclose(metrics["rollout_correction/masked_seqs"], 3 / 4, **TOL)
    np.testing.assert_allclose(metrics["rollout_correction/token_masked_tokens"], 4 / 10,
                               **TOL)
    np.testing.assert_allclose(metrics["rollout_correction/seq_max_kl_masked_tokens"], 5 / 10,
                               **TOL)


def test_corrections_compose_with_decoupled_ppo(run):
    """As docs/operations.md says: with the recomputed (proximal) old policy, a kept
    token's loss is w_t * PPO(pi / pi_prox, A), w_t the tis_cap weight of rho_t = pi_prox /
    mu_t, and a rejected token is out of the loss and its denominators; an engine
    log-prob of an older weight version (the ratio 3, exp(30)) is corrected the same."""
    out, _ = run(_masking_algo())
    rng = np.random.default_rng(0)
    logp = CURRENT + 0.3 * rng.standard_normal((B, T)).astype(np.float32)
    weights = np.ones((B, T))
    weights[ACTION > 0] = [0.5, 1.5, 2.5, 1.0, 2.5, 1.5, 0.5, 1.0, 1.0, 2.0]
    np.testing.assert_allclose(out["is_weights"], weights, **TOL)
    for agg in ("token-mean", "seq-mean-token-mean"):
        def loss_fn(logp):
            return losses.rl_objective(logp, out["old_logp"], out["advantages"],
                                       out["loss_mask"], is_weights=out["is_weights"],
                                       agg=agg, clip_low=0.2, clip_high=0.2)[0]

        loss, grad = jax.value_and_grad(loss_fn)(jnp.asarray(logp))
        adv = per_row(DR_GRPO, ACTION)
        token_args = (logp, CURRENT, adv, KEPT > 0, "ppo")
        token_loss = weights * ref.policy_token_loss(*token_args, clip_low=0.2, clip_high=0.2)
        np.testing.assert_allclose(loss, ref.aggregate(token_loss, KEPT > 0, agg), **TOL)
        np.testing.assert_allclose(
            grad, ref.aggregate_weights(KEPT > 0, agg) * weights
            * ref.policy_token_grad(*token_args, clip_low=0.2, clip_high=0.2), **TOL)


def test_mismatch_metrics(run):
    _, metrics = run(make_algo())
    # k3 of KL(engine || trainer) per action token: r - 1 - log r of the ratio r, and
    # the clamp at 10 for the log-ratio of 30.
    k3 = [10.0 if r is None else r - 1.0 - np.log(r) for r in _RATIOS]
    np.testing.assert_allclose(metrics["logp_mismatch_kl"], np.mean(k3), **TOL)
    abs_log_ratio = 30.0 + 2 * np.log(2) + 2 * np.log(1.5) + np.log(3) + np.log(2)
    np.testing.assert_allclose(metrics["logp_mismatch_abs"], abs_log_ratio / 10, **TOL)
    # k1 = mean(log pi_engine - log pi_trainer), the log-ratio of 30 unclamped; the ratio's
    # statistics with it clamped at 20.
    sum_log_ratio = 30.0 + np.log(0.5 * 1.5 * 3.0 * 1.5 * 0.5 * 2.0)
    np.testing.assert_allclose(metrics["logp_mismatch_k1"], -sum_log_ratio / 10, **TOL)
    ratios = [np.exp(20.0) if r is None else r for r in _RATIOS]
    np.testing.assert_allclose(metrics["logp_mismatch_ratio_mean"], np.mean(ratios), rtol=1e-6)
    np.testing.assert_allclose(metrics["logp_mismatch_ratio_min"], 0.5, **TOL)
    np.testing.assert_allclose(metrics["logp_mismatch_ratio_max"], np.exp(20.0), rtol=1e-6)
    np.testing.assert_allclose(metrics["advantage_abs_mean"],
                               (3 * 0.5 + 2 * 0.5 + 2 * 0.75 + 3 * 0.75) / 10, **TOL)
    # Without masks nothing is rejected, and that is logged too.
    assert metrics["rollout_correction/masked_tokens"] == 0
    assert metrics["rollout_correction/masked_seqs"] == 0
    assert set(metrics) == {"logp_mismatch_abs", "logp_mismatch_kl", "logp_mismatch_k1",
                            "logp_mismatch_ratio_mean", "logp_mismatch_ratio_min",
                            "logp_mismatch_ratio_max", "rollout_correction/masked_tokens",
                            "rollout_correction/masked_seqs", "advantage_abs_mean"}


def test_kl_as_a_loss_term(run):
    out, metrics = run(make_algo(kl_coef=0.1, kl_kind="k1", kl_in_reward=False))
    np.testing.assert_allclose(out["ref_logp"], REF, **TOL)
    np.testing.assert_allclose(metrics["kl_ref"], 1.0, **TOL)
    # The rewards, and so the advantages, are those without KL.
    np.testing.assert_allclose(out["advantages"], per_row(DR_GRPO, ACTION), **TOL)


def test_kl_in_the_reward(run):
    out, metrics = run(make_algo(kl_coef=0.1, kl_kind="k1", kl_in_reward=True))
    np.testing.assert_allclose(metrics["kl_ref"], 1.0, **TOL)
    # Each action token's reward loses 0.1 * 1: scores 1 - 0.3, 0 - 0.2 | 2 - 0.2, 0.5 - 0.3
    # with group means 0.25 and 1.0.
    np.testing.assert_allclose(out["advantages"], per_row([0.45, -0.45, 0.8, -0.8, 0.0],
                                                          ACTION), **TOL)


def test_kl_is_measured_from_the_old_log_probs(run):
    _, metrics = run(make_algo(kl_coef=0.1, kl_kind="k1", old_logp="behavior"))
    # k1(behavior, ref) = 1 - log-ratio on action tokens.
    total_log_ratio = 30.0 + np.log(0.5 * 1.5 * 3.0 * 1.5 * 0.5 * 2.0)
    np.testing.assert_allclose(metrics["kl_ref"], 1.0 - total_log_ratio / 10, **TOL)


SCORES = REWARDS.sum(axis=1)


@pytest.mark.parametrize("estimator,expected", [
    ("dr_grpo", lambda: per_row(DR_GRPO, ACTION)),
    # Leave-one-out in groups of two: each score minus the other's.
    ("rloo", lambda: per_row([1.0, -1.0, 1.5, -1.5, 0.0], ACTION)),
    # (s - mean) / (std + 1e-6); both groups of two have |s - mean| = std / sqrt(2).
    ("grpo", lambda: per_row(
        [0.5 / (0.5 * np.sqrt(2) + 1e-6), -0.5 / (0.5 * np.sqrt(2) + 1e-6),
         0.75 / (0.75 * np.sqrt(2) + 1e-6), -0.75 / (0.75 * np.sqrt(2) + 1e-6), 0.0], ACTION)),
    ("grpo", lambda: per_row(ref.grpo(SCORES, GROUP_IDS, NUM_GROUPS), ACTION)),
    ("rloo", lambda: per_row(ref.rloo(SCORES, GROUP_IDS, NUM_GROUPS), ACTION)),
    ("reinforce_pp", lambda: ref.reinforce_plus_plus(REWARDS, ACTION, gamma=0.9)),
    ("reinforce_pp_baseline",
     lambda: ref.reinforce_plus_plus_baseline(SCORES, GROUP_IDS, NUM_GROUPS, ACTION)),
])
def test_advantage_estimators(run, estimator, expected):
    out, _ = run(make_algo(advantage=estimator, gamma=0.9))
    np.testing.assert_allclose(out["advantages"], expected(), **TOL)
    # The padding row (group id -1, no tokens) gets exactly zero advantage.
    np.testing.assert_array_equal(out["advantages"][4], 0.0)


VALUES = (0.05 * np.arange(B * T, dtype=np.float32).reshape(B, T) - 0.4).astype(np.float32)


def fake_value_fn(critic_params, batch):
    chex.assert_shape(batch["targets"], (B, T))
    return critic_params


@pytest.mark.parametrize("kl_in_reward", [False, True])
def test_gae_with_a_critic(run, kl_in_reward):
    algo = make_algo(name="ppo", advantage="gae", gamma=0.9, lam=0.8, kl_coef=0.1,
                     kl_kind="k1", kl_in_reward=kl_in_reward)
    out, metrics = run(algo, value_fn=fake_value_fn, critic_params=jnp.asarray(VALUES))
    # With the KL in the reward every action token's reward is 0.1 lower (k1 = 1).
    rewards = REWARDS - 0.1 * ACTION if kl_in_reward else REWARDS
    advantages, returns = ref.gae(rewards, VALUES, ACTION, gamma=0.9, lam=0.8)
    np.testing.assert_allclose(out["advantages"], ref.whiten(advantages, ACTION), **TOL)
    np.testing.assert_allclose(out["returns"], returns, **TOL)
    np.testing.assert_array_equal(out["old_values"], VALUES)
    np.testing.assert_allclose(metrics["value_mean"], VALUES[ACTION > 0].mean(), **TOL)
    np.testing.assert_array_equal(out["advantages"][4], 0.0)


def test_gae_without_a_critic_is_a_setup_error():
    with pytest.raises(ValueError, match="value_fn"):
        build_prepare(fake_logprob_fn, make_algo(name="ppo", advantage="gae"),
                      num_groups=NUM_GROUPS)


def test_critic_free_estimators_add_no_critic_arrays(run):
    out, _ = run(make_algo(advantage="rloo"))
    assert not {"returns", "old_values"} & set(out)


def test_an_unknown_estimator_is_a_setup_error():
    with pytest.raises(ValueError, match="unknown advantage estimator 'remax'; registered"):
        build_prepare(fake_logprob_fn, make_algo(advantage="remax"), num_groups=NUM_GROUPS)
