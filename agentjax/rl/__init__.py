"""agentjax.rl: the pure-functional numerics of the RL update (arrays in, arrays out).

Submodules: `advantages` (GAE, GRPO family, REINFORCE++, ReMax, turn returns, whiten; the
registry ADVANTAGES of the estimators a config chooses), `aggregation` (micro-batch-exact
reduction to a loss with global denominators), `policy_losses` (`policy_loss` and the
registry POLICY_LOSSES of its kinds), `losses` (value / KL / entropy losses and the
trainer's objective `rl_objective`), `kl` (k1/k2/k3 estimators, entropy), `offpolicy`
(importance weights of the decoupled PPO objective), `rollout_correction` (the
rollout-trainer mismatch: its metrics and rejection masks), `preference` (DPO / IPO /
hinge on trajectory pairs), `logprobs` (chunked token log-probs from hidden states), `shaping`
(length penalties, DAPO filter), `turn_credit` (turn-level estimators: GiGPO's step
groups, per-turn returns with a leave-one-out baseline) and `token_packing` (a
minibatch's episodes packed into
micro-batches of a token budget, inside jit).
From a model (an nnx graphdef): `objectives` (the update's loss functions: RL, value,
SFT, DPO) and `prepare` (log-probs, KL and advantages of a rollout batch).
Conventions: [B, T] arrays with a `mask` that is 1 on action tokens; mask-0 positions
contribute nothing.
"""
from agentjax.rl import (
    advantages,
    aggregation,
    kl,
    logprobs,
    losses,
    objectives,
    offpolicy,
    policy_losses,
    preference,
    prepare,
    rollout_correction,
    shaping,
    token_packing,
    turn_credit,
)
from agentjax.rl.advantages import (
    ADVANTAGES,
    GroupStats,
    broadcast_to_tokens,
    gae,
    gae_associative,
    group_stats,
    grpo,
    reinforce_plus_plus,
    reinforce_plus_plus_baseline,
    remax,
    rloo,
    turn_returns,
    whiten,
)
from agentjax.rl.kl import entropy_from_logits
from agentjax.rl.logprobs import token_logprobs, token_logprobs_full
from agentjax.rl.aggregation import LossNorm, aggregate, loss_norm, masked_extreme, masked_mean
from agentjax.rl.losses import entropy_bonus, grpo_loss, kl_penalty, rl_objective, value_loss
from agentjax.rl.offpolicy import importance_weights
from agentjax.rl.policy_losses import POLICY_LOSSES, policy_loss
from agentjax.rl.preference import count_pairs, dpo_loss, sequence_logprobs
from agentjax.rl.shaping import dynamic_sampling_keep, length_penalty, overlong_penalty

__all__ = [
    "ADVANTAGES",
    "GroupStats",
    "LossNorm",
    "POLICY_LOSSES",
    "advantages",
    "aggregate",
    "aggregation",
    "broadcast_to_tokens",
    "count_pairs",
    "dpo_loss",
    "dynamic_sampling_keep",
    "entropy_bonus",
    "entropy_from_logits",
    "gae",
    "gae_associative",
    "group_stats",
    "grpo",
    "grpo_loss",
    "importance_weights",
    "kl",
    "kl_penalty",
    "length_penalty",
    "logprobs",
    "loss_norm",
    "losses",
    "masked_extreme",
    "masked_mean",
    "objectives",
    "offpolicy",
    "overlong_penalty",
    "policy_loss",
    "policy_losses",
    "preference",
    "prepare",
    "reinforce_plus_plus",
    "reinforce_plus_plus_baseline",
    "remax",
    "rl_objective",
    "rloo",
    "rollout_correction",
    "sequence_logprobs",
    "shaping",
    "token_packing",
    "token_logprobs",
    "token_logprobs_full",
    "turn_credit",
    "turn_returns",
    "value_loss",
    "whiten",
]
