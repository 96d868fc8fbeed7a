"""Float64 numpy references for agentjax.rl, written straight from the formulas.

Deliberately plain: Python loops over rows, tokens and groups, no vectorization tricks, no
code shared with the library. `m` is always a boolean action mask. Conventions mirrored
from the library docs: mask-0 outputs are 0; a group of size 1 has mean 0 (and std 1 for
GRPO); a group whose scores are all equal gets advantage 0; rows with an out-of-range
group id get 0.
"""
from __future__ import annotations

import math

import numpy as np


def _f64(*xs):
    return [np.asarray(x, np.float64) for x in xs]


# ---------------------------------------------------------------------------- advantages


def gae(rewards, values, mask, gamma, lam):
    """Masked GAE: recursion over action tokens only, V after the last action token = 0."""
    rewards, values = _f64(rewards, values)
    mask = np.asarray(mask, bool)
    adv = np.zeros_like(rewards)
    for b in range(rewards.shape[0]):
        next_value, next_adv = 0.0, 0.0
        for t in reversed(range(rewards.shape[1])):
            if not mask[b, t]:
                continue
            delta = rewards[b, t] + gamma * next_value - values[b, t]
            next_adv = delta + gamma * lam * next_adv
            next_value = values[b, t]
            adv[b, t] = next_adv
    returns = np.where(mask, adv + values, 0.0)
    return adv, returns


def reward_to_go(rewards, mask):
    """Undiscounted sum of the rewards at action positions t' >= t (action tokens only)."""
    rewards = _f64(rewards)[0]
    mask = np.asarray(mask, bool)
    out = np.zeros_like(rewards)
    for b in range(rewards.shape[0]):
        for t in range(rewards.shape[1]):
            if mask[b, t]:
                out[b, t] = sum(rewards[b, u] for u in range(t, rewards.shape[1]) if mask[b, u])
    return out


def whiten(x, mask, shift_mean=True):
    x = _f64(x)[0]
    mask = np.asarray(mask, bool)
    vals = x[mask]
    n = len(vals)
    mean = vals.sum() / max(n, 1)
    var = ((vals - mean) ** 2).sum() / max(n - 1, 1)
    out = (x - mean) / math.sqrt(var + 1e-8)
    if not shift_mean:
        out = out + mean
    return np.where(mask, out, 0.0)


def _groups(scores, group_ids, num_groups):
    members = {g: [] for g in range(num_groups)}
    for i, g in enumerate(group_ids):
        if 0 <= g < num_groups:
            members[int(g)].append(float(scores[i]))
    return members


def grpo(scores, group_ids, num_groups, norm_by_std=True, unbiased=True, eps=1e-6):
    scores = _f64(scores)[0]
    members = _groups(scores, group_ids, num_groups)
    out = np.zeros_like(scores)
    for i, g in enumerate(group_ids):
        if not 0 <= g < num_groups:
            continue
        group = members[int(g)]
        n = len(group)
        if n == 1:
            mean, std = 0.0, 1.0
        else:
            if max(group) == min(group):
                continue  # zero variance -> exactly 0
            mean = sum(group) / n
            std = math.sqrt(sum((s - mean) ** 2 for s in group) / (n - 1 if unbiased else n))
        out[i] = (scores[i] - mean) / (std + eps) if norm_by_std else scores[i] - mean
    return out


def rloo(scores, group_ids, num_groups):
    scores = _f64(scores)[0]
    members = _groups(scores, group_ids, num_groups)
    out = np.zeros_like(scores)
    for i, g in enumerate(group_ids):
        if not 0 <= g < num_groups:
            continue
        group = members[int(g)]
        n = len(group)
        if n == 1:
            out[i] = scores[i]
        elif max(group) != min(group):
            others = (sum(group) - scores[i]) / (n - 1)
            out[i] = scores[i] - others  # leave-one-out baseline
    return out


def discounted_returns(rewards, mask, gamma):
    """G_t = sum over later action tokens u >= t of gamma^(#action tokens between) r_u."""
    rewards = _f64(rewards)[0]
    mask = np.asarray(mask, bool)
    out = np.zeros_like(rewards)
    for b in range(rewards.shape[0]):
        running = 0.0
        for t in reversed(range(rewards.shape[1])):
            if mask[b, t]:
                running = rewards[b, t] + gamma * running
                out[b, t] = running
    return out


