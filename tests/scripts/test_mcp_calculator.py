"""scripts/mcp_calculator.py: exact arithmetic by hand values, and the MCP server that
configs/grpo_tools.py starts, reached through the python env's native tool calls."""
import importlib.util
import os

import pytest

from agentjax.envs.registry import build_suite
from tests.config.test_recipes import recipe
from tests.train.runs import ROOT

SPEC = importlib.util.spec_from_file_location(
    "mcp_calculator", os.path.join(ROOT, "scripts", "mcp_calculator.py"))
calculator = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(calculator)


@pytest.mark.parametrize("expression,value", [
    ("347 * 29", "10063"), ("(2 + 3) / 4", "1.25"), ("-7 // 2", "-4"), ("7 % -3", "-2"),
    ("2 ** 10", "1024"), ("2 ** -2", "0.25"), ("1 / 3", "0.333333333333"),
    ("-2 / 3", "-0.666666666667"), ("7.5 / 2.5", "3"), ("0.1 + 0.2", "0.3"),
    (" +5 ", "5")])
def test_values_by_hand(expression, value):
    assert calculator.calculate(expression) == value


@pytest.mark.parametrize("expression,problem", [
    ("1 / 0", "division by zero"), ("0 ** -1", "division by zero"), ("5 % 0", "division by zero"),
    ("__import__('os')", "Call is not allowed"), ("x + 1", "Name is not allowed"),
    ("'a' * 3", "Constant is not allowed"), ("2 ** 0.5", "whole numbers"),
    ("9 ** 9 ** 9", "whole numbers"), ("(10 ** 1000) ** 1000", "digits"),
    ("1 +", "not an arithmetic expression")])
def test_what_is_not_arithmetic_is_said(expression, problem):
    with pytest.raises(ValueError, match=problem):
        calculator.calculate(expression)


def test_the_recipe_offers_the_servers_tool_in_native_calls(tmp_path):
    config = recipe("grpo_tools.py").get_config("test")
    suite = build_suite(config, str(tmp_path))
    assert [t["function"]["name"] for t in suite.tools] == ["python", "calculate"]
    env = suite.make_env()
    env.tool_parser = "hermes"  # "auto" resolves from the policy's tokenizer in the loop
    env.reset(suite.train_tasks[0])
    call = ('<tool_call>\n{"name": "calculate", "arguments": {"expression": "347 * 29"}}\n'
            '</tool_call>')
    result = env.step(call + "\n" + call.replace("347 * 29", "1 / 0"))
    assert not result.done and result.info["valid"]
    observation = str(result.observation)
    assert "10063" in observation and "division by zero" in observation

