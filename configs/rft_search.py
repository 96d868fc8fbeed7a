"""Rejection-sampling fine-tuning (RFT, expert iteration) of the search agent: after the
same pretraining and SFT as configs/grpo_search.py, rounds of rolling out the current
policy on training questions, keeping the episodes that answered correctly (each token
sequence once) and fine-tuning on them with the masked SFT loss (train/stages/offline.py).

    python scripts/train.py --config configs/rft_search.py --workdir runs/rft
    python scripts/train.py --config configs/rft_search.py --config.init_from=runs/sft/sft

Each round's kept episodes are saved as JSONL (token ids, action masks, text) in
<workdir>/rft/; `--config.rft.data_path=my_set.jsonl` adds a set of one's own.
Variants: cpu (default on CPU: 4 rounds, the GRPO job's ~5,000 episodes), hf (a local HF
model), test (seconds; CI). Ablations: `SWEEPS`.
"""
from agentjax.config import presets


def get_config(arg=None):
    variant = presets.variant(arg)
    # The GRPO search agent's world, model, pretraining and SFT, with the offline
    # stages' budgets (presets.offline_search: one update per step; rft.rounds x
    # rft.tasks x rollout.group_size episodes, on cpu 4 x 160 x 8 as the GRPO run's).
    config = presets.offline_search(variant)
    config.stage = "rft"
    # The SFT loss on the kept episodes, at the RL run's step size.
    config.optim.lr = {"cpu": 5e-4, "hf": 1e-6, "test": 1e-3}[variant]
    return config


SWEEPS = {
    # The same episode budget in one, two or four rounds.
    "rounds": [(f"rounds{n}", {"rft.rounds": n, "rft.tasks": 640 // n}) for n in (1, 2, 4)],
    "accumulate": [("latest", {"rft.accumulate": False}), ("all", {"rft.accumulate": True})],
}


def sweep(name):
    return presets.arms(SWEEPS, name)
