"""Advantage estimators over masked token sequences.

Every function takes [B, T] arrays with an explicit `mask` (1 on action tokens the policy
sampled, 0 on prompt / observation / padding tokens) or per-sequence [N] scores with
`group_ids`. The mask is read as a boolean (non-zero = action token). Positions with mask 0
get exactly 0 in every [B, T] output, and values stored there (rewards, values, NaN
padding) never leak into the result.

Group-relative estimators (grpo, rloo, reinforce++-baseline) follow the conventions of the
PyTorch frameworks (verl `core_algos.py`): a group of size 1 has mean 0 (and std 1 for
GRPO). agentjax additionally guarantees that a group whose scores are all equal gets
exactly 0 (never NaN, never rounding noise / eps) and that rows whose group id lies outside
[0, num_groups) (e.g. padding rows with id -1) are ignored and get 0.

`ADVANTAGES` registers the estimators a config chooses (`algo.advantage`), one function
each with one signature (`AdvantageFn`) over the trainer's [B, T] batch; `needs_critic`
says which read a critic's values, `needs_turns` which read the turn structure (the
turn-level estimators of rl/turn_credit.py). `remax` and `turn_returns` are library API
with no trainer path yet (not registered): ReMax's baseline is the reward of a greedy
rollout of each prompt, an extra rollout per prompt the RL loop does not make;
`turn_returns` needs each turn's reward as a [B, K] array, while the trainer's batch holds
rewards per token (`collate`), which `reinforce_plus_plus` discounts per token and
rl/turn_credit.py sums per turn.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from agentjax.core.registry import Registry
from agentjax.rl import _common
from agentjax.rl._common import as_float

# rsqrt(var + eps) in `whiten`, as in verl's masked_whiten.
WHITEN_EPS = 1e-8


def gae(rewards, values, mask, *, gamma, lam):
    """Generalized advantage estimation with a reverse `lax.scan` over T.

    delta_t = r_t + gamma * V_next - V_t and A_t = delta_t + gamma * lam * A_next, where
    V_next / A_next are those of the next *action* position: positions with mask 0 are
    skipped by the recursion (the running next-value and next-advantage pass through them
    unchanged, no decay), so observation tokens between turns neither cut nor discount
    the credit. The value after the last action token is 0 (episode end).

    Args:
      rewards: [B, T] float per-token rewards; entries at mask-0 positions are ignored
        (put the outcome reward on the last action token).
      values: [B, T] float critic values V(s_t); ignored at mask-0 positions.
      mask: [B, T] action mask (non-zero = action token).
      gamma: discount factor (Python float or scalar array).
      lam: GAE lambda (Python float or scalar array).

    Returns:
      (advantages, returns), both [B, T] float with returns = advantages + values on action
      tokens and exactly 0 at mask-0 positions. Not whitened: call `whiten` if wanted.
    """
    _common.check_tokens(rewards=rewards, values=values, mask=mask)
    rewards, values = as_float(rewards, values)
    valid = mask.astype(bool)
    batch = rewards.shape[0]

    def step(carry, xs):
        next_value, next_adv = carry
        reward, value, is_action = xs
        adv = reward + gamma * next_value - value + gamma * lam * next_adv
        carry = (jnp.where(is_action, value, next_value), jnp.where(is_action, adv, next_adv))
        return carry, adv

    zeros = jnp.zeros((batch,), rewards.dtype)
    _, adv = lax.scan(step, (zeros, zeros), (rewards.T, values.T, valid.T), reverse=True)
    adv = jnp.where(valid, adv.T, 0.0)
    return adv, jnp.where(valid, adv + values, 0.0)


def _affine_suffix(scale, shift):
    """x_t = scale_t * x_{t+1} + shift_t with x_T = 0, along axis 1, in O(log T) depth."""

    def compose(later, current):  # current o later, as affine maps (scale, shift)
        return current[0] * later[0], current[0] * later[1] + current[1]

    return lax.associative_scan(compose, (scale, shift), reverse=True, axis=1)[1]


def gae_associative(rewards, values, mask, *, gamma, lam):
    """Same as `gae` (same arguments and results), computed with `lax.associative_scan`.

    Both recursions of masked GAE are affine in their carry: the pass-through next value
    W_t = (1 - m_t) W_{t+1} + m_t V_t and the advantage A_t = c_t A_{t+1} + m_t delta_t
    with c_t = gamma * lam on action tokens and 1 elsewhere. Each is a suffix composition
    of affine maps, so the depth is O(log T) instead of T sequential steps: use this for
    long trajectories on TPU/GPU. Results match `gae` up to float rounding.

    Args:
      rewards: [B, T] float per-token rewards; ignored at mask-0 positions.
      values: [B, T] float critic values; ignored at mask-0 positions.
      mask: [B, T] action mask (non-zero = action token).
      gamma: discount factor.
      lam: GAE lambda.

    Returns:
      (advantages, returns), [B, T] each, exactly 0 at mask-0 positions.
    """
    _common.check_tokens(rewards=rewards, values=values, mask=mask)
    rewards, values = as_float(rewards, values)
    valid = mask.astype(bool)
    one, zero = jnp.ones_like(values), jnp.zeros_like(values)
    # W_t: value of the first action position >= t (0 if none).
    first_value = _affine_suffix(jnp.where(valid, zero, one), jnp.where(valid, values, zero))
    next_value = jnp.concatenate([first_value[:, 1:], zero[:, :1]], axis=1)
    delta = rewards + gamma * next_value - values
    adv = _affine_suffix(
        jnp.where(valid, gamma * lam * one, one), jnp.where(valid, delta, zero)
    )
    adv = jnp.where(valid, adv, 0.0)
    return adv, jnp.where(valid, adv + values, 0.0)


def whiten(x, mask, *, shift_mean=True):
    """Normalize `x` over the action tokens of the whole batch: (x - mean) / sqrt(var + 1e-8).

    mean and the unbiased variance are taken over all positions with mask 1 (as verl's
    masked_whiten). With fewer than two action tokens the variance is taken as 0, so the
    output stays finite.

    Args:
      x: [B, T] float values to whiten.
      mask: [B, T] action mask (non-zero = included).
      shift_mean: if False the batch mean is added back (only the scale is normalized).

    Returns:
      [B, T] whitened values, exactly 0 at mask-0 positions.
    """
    _common.check_tokens(x=x, mask=mask)
    (x,) = as_float(x)
    valid = mask.astype(bool)
    count = valid.sum().astype(x.dtype)
    mean = jnp.where(valid, x, 0.0).sum() / jnp.maximum(count, 1.0)
    sq_dev = jnp.where(valid, jnp.square(x - mean), 0.0).sum()
    var = sq_dev / jnp.maximum(count - 1.0, 1.0)
    out = (x - mean) * lax.rsqrt(var + WHITEN_EPS)
    if not shift_mean:
        out = out + mean
    return jnp.where(valid, out, 0.0)


class GroupStats(NamedTuple):
    """Per-group statistics of per-sequence scores; each field is [num_groups]."""

    count: jax.Array  # number of member rows (float)
    mean: jax.Array  # mean of the member scores (0 for an empty group)
    std: jax.Array  # standard deviation (unbiased or population), 0 for size <= 1
    constant: jax.Array  # bool: all member scores are exactly equal (true for size <= 1)


def _check_groups(scores, group_ids, num_groups) -> None:
    _common.check_rank("scores", scores, 1)
    _common.check_rank("group_ids", group_ids, 1)
    _common.check_same_shape(scores=scores, group_ids=group_ids)
    _common.check_integer("group_ids", group_ids)
    _common.check_positive_int("num_groups", num_groups)


def group_stats(scores, group_ids, num_groups, *, unbiased=True) -> GroupStats:
    """Count, mean, std and exact-constancy of `scores` within each group.

    Args:
      scores: [N] float per-sequence scores.
      group_ids: [N] int group of each row; rows with ids outside [0, num_groups) are
        ignored.
      num_groups: static Python int, the number of groups.
      unbiased: divide the squared deviations by (count - 1) instead of count.

    Returns:
      GroupStats with [num_groups] fields.
    """
    _check_groups(scores, group_ids, num_groups)
    (scores,) = as_float(scores)
    in_range = (group_ids >= 0) & (group_ids < num_groups)
    # Out-of-range rows are routed to an extra dropped segment.
    seg = jnp.where(in_range, group_ids, num_groups)
    n = num_groups + 1
    count = jax.ops.segment_sum(jnp.ones_like(scores), seg, n)[:num_groups]
    total = jax.ops.segment_sum(scores, seg, n)[:num_groups]
    mean = total / jnp.maximum(count, 1.0)
    dev = scores - jnp.append(mean, 0.0)[seg]
    sq = jax.ops.segment_sum(jnp.square(dev), seg, n)[:num_groups]
    denom = jnp.maximum(count - 1.0, 1.0) if unbiased else jnp.maximum(count, 1.0)
    std = jnp.where(count > 1, jnp.sqrt(sq / denom), 0.0)
    high = jax.ops.segment_max(scores, seg, n)[:num_groups]
    low = jax.ops.segment_min(scores, seg, n)[:num_groups]
    constant = (count <= 1) | (high == low)
    return GroupStats(count, mean, std, constant)


def _gather_groups(stats: GroupStats, group_ids, num_groups):
    """Per-row view of the group statistics plus the in-range mask."""
    in_range = (group_ids >= 0) & (group_ids < num_groups)
    idx = jnp.clip(group_ids, 0, num_groups - 1)
    return jax.tree.map(lambda field: field[idx], stats), in_range


def grpo(scores, group_ids, num_groups, *, norm_by_std=True, unbiased=True, eps=1e-6):
    """Group-relative advantages: (s_i - mean_g) / (std_g + eps), or s_i - mean_g (Dr.GRPO).

    A group of size 1 uses mean 0 and std 1 (verl). A group whose scores are all equal
    gets exactly 0. Rows with an out-of-range group id get 0.

    Args:
      scores: [N] float per-sequence scores (e.g. outcome rewards).
      group_ids: [N] int id of the prompt group each sequence belongs to.
      num_groups: static Python int, number of groups (ids in [0, num_groups)).
      norm_by_std: divide by the group std (GRPO); False gives Dr.GRPO.
      unbiased: use the unbiased (N-1) group std, as torch.std does.
      eps: added to the std before dividing.

    Returns:
      [N] float per-sequence advantages (use `broadcast_to_tokens` for [B, T]).
    """
    stats = group_stats(scores, group_ids, num_groups, unbiased=unbiased)
    (scores,) = as_float(scores)
    row, in_range = _gather_groups(stats, group_ids, num_groups)
    single = row.count <= 1
    adv = scores - jnp.where(single, 0.0, row.mean)
    if norm_by_std:
        adv = adv / (jnp.where(single, 1.0, row.std) + eps)
    return jnp.where(in_range & ~(row.constant & ~single), adv, 0.0)


def rloo(scores, group_ids, num_groups):
    """REINFORCE leave-one-out: A_i = n / (n - 1) * (s_i - mean_g) = s_i - mean of the others.

    A group of size 1 keeps its score (verl); a group with all-equal scores gets exactly 0;
    rows with an out-of-range group id get 0.

    Args:
      scores: [N] float per-sequence scores.
      group_ids: [N] int group ids.
      num_groups: static Python int, number of groups.

    Returns:
      [N] float per-sequence advantages.
    """
    stats = group_stats(scores, group_ids, num_groups)
    (scores,) = as_float(scores)
    row, in_range = _gather_groups(stats, group_ids, num_groups)
    n = row.count
    adv = jnp.where(n > 1, n / jnp.maximum(n - 1.0, 1.0) * (scores - row.mean), scores)
    return jnp.where(in_range & ~(row.constant & (n > 1)), adv, 0.0)


def reinforce_plus_plus(rewards, mask, *, gamma):
    """REINFORCE++: per-token discounted return, whitened over the action tokens of the batch.

    G_t = r_t + gamma * G_next over action tokens, where, as in `gae`, mask-0 positions are
    skipped (pass-through) rather than resetting the return: in a multi-turn trajectory the
    final reward still reaches the earlier turns. (verl resets the running return at mask 0,
    which is identical for right-padded single-turn responses.)

    Args:
      rewards: [B, T] float per-token rewards; ignored at mask-0 positions.
      mask: [B, T] action mask.
      gamma: discount factor.

    Returns:
      [B, T] float advantages, 0 at mask-0 positions.
    """
    _common.check_tokens(rewards=rewards, mask=mask)
    (rewards,) = as_float(rewards)
    returns, _ = gae(rewards, jnp.zeros_like(rewards), mask, gamma=gamma, lam=1.0)
    return whiten(returns, mask)


def broadcast_to_tokens(seq_adv, mask):
    """Give every action token of sequence b the value seq_adv[b]; mask-0 positions get 0.

    Args:
      seq_adv: [B] float per-sequence values (advantages or scores).
      mask: [B, T] action mask.

    Returns:
      [B, T] float.
    """
    _common.check_rank("seq_adv", seq_adv, 1)
    _common.check_rank("mask", mask, 2)
    if seq_adv.shape[0] != mask.shape[0]:
        raise ValueError(f"seq_adv has {seq_adv.shape[0]} rows but mask has {mask.shape[0]}")
    (seq_adv,) = as_float(seq_adv)
    return jnp.where(mask.astype(bool), seq_adv[:, None], 0.0)


def reinforce_plus_plus_baseline(scores, group_ids, num_groups, mask):
    """REINFORCE++-baseline: (s_i - mean_g) broadcast to tokens, then whitened over the batch.

    The group mean of a size-1 group is 0 (verl). Note that the batch whitening shifts
    every token by the batch mean, so - as in the paper and verl - a zero-variance group's
    tokens are 0 before whitening but not after.

    Args:
      scores: [N] float per-sequence scores.
      group_ids: [N] int group ids (rows outside [0, num_groups) get 0 before whitening).
      num_groups: static Python int, number of groups.
      mask: [N, T] action mask.

    Returns:
      [N, T] float advantages, 0 at mask-0 positions.
    """
    stats = group_stats(scores, group_ids, num_groups)
    (scores,) = as_float(scores)
    row, in_range = _gather_groups(stats, group_ids, num_groups)
    centered = scores - jnp.where(row.count > 1, row.mean, 0.0)
    centered = jnp.where(in_range & ~(row.constant & (row.count > 1)), centered, 0.0)
    return whiten(broadcast_to_tokens(centered, mask), mask)


def remax(scores, baseline_scores):
    """ReMax: A_i = s_i - b_i with b_i the reward of the greedy rollout for the same prompt.

    Args:
      scores: [N] float scores of the sampled rollouts.
      baseline_scores: [N] float scores of the greedy (argmax) rollouts.

    Returns:
      [N] float per-sequence advantages.
    """
    _common.check_rank("scores", scores, 1)
    _common.check_same_shape(scores=scores, baseline_scores=baseline_scores)
    scores, baseline_scores = as_float(scores, baseline_scores)
    return scores - baseline_scores


def turn_returns(turn_rewards, turn_ids, mask, *, gamma):
    """Per-turn discounted returns broadcast to the action tokens of each turn.

    G_k = sum_{j >= k} gamma^(j - k) r_j over the turns of a trajectory (the discount is per
    turn, not per token), so process / subgoal rewards given at turn k credit turn k and,
    discounted, the turns before it. Action token t of turn k gets G_k.

    Args:
      turn_rewards: [B, K] float reward of each turn (0 for turns without one).
      turn_ids: [B, T] int turn index of each token; tokens with an id outside [0, K) get 0.
      mask: [B, T] action mask; mask-0 positions get 0.
      gamma: per-turn discount factor.

    Returns:
      [B, T] float per-token returns.
    """
    _common.check_rank("turn_rewards", turn_rewards, 2)
    _common.check_tokens(turn_ids=turn_ids, mask=mask)
    _common.check_integer("turn_ids", turn_ids)
    if turn_rewards.shape[0] != mask.shape[0]:
        raise ValueError(
            f"turn_rewards has {turn_rewards.shape[0]} rows but mask has {mask.shape[0]}"
        )
    (turn_rewards,) = as_float(turn_rewards)
    num_turns = turn_rewards.shape[1]
    g = _affine_suffix(jnp.full_like(turn_rewards, gamma), turn_rewards)
    in_range = (turn_ids >= 0) & (turn_ids < num_turns)
    per_token = jnp.take_along_axis(g, jnp.clip(turn_ids, 0, num_turns - 1), axis=1)
    return jnp.where(in_range & mask.astype(bool), per_token, 0.0)


# ------------------------------------------------------------- the trainer's estimators


class AdvantageEstimate(NamedTuple):
    """What an `AdvantageFn` returns."""

    advantages: jax.Array  # [B, T], 0 at mask-0 positions
    returns: jax.Array | None = None  # [B, T] critic targets (estimators with a critic)
    metrics: Mapping[str, jax.Array] | None = None  # scalars the trainer logs


# (rewards [B, T], mask [B, T], group_ids [B], values [B, T] | None, *, num_groups,
#  params) -> AdvantageEstimate. rewards are per token (the KL already subtracted when it
# is in the reward; a sequence's score is their sum), mask the loss mask, group_ids -1 on
# padding rows, values the critic's (None unless `needs_critic`), num_groups static and
# params the algo config section, a Mapping from which each estimator reads its own
# hyperparameters by their config names (gamma, lam). An estimator registered with
# `turns=True` also takes the keyword arguments turn_ids and anchor_ids, the batch's
# [B, T] int arrays (`core.anchors.anchor_ids`).
AdvantageFn = Callable[..., AdvantageEstimate]
ADVANTAGES: Registry[AdvantageFn] = Registry("advantage estimator")


def register_advantage(name: str, *, critic: bool = False, turns: bool = False):
    """Registers an `AdvantageFn` under `name`; `critic` marks one that reads values,
    `turns` one that reads the batch's turn_ids and anchor_ids."""

    def add(fn):
        fn.needs_critic = critic
        fn.needs_turns = turns
        return ADVANTAGES.register(name)(fn)

    return add


