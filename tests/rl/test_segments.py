"""rl/segments.py: a rollout cut into segments counts once, in the advantages and the loss.

The per-token weights each aggregation gives a segmented rollout are checked against a
float64 numpy reference written from the formula; the loss and gradient of a rollout cut
into 5 segments against the same tokens in one row, through `collate`, `prepare` and the
RL objective (micro-batches included), with and without jit.
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentjax.config.choices import AGGREGATIONS
from agentjax.config.schema import default_config
from agentjax.core.trajectory import Trajectory, Turn, collate
from agentjax.rl import segments
from agentjax.rl.advantages import ADVANTAGES
from agentjax.rl.aggregation import aggregate, loss_norm
from agentjax.rl.losses import rl_objective
from agentjax.rl.prepare import build_prepare
from agentjax.train.update import accumulate_grads
from tests import reference as ref
from tests.sharding import assert_rows_sharded_match_one_device

JIT = pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])

# Four rows: rollout 0 is rows 0, 1, 2 (three segments), rollout 1 row 3, then padding.
MASK = np.array([[0, 1, 1, 0, 1, 0],
                 [0, 0, 1, 0, 0, 0],
                 [1, 1, 1, 1, 0, 0],
                 [0, 1, 1, 1, 1, 1],
                 [0, 0, 0, 0, 0, 0]], np.float32)
ROLLOUT_IDS = np.array([0, 0, 0, 1, -1], np.int32)


def reference_weights(mask, rollout_ids, mode, constant):
    """w[b, t] of aggregate(x) = sum w x, from the per-rollout formula in float64:
    token-mean 1/N, seq-mean-token-mean 1/(n_r R), seq-mean-token-sum 1/R,
    seq-mean-token-sum-norm 1/(R C), R the rollouts with a token, n_r their tokens."""
    mask = np.asarray(mask, bool)
    tokens = {r: sum(mask[b].sum() for b in range(len(mask)) if rollout_ids[b] == r)
              for r in set(rollout_ids.tolist()) if r >= 0}
    rollouts = sum(n > 0 for n in tokens.values())
    weights = np.zeros(mask.shape)
    for b, t in zip(*np.nonzero(mask)):
        n_r = tokens[rollout_ids[b]]
        weights[b, t] = {"token-mean": 1 / mask.sum(),
                         "seq-mean-token-mean": 1 / (n_r * rollouts),
                         "seq-mean-token-sum": 1 / rollouts,
                         "seq-mean-token-sum-norm": 1 / (rollouts * constant)}[mode]
    return weights


@JIT
@pytest.mark.parametrize("mode", AGGREGATIONS)
def test_per_rollout_weights_match_the_float64_reference(mode, jit):
    def weights(mask, rollout_ids):
        tokens = segments.rollout_tokens(mask, rollout_ids)
        norm = loss_norm(mask, constant=7.0, rollout_tokens=tokens)
        return jax.grad(lambda x: aggregate(x, mask, mode, norm=norm))(jnp.zeros(mask.shape))

    fn = jax.jit(weights) if jit else weights
    np.testing.assert_allclose(fn(MASK, ROLLOUT_IDS),
                               reference_weights(MASK, ROLLOUT_IDS, mode, 7.0),
                               rtol=1e-6, atol=1e-9)
    # Without segments the weights are the plain aggregation's (each row a sequence).
    plain = np.arange(len(MASK), dtype=np.int32)
    np.testing.assert_allclose(fn(MASK, plain),
                               ref.aggregate_weights(MASK, mode, constant=7.0),
                               rtol=1e-6, atol=1e-9)


def test_rollout_tokens_and_lead_rows():
    np.testing.assert_array_equal(segments.rollout_tokens(MASK, ROLLOUT_IDS), [8, 8, 8, 5, 0])
    # Rollout 0's lead is its first row with a token; a rollout without any keeps its first.
    mask = MASK.copy()
    mask[0] = 0
    np.testing.assert_array_equal(segments.lead_rows(mask, ROLLOUT_IDS),
                                  [False, True, False, True, False])
    np.testing.assert_array_equal(segments.lead_rows(np.zeros_like(MASK), ROLLOUT_IDS),
                                  [True, False, False, True, False])


@JIT
@pytest.mark.parametrize("kind", ["grpo", "dr_grpo", "rloo"])
def test_group_statistics_count_rollouts_not_segments(kind, jit):
    """Group 0: rollout 0 in 3 segments scoring 1 in all (its reward on its last
    segment), rollouts 1, 2 score 0 and 0.5; group 1: rollouts 3, 4 score 2, 2 (zero
    variance). Every token of a rollout gets the reference advantage of its score among
    the group's rollouts, counted once each."""
    mask = np.ones((7, 4), np.float32)
    mask[5, :2] = 0
    rewards = np.zeros((7, 4), np.float32)
    rewards[2, 3], rewards[4, 3], rewards[5, 3], rewards[6, 3] = 1.0, 0.5, 2.0, 2.0
    group_ids = np.array([0, 0, 0, 0, 0, 1, 1], np.int32)
    rollout_ids = np.array([0, 0, 0, 1, 2, 3, 4], np.int32)
    algo = default_config().algo

    def advantages(rewards, mask, group_ids, rollout_ids):
        return segments.per_rollout_advantages(
            ADVANTAGES.get(kind), rewards, mask, group_ids, rollout_ids, num_groups=2,
            params=algo).advantages

    fn = jax.jit(advantages) if jit else advantages
    out = np.asarray(fn(rewards, mask, group_ids, rollout_ids))
    scores = np.array([1.0, 0.0, 0.5, 2.0, 2.0])
    rollout_groups = np.array([0, 0, 0, 1, 1])
    expected = {"grpo": lambda: ref.grpo(scores, rollout_groups, 2),
                "dr_grpo": lambda: ref.grpo(scores, rollout_groups, 2, norm_by_std=False),
                "rloo": lambda: ref.rloo(scores, rollout_groups, 2)}[kind]()
    np.testing.assert_allclose(out, np.where(mask > 0, expected[rollout_ids][:, None], 0.0),
                               rtol=1e-5, atol=1e-6)
    assert expected[0] != 0  # the segmented rollout does get a signal


