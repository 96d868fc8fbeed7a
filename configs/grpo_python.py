"""GRPO with a sandboxed Python tool: arithmetic questions, hermes-style
`<tool_call>{"name": "python", ...}</tool_call>` calls run under bubblewrap, answers
checked exactly.

    python scripts/train.py --config configs/grpo_python.py
    python scripts/train.py --config configs/grpo_python.py:hf \
        --config.model.path=/data/Qwen2.5-3B --workdir=/ckpt/grpo-python

Needs bubblewrap (`apt-get install -y bubblewrap`). Variants: cpu, hf, test.
"""
from agentjax.config import presets


def get_config(arg=None):
    config = presets.python_config("grpo", arg)
    # As many held-out questions as an evaluation uses (the hf variant evaluates 400).
    config.data.test_questions = f"1:{config.eval.num_tasks}"
    return config


def sweep(name):
    arms = {"group_size": [(f"G{g}", {"rollout.group_size": g,
                                      "rollout.prompts_per_step": 128 // g})
                           for g in (4, 8, 16)]}
    if name not in arms:
        raise ValueError(f"unknown sweep {name!r}; choose one of {sorted(arms)}")
    return [{"name": arm, "overrides": overrides} for arm, overrides in arms[name]]
