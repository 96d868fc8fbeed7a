"""Turn-level credit for multi-turn episodes: GiGPO's step groups and a per-turn return
with an action-independent baseline, as `ADVANTAGES` entries ("gigpo", "turn_rloo").

Both read the trainer's [B, T] batch as every estimator does, plus `turn_ids` (the turn
of each token, `Trajectory.turn_ids`: 0 on the prompt, k on turn k's action and the
observation after it) and, for GiGPO, `anchor_ids` (`core.anchors.anchor_ids`: equal ids
mark turns of one group that acted from the same state). A turn's reward is the sum of
the per-token rewards on its loss tokens (`collate` puts a turn's env reward on its last
action token and the final reward on the episode's last one), and its return is

    G_k = sum_{j >= k} gamma^(j - k) r_j,          gamma = algo.turn_gamma, per turn,

so a turn is credited with its own and the later turns' rewards, never the earlier ones.
Every token of turn k gets turn k's advantage; mask-0 positions get exactly 0.

Per-turn quantities live in [B, T + 1] "turn slots" (slot k is turn k of the row: a row
of T tokens has at most T turns); tokens whose turn id is outside [0, T] get 0.
"""
from __future__ import annotations

from typing import Any, Mapping

import jax
import jax.numpy as jnp

from agentjax.config.choices import GIGPO_NORMS, TURN_BASELINES
from agentjax.rl import _common
from agentjax.rl._common import as_float
from agentjax.rl.advantages import (
    AdvantageEstimate,
    _affine_suffix,
    _gather_groups,
    broadcast_to_tokens,
    group_stats,
    grpo,
    register_advantage,
    rloo,
)


def _slots(turn_ids, mask):
    """(flat slot index [B, T], valid [B, T], slot count B * (T + 1)) of the loss tokens."""
    rows, length = turn_ids.shape
    valid = mask.astype(bool) & (turn_ids >= 0) & (turn_ids <= length)
    slot = jnp.arange(rows)[:, None] * (length + 1) + turn_ids
    return jnp.where(valid, slot, rows * (length + 1)), valid, rows * (length + 1)


def _per_slot(fn, values, slot, count):
    """fn-reduction (a jax.ops.segment_* op) of [B, T] values into [B, T + 1] slots."""
    rows = slot.shape[0]
    return fn(values.ravel(), slot.ravel(), count + 1)[:count].reshape(rows, -1)


def _to_tokens(per_slot, turn_ids, valid):
    """Token t of turn k gets per_slot[b, k]; tokens outside `valid` get 0."""
    index = jnp.clip(turn_ids, 0, per_slot.shape[1] - 1)
    return jnp.where(valid, jnp.take_along_axis(per_slot, index, axis=1), 0.0)


def turn_slot_returns(rewards, turn_ids, mask, *, gamma):
    """Each turn's discounted return G_k and whether the turn has a loss token.

    Args:
      rewards: [B, T] float per-token rewards; ignored at mask-0 positions.
      turn_ids: [B, T] int turn of each token.
      mask: [B, T] loss mask (non-zero = included).
      gamma: per-turn discount.

    Returns:
      (returns, present): [B, T + 1] float G of each turn slot (0 past the row's last
      rewarded turn) and [B, T + 1] bool.
    """
    _common.check_tokens(rewards=rewards, turn_ids=turn_ids, mask=mask)
    _common.check_integer("turn_ids", turn_ids)
    (rewards,) = as_float(rewards)
    slot, valid, count = _slots(turn_ids, mask)
    turn_rewards = _per_slot(jax.ops.segment_sum, jnp.where(valid, rewards, 0.0), slot, count)
    present = _per_slot(jax.ops.segment_sum, valid.astype(jnp.int32), slot, count) > 0
    returns = _affine_suffix(jnp.full_like(turn_rewards, gamma), turn_rewards)
    return returns, present


