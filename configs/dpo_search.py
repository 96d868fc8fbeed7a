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
Ablations: `SWEEPS`.
"""
from agentjax.config import presets


def get_config(arg=None):
    variant = presets.variant(arg)
    # The GRPO search agent's world, model, pretraining and SFT, with the offline
    # stages' budgets (presets.offline_search: one update per step; a collection of
    # dpo.tasks x rollout.group_size episodes, on cpu 512 x 8, about the GRPO run's).
    config = presets.offline_search(variant)
    config.stage = "dpo"
    config.dpo.kind, config.dpo.beta = "sigmoid", 0.1  # the DPO loss
    # DPO moves a policy faster than GRPO's clipped ratio does (the loss is unbounded in
    # the log-ratio), so its step is smaller; neither value was tuned. hf: DPO's usual
    # step on a pretrained model.
    config.optim.lr = {"cpu": 1e-4, "hf": 5e-7, "test": 1e-3}[variant]
    return config


SWEEPS = {
    "beta": [(f"beta{b}", {"dpo.beta": b}) for b in (0.05, 0.1, 0.3)],
    # The same episode budget: one collection of 512 tasks, or four of 128.
    "online": [("offline", {"dpo.refresh_every": 0, "dpo.tasks": 512}),
               ("online", {"dpo.refresh_every": 10, "dpo.tasks": 128})],
    "pairs": [(kind, {"dpo.pairs": kind}) for kind in ("trajectory", "turn", "both")],
    "kind": [(kind, {"dpo.kind": kind}) for kind in ("sigmoid", "ipo", "hinge")],
}


def sweep(name):
    return presets.arms(SWEEPS, name)
