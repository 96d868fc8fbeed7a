"""agentjax.rl.turn_credit (gigpo, turn_rloo) against float64 references written from the
formulas over each episode's list of turns, hand values, the identities with GRPO / RLOO,
an exact enumeration of the verl#7244 length bias, sharding, and every policy loss
through the real prepare path."""
import functools
import itertools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec

from agentjax.config.schema import default_config
from agentjax.core.anchors import anchor_ids
from agentjax.core.trajectory import Trajectory, Turn, collate
from agentjax.rl import advantages as adv
from agentjax.rl import turn_credit as tc
from agentjax.rl.aggregation import loss_norm
from agentjax.rl.losses import rl_objective
from agentjax.rl.policy_losses import POLICY_LOSSES
from agentjax.rl.prepare import build_prepare
from tests import reference as ref
from tests.rl._inputs import kind_params

TOL = dict(rtol=1e-5, atol=1e-5)
T = 24  # tokens per row of the built batches


# ------------------------------------------------------------------ episodes -> batch


def build(episodes, group_ids, *, rows=None, length=T, prompt=2, seed=0):
    """A trainer batch from episodes given as lists of turns.

    Each turn is (action tokens, observation tokens, reward, anchor key); its reward goes
    on its last action token (as `collate` puts it), small extra rewards on its other
    action tokens (a KL in the reward), NaN on every mask-0 position (it must not leak).
    Anchor ids are numbered densely per (group, key) as `core.anchors` numbers them.

    Returns (rewards, mask, turn_ids, anchor_ids, group_ids, turn_rewards) with
    turn_rewards[i] the list of episode i's per-turn reward sums (float64).
    """
    rng = np.random.default_rng(seed)
    rows = rows or len(episodes)
    rewards = np.full((rows, length), np.nan, np.float32)
    mask = np.zeros((rows, length), bool)
    turn_ids = np.zeros((rows, length), np.int32)
    anchor_ids = np.full((rows, length), -1, np.int32)
    dense, turn_rewards = {}, []
    for row, (turns, group) in enumerate(zip(episodes, group_ids)):
        cursor, sums = prompt, []
        for k, (actions, observations, reward, key) in enumerate(turns, start=1):
            span = slice(cursor, cursor + actions)
            extra = (0.05 * rng.standard_normal(actions - 1)).astype(np.float32)
            rewards[row, span] = np.append(extra, np.float32(reward))
            mask[row, span] = True
            sums.append(float(np.float64(reward) + extra.astype(np.float64).sum()))
            end = cursor + actions + observations
            turn_ids[row, cursor:end] = k
            anchor_ids[row, cursor:end] = dense.setdefault((group, key), len(dense))
            cursor = end
        assert cursor <= length
        turn_rewards.append(sums)
    groups = np.full((rows,), -1, np.int32)
    groups[:len(group_ids)] = group_ids
    return rewards, mask, turn_ids, anchor_ids, groups, turn_rewards


def per_token(values_per_turn, mask, turn_ids, rows):
    """Token t of turn k of row b gets values_per_turn[b][k - 1]; others 0."""
    out = np.zeros(mask.shape)
    for b in range(rows):
        for t in np.flatnonzero(mask[b]):
            out[b, t] = values_per_turn[b][turn_ids[b, t] - 1]
    return out


# Two groups of three plus a lone episode and a padding row. Group 0: the three share
# turn 1 (the prompt); episodes 0 and 1 took the same first action (anchor "a") and differ
# after; episode 2 took another ("b") and has 3 turns. Group 1: lengths 1, 2, 2 and a
# shared second anchor; its first episode ends at turn 1.
EPISODES = [
    [(3, 2, 1.0, "p"), (2, 1, 0.5, "a"), (2, 0, 1.0, "aa")],
    [(2, 2, 0.0, "p"), (3, 1, 0.5, "a"), (1, 0, 0.0, "ab")],
    [(2, 1, 0.2, "p"), (2, 1, -0.4, "b"), (2, 1, 0.3, "bb")],
    [(4, 0, 2.0, "p")],
    [(2, 1, 0.0, "p"), (3, 0, 1.0, "x")],
    [(1, 2, 0.5, "p"), (2, 0, 1.5, "x")],
    [(2, 1, 0.3, "p"), (2, 0, 0.7, "q")],
]
GROUPS = [0, 0, 0, 1, 1, 1, 2]
NUM_GROUPS = 4  # group 3 has no member
ROWS = 8  # one padding row