def step_advantages(rewards, turn_ids, anchor_ids, mask, *, gamma, norm_by_std, eps=1e-6):
    """GiGPO's step-level advantages: each turn's return against its anchor group's.

    A_step(turn) = (G - mean) / (std + eps) over the turns that share its anchor id
    (unbiased std, as torch.std), or G - mean without `norm_by_std`. A turn alone in its
    anchor group, or in a group whose returns are all equal, gets exactly 0 (verl-agent's
    `step_norm_reward` gives a lone turn its own mean: 0). Turns with anchor id -1 get 0.

    Args:
      rewards: [B, T] float per-token rewards; ignored at mask-0 positions.
      turn_ids: [B, T] int turn of each token.
      anchor_ids: [B, T] int anchor id of each token's turn (`core.anchors.anchor_ids`).
      mask: [B, T] loss mask.
      gamma: per-turn discount of the returns.
      norm_by_std: divide by the anchor group's std.
      eps: added to the std.

    Returns:
      (advantages [B, T] float, turn slots in an anchor group of two or more [B, T + 1]
      bool, present turn slots [B, T + 1] bool).
    """
    _common.check_tokens(turn_ids=turn_ids, anchor_ids=anchor_ids)
    _common.check_integer("anchor_ids", anchor_ids)
    returns, present = turn_slot_returns(rewards, turn_ids, mask, gamma=gamma)
    slot, valid, count = _slots(turn_ids, mask)
    anchor = _per_slot(jax.ops.segment_max, jnp.where(valid, anchor_ids, -1), slot, count)
    anchor = jnp.where(present, anchor, -1).ravel()
    stats = group_stats(returns.ravel(), anchor, count)
    row, in_range = _gather_groups(stats, anchor, count)
    adv = returns.ravel() - row.mean
    if norm_by_std:
        adv = adv / (row.std + eps)
    shared = in_range & (row.count > 1)
    adv = jnp.where(shared & ~row.constant, adv, 0.0).reshape(returns.shape)
    return _to_tokens(adv, turn_ids, valid), shared.reshape(returns.shape), present


def gigpo(rewards, mask, group_ids, turn_ids, anchor_ids, num_groups, *, gamma, weight,
          norm_by_std, eps=1e-6):
    """GiGPO (Feng et al. 2025, arXiv 2505.10978, Eq. 8): A = A_episode + weight * A_step.

    A_episode is GRPO over the episodes' scores (the sum of their token rewards) within
    the prompt group, divided by the group std with `norm_by_std` (verl-agent's
    "mean_std_norm") or not ("mean_norm"); A_step is `step_advantages` with the same
    normalization. verl-agent's trainer holds one row per turn and by default takes the
    episode statistics over those rows (an episode counted once per turn); here a row is
    an episode, so each episode counts once, the paper's Eq. 3.

    With one turn per episode and "context" anchors every step group is its prompt
    group, so A_step = A_episode and A = (1 + weight) A_episode; with weight 0 it is
    GRPO (Dr.GRPO without `norm_by_std`).

    Args:
      rewards, mask, group_ids, num_groups: as `advantages.grpo` / the trainer's batch.
      turn_ids, anchor_ids: [B, T] int, as `step_advantages`.
      gamma: per-turn discount of the step returns.
      weight: the step advantage's weight w.
      norm_by_std: divide both parts by their group's std.
      eps: added to the stds.

    Returns:
      (advantages [B, T], metrics): step_grouped_frac, the fraction of turns that share
      an anchor with another turn (the turns A_step moves), and step_adv_abs_mean.
    """
    _common.check_tokens(rewards=rewards, mask=mask)
    (rewards,) = as_float(rewards)
    valid = mask.astype(bool)
    scores = jnp.where(valid, rewards, 0.0).sum(axis=1)
    episode = broadcast_to_tokens(
        grpo(scores, group_ids, num_groups, norm_by_std=norm_by_std, eps=eps), mask)
    step, shared, present = step_advantages(rewards, turn_ids, anchor_ids, mask, gamma=gamma,
                                            norm_by_std=norm_by_std, eps=eps)
    in_group = ((group_ids >= 0) & (group_ids < num_groups))[:, None]
    step = jnp.where(in_group, step, 0.0)
    turns = jnp.maximum(present.sum(), 1)
    metrics = {"step_grouped_frac": (shared & present).sum() / turns,
               "step_adv_abs_mean": jnp.abs(step).sum() / jnp.maximum(valid.sum(), 1)}
    return jnp.where(valid, episode + weight * step, 0.0), metrics


