"""PPO search agent: the flagship search task trained with PPO and a critic
(a value model, GAE over action tokens only, clipped value loss, critic warmup).

CPU default (offline world, SFT warm-start, then PPO):

    python scripts/train.py --config configs/ppo_search.py

Real model (local HF folder):

    python scripts/train.py --config configs/ppo_search.py:hf \
        --config.model.path=/data/Qwen2.5-3B --workdir=/ckpt/ppo-search

Variants: cpu, hf, test (see agentjax/config/presets.py). Ablations: sweep(name).
"""
from agentjax.config import presets


def get_config(arg=None):
    return presets.search_config("ppo", arg)


def sweep(name):
    return presets.search_sweep(name)