@pytest.fixture(scope="module")
def batch():
    return build(EPISODES, GROUPS, rows=ROWS)


class ReferenceTest(chex.TestCase):

    def setUp(self):
        super().setUp()
        self.rewards, self.mask, self.turn_ids, self.anchor_ids, self.groups, self.sums = (
            build(EPISODES, GROUPS, rows=ROWS))

    @chex.variants(with_jit=True, without_jit=True)
    def test_gigpo(self):
        for gamma, weight, norm_by_std in [(0.9, 1.0, False), (1.0, 0.5, True),
                                           (0.5, 2.0, True)]:
            fn = self.variant(functools.partial(tc.gigpo, num_groups=NUM_GROUPS, gamma=gamma,
                                                weight=weight, norm_by_std=norm_by_std))
            got, metrics = fn(self.rewards, self.mask, self.groups, self.turn_ids,
                              self.anchor_ids)
            chex.assert_shape(got, (ROWS, T))
            chex.assert_type(got, jnp.float32)
            anchors = [[turn[3] for turn in turns] for turns in EPISODES]
            expected = per_token(ref.gigpo(self.sums, anchors, self.groups, NUM_GROUPS,
                                           gamma=gamma, weight=weight,
                                           norm_by_std=norm_by_std),
                                 self.mask, self.turn_ids, len(EPISODES))
            np.testing.assert_allclose(got, expected, **TOL, err_msg=str((gamma, weight)))
            # Shared anchors: turn 1 of the 6 episodes in groups of three, turn 2 of
            # episodes 0, 1 and 4, 5: 10 of the 16 turns.
            np.testing.assert_allclose(metrics["step_grouped_frac"], 10 / 16, **TOL)

    @chex.variants(with_jit=True, without_jit=True)
    def test_turn_rloo(self):
        for gamma, baseline in itertools.product([1.0, 0.8], tc.TURN_BASELINES):
            fn = self.variant(functools.partial(tc.turn_rloo, num_groups=NUM_GROUPS,
                                                gamma=gamma, baseline=baseline))
            got = fn(self.rewards, self.mask, self.groups, self.turn_ids)
            chex.assert_shape(got, (ROWS, T))
            chex.assert_type(got, jnp.float32)
            expected = per_token(ref.turn_rloo(self.sums, self.groups, NUM_GROUPS,
                                               gamma=gamma, baseline=baseline),
                                 self.mask, self.turn_ids, len(EPISODES))
            np.testing.assert_allclose(got, expected, **TOL, err_msg=str((gamma, baseline)))