def turn_rloo(rewards, mask, group_ids, turn_ids, num_groups, *, gamma, baseline):
    """Per-turn return minus a leave-one-out baseline that does not depend on the action.

    A(turn k of episode i) = G_{i,k} - b, with b from the *other* episodes of i's group
    only (n of them in all; a group of one keeps G, as `advantages.rloo`):

      - "episode": b = mean_{j != i} G_{j,1}, the others' returns from their start.
      - "turn": b = mean_{j != i} G_{j,k}, the others' returns from the same turn index
        k, an episode that ended before turn k counting 0: every episode enters every
        turn index whatever its length.

    Why these and not the per-turn-index baseline (verl#7244): normalizing turn rewards
    per turn index over the episodes that reached that turn (MT-GRPO) and summing them,
    A_{i,k} = sum_{j=k}^{K_i} gamma^(j-k) (r_{i,j} - mean of r_{., j} over the episodes
    with a turn j), subtracts a baseline with one term per remaining turn of episode i:
    how many there are (K_i) depends on episode i's own actions (stop now, or take
    another turn), so the baseline is correlated with the action it scores and the
    expected gradient gains a term, -E[the later turns' mean rewards], on every "take
    another turn" decision: a length bias whose sign follows the intermediate rewards.
    Both baselines here are sums over a fixed set (the other episodes, each at a fixed
    turn index) that episode i's actions never change, so E[grad log pi(a) b] = 0 and
    the gradient is unbiased (`tests/rl/test_turn_credit.py` shows both by exact
    enumeration). Leaving the episode itself out (RLOO) also avoids GRPO's (1 - 1/n)
    self-inclusion, and no std division: the std would depend on the episode's own
    return. "episode" compares every turn with the others' value from the start; "turn"
    with their return from turn k on, on the scale of G_{i,k} when rewards come per turn.
    With one turn per episode (or rewards only at the end and gamma = 1 for "episode")
    it is RLOO.

    Args:
      rewards, mask, group_ids, num_groups: as `advantages.rloo` / the trainer's batch.
      turn_ids: [B, T] int turn of each token.
      gamma: per-turn discount.
      baseline: "episode" or "turn".

    Returns:
      [B, T] float advantages, 0 at mask-0 positions and on rows outside the groups.
    """
    _common.check_choice("baseline", baseline, TURN_BASELINES)
    returns, _ = turn_slot_returns(rewards, turn_ids, mask, gamma=gamma)
    rows, slots = returns.shape
    in_group = (group_ids >= 0) & (group_ids < num_groups)
    if baseline == "turn":
        ids = jnp.where(in_group[:, None],
                        group_ids[:, None] * slots + jnp.arange(slots)[None, :], -1)
        adv = rloo(returns.ravel(), ids.ravel(), num_groups * slots).reshape(rows, slots)
    else:
        first = returns[:, 1]
        # rloo(first) = first - b for groups of two or more, first (b = 0) for one.
        adv = returns - (first - rloo(first, group_ids, num_groups))[:, None]
    _, valid, _ = _slots(turn_ids, mask)
    return _to_tokens(jnp.where(in_group[:, None], adv, 0.0), turn_ids, valid)


@register_advantage("gigpo", turns=True)
def _gigpo(rewards, mask, group_ids, values, *, num_groups: int, params: Mapping[str, Any],
           turn_ids, anchor_ids) -> AdvantageEstimate:
    """GiGPO: episode-level group advantage plus params["gigpo_weight"] times the
    step-level advantage of anchor-state groups (params["turn_gamma"],
    params["gigpo_norm"])."""
    _common.check_choice("gigpo_norm", params["gigpo_norm"], GIGPO_NORMS)
    advantages, metrics = gigpo(
        rewards, mask, group_ids, turn_ids, anchor_ids, num_groups,
        gamma=params["turn_gamma"], weight=params["gigpo_weight"],
        norm_by_std=params["gigpo_norm"] == "std")
    return AdvantageEstimate(advantages, metrics={f"gigpo/{k}": v for k, v in metrics.items()})


@register_advantage("turn_rloo", turns=True)
def _turn_rloo(rewards, mask, group_ids, values, *, num_groups: int,
               params: Mapping[str, Any], turn_ids, anchor_ids) -> AdvantageEstimate:
    """Per-turn returns (params["turn_gamma"]) minus the leave-one-out baseline
    params["turn_baseline"]."""
    return AdvantageEstimate(turn_rloo(rewards, mask, group_ids, turn_ids, num_groups,
                                       gamma=params["turn_gamma"],
                                       baseline=params["turn_baseline"]))