def reinforce_plus_plus(rewards, mask, gamma):
    return whiten(discounted_returns(rewards, mask, gamma), mask)


def reinforce_plus_plus_baseline(scores, group_ids, num_groups, mask):
    scores = _f64(scores)[0]
    members = _groups(scores, group_ids, num_groups)
    centered = np.zeros_like(scores)
    for i, g in enumerate(group_ids):
        if not 0 <= g < num_groups:
            continue
        group = members[int(g)]
        if len(group) == 1:
            centered[i] = scores[i]
        elif max(group) != min(group):
            centered[i] = scores[i] - sum(group) / len(group)
    mask = np.asarray(mask, bool)
    return whiten(np.where(mask, centered[:, None], 0.0), mask)


def turn_returns(turn_rewards, turn_ids, mask, gamma):
    turn_rewards = _f64(turn_rewards)[0]
    mask = np.asarray(mask, bool)
    num_turns = turn_rewards.shape[1]
    out = np.zeros(mask.shape)
    for b in range(mask.shape[0]):
        for t in range(mask.shape[1]):
            k = int(turn_ids[b, t])
            if mask[b, t] and 0 <= k < num_turns:
                out[b, t] = sum(gamma ** (j - k) * turn_rewards[b, j] for j in range(k, num_turns))
    return out


# ------------------------------------------------------------------- turn credit


def turn_slot_returns(turn_rewards, gamma):
    """G_k = sum_{j >= k} gamma^(j - k) r_j over one episode's per-turn rewards."""
    return [sum(gamma ** (j - k) * r for j, r in enumerate(turn_rewards) if j >= k)
            for k in range(len(turn_rewards))]


def gigpo(turn_rewards, turn_anchors, group_ids, num_groups, *, gamma, weight, norm_by_std,
          eps=1e-6):
    """GiGPO (Feng et al. 2025, Eq. 3, 5, 7, 8) per turn of each episode: the episode's
    GRPO advantage plus weight x its return against the returns of the group's turns with
    the same anchor key (0 alone or all equal). turn_rewards / turn_anchors: one list per
    episode."""
    scores = [sum(r) for r in turn_rewards]
    episode = grpo(np.asarray(scores), group_ids[:len(scores)], num_groups,
                   norm_by_std=norm_by_std, eps=eps)
    returns = [turn_slot_returns(r, gamma) for r in turn_rewards]
    members = {}
    for i, anchors in enumerate(turn_anchors):
        for k, anchor in enumerate(anchors):
            members.setdefault((group_ids[i], anchor), []).append(returns[i][k])
    out = []
    for i, anchors in enumerate(turn_anchors):
        row = []
        for k, anchor in enumerate(anchors):
            same = np.asarray(members[(group_ids[i], anchor)])
            step = 0.0
            if len(same) > 1 and same.max() != same.min():
                step = returns[i][k] - same.mean()
                if norm_by_std:
                    step /= same.std(ddof=1) + eps
            row.append(episode[i] + weight * step if 0 <= group_ids[i] < num_groups else 0.0)
        out.append(row)
    return out


def turn_rloo(turn_rewards, group_ids, num_groups, *, gamma, baseline):
    """Per turn of each episode: G_{i,k} minus the mean over the group's other episodes
    of G_{j,1} ("episode") or G_{j,k}, 0 past their end ("turn"); a group of one keeps G."""
    returns = [turn_slot_returns(r, gamma) for r in turn_rewards]
    out = []
    for i, own in enumerate(returns):
        others = [j for j in range(len(returns)) if j != i and group_ids[j] == group_ids[i]]
        row = []
        for k, g in enumerate(own):
            if not 0 <= group_ids[i] < num_groups:
                row.append(0.0)
                continue
            if not others:
                row.append(g)
                continue
            column = 0 if baseline == "episode" else k
            row.append(g - np.mean([returns[j][column] if column < len(returns[j]) else 0.0
                                    for j in others]))
        out.append(row)
    return out


# ---------------------------------------------------------------------------- kl


