"""agentjax.rl.advantages against tests/reference.py and hand-computed values."""
import functools

import chex
import hypothesis.extra.numpy as hnp
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.sharding import AxisType, NamedSharding, PartitionSpec

from agentjax.config import choices
from agentjax.rl import advantages as adv
from tests import reference as ref
from tests.rl._inputs import B, T, edge_groups, edge_mask, floats

TOL = dict(rtol=1e-5, atol=1e-5)


class ReferenceTest(chex.TestCase):
    """Each estimator vs its float64 reference, with and without jit, on edge-case inputs."""

    def setUp(self):
        super().setUp()
        rng = np.random.default_rng(0)
        self.mask = edge_mask(rng)
        self.rewards = floats(rng, (B, T))
        self.values = floats(rng, (B, T))
        # Garbage at masked positions must not leak into any output.
        self.rewards[~self.mask] = np.nan
        self.values[~self.mask] = 1e30
        self.scores, self.group_ids, self.num_groups = edge_groups(rng)

    @chex.variants(with_jit=True, without_jit=True)
    def test_gae_and_associative(self):
        for gamma, lam in [(0.99, 0.95), (1.0, 1.0), (0.5, 0.0)]:
            expected = ref.gae(np.nan_to_num(self.rewards), self.values, self.mask, gamma, lam)
            for fn in (adv.gae, adv.gae_associative):
                got = self.variant(functools.partial(fn, gamma=gamma, lam=lam))(
                    self.rewards, self.values, self.mask
                )
                for g, e in zip(got, expected):
                    chex.assert_trees_all_close(g, e.astype(np.float32), **TOL)

    @chex.variants(with_jit=True, without_jit=True)
    def test_whiten(self):
        x = floats(np.random.default_rng(1), (B, T), 3.0) + 2.0
        for shift in (True, False):
            got = self.variant(functools.partial(adv.whiten, shift_mean=shift))(x, self.mask)
            chex.assert_trees_all_close(got, ref.whiten(x, self.mask, shift), **TOL)

    @chex.variants(with_jit=True, without_jit=True)
    def test_grpo_family(self):
        s, g, n = self.scores, self.group_ids, self.num_groups
        for norm_by_std in (True, False):
            for unbiased in (True, False):
                fn = functools.partial(
                    adv.grpo, num_groups=n, norm_by_std=norm_by_std, unbiased=unbiased
                )
                got = self.variant(fn)(s, g)
                chex.assert_trees_all_close(got, ref.grpo(s, g, n, norm_by_std, unbiased), **TOL)
        got = self.variant(functools.partial(adv.rloo, num_groups=n))(s, g)
        chex.assert_trees_all_close(got, ref.rloo(s, g, n), **TOL)
        got = self.variant(functools.partial(adv.reinforce_plus_plus_baseline, num_groups=n))(
            s, g, mask=self.mask
        )
        expected = ref.reinforce_plus_plus_baseline(s, g, n, self.mask)
        chex.assert_trees_all_close(got, expected, **TOL)

    @chex.variants(with_jit=True, without_jit=True)
    def test_reinforce_plus_plus_remax_broadcast(self):
        got = self.variant(functools.partial(adv.reinforce_plus_plus, gamma=0.9))(
            self.rewards, self.mask
        )
        expected = ref.reinforce_plus_plus(np.nan_to_num(self.rewards), self.mask, 0.9)
        chex.assert_trees_all_close(got, expected, **TOL)
        baseline = self.scores[::-1].copy()
        got = self.variant(adv.remax)(self.scores, baseline)
        chex.assert_trees_all_close(got, self.scores - baseline)
        got = self.variant(adv.broadcast_to_tokens)(self.scores, self.mask)
        chex.assert_trees_all_close(got, np.where(self.mask, self.scores[:, None], 0.0))

    @chex.variants(with_jit=True, without_jit=True)
    def test_turn_returns(self):
        rng = np.random.default_rng(2)
        turn_rewards = floats(rng, (B, 4))
        turn_ids = np.cumsum(~self.mask, axis=1).astype(np.int32) // 2 - 1  # includes -1 and 4+
        got = self.variant(functools.partial(adv.turn_returns, gamma=0.8))(
            turn_rewards, turn_ids, self.mask
        )
        expected = ref.turn_returns(turn_rewards, turn_ids, self.mask, 0.8)
        chex.assert_trees_all_close(got, expected, **TOL)