def test_hand_values():
    """One group of three 2-turn episodes, rewards on the turns' single action tokens,
    gamma 0.5. Turn rewards (1, 2), (1, 0), (0, 4): returns G = (2, 2), (1, 0), (2, 4);
    scores 3, 1, 4 (mean 8/3). Episodes 0 and 1 share turn 2's anchor, episode 2 not.

    gigpo, mean, w = 1: turn 1 (one anchor, G = 2, 1, 2, mean 5/3) steps 1/3, -2/3, 1/3;
    turn 2: episodes 0, 1 (G = 2, 0, mean 1) steps 1, -1; episode 2 alone: 0.
    turn_rloo, episode: b = mean of the others' G_1: 3/2, 2, 3/2.
    turn_rloo, turn: turn 2's b = mean of the others' G_2: 2, 3, 1."""
    episodes = [[(1, 1, 1.0, "p"), (1, 0, 2.0, "s")], [(1, 1, 1.0, "p"), (1, 0, 0.0, "s")],
                [(1, 1, 0.0, "p"), (1, 0, 4.0, "t")]]
    rewards, mask, turn_ids, anchor_ids, groups, _ = build(episodes, [0, 0, 0], length=6)

    @jax.jit
    def estimators(rewards, mask, groups, turn_ids, anchor_ids):
        return (tc.gigpo(rewards, mask, groups, turn_ids, anchor_ids, 1, gamma=0.5,
                         weight=1.0, norm_by_std=False)[0],
                *(tc.turn_rloo(rewards, mask, groups, turn_ids, 1, gamma=0.5, baseline=b)
                  for b in ("episode", "turn")))

    gigpo, episode_baseline, turn_baseline = (
        np.asarray(out)[mask].reshape(3, 2)
        for out in estimators(rewards, mask, groups, turn_ids, anchor_ids))
    episode = np.array([3, 1, 4]) - 8 / 3
    np.testing.assert_allclose(gigpo, [[episode[0] + 1 / 3, episode[0] + 1],
                                       [episode[1] - 2 / 3, episode[1] - 1],
                                       [episode[2] + 1 / 3, episode[2]]], **TOL)
    np.testing.assert_allclose(episode_baseline,
                               [[2 - 1.5, 2 - 1.5], [1 - 2, 0 - 2], [2 - 1.5, 4 - 1.5]], **TOL)
    np.testing.assert_allclose(turn_baseline,
                               [[2 - 1.5, 2 - 2], [1 - 2, 0 - 3], [2 - 1.5, 4 - 1]], **TOL)


def test_masked_positions_get_zero_and_never_leak(batch):
    rewards, mask, turn_ids, anchor_ids, groups, _ = batch
    assert np.isnan(rewards[~mask]).all()
    for out in (tc.gigpo(rewards, mask, groups, turn_ids, anchor_ids, NUM_GROUPS, gamma=0.9,
                         weight=1.0, norm_by_std=True)[0],
                tc.turn_rloo(rewards, mask, groups, turn_ids, NUM_GROUPS, gamma=0.9,
                             baseline="turn")):
        assert np.isfinite(out).all()
        assert (np.asarray(out)[~mask] == 0).all()


def test_collated_episodes_with_their_anchor_ids_give_the_reference():
    """The real path: Trajectories with turn rewards and a final reward, `collate`, then
    `core.anchors.anchor_ids` (context keys), against the reference on the episodes'
    turn rewards, each turn keyed by the tuple of ids before it."""
    def episode(turns, group, final):
        return Trajectory(prompt_ids=[1, 2], group_id=group, final_reward=final, turns=[
            Turn(list(a), [0.0] * len(a), "stop", list(o), reward=r) for a, o, r in turns])

    trajectories = [
        episode([([5, 6], [9], 0.5), ([7], [9], 0.0), ([8], [], 0.0)], 0, 1.0),
        episode([([5, 6], [9], 0.5), ([7], [9], 0.0), ([6], [], 0.0)], 0, 0.0),
        episode([([5, 6], [9], 0.5), ([8], [], 0.0)], 0, 1.0),
        episode([([6], [9], 0.0), ([7, 7], [], 0.0)], 0, 0.0),
        episode([([5], [], 0.0)], 1, 1.0),
        episode([([5], [9], 0.25), ([5], [], 0.0)], 1, 0.0),
    ]
    batch = collate(trajectories, buckets=(16,), pad_id=0, batch_size=7)
    anchors = anchor_ids(trajectories, batch["targets"].shape)
    mask = batch["action_mask"] > 0
    got, metrics = jax.jit(functools.partial(tc.gigpo, num_groups=2, gamma=0.9, weight=1.0,
                                             norm_by_std=True))(
        batch["rewards"], mask, batch["group_ids"], batch["turn_ids"], anchors)
    turn_rewards = [[t.reward for t in traj.turns] for traj in trajectories]
    for rewards, traj in zip(turn_rewards, trajectories):
        rewards[-1] += traj.final_reward
    keys = [[tuple(traj.token_ids[:int(np.flatnonzero(traj.turn_ids == k)[0])])
             for k in range(1, len(traj.turns) + 1)] for traj in trajectories]
    expected = ref.gigpo(turn_rewards, keys, batch["group_ids"], 2, gamma=0.9, weight=1.0,
                         norm_by_std=True)
    np.testing.assert_allclose(got, per_token(expected, mask, batch["turn_ids"], 6), **TOL)
    # Shared anchors: turn 1 of episodes 0-3, turn 2 of 0-2, turn 3 of 0-1 (the same
    # context, different actions), turn 1 of 4-5: 11 of the 13 turns.
    np.testing.assert_allclose(metrics["step_grouped_frac"], 11 / 13, **TOL)