def kl(logp, ref_logp, kind):
    """Values of the per-token KL estimators ("+" variants have the value of k1 / k3)."""
    logp, ref_logp = _f64(logp, ref_logp)
    d = logp - ref_logp
    kind = kind.rstrip("+")
    if kind == "k1":
        return d
    if kind == "k2":
        return 0.5 * d**2
    log_ratio = np.clip(-d, -20, 20)
    return np.clip(np.exp(log_ratio) - log_ratio - 1, -10, 10)


def kl_grad(logp, ref_logp, kind):
    """d kl / d logp per token."""
    logp, ref_logp = _f64(logp, ref_logp)
    d = logp - ref_logp
    if kind == "k2":
        return d
    if kind in ("k1+", "k3+"):
        return np.where(np.abs(d) < 20, d, 0.0)  # gradient of k2 on the clamped log-ratio
    if kind == "k1":
        return np.ones_like(d)
    # k3 = exp(-d) + d - 1 -> 1 - exp(-d), zero where a clamp is active.
    value = np.exp(-d) + d - 1
    return np.where((np.abs(d) < 20) & (value < 10), 1 - np.exp(-d), 0.0)


def entropy(logits):
    logits = _f64(logits)[0]
    out = np.zeros(logits.shape[:-1])
    for idx in np.ndindex(*logits.shape[:-1]):
        z = logits[idx]
        p = np.exp(z - z.max())
        p /= p.sum()
        out[idx] = -sum(pi * math.log(pi) for pi in p if pi > 0)
    return out


# ---------------------------------------------------------------------------- losses


def aggregate(x, mask, mode, num_tokens=None, num_seqs=None, constant=None):
    """Aggregation with explicit global denominators (defaults: this batch's counts)."""
    x = _f64(x)[0]
    mask = np.asarray(mask, bool)
    if num_tokens is None:
        num_tokens = max(mask.sum(), 1)
    if num_seqs is None:
        num_seqs = max(int((mask.sum(1) > 0).sum()), 1)
    if constant is None:
        constant = mask.shape[1]
    row_sums = [sum(x[b, t] for t in range(x.shape[1]) if mask[b, t]) for b in range(x.shape[0])]
    if mode == "token-mean":
        return sum(row_sums) / num_tokens
    if mode == "seq-mean-token-mean":
        return sum(s / max(mask[b].sum(), 1) for b, s in enumerate(row_sums)) / num_seqs
    if mode == "seq-mean-token-sum":
        return sum(row_sums) / num_seqs
    if mode == "seq-mean-token-sum-norm":
        return sum(row_sums) / (num_seqs * constant)
    raise ValueError(mode)


def aggregate_weights(mask, mode, num_tokens=None, num_seqs=None, constant=None):
    """w[b, t] with aggregate(x) = sum_bt w[b, t] x[b, t]: the gradient of the aggregate."""
    mask = np.asarray(mask, bool)
    weights = np.zeros(mask.shape)
    for idx in zip(*np.nonzero(mask)):
        one_hot = np.zeros(mask.shape)
        one_hot[idx] = 1.0
        weights[idx] = aggregate(one_hot, mask, mode, num_tokens, num_seqs, constant)
    return weights


def policy_token_loss(logp, old_logp, adv, mask, kind, clip_low, clip_high, dual_clip=None):
    """Per-token policy loss values (0 at mask-0 positions)."""
    logp, old_logp, adv = _f64(logp, old_logp, adv)
    mask = np.asarray(mask, bool)
    out = np.zeros_like(logp)
    for b in range(logp.shape[0]):
        n = mask[b].sum()
        seq_log_ratio = sum(logp[b, t] - old_logp[b, t] for t in range(logp.shape[1]) if mask[b, t])
        seq_ratio = math.exp(min(seq_log_ratio / max(n, 1), 10.0))
        for t in range(logp.shape[1]):
            if not mask[b, t]:
                continue
            a = adv[b, t]
            ratio = math.exp(min(max(logp[b, t] - old_logp[b, t], -20), 20))
            clipped = min(max(ratio, 1 - clip_low), 1 + clip_high)
            if kind == "ppo":
                loss = max(-a * ratio, -a * clipped)
                if dual_clip is not None and a < 0:
                    loss = min(loss, -a * dual_clip)
            elif kind == "gspo":
                s_clipped = min(max(seq_ratio, 1 - clip_low), 1 + clip_high)
                loss = max(-a * seq_ratio, -a * s_clipped)
            elif kind == "cispo":
                loss = -clipped * a * logp[b, t]
            elif kind == "reinforce":
                loss = -a * logp[b, t]
            else:
                raise ValueError(kind)
            out[b, t] = loss
    return out


