"""agentjax.rl: the pure-functional numerics of the RL update (arrays in, arrays out).

Submodules: `advantages` (GAE, GRPO family, REINFORCE++, ReMax, turn returns, whiten),
`kl` (k1/k2/k3 estimators, entropy), `losses` (policy / value / KL / entropy losses, the
trainer's objective `rl_objective`, micro-batch-exact aggregation), `logprobs` (chunked
token log-probs from hidden states) and `shaping` (length penalties, DAPO filter).
Conventions: [B, T] arrays with a `mask` that is 1 on action tokens; mask-0 positions
contribute nothing.
"""
from agentjax.rl import advantages, kl, logprobs, losses, shaping
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
    masked_mean,
    policy_loss,
    rl_objective,
    value_loss,
)
from agentjax.rl.shaping import dynamic_sampling_keep, length_penalty, overlong_penalty

__all__ = [
    "GroupStats",
    "LossNorm",
    "advantages",
    "aggregate",
    "broadcast_to_tokens",
    "dynamic_sampling_keep",
    "entropy_bonus",
    "entropy_from_logits",
    "gae",
    "gae_associative",
    "group_stats",
    "grpo",
    "grpo_loss",
    "kl",
    "kl_penalty",
    "length_penalty",
    "logprobs",
    "loss_norm",
    "losses",
    "masked_mean",
    "overlong_penalty",
    "policy_loss",
    "reinforce_plus_plus",
    "reinforce_plus_plus_baseline",
    "remax",
    "rl_objective",
    "rloo",
    "shaping",
    "token_logprobs",
    "token_logprobs_full",
    "turn_returns",
    "value_loss",
    "whiten",
]
