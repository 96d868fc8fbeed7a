"""DPO of the search agent on pairs of its own episodes: after the same pretraining and
SFT as configs/grpo_search.py, a successful and a failed episode of one question
(trajectory-level pairs) and two episodes that share a prefix token for token and
diverge at one turn (turn-level pairs, from branch rollouts), trained with the DPO loss
on action tokens only against the frozen SFT policy (train/stages/offline.py).

    python scripts/train.py --config configs/dpo_search.py --workdir runs/dpo
    python scripts/train.py --config configs/dpo_search.py --config.dpo.refresh_every=10

Offline DPO (the default: pairs collected once, from the SFT policy) or online /
iterative DPO (dpo.refresh_every > 0: re-collected from the current policy). The pairs
are saved as JSONL in <workdir>/dpo/; `--config.dpo.data_path=pairs.jsonl` trains on
pairs of one's own instead (data/offline_jsonl.py has the format).
Variants: cpu (default on CPU), hf (a local HF model), test (seconds; CI; online).
Ablations: sweep(name) with name in ("beta", "online", "pairs", "kind").
"""
from agentjax.config import presets


def get_config(arg=None):
    return presets.offline_config("dpo", arg)


def sweep(name):
    return presets.offline_sweep("dpo", name)