# ---------------------------------------------------------------------------- identities


def test_weight_zero_is_grpo_and_dr_grpo(batch):
    rewards, mask, turn_ids, anchor_ids, groups, _ = batch
    scores = np.where(mask, rewards, 0).sum(axis=1)
    for norm_by_std in (True, False):
        got, _ = tc.gigpo(rewards, mask, groups, turn_ids, anchor_ids, NUM_GROUPS, gamma=0.9,
                          weight=0.0, norm_by_std=norm_by_std)
        expected = adv.broadcast_to_tokens(
            adv.grpo(scores, groups, NUM_GROUPS, norm_by_std=norm_by_std), mask)
        np.testing.assert_array_equal(got, expected)


def test_one_turn_per_episode_collapses_step_groups_to_prompt_groups():
    """Every step group is its prompt group: A_step = A_episode, so GiGPO is (1 + w) GRPO;
    turn_rloo is RLOO with either baseline."""
    rng = np.random.default_rng(4)
    episodes = [[(int(rng.integers(1, 5)), int(rng.integers(0, 3)),
                  float(rng.integers(0, 3)), "p")] for _ in range(7)]
    groups = [0, 0, 0, 1, 1, 2, 2]
    episodes[5][0] = (2, 0, episodes[6][0][2], "p")  # group 2: equal scores
    rewards, mask, turn_ids, anchor_ids, group_ids, sums = build(episodes, groups, rows=8)
    scores = np.where(mask, rewards, 0).sum(axis=1)
    for norm_by_std, weight in ((True, 1.0), (False, 0.5)):
        got, metrics = tc.gigpo(rewards, mask, group_ids, turn_ids, anchor_ids, 3, gamma=0.7,
                                weight=weight, norm_by_std=norm_by_std)
        grpo = adv.broadcast_to_tokens(adv.grpo(scores, group_ids, 3,
                                                norm_by_std=norm_by_std), mask)
        np.testing.assert_allclose(got, (1 + weight) * np.asarray(grpo), **TOL)
        assert metrics["step_grouped_frac"] == 1.0
    rloo = adv.broadcast_to_tokens(adv.rloo(scores, group_ids, 3), mask)
    for baseline in tc.TURN_BASELINES:
        got = tc.turn_rloo(rewards, mask, group_ids, turn_ids, 3, gamma=0.7, baseline=baseline)
        np.testing.assert_allclose(got, rloo, **TOL)


def test_outcome_only_rewards_at_gamma_one_are_rloo_on_every_turn(batch):
    """Rewards only at the end and gamma 1: every turn's return is the episode's score,
    so turn_rloo with the episode baseline is RLOO on every token of a multi-turn row."""
    _, mask, turn_ids, _, groups, _ = batch
    rewards = np.zeros(mask.shape, np.float32)
    last = [np.flatnonzero(row).max() for row in mask[:len(EPISODES)]]
    rewards[np.arange(len(EPISODES)), last] = [1.0, 0.0, 1.0, 0.5, 0.0, 1.0, 1.0]
    got = tc.turn_rloo(rewards, mask, groups, turn_ids, NUM_GROUPS, gamma=1.0,
                       baseline="episode")
    rloo = adv.broadcast_to_tokens(adv.rloo(rewards.sum(axis=1), groups, NUM_GROUPS), mask)
    np.testing.assert_allclose(got, rloo, **TOL)


