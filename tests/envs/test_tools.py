"""Tool registry, schemas and argument validation."""
import json

import pytest

from agentjax.envs.tools import (ToolError, describe_tools, make_tool, register_tool,
                                 tool_schema, validate_arguments)

SCHEMA = {
    "type": "object",
    "properties": {"code": {"type": "string"}, "n": {"type": "integer"},
                   "x": {"type": ["number", "null"]}, "flag": {"type": "boolean"},
                   "free": {}},
    "required": ["code"],
    "additionalProperties": False,
}


@pytest.mark.parametrize("arguments, error", [
    ({"code": "1"}, None),
    ({"code": "1", "n": 3, "x": 2.5, "flag": True, "free": [1]}, None),
    ({"code": "1", "x": None}, None),
    ({"code": "1", "x": 3}, None),  # an integer is a JSON number
    ({}, "missing required argument(s): code"),
    ({"code": 1}, "argument 'code' must be of type string"),
    ({"code": "1", "n": 2.5}, "argument 'n' must be of type integer"),
    ({"code": "1", "n": True}, "argument 'n' must be of type integer"),
    ({"code": "1", "flag": 1}, "argument 'flag' must be of type boolean"),
    ({"code": "1", "x": "2"}, "argument 'x' must be of type number or null"),
    ({"code": "1", "extra": 0}, "unexpected argument(s): 'extra'"),
])
def test_validate_arguments(arguments, error):
    assert validate_arguments(SCHEMA, arguments) == error


@register_tool("test_tools_echo")
class Echo:
    name = "echo"
    description = "Echoes its text."
    parameters = {"type": "object", "properties": {"text": {"type": "string"}},
                  "required": ["text"]}

    def __init__(self, prefix=""):
        self.prefix = prefix

    def __call__(self, arguments):
        return self.prefix + arguments["text"]


def test_registry_builds_tools_by_name():
    tool = make_tool("test_tools_echo", prefix="> ")
    assert tool({"text": "hi"}) == "> hi"
    with pytest.raises(ValueError, match="unknown tool 'nope'"):
        make_tool("nope")
    with pytest.raises(ValueError, match="already registered"):
        register_tool("test_tools_echo")(Echo)


def test_schemas_are_hermes_functions():
    tool = Echo()
    assert tool_schema(tool) == {"type": "function", "function": {
        "name": "echo", "description": "Echoes its text.", "parameters": tool.parameters}}
    block = describe_tools({"echo": tool})
    assert block.startswith("<tools>\n") and block.endswith("\n</tools>")
    assert json.loads(block.splitlines()[1]) == tool_schema(tool)


def test_tool_error_summary():
    assert ToolError("line one\nlast line\n").summary == "last line"
    assert ToolError("x", summary="short", extra={"a": 1}).extra == {"a": 1}
    assert ToolError("").summary == "failed"
