"""Action parsers: policy text in, one `Action` out — never an exception.

Two formats:
  * Search-R1 tags: `<think>…</think>` (optional, not checked here), then
    `<search> query </search>` or `<answer> text </answer>`.
  * Hermes-style tool calls: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`,
    or `<answer> text </answer>`.

When a turn holds several complete action tags, the last one counts (the sampler stops
at the first closing tag, so in practice there is one). Anything malformed — no action,
a missing closing tag, an empty query or answer, bad JSON, an unknown tool — parses to
`kind="invalid"` with an `error` string for the corrective observation and the log.
"""
from __future__ import annotations

import dataclasses
import json
import re
from typing import Any, Collection, Mapping

_SEARCH_R1_TAG = re.compile(r"<(search|answer)>(.*?)</\1>", re.DOTALL)
_TOOL_CALL_TAG = re.compile(r"<(tool_call|answer)>(.*?)</\1>", re.DOTALL)


@dataclasses.dataclass(frozen=True)
class Action:
    """One parsed policy action.

    Attributes:
      kind: "search", "answer", "tool_call" or "invalid".
      query: the search query (kind "search"), stripped.
      answer: the final answer text (kind "answer"), stripped.
      tool_name: the called tool (kind "tool_call"), or the unknown tool an invalid call
        named.
      arguments: the call's arguments (kind "tool_call").
      error: why the action is invalid (kind "invalid").
    """

    kind: str
    query: str | None = None
    answer: str | None = None
    tool_name: str | None = None
    arguments: Mapping[str, Any] | None = None
    error: str | None = None


def invalid(error: str) -> Action:
    return Action(kind="invalid", error=error)


def parse_search_r1(text: str) -> Action:
    """Parses a Search-R1 turn.

    Args:
      text: the decoded policy output of one turn.

    Returns:
      `Action("search", query=...)`, `Action("answer", answer=...)` or an invalid action.
    """
    match = _last_match(_SEARCH_R1_TAG, text)
    if match is None:
        return invalid(_missing_tag_error(text, ("search", "answer")))
    tag, content = match.group(1), match.group(2).strip()
    if not content:
        return invalid(f"empty <{tag}></{tag}>")
    if tag == "search":
        return Action(kind="search", query=content)
    return Action(kind="answer", answer=content)


def parse_tool_call(text: str, tools: Collection[str] | None = None) -> Action:
    """Parses a hermes-style tool-calling turn.

    Args:
      text: the decoded policy output of one turn.
      tools: names of the tools that exist; a call to any other name is invalid. None
        accepts any name.

    Returns:
      `Action("tool_call", tool_name=..., arguments=...)`, `Action("answer", ...)` or an
      invalid action. `arguments` given as a JSON-encoded string (some models emit that)
      are decoded; missing `arguments` mean `{}`.
    """
    match = _last_match(_TOOL_CALL_TAG, text)
    if match is None:
        return invalid(_missing_tag_error(text, ("tool_call", "answer")))
    tag, content = match.group(1), match.group(2).strip()
    if tag == "answer":
        return Action(kind="answer", answer=content) if content else invalid(
            "empty <answer></answer>")
    try:
        call = json.loads(content)
    except json.JSONDecodeError as e:
        return invalid(f"tool call is not valid JSON ({e.msg} at char {e.pos})")
    if not isinstance(call, dict):
        return invalid(f"tool call must be a JSON object, got {type(call).__name__}")
    name = call.get("name")
    if not isinstance(name, str) or not name.strip():
        return invalid('tool call needs a non-empty string "name"')
    name = name.strip()
    if tools is not None and name not in tools:
        return Action(kind="invalid", tool_name=name,
                      error=f"unknown tool {name!r}; available: {', '.join(sorted(tools))}")
    arguments = call.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError as e:
            return invalid(f'"arguments" string is not valid JSON ({e.msg})')
    if not isinstance(arguments, dict):
        return invalid(f'"arguments" must be a JSON object, got {type(arguments).__name__}')
    return Action(kind="tool_call", tool_name=name, arguments=arguments)


def _last_match(pattern: re.Pattern, text: str) -> re.Match | None:
    match = None
    for match in pattern.finditer(text):
        pass
    return match


def _missing_tag_error(text: str, tags: tuple[str, ...]) -> str:
    for tag in tags:
        if f"<{tag}>" in text:
            return f"<{tag}> without a closing </{tag}>"
    return "no action: expected " + " or ".join(f"<{t}>...</{t}>" for t in tags)
