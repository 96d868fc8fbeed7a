"""The search env as your own agent: examples/search_r1_agent.py, a plain `openai` client
agent that speaks Search-R1 tags, trained with GRPO through the OpenAI-compatible
endpoint (env.name="openai_agent"; docs/agents.md). Everything else is
configs/grpo_search.py's (the world, pretraining, SFT, the RL budget), so the two compare
in held-out success and time per step, from the same SFT agent:

    python scripts/train.py --config configs/grpo_search_agent.py
    python scripts/train.py --config configs/grpo_search_agent.py \
        --config.init_from=<a configs/grpo_search.py run's workdir>/sft
    python scripts/train.py --config configs/grpo_search_agent.py:test   # seconds

The same env in native tool calls (the template's own format) is examples/tool_agent.py:
--config.env.tool_format=native --config.env.agent=examples/tool_agent.py:agent
--config.rollout.max_tokens=768 --config.rollout.max_new_tokens=64 (the tool schemas make
the prompt about 400 tokens longer, and a call is 38 tokens where a Search-R1 search is 7).

Variants: cpu, hf, test.
"""
import os

from agentjax.config import presets

AGENT = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "examples",
                     "search_r1_agent.py")


def get_config(arg=None):
    # The search agent of configs/grpo_search.py, played by a program of its own.
    config = presets.search_config("grpo", arg)
    config.env.name = "openai_agent"
    config.env.agent_tasks = "search"
    config.env.agent = os.path.normpath(AGENT) + ":agent"
    # One batch row per rollout, as the built-in env's (configs/grpo_python_agent.py
    # says when to raise it).
    config.rollout.max_segments = 1
    return config


SWEEPS = presets.AGENT_SWEEPS


def sweep(name):
    return presets.arms(SWEEPS, name)
