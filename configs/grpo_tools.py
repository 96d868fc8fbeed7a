"""The python-tool agent with native tool calls and a tool from an MCP server: the
policy calls `python` (agentjax's sandboxed tool) and `calculate` (an MCP server's,
scripts/mcp_calculator.py, started over stdio when the run starts) in its chat template's
own format, parsed by the template's parser (env.tool_parser "auto"; templates without
tool support, such as the tiny model's, get the Hermes fallback: the schemas in the
system message), and reads their results as `tool` messages.

    pip install -e '.[mcp]'
    python scripts/train.py --config configs/grpo_tools.py
    python scripts/train.py --config configs/grpo_tools.py:hf \
        --config.model.path=/data/Qwen2.5-3B-Instruct --workdir=/ckpt/grpo-tools

Any MCP server is a tool the same way: env.mcp_servers is a JSON list of stdio commands
or streamable-HTTP URLs (config/mcp_servers.py). Needs bubblewrap (`apt-get install -y
bubblewrap`). Variants: cpu, hf, test.
"""
import json
import os
import sys

from agentjax.config import presets

CALCULATOR = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "scripts",
                          "mcp_calculator.py")


def get_config(arg=None):
    # The python agent trained by GRPO after SFT (configs/grpo_python.py's settings).
    config = presets.python_config("grpo", arg)
    config.env.tool_format = "native"
    # One stdio server for the whole run: the calculator keeps no state between calls.
    config.env.mcp_servers = json.dumps([{
        "name": "calculator", "command": sys.executable,
        "args": [os.path.normpath(CALCULATOR)], "isolation": "shared", "timeout_s": 10}])
    # As many held-out questions as an evaluation uses (the hf variant evaluates 400).
    config.data.test_questions = f"1:{config.eval.num_tasks}"
    return config


# Native calls against the python env's earlier format (the schemas written into the
# prompt, Hermes calls), the MCP calculator offered in both.
SWEEPS = {"tool_format": [("native", {}), ("hermes_prompt", {"env.tool_format": "hermes_prompt"})]}


def sweep(name):
    return presets.arms(SWEEPS, name)