def test_gae_hand_computed():
    # Tokens: action(r=0, V=1), observation(r=5 ignored, V=9 ignored), action(r=0, V=2),
    # action(r=1, V=3). gamma=0.5, lam=0.5, observation skipped without decay:
    # t=3: delta = 1 + 0 - 3 = -2,            A = -2
    # t=2: delta = 0 + 0.5*3 - 2 = -0.5,      A = -0.5 + 0.25*(-2) = -1
    # t=0: delta = 0 + 0.5*2 - 1 = 0,         A = 0 + 0.25*(-1) = -0.25
    rewards = jnp.array([[0.0, 5.0, 0.0, 1.0]])
    values = jnp.array([[1.0, 9.0, 2.0, 3.0]])
    mask = jnp.array([[1, 0, 1, 1]])
    for fn in (adv.gae, adv.gae_associative):
        advantages, returns = fn(rewards, values, mask, gamma=0.5, lam=0.5)
        np.testing.assert_allclose(advantages, [[-0.25, 0.0, -1.0, -2.0]])
        np.testing.assert_allclose(returns, [[0.75, 0.0, 1.0, 1.0]])


def test_group_estimators_hand_computed():
    scores = jnp.array([1.0, 0.0, 0.5, 0.5, 2.0])
    group_ids = jnp.array([0, 0, 1, 1, 2])
    # group 0: mean 0.5, unbiased std sqrt(0.5); group 1 zero variance; group 2 size 1.
    np.testing.assert_allclose(
        adv.grpo(scores, group_ids, 3, eps=0.0),
        [0.5 / np.sqrt(0.5), -0.5 / np.sqrt(0.5), 0.0, 0.0, 2.0],
        rtol=1e-6,
    )
    np.testing.assert_allclose(
        adv.grpo(scores, group_ids, 3, norm_by_std=False), [0.5, -0.5, 0.0, 0.0, 2.0]
    )
    np.testing.assert_allclose(adv.rloo(scores, group_ids, 3), [1.0, -1.0, 0.0, 0.0, 2.0])
    # per-turn discount: G = [1 + 0.5 * 0 + 0.25 * 2, 0 + 0.5 * 2, 2]
    got = adv.turn_returns(
        jnp.array([[1.0, 0.0, 2.0]]), jnp.array([[0, 0, 1, 2, 2]]), jnp.ones((1, 5)), gamma=0.5
    )
    np.testing.assert_allclose(got, [[1.5, 1.5, 1.0, 2.0, 2.0]])


def test_zero_variance_is_exactly_zero():
    # 0.1 * 3 / 3 != 0.1 in float32 rounding terms; the result must still be exactly 0.
    scores = jnp.full((6,), 0.1)
    group_ids = jnp.array([0, 0, 0, 1, 1, 1])
    for fn in (adv.grpo, adv.rloo):
        out = fn(scores, group_ids, 2)
        assert np.all(np.asarray(out) == 0.0), out


def test_all_masked_batch_is_finite_and_zero():
    zeros = jnp.zeros((2, 5))
    mask = jnp.zeros((2, 5), bool)
    outs = [
        *adv.gae(zeros, zeros, mask, gamma=1.0, lam=1.0),
        *adv.gae_associative(zeros, zeros, mask, gamma=1.0, lam=1.0),
        adv.whiten(zeros + 1.0, mask),
        adv.reinforce_plus_plus(zeros + 1.0, mask, gamma=1.0),
        adv.reinforce_plus_plus_baseline(jnp.ones(2), jnp.array([0, 0]), 1, mask),
    ]
    for out in outs:
        assert np.all(np.asarray(out) == 0.0)


_gae_jit = jax.jit(adv.gae)
_gae_assoc_jit = jax.jit(adv.gae_associative)
_token_floats = hnp.arrays(np.float32, (B, T), elements=st.floats(-2, 2, width=32))


@settings(max_examples=25, deadline=None, derandomize=True)
@given(
    rewards=_token_floats,
    values=_token_floats,
    mask=hnp.arrays(np.bool_, (B, T)),
    gamma=st.floats(0.0, 1.0),
    lam=st.floats(0.0, 1.0),
)
def test_gae_scan_equals_associative(rewards, values, mask, gamma, lam):
    scan = _gae_jit(rewards, values, mask, gamma=gamma, lam=lam)
    assoc = _gae_assoc_jit(rewards, values, mask, gamma=gamma, lam=lam)
    chex.assert_trees_all_close(scan, assoc, rtol=1e-5, atol=1e-5)
    expected = ref.gae(rewards, values, mask, gamma, lam)
    chex.assert_trees_all_close(scan, tuple(e.astype(np.float32) for e in expected), **TOL)


@settings(max_examples=15, deadline=None, derandomize=True)
@given(rewards=_token_floats, values=_token_floats, mask=hnp.arrays(np.bool_, (B, T)))
def test_gae_lambda_one_is_reward_to_go_minus_values(rewards, values, mask):
    # With gamma = lam = 1, GAE telescopes to the (masked) reward-to-go minus V.
    advantages, returns = _gae_jit(rewards, values, mask, gamma=1.0, lam=1.0)
    to_go = ref.reward_to_go(rewards, mask)
    np.testing.assert_allclose(advantages, np.where(mask, to_go - values, 0.0), **TOL)
    np.testing.assert_allclose(returns, to_go, **TOL)