# ------------------------------------------- 5 segments against one trajectory, end to end

VOCAB = 16


def _turns(rng, count):
    return [Turn([int(t) for t in rng.integers(2, VOCAB, 3)], [-0.5, -1.0, -1.5], "stop",
                 observation_ids=[int(t) for t in rng.integers(2, VOCAB, 2)])
            for _ in range(count)]


def _rollouts(segmented: bool):
    """Two groups of two rollouts; rollout 0 has 10 turns, whole or cut into 5 segments
    (each with its own prompt: the context the agent re-sent, rewritten)."""
    rng = np.random.default_rng(0)
    long_turns = _turns(rng, 10)
    others = [Trajectory([1, 2, 3], _turns(rng, k), final_reward=r, group_id=g)
              for k, r, g in ((2, 0.0, 0), (3, 1.0, 1), (1, 0.0, 1))]
    if not segmented:
        first = Trajectory([1, 5, 6], long_turns, final_reward=1.0, group_id=0)
    else:
        parts = [Trajectory([1, 7 + i, 8], long_turns[2 * i:2 * i + 2]) for i in range(5)]
        first = parts[-1]
        first.final_reward, first.group_id, first.segments = 1.0, 0, parts[:-1]
    return [first, others[0], others[1], others[2]]


def _table_logprob_fn(params, batch, temperature):
    """log-probs that depend only on the target token: the same token scores the same
    whichever row and context it is in, so the two layouts can be compared."""
    logp = params[batch["targets"]] / temperature
    return logp, jnp.zeros_like(logp)


def _loss_and_grad(segmented, mode, *, normalize, micro_batches, jit):
    batch = collate(_rollouts(segmented), buckets=(64,), pad_id=0, batch_size=8)
    del batch["truncated"]
    batch["temperature"] = np.ones(8, np.float32)
    config = default_config()
    algo = config.algo
    algo.agg, algo.rollout_normalization = mode, normalize
    prepare = build_prepare(_table_logprob_fn, algo, num_groups=2)
    table = jnp.linspace(-2.0, -0.5, VOCAB)
    prepared, _ = (jax.jit(prepare) if jit else prepare)(table, None, None, batch)

    def loss_fn(params, micro, norm):
        logp, entropy = _table_logprob_fn(params, micro, 1.0)
        # The update's old log-probs are the behavior's here, so the ratios are not 1.
        return rl_objective(logp, micro["behavior_logp"], micro["advantages"],
                            micro["loss_mask"], entropy=entropy, kind="ppo", agg=mode,
                            norm=norm, entropy_coef=0.01, clip_low=0.2, clip_high=0.28)

    grads = functools.partial(accumulate_grads, loss_fn, micro_batches=micro_batches,
                              norm_constant=64.0)
    loss, grad, _ = (jax.jit(grads) if jit else grads)(table, prepared)
    return float(loss), np.asarray(grad), np.asarray(prepared["advantages"])


