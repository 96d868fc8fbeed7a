"""Action parsers: policy text in, one `Action` out — never an exception.

Two formats:
  * Search-R1 tags: `<think>…</think>` (optional, not checked here), then
    `<search> query </search>` or `<answer> text </answer>`.
  * Hermes-style tool calls: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`,
    or `<answer> text </answer>`.

When a turn holds several complete action tags, the last one counts (the sampler stops
at the first closing tag, so in practice there is one). Anything malformed — no action,
a missing closing tag, an empty query or answer, bad JSON (including numbers too long
to convert and nesting deeper than `MAX_JSON_DEPTH`), an unknown tool — parses to
`kind="invalid"` with a short `error` string for the corrective observation and the log.

Parsing takes time linear in the action's length whatever the text holds: the policy
can write a megabyte of unclosed tags, and a regex like `<(search|answer)>(.*?)</\1>`
would rescan the rest of the text from every opening tag (quadratic).
"""
from __future__ import annotations

import dataclasses
import functools
import json
import re
from typing import Any, Collection, Mapping, Sequence

_SEARCH_R1_TAGS = ("search", "answer")
_TOOL_CALL_TAGS = ("tool_call", "answer")

# Deeper JSON is refused: no tool takes it, and code that walks arguments recursively
# (logging, duplicate detection in rewards) must not hit Python's recursion limit.
MAX_JSON_DEPTH = 32
# Names the policy made up are echoed in errors at most this long.
MAX_ECHOED_CHARS = 80


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
    match = last_tag(text, _SEARCH_R1_TAGS)
    if match is None:
        return invalid(_missing_tag_error(text, _SEARCH_R1_TAGS))
    tag, content = match[0], match[1].strip()
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
    match = last_tag(text, _TOOL_CALL_TAGS)
    if match is None:
        return invalid(_missing_tag_error(text, _TOOL_CALL_TAGS))
    tag, content = match[0], match[1].strip()
    if tag == "answer":
        return Action(kind="answer", answer=content) if content else invalid(
            "empty <answer></answer>")
    call, problem = load_json(content)
    if problem:
        return invalid(f"tool call is not valid JSON ({problem})")
    if not isinstance(call, dict):
        return invalid(f"tool call must be a JSON object, got {type(call).__name__}")
    name = call.get("name")
    if not isinstance(name, str) or not name.strip():
        return invalid('tool call needs a non-empty string "name"')
    name = name.strip()
    if tools is not None and name not in tools:
        return Action(kind="invalid", tool_name=name,
                      error=f"unknown tool {echo(name)}; available: {', '.join(sorted(tools))}")
    arguments = call.get("arguments", {})
    if isinstance(arguments, str):
        arguments, problem = load_json(arguments)
        if problem:
            return invalid(f'"arguments" string is not valid JSON ({problem})')
    if not isinstance(arguments, dict):
        return invalid(f'"arguments" must be a JSON object, got {type(arguments).__name__}')
    return Action(kind="tool_call", tool_name=name, arguments=arguments)


def last_tag(text: str, tags: Sequence[str]) -> tuple[str, str] | None:
    """The last complete `<tag>content</tag>` of `text` for any of `tags`, as
    `(tag, content)`, else None; in time linear in `len(text)`.

    "Complete" is what the regex `<(t1|t2)>(.*?)</\\1>` matches, scanning left to right
    without overlaps: an opening tag pairs with the first closing tag of the same name
    after it; an opening tag with no closing tag after it is skipped, and tags inside a
    matched pair's content are part of that content. The regex itself would rescan the
    rest of the text from every unpaired opening tag; here a tag with no closing tag
    left is dropped from the search, and each closing tag is searched for from where the
    previous search for it stopped, so no character is scanned more than once per tag.
    """
    live = tuple(tags)  # tags that may still have a closing tag ahead
    opening = _opening_tags(live)
    closing = {tag: f"</{tag}>" for tag in tags}
    next_close = dict.fromkeys(tags, -1)  # tag -> position of its next closing tag
    last, pos = None, 0
    while match := opening.search(text, pos):
        tag, start = match.group(1), match.end()
        close = next_close[tag]
        if close < start:
            close = next_close[tag] = text.find(closing[tag], start)
            if close < 0:
                live = tuple(t for t in live if t != tag)
                if not live:
                    break
                opening, pos = _opening_tags(live), start
                continue
        last = (tag, start, close)
        pos = close + len(closing[tag])
    return None if last is None else (last[0], text[last[1]:last[2]])


@functools.lru_cache(maxsize=None)
def _opening_tags(tags: tuple[str, ...]) -> re.Pattern:
    return re.compile("<(" + "|".join(re.escape(t) for t in tags) + ")>")


def echo(text: str) -> str:
    """`repr` of policy-written text for an error message, cut to MAX_ECHOED_CHARS."""
    if len(text) <= MAX_ECHOED_CHARS:
        return repr(text)
    return f"{text[:MAX_ECHOED_CHARS]!r}... ({len(text)} characters)"


def load_json(text: str) -> tuple[Any, str | None]:
    """(value, None), or (None, why) when `text` is not JSON any tool can take."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        return None, f"{e.msg} at char {e.pos}"
    except RecursionError:
        return None, f"nested deeper than {MAX_JSON_DEPTH} levels"
    except ValueError as e:
        # An integer too long to convert; the advice after ";" is for programmers.
        return None, str(e).split(";")[0]
    if exceeds_depth(value, MAX_JSON_DEPTH):
        return None, f"nested deeper than {MAX_JSON_DEPTH} levels"
    return value, None


def exceeds_depth(value: Any, limit: int) -> bool:
    """Whether containers nest more than `limit` levels deep (iterative: no recursion)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            if depth > limit:
                return True
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
    return False


def _missing_tag_error(text: str, tags: tuple[str, ...]) -> str:
    for tag in tags:
        if f"<{tag}>" in text:
            return f"<{tag}> without a closing </{tag}>"
    return "no action: expected " + " or ".join(f"<{t}>...</{t}>" for t in tags)