def policy_token_grad(logp, old_logp, adv, mask, kind, clip_low, clip_high, dual_clip=None):
    """d(per-token loss)/d logp_t for the kinds whose loss is per-token separable.

    GSPO is not separable (its value depends on the sequence mean); its GSPO-token gradient
    per token is d/d logp_t [max(-A s, -A clip(s))] with s held at the sequence ratio:
    -A s where the unclipped branch is active, else 0.
    """
    logp, old_logp, adv = _f64(logp, old_logp, adv)
    mask = np.asarray(mask, bool)
    out = np.zeros_like(logp)
    for b in range(logp.shape[0]):
        n = mask[b].sum()
        seq_log_ratio = sum(logp[b, t] - old_logp[b, t] for t in range(logp.shape[1]) if mask[b, t])
        seq_ratio = math.exp(min(seq_log_ratio / max(n, 1), 10.0))
        for t in range(logp.shape[1]):
            if not mask[b, t]:
                continue
            a = adv[b, t]
            ratio = math.exp(logp[b, t] - old_logp[b, t])
            if kind == "ppo":
                clipped = min(max(ratio, 1 - clip_low), 1 + clip_high)
                unclipped_active = -a * ratio >= -a * clipped
                grad = -a * ratio if unclipped_active else 0.0
                if dual_clip is not None and a < 0 and max(-a * ratio, -a * clipped) > -a * dual_clip:
                    grad = 0.0
            elif kind == "gspo":
                s_clipped = min(max(seq_ratio, 1 - clip_low), 1 + clip_high)
                grad = -a * seq_ratio if -a * seq_ratio >= -a * s_clipped else 0.0
            elif kind == "cispo":
                grad = -min(max(ratio, 1 - clip_low), 1 + clip_high) * a
            elif kind == "reinforce":
                grad = -a
            else:
                raise ValueError(kind)
            out[b, t] = grad
    return out


def value_token_loss(values, old_values, returns, mask, clip=None):
    values, old_values, returns = _f64(values, old_values, returns)
    mask = np.asarray(mask, bool)
    out = np.zeros_like(values)
    for idx in zip(*np.nonzero(mask)):
        err = (values[idx] - returns[idx]) ** 2
        if clip is not None:
            v_clip = old_values[idx] + min(max(values[idx] - old_values[idx], -clip), clip)
            err = max(err, (v_clip - returns[idx]) ** 2)
        out[idx] = 0.5 * err
    return out


# ---------------------------------------------------------------------------- off-policy


def importance_weights(proximal, behavior, mask, cap, bound, level="token"):
    """w = bound(pi_prox / mu) on action tokens (log-ratio clamped to +-20), 1 elsewhere;
    at sequence level pi_prox / mu is the product over the row's action tokens."""
    proximal, behavior = _f64(proximal, behavior)
    mask = np.asarray(mask, bool)
    out = np.ones_like(proximal)
    row_log_ratio = [sum(proximal[b, t] - behavior[b, t] for t in range(mask.shape[1])
                         if mask[b, t]) for b in range(mask.shape[0])]
    for idx in zip(*np.nonzero(mask)):
        log_rho = row_log_ratio[idx[0]] if level == "sequence" else proximal[idx] - behavior[idx]
        rho = math.exp(min(max(log_rho, -20), 20))
        if bound == "truncate":
            out[idx] = min(rho, cap)
        elif bound == "mask":
            out[idx] = rho if rho <= cap else 0.0
        else:
            raise ValueError(bound)
    return out