# -------------------------------------------------------- the verl#7244 length bias


def naive_per_turn_index(turn_rewards_by_episode, gamma):
    """The per-turn-index construction verl#7244 shows biased (MT-GRPO style, centered):
    b_j = mean of r_{., j} over the episodes that have a turn j, and
    A_{i,k} = sum_{j=k}^{K_i} gamma^(j-k) (r_{i,j} - b_j): one baseline term per turn
    episode i itself took."""
    longest = max(len(r) for r in turn_rewards_by_episode)
    b = [np.mean([r[j] for r in turn_rewards_by_episode if len(r) > j])
         for j in range(longest)]
    return [[sum(gamma ** (j - k) * (r[j] - b[j]) for j in range(k, len(r)))
             for k in range(len(r))] for r in turn_rewards_by_episode]


def test_per_turn_index_baseline_is_biased_toward_another_turn_ours_is_not():
    """A hard task with a +-1 outcome: stop and answer now (success 0.3) or take another
    turn (a tool call, reward 0) and answer then (success 0.3). Both actions have the same
    expected return, -0.4, so the exact policy gradient wrt the logit theta of "another
    turn" is 0. Enumerating every outcome of a group of 3 (64 configurations, each
    weighted by its probability) gives each estimator's expected gradient exactly, in
    float64. The naive per-turn-index baseline subtracts b_2 = E[r_2] < 0 only from the
    episodes that took turn 2: a bonus for another turn. turn_rloo (both baselines) and
    GiGPO (mean normalization) give 0."""
    theta, success, group = 0.3, 0.3, 3
    p_more = 1 / (1 + np.exp(-theta))
    grad_log_pi = {True: 1 - p_more, False: -p_more}  # d log pi(action) / d theta
    outcomes = [(more, won) for more in (False, True) for won in (True, False)]

    def prob(more, won):
        return (p_more if more else 1 - p_more) * (success if won else 1 - success)

    configs = list(itertools.product(outcomes, repeat=group))
    episodes, turn_rewards = [], []
    for config in configs:
        for more, won in config:
            outcome = 1.0 if won else -1.0
            turns = [(1, 1, 0.0, "p"), (1, 0, outcome, "tool")] if more else [
                (1, 0, outcome, "p")]
            episodes.append(turns)
            turn_rewards.append([t[2] for t in turns])
    group_ids = np.repeat(np.arange(len(configs)), group).astype(np.int32)
    weights = np.array([np.prod([prob(*o) for o in config]) for config in configs])
    assert abs(weights.sum() - 1) < 1e-12
    more = np.array([o[0] for config in configs for o in config])
    score_fn = np.array([grad_log_pi[m] for m in more])

    def expected_gradient(first_turn_advantage):
        """E[sum_i A_{i,1} d log pi(a_i) / d theta] / group (turn 2 has no choice)."""
        per_config = (np.asarray(first_turn_advantage) * score_fn).reshape(-1, group)
        return float(weights @ per_config.sum(axis=1)) / group

    naive = []
    for c in range(len(configs)):
        naive += [a[0] for a in naive_per_turn_index(turn_rewards[c * group:(c + 1) * group],
                                                     gamma=1.0)]
    bias = expected_gradient(naive)
    # The closed form: A_{i,1} = G_i - b_1 - [another turn] b_2. G_i's term is the true
    # gradient, 0; b_1's is -(1/n) d E[r_1] / d theta (its own r_{i,1}) = (1/n) p (1 - p)
    # E[outcome]; b_2's, only on "another turn", -p (1 - p) E[b_2] with E[b_2] the mean
    # outcome: in all -(1 - 1/n) p (1 - p) E[outcome], positive where outcomes average
    # below 0: toward another turn.
    mean_outcome = 2 * success - 1
    np.testing.assert_allclose(bias, -(1 - 1 / group) * p_more * (1 - p_more) * mean_outcome,
                               rtol=1e-12)
    assert bias > 0.05, bias

    with jax.enable_x64(True):
        rewards, mask, turn_ids, anchor_ids, groups, _ = build(episodes, group_ids, length=4,
                                                               prompt=1)
        rewards = np.where(mask, rewards, 0.0).astype(np.float64)
        first = (turn_ids == 1) & mask

        @jax.jit
        def estimators(rewards, mask, groups, turn_ids, anchor_ids):
            out = {f"turn_rloo/{b}": tc.turn_rloo(rewards, mask, groups, turn_ids,
                                                  len(configs), gamma=1.0, baseline=b)
                   for b in tc.TURN_BASELINES}
            out["gigpo/mean"] = tc.gigpo(rewards, mask, groups, turn_ids, anchor_ids,
                                         len(configs), gamma=1.0, weight=1.0,
                                         norm_by_std=False)[0]
            return out

        ours = estimators(rewards, mask, groups, turn_ids, anchor_ids)
        for name, advantages in ours.items():
            assert advantages.dtype == jnp.float64
            first_turn = np.asarray(advantages)[first]  # one action token per first turn
            assert first_turn.shape == (len(episodes),)
            np.testing.assert_allclose(expected_gradient(first_turn), 0.0, atol=1e-15,
                                       err_msg=name)