def needs_critic(kind: str) -> bool:
    """Whether estimator `kind` reads a critic's values (the trainer then trains one)."""
    return ADVANTAGES.get(kind).needs_critic


def needs_turns(kind: str) -> bool:
    """Whether estimator `kind` reads turn_ids and anchor_ids (the trainer then adds
    `core.anchors.anchor_ids` to the batch)."""
    return ADVANTAGES.get(kind).needs_turns


@register_advantage("grpo")
def _grpo(rewards, mask, group_ids, values, *, num_groups: int,
          params: Mapping[str, Any]) -> AdvantageEstimate:
    """GRPO (DeepSeekMath, arXiv 2402.03300): group-normalized scores on every token."""
    seq = grpo(rewards.sum(axis=1), group_ids, num_groups, norm_by_std=True)
    return AdvantageEstimate(broadcast_to_tokens(seq, mask))


@register_advantage("dr_grpo")
def _dr_grpo(rewards, mask, group_ids, values, *, num_groups: int,
             params: Mapping[str, Any]) -> AdvantageEstimate:
    """Dr.GRPO (arXiv 2503.20783): scores minus the group mean, no std division."""
    seq = grpo(rewards.sum(axis=1), group_ids, num_groups, norm_by_std=False)
    return AdvantageEstimate(broadcast_to_tokens(seq, mask))


