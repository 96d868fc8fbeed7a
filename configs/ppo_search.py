"""PPO search agent: the flagship search task trained with PPO and a critic
(a value model, GAE over action tokens only, clipped value loss, critic warmup).

CPU default (offline world, SFT warm-start, then PPO):

    python scripts/train.py --config configs/ppo_search.py

Real model (local HF folder):

    python scripts/train.py --config configs/ppo_search.py:hf \
        --config.model.path=/data/Qwen2.5-3B --workdir=/ckpt/ppo-search

Variants: cpu, hf, test (agentjax/config/presets.py). Ablations: `SWEEPS`.
"""
from agentjax.config import presets


def get_config(arg=None):
    variant = presets.variant(arg)
    # The search agent at this machine size, with its RL budget (presets.search_agent).
    config = presets.search_agent(variant)
    config.env.name = "search"
    config.reward.outcome = "em"
    config.stage = "rl"  # after pretraining and SFT
    # PPO: GAE advantages (no discount, lambda 0.95) from a critic trained alongside
    # (algo.critic_lr), PPO's clipped ratio and clipped value loss, every token alike.
    config.algo.name = "ppo"
    config.algo.advantage = "gae"
    config.algo.loss = "ppo"
    config.algo.agg = "token-mean"
    config.algo.gamma, config.algo.lam = 1.0, 0.95
    config.algo.value_clip = 0.2
    # The critic alone learns for the first updates, so the first advantages are not noise.
    config.algo.critic_warmup_steps = {"cpu": 5, "hf": 5, "test": 0}[variant]
    return config


SWEEPS = presets.SEARCH_SWEEPS


def sweep(name):
    return presets.arms(SWEEPS, name)
