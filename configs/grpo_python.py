"""GRPO with a sandboxed Python tool: arithmetic questions, hermes-style
`<tool_call>{"name": "python", ...}</tool_call>` calls run under bubblewrap, answers
checked exactly.

    python scripts/train.py --config configs/grpo_python.py
    python scripts/train.py --config configs/grpo_python.py:hf \
        --config.model.path=/data/Qwen2.5-3B --workdir=/ckpt/grpo-python

Needs bubblewrap (`apt-get install -y bubblewrap`). Variants: cpu, hf, test. `hf` is
sized for an accelerator (64 prompts x 5 samples a step, 4,096-token episodes, 256 engine
slots: a 23 GiB plan even for a 135M model, and hours a step on a CPU); a real model on a
small CPU machine is configs/real_python.py.
"""
from agentjax.config import presets


def get_config(arg=None):
    variant = presets.variant(arg)
    # The model, SFT warm start and RL budget of the search agent at this machine size
    # (presets.search_agent); the task is another.
    config = presets.search_agent(variant)
    # The task: arithmetic questions, a Python tool, the answer checked exactly.
    config.env.name = "python"
    config.env.max_turns = 3
    config.reward.outcome = "em"
    config.reward.format_weight = 0.0
    config.data.train_questions = {"cpu": "1:2000", "hf": "1:2000", "test": "1:24"}[variant]
    # As many held-out questions as an evaluation uses (the hf variant evaluates 400).
    config.data.test_questions = f"1:{config.eval.num_tasks}"
    config.pretrain.steps = 0  # no text corpus for arithmetic
    config.sft.rename_frac = 0.0  # no entities to rename
    # The tool schemas make the system prompt long.
    config.rollout.max_tokens = {"cpu": 1024, "hf": 1024, "test": 768}[variant]
    config.stage = "rl"  # after SFT
    # GRPO (as configs/grpo_search.py).
    config.algo.name = "grpo"
    config.algo.advantage = "grpo"
    config.algo.loss = "ppo"
    config.algo.clip_low, config.algo.clip_high = 0.2, 0.2
    config.algo.agg = "seq-mean-token-mean"
    return config


SWEEPS = {"group_size": [(f"G{g}", {"rollout.group_size": g,
                                    "rollout.prompts_per_step": 128 // g})
                         for g in (4, 8, 16)]}


def sweep(name):
    return presets.arms(SWEEPS, name)
