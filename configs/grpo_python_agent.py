"""The python tool env as your own agent: examples/python_agent.py, a plain `openai`
client agent with the env's sandboxed python tool, trained with GRPO through the
OpenAI-compatible endpoint (env.name="openai_agent"; docs/agents.md). The tasks, tool,
answer rule and reward are configs/grpo_tools.py's (native tool calls) without its MCP
calculator, and so is everything else, so the two compare success and time per step.

    python scripts/train.py --config configs/grpo_python_agent.py
    python scripts/train.py --config configs/grpo_python_agent.py:test

Needs bubblewrap (`apt-get install -y bubblewrap`). Variants: cpu, hf, test.
"""
import os

from agentjax.config import presets

AGENT = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "examples",
                     "python_agent.py")


def get_config(arg=None):
    # The python agent trained by GRPO after SFT (configs/grpo_python.py's settings).
    config = presets.python_config("grpo", arg)
    config.env.tool_format = "native"  # the demonstrations' calls as the agent's
    config.env.name = "openai_agent"
    config.env.agent_tasks = "python"
    config.env.agent = os.path.normpath(AGENT) + ":agent"
    # A call whose prompt does not extend the one before (the template wrote a turn back
    # otherwise than it was sampled) starts a segment: room for one per model call.
    config.rollout.max_segments = config.env.max_turns
    config.data.test_questions = f"1:{config.eval.num_tasks}"
    return config


# Each segment of a rollout a sequence of its own, against one rollout counted once
# (rl/segments.py): what algo.rollout_normalization changes for an agent whose prompts
# do not always extend.
SWEEPS = {"rollout_normalization": [("per_rollout", {}),
                                    ("per_segment", {"algo.rollout_normalization": False})]}


def sweep(name):
    return presets.arms(SWEEPS, name)
