"""DAPO search agent: the flagship search task trained with DAPO
(clip-higher, dynamic sampling that refills the batch, token-mean loss, overlong shaping).

CPU default (offline world, SFT warm-start, then DAPO):

    python scripts/train.py --config configs/dapo_search.py

Real model (local HF folder):

    python scripts/train.py --config configs/dapo_search.py:hf \
        --config.model.path=/data/Qwen2.5-3B --workdir=/ckpt/dapo-search

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
    # DAPO: group-normalized advantages (as GRPO), a higher upper clip, every token of
    # the batch weighted alike, groups whose rewards are all equal replaced by new ones,
    # a penalty on episodes within 64 action tokens of algo.overlong_max_len.
    config.algo.name = "dapo"
    config.algo.advantage = "grpo"
    config.algo.loss = "ppo"
    config.algo.clip_low, config.algo.clip_high = 0.2, 0.28
    config.algo.agg = "token-mean"
    config.algo.dynamic_sampling = True
    config.algo.overlong_buffer = 64
    # DAPO drops the KL term; the hf variant keeps Search-R1's 0.001 (k3).
    config.algo.kl_coef = 0.001 if variant == "hf" else 0.0
    return config


SWEEPS = presets.SEARCH_SWEEPS


def sweep(name):
    return presets.arms(SWEEPS, name)
