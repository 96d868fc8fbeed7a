"""SFT warm-start of the search agent: masked next-token loss on the action tokens of
an imperfect demonstrator's episodes (plus Agent-FLAN-style negative examples, whose
invalid action is masked out so only the recovery is learned). The CPU variant first
pretrains the tiny model on other worlds' documents (`config.pretrain`).

    python scripts/train.py --config configs/sft_search.py --workdir runs/sft
    python scripts/train.py --config configs/grpo_search.py --config.init_from=runs/sft

The run exports its policy to <workdir>/hf (an HF checkpoint + tokenizer), which
`init_from` (and scripts/evaluate.py, SGLang) read.
Variants: cpu (default on CPU), hf (a local HF model), test. Ablations: `SWEEPS`.
"""
from agentjax.config import presets


def get_config(arg=None):
    variant = presets.variant(arg)
    # configs/grpo_search.py's config (presets.search_config), so that this is exactly
    # the pretraining and SFT that GRPO run starts with: cpu pretrains 1200 steps, then
    # 1000 SFT steps of 8 rows at lr 3e-3 on a demonstrator that guesses 60% of the time
    # and has half its searching episodes' entities renamed.
    config = presets.search_config("grpo", variant)
    config.stage = "sft"  # stop after SFT
    if variant == "hf":  # a pretrained model: gentle, short SFT
        config.sft.steps, config.sft.lr, config.sft.batch_size = 200, 1e-5, 16
    return config


SWEEPS = {
    "demonstrator": [(f"guess{p}", {"sft.guess_prob": p}) for p in (0.0, 0.25, 0.5)],
    "negatives": [(f"neg{p}", {"sft.negative_frac": p}) for p in (0.0, 0.1, 0.3)],
}


def sweep(name):
    return presets.arms(SWEEPS, name)