def rollout_correction_keep(trainer, behavior, action, advantages, masks, th):
    """[B, T] bool: kept by every mask of `masks` (names of rl/rollout_correction.py)
    with bounds th (a dict); from delta_t = log pi_t - log mu_t on action tokens, clamped
    to +-20. A token mask never rejects a non-action token; a row mask rejects its row."""
    trainer, behavior, advantages = _f64(trainer, behavior, advantages)
    action = np.asarray(action, bool)
    if advantages.ndim == 1:
        advantages = np.repeat(advantages[:, None], action.shape[1], axis=1)
    keep = np.ones(action.shape, bool)
    for b in range(action.shape[0]):
        steps = [t for t in range(action.shape[1]) if action[b, t]]
        delta = {t: min(max(trainer[b, t] - behavior[b, t], -20.0), 20.0) for t in steps}
        n = max(len(steps), 1)

        def kl(d):
            return 0.5 * d * d if th["kl_estimator"] == "k2" else math.exp(d) - 1.0 - d

        row_kept = True
        for name in masks:
            if name == "geometric":
                geo = math.exp(sum(delta.values()) / n)
                row_kept &= th["geo_low"] <= geo <= th["geo_high"]
            elif name == "product":
                prod = math.exp(sum(delta.values()))
                row_kept &= th["product_low"] <= prod <= th["product_high"]
            elif name == "seq_mean_kl":
                row_kept &= sum(kl(d) for d in delta.values()) / n <= th["seq_mean_kl"]
            elif name == "seq_max_kl":
                row_kept &= max([kl(d) for d in delta.values()], default=0.0) <= th["seq_max_kl"]
            elif name == "token":
                for t in steps:
                    keep[b, t] &= th["token_low"] <= math.exp(delta[t]) <= th["token_high"]
            elif name == "opsm":
                seq_kl = sum(-d for d in delta.values()) / n
                for t in range(action.shape[1]):  # observations in the loss too
                    keep[b, t] &= not (advantages[b, t] < 0 and seq_kl > th["opsm_delta"])
            else:
                raise ValueError(name)
        if not row_kept:
            keep[b] = False
    return keep


# ---------------------------------------------------------------------------- preference


def _sigmoid(x):
    return 1.0 / (1.0 + math.exp(-x))


def dpo(policy_c, policy_r, ref_c, ref_r, mask_c, mask_r, beta, kind, eps=0.0,
        normalized=False, num_pairs=None):
    """DPO-family loss over pairs; returns (loss, d loss / d policy_c, d loss / d policy_r,
    rewards_c, rewards_r, counted), rewards beta * h per pair.

    h = sum of (policy - ref) over action tokens (divided by their count if normalized),
    z = h_c - h_r; a pair counts when both trajectories have an action token; the loss is
    the sum over counting pairs divided by num_pairs (default: their number, >= 1).
    """
    policy_c, policy_r, ref_c, ref_r = _f64(policy_c, policy_r, ref_c, ref_r)
    mask_c, mask_r = np.asarray(mask_c, bool), np.asarray(mask_r, bool)
    pairs = policy_c.shape[0]
    counted = [bool(mask_c[p].any() and mask_r[p].any()) for p in range(pairs)]
    if num_pairs is None:
        num_pairs = max(sum(counted), 1)
    loss = 0.0
    grad_c, grad_r = np.zeros_like(policy_c), np.zeros_like(policy_r)
    rewards_c, rewards_r = np.zeros(pairs), np.zeros(pairs)
    for p in range(pairs):
        n_c = max(int(mask_c[p].sum()), 1) if normalized else 1
        n_r = max(int(mask_r[p].sum()), 1) if normalized else 1
        h_c = sum(policy_c[p, t] - ref_c[p, t] for t in range(policy_c.shape[1]) if mask_c[p, t])
        h_r = sum(policy_r[p, t] - ref_r[p, t] for t in range(policy_r.shape[1]) if mask_r[p, t])
        h_c, h_r = h_c / n_c, h_r / n_r
        rewards_c[p], rewards_r[p] = beta * h_c, beta * h_r
        if not counted[p]:
            continue
        z = h_c - h_r
        if kind == "sigmoid":
            value = (-(1 - eps) * math.log(_sigmoid(beta * z))
                     - eps * math.log(_sigmoid(-beta * z)))
            slope = -(1 - eps) * beta * _sigmoid(-beta * z) + eps * beta * _sigmoid(beta * z)
        elif kind == "ipo":
            value = (z - 1 / (2 * beta)) ** 2
            slope = 2 * (z - 1 / (2 * beta))
        elif kind == "hinge":
            value = max(0.0, 1 - beta * z)
            slope = -beta if 1 - beta * z > 0 else 0.0
        else:
            raise ValueError(kind)
        loss += value / num_pairs
        grad_c[p] = np.where(mask_c[p], slope / n_c / num_pairs, 0.0)
        grad_r[p] = np.where(mask_r[p], -slope / n_r / num_pairs, 0.0)
    return loss, grad_c, grad_r, rewards_c, rewards_r, np.array(counted)