# ------------------------------------------------------------------------------ sharding


def test_sharded_matches_single_device(eight_devices, batch):
    mesh = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Auto,), devices=eight_devices)
    rows = NamedSharding(mesh, PartitionSpec("data"))
    rewards, mask, turn_ids, anchor_ids, groups, _ = batch
    args = (np.where(mask, rewards, 0.0), mask, groups, turn_ids, anchor_ids)

    @jax.jit
    def estimators(rewards, mask, groups, turn_ids, anchor_ids):
        return (tc.gigpo(rewards, mask, groups, turn_ids, anchor_ids, NUM_GROUPS, gamma=0.9,
                         weight=1.0, norm_by_std=True),
                tc.turn_rloo(rewards, mask, groups, turn_ids, NUM_GROUPS, gamma=0.9,
                             baseline="turn"),
                tc.turn_rloo(rewards, mask, groups, turn_ids, NUM_GROUPS, gamma=0.9,
                             baseline="episode"))

    single = estimators(*(jax.device_put(x, eight_devices[0]) for x in args))
    sharded = estimators(*(jax.device_put(x, rows) for x in args))
    chex.assert_trees_all_close(sharded, single, rtol=1e-6, atol=1e-6)


# ------------------------------------------------- the registry, prepare and every loss


def turn_algo(advantage, **overrides):
    algo = default_config().algo
    algo.advantage, algo.old_logp, algo.tis_cap, algo.agg = advantage, "behavior", 0.0, \
        "token-mean"
    for key, value in overrides.items():
        setattr(algo, key, value)
    return algo


def prepared(algo, batch):
    rewards, mask, turn_ids, anchor_ids, groups, _ = batch
    logp = np.where(mask, -1.0, 0.0).astype(np.float32)
    data = dict(targets=np.zeros(mask.shape, np.int32), action_mask=mask.astype(np.float32),
                segment_ids=(turn_ids > 0).astype(np.int32) | mask, turn_ids=turn_ids,
                anchor_ids=anchor_ids, behavior_logp=logp,
                rewards=np.where(mask, rewards, 0.0).astype(np.float32), group_ids=groups,
                temperature=np.ones(mask.shape[:1], np.float32))

    def logprob_fn(params, batch, temperature):
        return params, jnp.zeros_like(params)

    prepare = jax.jit(build_prepare(logprob_fn, algo, num_groups=NUM_GROUPS))
    return prepare(jnp.asarray(logp), None, None, data), logp