@pytest.mark.parametrize("mode, jit", [(mode, True) for mode in AGGREGATIONS]
                         + [("seq-mean-token-mean", False)])
def test_five_segments_give_the_loss_and_gradient_of_one_trajectory(mode, jit):
    whole = _loss_and_grad(False, mode, normalize=True, micro_batches=1, jit=jit)
    for micro_batches in (1, 2):  # micro-batches split the segments across them
        cut = _loss_and_grad(True, mode, normalize=True, micro_batches=micro_batches,
                             jit=jit)
        np.testing.assert_allclose(cut[0], whole[0], rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(cut[1], whole[1], rtol=1e-5, atol=1e-7)
    # The advantages: the rollout's on every segment, as one row's.
    assert np.count_nonzero(cut[2]) == np.count_nonzero(whole[2])
    np.testing.assert_allclose(np.sort(cut[2][cut[2] != 0]), np.sort(whole[2][whole[2] != 0]),
                               rtol=1e-6)
    if mode != "token-mean":  # without normalization the segments weigh 5 sequences
        plain = _loss_and_grad(True, mode, normalize=False, micro_batches=1, jit=jit)
        assert not np.allclose(plain[1], whole[1], rtol=1e-3)


def test_unsegmented_batches_are_unchanged_bit_for_bit():
    rollouts = _rollouts(False)
    batch = collate(rollouts, buckets=(64,), pad_id=0, batch_size=8)
    np.testing.assert_array_equal(batch["rollout_ids"], [0, 1, 2, 3, -1, -1, -1, -1])
    for mode in ("token-mean", "seq-mean-token-mean"):
        on = _loss_and_grad(False, mode, normalize=True, micro_batches=2, jit=True)
        off = _loss_and_grad(False, mode, normalize=False, micro_batches=2, jit=True)
        assert on[0] == off[0]
        np.testing.assert_array_equal(on[1], off[1])
        np.testing.assert_array_equal(on[2], off[2])


def test_collate_gives_segments_rows_of_their_rollout_and_keeps_the_last():
    rollouts = _rollouts(True)
    batch = collate(rollouts, buckets=(64,), pad_id=0, batch_size=10)
    np.testing.assert_array_equal(batch["rollout_ids"], [0] * 5 + [1, 2, 3, -1, -1])
    np.testing.assert_array_equal(batch["group_ids"], [0] * 5 + [0, 1, 1, -1, -1])
    # The reward is the rollout's, once: on its last segment.
    np.testing.assert_array_equal(batch["seq_rewards"][:5], [0, 0, 0, 0, 1])
    kept = collate(rollouts, buckets=(64,), pad_id=0, batch_size=6, max_segments=2)
    np.testing.assert_array_equal(kept["rollout_ids"], [0, 0, 1, 2, 3, -1])
    np.testing.assert_array_equal(kept["inputs"][:2], batch["inputs"][3:5])


def test_sharded_matches_single_device(eight_devices):
    """Segments of one rollout on different devices: advantages, rollout token counts and
    the loss's denominators are global."""
    rng = np.random.default_rng(1)
    mask = (rng.random((8, 6)) < 0.7).astype(np.float32)
    rewards = np.zeros((8, 6), np.float32)
    rewards[:, -1] = rng.integers(0, 2, 8)
    group_ids = np.array([0, 0, 0, 0, 1, 1, 1, -1], np.int32)
    rollout_ids = np.array([0, 0, 0, 1, 2, 2, 3, -1], np.int32)
    logp = -rng.random((8, 6)).astype(np.float32)
    old_logp = logp - 0.05 * rng.standard_normal((8, 6)).astype(np.float32)
    algo = default_config().algo

    def objective(logp, old_logp, rewards, mask, group_ids, rollout_ids):
        advantages = segments.per_rollout_advantages(
            ADVANTAGES.get("grpo"), rewards, mask, group_ids, rollout_ids, num_groups=2,
            params=algo).advantages
        norm = loss_norm(mask, rollout_tokens=segments.rollout_tokens(mask, rollout_ids))
        return rl_objective(logp, old_logp, advantages, mask, kind="ppo",
                            agg="seq-mean-token-mean", norm=norm, clip_low=0.2,
                            clip_high=0.28)

    assert_rows_sharded_match_one_device(
        objective, (logp, old_logp, rewards, mask, group_ids, rollout_ids), eight_devices)
