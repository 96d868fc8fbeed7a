"""Rejection-sampling fine-tuning (RFT, expert iteration) of the search agent: after the
same pretraining and SFT as configs/grpo_search.py, rounds of rolling out the current
policy on training questions, keeping the episodes that answered correctly (each token
sequence once) and fine-tuning on them with the masked SFT loss (train/stages/offline.py).

    python scripts/train.py --config configs/rft_search.py --workdir runs/rft
    python scripts/train.py --config configs/rft_search.py --config.init_from=runs/sft/sft

Each round's kept episodes are saved as JSONL (token ids, action masks, text) in
<workdir>/rft/; `--config.rft.data_path=my_set.jsonl` adds a set of one's own.
Variants: cpu (default on CPU: 4 rounds, the GRPO job's ~5,000 episodes), hf (a local HF
model), test (seconds; CI). Ablations: sweep(name) with name in ("rounds", "accumulate").
"""
from agentjax.config import presets


def get_config(arg=None):
    return presets.offline_config("rft", arg)


def sweep(name):
    return presets.offline_sweep("rft", name)
