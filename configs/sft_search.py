"""SFT warm-start of the search agent: masked next-token loss on the action tokens of
an imperfect demonstrator's episodes (plus Agent-FLAN-style negative examples, whose
invalid action is masked out so only the recovery is learned). The CPU variant first
pretrains the tiny model on other worlds' documents (`config.pretrain`).

    python scripts/train.py --config configs/sft_search.py --workdir runs/sft
    python scripts/train.py --config configs/grpo_search.py --config.init_from=runs/sft

The run exports its policy to <workdir>/hf (an HF checkpoint + tokenizer), which
`init_from` (and scripts/evaluate.py, SGLang) read.
Variants: cpu (default on CPU), hf (a local HF model), test. Ablations: sweep(name).
"""
from agentjax.config import presets


def get_config(arg=None):
    config = presets.search_config("grpo", arg)
    config.stage = "sft"
    if config.model.path or arg == "hf":  # a pretrained model: gentle, short SFT
        config.sft.steps, config.sft.lr, config.sft.batch_size = 200, 1e-5, 16
    return config


def sweep(name):
    arms = {
        "demonstrator": [(f"guess{p}", {"sft.guess_prob": p}) for p in (0.0, 0.25, 0.5)],
        "negatives": [(f"neg{p}", {"sft.negative_frac": p}) for p in (0.0, 0.1, 0.3)],
    }
    if name not in arms:
        raise ValueError(f"unknown sweep {name!r}; choose one of {sorted(arms)}")
    return [{"name": arm, "overrides": overrides} for arm, overrides in arms[name]]
