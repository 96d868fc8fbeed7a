"""DAPO search agent: the flagship search task trained with DAPO
(clip-higher, dynamic sampling that refills the batch, token-mean loss, overlong shaping).

CPU default (offline world, SFT warm-start, then DAPO):

    python scripts/train.py --config configs/dapo_search.py

Real model (local HF folder):

    python scripts/train.py --config configs/dapo_search.py:hf \
        --config.model.path=/data/Qwen2.5-3B --workdir=/ckpt/dapo-search

Variants: cpu, hf, test (see agentjax/config/presets.py). Ablations: sweep(name).
"""
from agentjax.config import presets


def get_config(arg=None):
    return presets.search_config("dapo", arg)


def sweep(name):
    return presets.search_sweep(name)
