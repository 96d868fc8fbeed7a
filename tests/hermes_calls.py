"""A hermes-only stand-in for `agentjax.parsers.tool_calls` (the parser registry is
written beside this work), installed by the `tool_calls` fixture only while the real
module is absent. It follows the registry's interface: `parse_tool_calls(parser, text)
-> ParsedTurn`, never raising, and `detect_tool_parser(tokenizer) -> "hermes"`."""
from __future__ import annotations

import dataclasses
import json
import sys
import types


@dataclasses.dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict
    id: str | None = None


@dataclasses.dataclass(frozen=True)
class ParsedTurn:
    content: str
    calls: tuple[ToolCall, ...]
    errors: tuple[str, ...]
    truncated: bool


def parse_tool_calls(parser: str, text: str) -> ParsedTurn:
    if parser != "hermes":
        raise ValueError(f"the stand-in parses hermes only, not {parser!r}")
    content, calls, errors, position = [], [], [], 0
    while (start := text.find("<tool_call>", position)) >= 0:
        content.append(text[position:start])
        end = text.find("</tool_call>", start)
        if end < 0:
            return ParsedTurn("".join(content).strip(), tuple(calls), tuple(errors), True)
        body = text[start + len("<tool_call>"):end]
        position = end + len("</tool_call>")
        try:
            call = json.loads(body)
            calls.append(ToolCall(call["name"], dict(call.get("arguments", {}))))
        except (ValueError, KeyError, TypeError) as error:
            errors.append(f"tool call is not a JSON object with a name ({error})")
    content.append(text[position:])
    return ParsedTurn("".join(content).strip(), tuple(calls), tuple(errors), False)


def detect_tool_parser(tokenizer) -> str:
    return "hermes"


def install() -> None:
    """Makes this module importable as agentjax.parsers.tool_calls when that is absent."""
    try:
        import agentjax.parsers.tool_calls  # noqa: F401
    except ImportError:
        module = types.ModuleType("agentjax.parsers.tool_calls")
        module.__dict__.update(ToolCall=ToolCall, ParsedTurn=ParsedTurn,
                               parse_tool_calls=parse_tool_calls,
                               detect_tool_parser=detect_tool_parser)
        sys.modules["agentjax.parsers.tool_calls"] = module