@register_advantage("rloo")
def _rloo(rewards, mask, group_ids, values, *, num_groups: int,
          params: Mapping[str, Any]) -> AdvantageEstimate:
    """RLOO (Ahmadian et al. 2024, "Back to Basics"): each score minus the mean of the
    others of its group, on every token."""
    seq = rloo(rewards.sum(axis=1), group_ids, num_groups)
    return AdvantageEstimate(broadcast_to_tokens(seq, mask))


@register_advantage("reinforce_pp")
def _reinforce_pp(rewards, mask, group_ids, values, *, num_groups: int,
                  params: Mapping[str, Any]) -> AdvantageEstimate:
    """REINFORCE++ (Hu 2025): discounted per-token returns (params["gamma"]),
    batch-whitened."""
    return AdvantageEstimate(reinforce_plus_plus(rewards, mask, gamma=params["gamma"]))


@register_advantage("reinforce_pp_baseline")
def _reinforce_pp_baseline(rewards, mask, group_ids, values, *, num_groups: int,
                           params: Mapping[str, Any]) -> AdvantageEstimate:
    """REINFORCE++-baseline: scores minus the group mean, batch-whitened."""
    return AdvantageEstimate(reinforce_plus_plus_baseline(rewards.sum(axis=1), group_ids,
                                                          num_groups, mask))


@register_advantage("gae", critic=True)
def _gae(rewards, mask, group_ids, values, *, num_groups: int,
         params: Mapping[str, Any]) -> AdvantageEstimate:
    """PPO's GAE (Schulman et al. 2015, arXiv 1506.02438; params["gamma"], params["lam"])
    on the critic's values, advantages whitened over the batch; returns are the critic's
    targets."""
    advantages, returns = gae(rewards, values, mask, gamma=params["gamma"], lam=params["lam"])
    return AdvantageEstimate(whiten(advantages, mask), returns)
