"""agentjax.rl: the pure-functional numerics of the RL update (arrays in, arrays out).

Submodules: `advantages` (GAE, GRPO family, REINFORCE++, ReMax, turn returns, whiten),
`kl` (k1/k2/k3 estimators, entropy), `losses` (policy / value / KL / entropy losses, the
trainer's objective `rl_objective`, micro-batch-exact aggregation), `offpolicy` (importance
weights of the decoupled PPO objective), `preference` (DPO / IPO / hinge on trajectory
pairs), `logprobs` (chunked token log-probs from hidden states) and `shaping` (length
penalties, DAPO filter).
Conventions: [B, T] arrays with a `mask` that is 1 on action tokens; mask-0 positions
contribute nothing.
"""
from agentjax.rl import advantages, kl, logprobs, losses, offpolicy, preference, shaping
from agentjax.rl.advantages import (
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
from agentjax.rl.losses import (
    LossNorm,
    aggregate,
    entropy_bonus,
    grpo_loss,
    kl_penalty,
    loss_norm,
    masked_extreme,
    masked_mean,
    policy_loss,
    rl_objective,
    value_loss,
)
from agentjax.rl.offpolicy import importance_weights
from agentjax.rl.preference import count_pairs, dpo_loss, sequence_logprobs
from agentjax.rl.shaping import dynamic_sampling_keep, length_penalty, overlong_penalty

__all__ = [
    "GroupStats",
    "LossNorm",
    "advantages",
    "aggregate",
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
    "offpolicy",
    "overlong_penalty",
    "policy_loss",
    "preference",
    "reinforce_plus_plus",
    "reinforce_plus_plus_baseline",
    "remax",
    "rl_objective",
    "rloo",
    "sequence_logprobs",
    "shaping",
    "token_logprobs",
    "token_logprobs_full",
    "turn_returns",
    "value_loss",
    "whiten",
]