@pytest.mark.parametrize("advantage", ["gigpo", "turn_rloo"])
def test_registered_estimators_through_prepare_reach_every_loss(advantage, batch):
    """prepare adds the registered estimator's advantages (its library function with the
    config's hyperparameters) and metrics; every policy loss, on-policy (ratio 1), turns
    them into the gradient -A_t / N on each loss token: the turn-level credit reaches
    each token unchanged, whatever the loss."""
    rewards, mask, turn_ids, anchor_ids, groups, _ = batch
    algo = turn_algo(advantage, turn_gamma=0.8, gigpo_weight=0.5, gigpo_norm="std",
                     turn_baseline="turn")
    (out, metrics), logp = prepared(algo, batch)
    clean = np.where(mask, rewards, 0.0)
    if advantage == "gigpo":
        expected, step_metrics = tc.gigpo(clean, mask, groups, turn_ids, anchor_ids,
                                          NUM_GROUPS, gamma=0.8, weight=0.5, norm_by_std=True)
        np.testing.assert_allclose(metrics["gigpo/step_grouped_frac"],
                                   step_metrics["step_grouped_frac"])
    else:
        expected = tc.turn_rloo(clean, mask, groups, turn_ids, NUM_GROUPS, gamma=0.8,
                                baseline="turn")
    np.testing.assert_allclose(out["advantages"], expected, rtol=1e-6, atol=1e-6)
    advantages = np.asarray(out["advantages"])
    assert np.abs(advantages).max() > 0.1
    norm = loss_norm(out["loss_mask"])
    for kind in POLICY_LOSSES:
        grad = jax.grad(lambda lp, kind=kind: rl_objective(
            lp, out["old_logp"], out["advantages"], out["loss_mask"], kind=kind,
            agg="token-mean", norm=norm, **kind_params(kind))[0])(jnp.asarray(logp))
        np.testing.assert_allclose(grad, -advantages / mask.sum(), rtol=1e-5, atol=1e-7,
                                   err_msg=kind)


def test_prepare_without_anchor_ids_says_what_is_missing(batch):
    algo = turn_algo("gigpo")
    rewards, mask, turn_ids, _, groups, _ = batch
    data = dict(targets=np.zeros(mask.shape, np.int32), action_mask=mask.astype(np.float32),
                segment_ids=np.ones(mask.shape, np.int32), turn_ids=turn_ids,
                behavior_logp=np.zeros(mask.shape, np.float32),
                rewards=np.zeros(mask.shape, np.float32), group_ids=groups,
                temperature=np.ones(mask.shape[:1], np.float32))
    prepare = build_prepare(lambda p, b, t: (p, p), algo, num_groups=NUM_GROUPS)
    with pytest.raises(ValueError, match="anchor_ids"):
        prepare(jnp.zeros(mask.shape), None, None, data)


def test_bad_arguments_name_the_argument(batch):
    rewards, mask, turn_ids, anchor_ids, groups, _ = batch
    with pytest.raises(ValueError, match="baseline"):
        tc.turn_rloo(rewards, mask, groups, turn_ids, NUM_GROUPS, gamma=1.0, baseline="index")
    with pytest.raises(ValueError, match="turn_ids"):
        tc.turn_slot_returns(rewards, turn_ids.astype(np.float32), mask, gamma=1.0)
    with pytest.raises(ValueError, match="anchor_ids"):
        tc.step_advantages(rewards, turn_ids, anchor_ids[:, :3], mask, gamma=1.0,
                           norm_by_std=False)
    with pytest.raises(ValueError, match="gigpo_norm"):
        adv.ADVANTAGES.get("gigpo")(rewards, mask, groups, None, num_groups=NUM_GROUPS,
                                    params=dict(turn_gamma=1.0, gigpo_weight=1.0,
                                                gigpo_norm="median"),
                                    turn_ids=turn_ids, anchor_ids=anchor_ids)
