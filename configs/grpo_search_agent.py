"""The search env as your own agent: examples/tool_agent.py, a plain `openai` client
agent with the search world's retriever as its `search` tool, trained with GRPO through
the OpenAI-compatible endpoint (env.name="openai_agent"; docs/agents.md). Everything
else is configs/grpo_search.py's in native tool-call mode (pretraining, SFT on the
demonstrator's searches as the template's tool calls, GRPO), so the agent compares with

    python scripts/train.py --config configs/grpo_search.py --config.env.tool_format=native \
        --config.rollout.max_tokens=768

in held-out success and time per step. From that run's SFT agent:

    python scripts/train.py --config configs/grpo_search_agent.py \\
        --config.init_from=<workdir of the run above>/sft
    python scripts/train.py --config configs/grpo_search_agent.py:test   # seconds

Variants: cpu, hf, test.
"""
import os

from agentjax.config import presets

AGENT = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "examples",
                     "tool_agent.py")


def get_config(arg=None):
    # The search agent of configs/grpo_search.py, its searches as native tool calls.
    config = presets.search_config("grpo", arg)
    config.env.tool_format = "native"
    config.env.name = "openai_agent"
    config.env.agent_tasks = "search"
    config.env.agent = os.path.normpath(AGENT) + ":agent"
    # The tool schemas in the system message (the Hermes fallback of a template without
    # tools) make a prompt about 400 tokens longer than the Search-R1 instruction: the
    # demonstrations are 440-560 tokens (the test variant's smaller tokenizer: 600-1,060).
    config.rollout.max_tokens = 1088 if presets.variant(arg) == "test" else 768
    # One batch row per rollout, as the built-in env's (configs/grpo_python_agent.py
    # says when to raise it).
    config.rollout.max_segments = 1
    return config


SWEEPS = presets.AGENT_SWEEPS


def sweep(name):
    return presets.arms(SWEEPS, name)