# ---------------------------------------------------------------------------- logprobs


def token_logprobs(hidden, lm_head, targets, temperature=1.0):
    hidden, lm_head = _f64(hidden, lm_head)
    b_, t_ = targets.shape
    logp = np.zeros((b_, t_))
    ent = np.zeros((b_, t_))
    for b in range(b_):
        for t in range(t_):
            z = hidden[b, t] @ lm_head / temperature
            lse = z.max() + math.log(np.exp(z - z.max()).sum())
            logp[b, t] = z[targets[b, t]] - lse
            p = np.exp(z - lse)
            ent[b, t] = -(p * (z - lse)).sum()
    return logp, ent


# ---------------------------------------------------------------------------- shaping


def overlong_penalty(lengths, max_len, buffer, factor):
    out = []
    for n in np.asarray(lengths, np.float64):
        exceed = n - (max_len - buffer)
        if exceed <= 0:
            out.append(0.0)
        elif n > max_len:
            out.append(-factor)
        else:
            out.append(-exceed / buffer * factor)
    return np.array(out)


def length_penalty(rewards, lengths, target, kind, coef=None, tau=None):
    out = []
    for r, n in zip(np.asarray(rewards, np.float64), np.asarray(lengths, np.float64)):
        if kind == "linear":
            out.append(r - coef * max(0.0, n - target))
        else:
            out.append(r / (1 + math.exp((n - target) / tau)))
    return np.array(out)


def dynamic_sampling_keep(scores, group_ids, num_groups):
    members = _groups(np.asarray(scores, np.float64), group_ids, num_groups)
    keep = []
    for g in group_ids:
        if not 0 <= g < num_groups:
            keep.append(False)
            continue
        group = members[int(g)]
        keep.append(len(group) > 1 and float(np.std(group)) > 0)
    return np.array(keep)


def distill_advantages(task_adv, teacher_logp, student_logp, loss_mask, action_mask, coef,
                       task_weight):
    """On-policy distillation's advantages: task_weight * A_task + coef * (log pi_teacher -
    log pi_student) on loss tokens, the second term only on action tokens the teacher
    scored (a finite log-prob), no discount; and (k1, k3, scored fraction) of
    KL(student || teacher) per scored action token (k3 clamped as `kl`'s)."""
    task_adv, teacher_logp, student_logp = _f64(task_adv, teacher_logp, student_logp)
    loss_mask, action_mask = np.asarray(loss_mask) > 0, np.asarray(action_mask) > 0
    if task_adv.ndim == 1:
        task_adv = np.repeat(task_adv[:, None], loss_mask.shape[1], axis=1)
    out = np.zeros_like(student_logp)
    k1, k3, scored = [], [], 0
    for b, t in np.ndindex(*out.shape):
        is_scored = action_mask[b, t] and math.isfinite(teacher_logp[b, t])
        signal = teacher_logp[b, t] - student_logp[b, t] if is_scored else 0.0
        if loss_mask[b, t]:
            out[b, t] = task_weight * task_adv[b, t] + coef * signal
        if is_scored:
            scored += 1
            k1.append(student_logp[b, t] - teacher_logp[b, t])
            k3.append(float(kl(student_logp[b, t], teacher_logp[b, t], "k3")))
    mean = (lambda xs: sum(xs) / len(xs) if xs else 0.0)
    return out, (mean(k1), mean(k3), scored / max(int(action_mask.sum()), 1))
