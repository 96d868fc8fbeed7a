"""GRPO search agent (flagship): Search-R1-style multi-hop search with a BM25 index.

CPU default — builds the offline world, pretrains a tiny agent on the documents of
other synthetic worlds (so it can copy names from its context), warm-starts it with SFT
on an imperfect demonstrator's episodes (half of the searching ones with every entity
renamed, so that only reading fits them), trains it with GRPO and prints held-out
success of the demonstrator, the SFT agent and the GRPO agent (~22 minutes on 2 cores):

    python scripts/train.py --config configs/grpo_search.py

A real model on a GPU box / TPU pod (a local HF folder; nothing is downloaded):

    python scripts/train.py --config configs/grpo_search.py:hf \
        --config.model.path=/data/Qwen2.5-3B --workdir=/ckpt/grpo-search

Variants: cpu (default on CPU backends), hf (default elsewhere), test (seconds; CI).
Ablations: `python scripts/sweep.py --config configs/grpo_search.py --sweep NAME`
with NAME in `sweep()`.
"""
from agentjax.config import presets


def get_config(arg=None):
    return presets.search_config("grpo", arg)


def sweep(name):
    return presets.search_sweep(name)
