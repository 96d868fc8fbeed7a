"""The python tool env as your own agent: examples/tool_agent.py, a plain `openai`
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
                     "tool_agent.py")


def get_config(arg=None):
    # The python agent trained by GRPO after SFT (configs/grpo_python.py's settings).
    config = presets.python_config("grpo", arg)
    config.env.tool_format = "native"  # the demonstrations' calls as the agent's
    config.env.name = "openai_agent"
    config.env.agent_tasks = "python"
    config.env.agent = os.path.normpath(AGENT) + ":agent"
    # One batch row per rollout, as the built-in env's: the agent keeps its history, so
    # its prompts extend (agent/prompt_extends_frac). Where they do not (the template
    # wrote a turn back otherwise than it was sampled), a rollout is several segments and
    # only its last is trained (rollout/segments_dropped): raise this to env.max_turns,
    # which makes the batch, and the update's time, that many times bigger.
    config.rollout.max_segments = 1
    config.data.test_questions = f"1:{config.eval.num_tasks}"
    return config


SWEEPS = presets.AGENT_SWEEPS


def sweep(name):
    return presets.arms(SWEEPS, name)
