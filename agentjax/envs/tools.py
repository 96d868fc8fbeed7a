"""The Tool protocol and its registry (`TOOLS`), so tool-calling envs can take tools by name.

A tool is a name, a description, a JSON-schema for its arguments and a call that maps
validated arguments to observation text. `ToolError` is how a tool reports bad input or
a failure it wants the policy to see; the env turns it into a corrective observation.
"""
from __future__ import annotations

import json
from typing import Any, Callable, Mapping, Protocol, Sequence, runtime_checkable

from agentjax.core.registry import Registry
from agentjax.parsers.actions import echo


class ToolError(Exception):
    """A tool call failed in a way the policy should be told about.

    Args:
      message: the observation text shown to the policy.
      summary: one line for `TurnLog.error` (default: the message's last line).
      extra: details for `TurnLog.extra` (e.g. a sandbox status).
    """

    def __init__(self, message: str, *, summary: str | None = None,
                 extra: Mapping[str, Any] | None = None):
        super().__init__(message)
        lines = message.strip().splitlines()
        self.summary = summary or (lines[-1] if lines else "failed")
        self.extra = dict(extra or {})


@runtime_checkable
class Tool(Protocol):
    """A callable tool.

    Attributes:
      name: what the policy writes in `{"name": ...}`.
      description: one or two sentences shown to the policy.
      parameters: JSON schema (type "object") of the arguments.
    """

    name: str
    description: str
    parameters: Mapping[str, Any]

    def __call__(self, arguments: Mapping[str, Any]) -> str:
        """Runs the tool; returns the observation text or raises ToolError."""


# tool name -> `factory(**kwargs) -> Tool` (a Tool class, or a function building one).
TOOLS: Registry[Callable[..., Tool]] = Registry("tool")


def register_tool(name: str):
    """Class/function decorator: makes a Tool constructible by name (`make_tool`)."""
    return TOOLS.register(name)


def make_tool(name: str, **kwargs) -> Tool:
    """Builds the tool registered under `name` with `kwargs`."""
    return TOOLS.get(name)(**kwargs)


def tool_schema(tool: Tool) -> dict[str, Any]:
    """The OpenAI/hermes function schema of a tool (what chat templates take as `tools`)."""
    return {"type": "function", "function": {
        "name": tool.name, "description": tool.description, "parameters": dict(tool.parameters)}}


def describe_tools(tools: Mapping[str, Tool]) -> str:
    """Hermes-style `<tools>` block: one JSON function schema per line."""
    lines = "\n".join(json.dumps(tool_schema(t)) for t in tools.values())
    return f"<tools>\n{lines}\n</tools>"


_JSON_TYPES = {
    "string": str, "integer": int, "number": (int, float), "boolean": bool,
    "object": dict, "array": list, "null": type(None),
}


def validate_arguments(schema: Mapping[str, Any], arguments: Mapping[str, Any]) -> str | None:
    """Checks arguments against the top level of an object schema: required keys,
    property types, and no extra keys when `additionalProperties` is false.

    Returns:
      None when valid, else an error message for the corrective observation.
    """
    properties = schema.get("properties", {})
    missing = [k for k in schema.get("required", ()) if k not in arguments]
    if missing:
        return f"missing required argument(s): {', '.join(missing)}"
    if schema.get("additionalProperties") is False:
        extra = sorted(set(arguments) - set(properties))
        if extra:
            return f"unexpected argument(s): {_echo_names(extra)}"
    for key, value in arguments.items():
        expected = properties.get(key, {}).get("type")
        if expected is None:
            continue
        names = expected if isinstance(expected, list) else [expected]
        ok = any(isinstance(value, _JSON_TYPES[n]) for n in names if n in _JSON_TYPES)
        if isinstance(value, bool) and "boolean" not in names:
            ok = False  # JSON true/false is not a number, though bool subclasses int
        if not ok:
            return f"argument {key!r} must be of type {' or '.join(names)}"
    return None


def _echo_names(names: Sequence[str], most: int = 5) -> str:
    """Policy-written names for an error message: a few, each cut (parsers.actions.echo)."""
    shown = ", ".join(echo(n) for n in names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")


def tools_system_prompt(tools: Mapping[str, Tool]) -> str:
    """A hermes-style system message that lists the tools and the call format."""
    return (
        "You can call tools. Their JSON function schemas:\n"
        f"{describe_tools(tools)}\n"
        "To call a tool, write one JSON object with its name and arguments between "
        "<tool_call> and </tool_call>:\n"
        '<tool_call>\n{"name": <tool-name>, "arguments": <arguments-object>}\n</tool_call>\n'
        "The result comes back in the next message. When you know the final answer, "
        "write it between <answer> and </answer>."
    )