def test_sharded_matches_single_device(eight_devices):
    mesh = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Auto,), devices=eight_devices)
    rows = NamedSharding(mesh, PartitionSpec("data"))
    rng = np.random.default_rng(3)
    mask = edge_mask(rng)
    scores, group_ids, num_groups = edge_groups(rng)
    args = (floats(rng, (B, T)), floats(rng, (B, T)), mask, scores, group_ids)

    @jax.jit
    def estimators(rewards, values, mask, scores, group_ids):
        return (adv.gae(rewards, values, mask, gamma=0.9, lam=0.8),
                adv.gae_associative(rewards, values, mask, gamma=0.9, lam=0.8),
                adv.grpo(scores, group_ids, num_groups),
                adv.reinforce_plus_plus_baseline(scores, group_ids, num_groups, mask))

    single = estimators(*(jax.device_put(x, eight_devices[0]) for x in args))
    sharded = estimators(*(jax.device_put(x, rows) for x in args))
    chex.assert_trees_all_close(sharded, single, rtol=1e-6, atol=1e-6)


def test_bad_arguments_name_the_argument():
    x = jnp.zeros((2, 3))
    with pytest.raises(ValueError, match="values"):
        adv.gae(x, jnp.zeros((2, 4)), x, gamma=1.0, lam=1.0)
    with pytest.raises(ValueError, match="rewards"):
        adv.gae_associative(jnp.zeros(3), x, x, gamma=1.0, lam=1.0)
    with pytest.raises(ValueError, match="group_ids"):
        adv.grpo(jnp.zeros(3), jnp.zeros(3), 2)
    with pytest.raises(ValueError, match="group_ids"):
        adv.rloo(jnp.zeros(3), jnp.zeros(4, jnp.int32), 2)
    with pytest.raises(ValueError, match="num_groups"):
        adv.grpo(jnp.zeros(3), jnp.zeros(3, jnp.int32), 0)
    with pytest.raises(ValueError, match="baseline_scores"):
        adv.remax(jnp.zeros(3), jnp.zeros(2))
    with pytest.raises(ValueError, match="seq_adv"):
        adv.broadcast_to_tokens(jnp.zeros(3), x)
    with pytest.raises(ValueError, match="turn_ids"):
        adv.turn_returns(x, x, x, gamma=1.0)


def test_every_advantage_choice_is_registered_and_vice_versa():
    assert set(adv.ADVANTAGES) == set(choices.ADVANTAGES)
    assert {kind for kind in adv.ADVANTAGES if adv.needs_critic(kind)} == {"gae"}
    assert {kind for kind in adv.ADVANTAGES if adv.needs_turns(kind)} == {"gigpo", "turn_rloo"}


def test_registered_estimators_are_the_library_functions():
    """Each registered estimator, called with the one signature on [B, T] token rewards,
    is its library function on the scores (the rewards' row sums), bit for bit."""
    rng = np.random.default_rng(5)
    mask = edge_mask(rng)
    rewards, values = floats(rng, (B, T)), floats(rng, (B, T))
    _, group_ids, num_groups = edge_groups(rng)
    scores = rewards.sum(axis=1)
    params = {"gamma": 0.9, "lam": 0.8}
    gae_adv, gae_returns = adv.gae(rewards, values, mask, gamma=0.9, lam=0.8)
    expected = {
        "grpo": adv.broadcast_to_tokens(adv.grpo(scores, group_ids, num_groups), mask),
        "dr_grpo": adv.broadcast_to_tokens(
            adv.grpo(scores, group_ids, num_groups, norm_by_std=False), mask),
        "rloo": adv.broadcast_to_tokens(adv.rloo(scores, group_ids, num_groups), mask),
        "reinforce_pp": adv.reinforce_plus_plus(rewards, mask, gamma=0.9),
        "reinforce_pp_baseline": adv.reinforce_plus_plus_baseline(scores, group_ids,
                                                                  num_groups, mask),
        "gae": adv.whiten(gae_adv, mask),
    }
    # The turn-level estimators take turn_ids and anchor_ids too: test_turn_credit.py.
    assert set(expected) == {kind for kind in adv.ADVANTAGES if not adv.needs_turns(kind)}
    for kind, advantages in expected.items():
        estimate = adv.ADVANTAGES.get(kind)(
            rewards, mask, group_ids, values if adv.needs_critic(kind) else None,
            num_groups=num_groups, params=params)
        np.testing.assert_array_equal(estimate.advantages, advantages, err_msg=kind)
        if kind == "gae":
            np.testing.assert_array_equal(estimate.returns, gae_returns)
        else:
            assert estimate.returns is None, kind
    with pytest.raises(ValueError, match="unknown advantage estimator 'ppo'"):
        adv.ADVANTAGES.get("ppo")
