"""An agent that keeps a summary instead of its history trains end to end through
segments: configs/grpo_python_agent.py's `test` run (GRPO through the endpoint) with
that agent."""
import importlib.util
import os

import pytest

from agentjax.train.metrics import read_metrics
from agentjax.train.run import run
from tests.train.runs import ROOT

SUMMARIZING = f"{os.path.abspath(__file__)}:summarizing_python_agent"


async def summarizing_python_agent(client, task):
    """The python agent's task, but each call sends a fresh prompt: the question and a
    summary of the last reply (its prompts never extend the one before)."""
    from agentjax.envs.python.env import PythonEnv
    env = PythonEnv(tool_format="native")
    [user] = env.initial_messages(task)
    summary = ""
    for _ in range(2):
        content = user["content"] + (f"\nSo far: {summary}" if summary else "")
        reply = await client.chat.completions.create(
            model="policy", messages=[{"role": "user", "content": content}])
        summary = (reply.choices[0].message.content or "")[:40]
    return {"answer": env.native_answer(summary, []) or ""}


def _config(*overrides):
    spec = importlib.util.spec_from_file_location(
        "grpo_python_agent", os.path.join(ROOT, "configs", "grpo_python_agent.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config("test")
    config.devices = 1  # nothing here is about sharding: one device compiles and runs fastest
    config.checkpoint.async_save = False
    for key, value in overrides:
        section, name = key.split(".")
        config[section][name] = value
    return config


@pytest.mark.slow  # a whole run: 7 s with the compilation cache warm, 20-75 s cold (compiles)
def test_an_agent_that_summarizes_its_history_trains_through_segments(tmp_path):
    """(examples/tool_agent.py trains in tests/train/test_run.py, as every recipe.)"""
    results = run(_config(("sft.steps", 0), ("env.agent", SUMMARIZING),
                          ("rollout.max_segments", 2)), str(tmp_path))
    rows = read_metrics(str(tmp_path))
    assert [r["step"] for r in rows] == [1, 2] and "eval/success_sampled" in results
    for row in rows:
        assert row["stop/failed"] == 0 and row["mask/leak"] == 0
        assert row["agent/calls_mean"] >= 1 and "grad_norm" in row
        # Two calls, two segments, each rollout in the batch whole.
        assert row["rollout/segments_mean"] == 2 and row["agent/prompt_extends_frac"] == 0
        assert row["rollout/segments_dropped"] == 0
