"""Action parsers: every malformed turn becomes an invalid Action, never an exception."""
import json
import random
import re
import time

import hypothesis
import hypothesis.strategies as st
import pytest

from agentjax.parsers.actions import (MAX_JSON_DEPTH, Action, last_tag, parse_search_r1,
                                   parse_tool_call)


@pytest.mark.parametrize("text, expected", [
    ("<think>need facts</think>\n<search> capital of France </search>",
     Action(kind="search", query="capital of France")),
    ("<think>done</think> <answer> Paris </answer>", Action(kind="answer", answer="Paris")),
    ("<search>multi\nline query</search>", Action(kind="search", query="multi\nline query")),
    # The last complete action tag counts.
    ("<search>first</search> then <answer>second</answer>",
     Action(kind="answer", answer="second")),
    ("<answer>guess</answer><search>again</search>", Action(kind="search", query="again")),
    # An unclosed tag before a complete one does not hide it.
    ("<search>oops <answer>final</answer>", Action(kind="answer", answer="final")),
])
def test_search_r1_actions(text, expected):
    assert parse_search_r1(text) == expected


@pytest.mark.parametrize("text, error", [
    ("I think the answer is Paris.", "no action"),
    ("<think>hmm</think>", "no action"),
    ("<search> capital of France", "<search> without a closing </search>"),
    ("<answer>Paris", "<answer> without a closing </answer>"),
    ("<search>   </search>", "empty <search>"),
    ("<answer></answer>", "empty <answer>"),
    ("<SEARCH>x</SEARCH>", "no action"),
    ("<search>x</answer>", "<search> without a closing"),
    ("", "no action"),
])
def test_search_r1_invalid(text, error):
    action = parse_search_r1(text)
    assert action.kind == "invalid"
    assert error in action.error


def call(name, arguments, raw=False):
    body = {"name": name, "arguments": arguments}
    return f"<tool_call>\n{json.dumps(body) if not raw else raw}\n</tool_call>"


def test_tool_call_parses_hermes_json():
    action = parse_tool_call("Let me compute.\n" + call("python", {"code": "print(1)"}),
                             tools={"python"})
    assert action == Action(kind="tool_call", tool_name="python",
                            arguments={"code": "print(1)"})
    # arguments given as a JSON string (some models do that) and missing arguments.
    text = '<tool_call>{"name": "python", "arguments": "{\\"code\\": \\"x\\"}"}</tool_call>'
    assert parse_tool_call(text).arguments == {"code": "x"}
    assert parse_tool_call('<tool_call>{"name": "now"}</tool_call>').arguments == {}
    assert parse_tool_call("<answer> 42 </answer>") == Action(kind="answer", answer="42")
    # The last complete tag counts.
    both = call("python", {"code": "1"}) + "<answer>7</answer>"
    assert parse_tool_call(both).kind == "answer"
    assert parse_tool_call("<answer>7</answer>" + call("python", {"code": "1"})).kind == \
        "tool_call"


@pytest.mark.parametrize("text, error", [
    ("<tool_call>{'name': 'python'}</tool_call>", "not valid JSON"),
    ("<tool_call>{\"name\": \"python\", </tool_call>", "not valid JSON"),
    ("<tool_call>[1, 2]</tool_call>", "must be a JSON object"),
    ('<tool_call>{"arguments": {}}</tool_call>', 'non-empty string "name"'),
    ('<tool_call>{"name": "", "arguments": {}}</tool_call>', 'non-empty string "name"'),
    ('<tool_call>{"name": "python", "arguments": [1]}</tool_call>', "must be a JSON object"),
    ('<tool_call>{"name": "python", "arguments": "{oops"}</tool_call>', "not valid JSON"),
    ('<tool_call>{"name": "python", "arguments": {}}', "without a closing </tool_call>"),
    ("<answer>  </answer>", "empty <answer>"),
    ("just text", "no action"),
])
def test_tool_call_invalid(text, error):
    action = parse_tool_call(text, tools={"python"})
    assert action.kind == "invalid"
    assert error in action.error


def test_unknown_tool_is_invalid_and_named():
    action = parse_tool_call(call("browser", {"url": "x"}), tools={"python", "search"})
    assert action.kind == "invalid"
    assert action.tool_name == "browser"
    assert "unknown tool 'browser'" in action.error and "python, search" in action.error
    # Without a tool list any name is accepted.
    assert parse_tool_call(call("browser", {})).kind == "tool_call"


@hypothesis.settings(max_examples=300, deadline=None)
@hypothesis.given(st.lists(st.sampled_from(
    list("<>/{}[]\":, \nabc") + ["<search>", "</search>", "<answer>", "</answer>",
                                 "<tool_call>", "</tool_call>", "<think>", '"name"',
                                 '"arguments"', '"python"']),
    max_size=30).map("".join))
def test_parsers_never_raise(text):
    for action in (parse_search_r1(text), parse_tool_call(text, tools={"python"})):
        assert action.kind in ("search", "answer", "tool_call", "invalid")
        assert (action.error is not None) == (action.kind == "invalid")


@hypothesis.settings(max_examples=100, deadline=None)
@hypothesis.given(st.text(min_size=1).filter(lambda s: "<" not in s and s.strip()))
def test_search_query_round_trips(query):
    assert parse_search_r1(f"<search>{query}</search>").query == query.strip()
    action = parse_tool_call(call("search", {"query": query}), tools={"search"})
    assert action.arguments == {"query": query}


@pytest.mark.parametrize("body, error", [
    ("[" * 100_000, "nested deeper than"),  # RecursionError inside json
    ("[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1), "nested deeper than"),
    ('{"name": "python", "arguments": ' + "[" * 50 + "]" * 50 + "}", "nested deeper than"),
    ('{"name": "python", "arguments": {"n": ' + "9" * 5000 + "}}",
     "Exceeds the limit (4300 digits)"),  # ValueError: int conversion limit
    ('{"name": "python", "arguments": "' + "[" * 100_000 + '"}', "nested deeper than"),
])
def test_json_that_python_cannot_load_is_invalid(body, error):
    action = parse_tool_call(f"<tool_call>{body}</tool_call>", tools={"python"})
    assert action.kind == "invalid" and error in action.error and len(action.error) < 200


def test_json_depth_limit_counts_the_call_object():
    def nested_call(levels):  # call object + arguments object + `levels` lists
        lists = "[" * levels + "]" * levels
        return f'<tool_call>{{"name": "f", "arguments": {{"a": {lists}}}}}</tool_call>'

    assert parse_tool_call(nested_call(MAX_JSON_DEPTH - 2)).kind == "tool_call"
    assert parse_tool_call(nested_call(MAX_JSON_DEPTH - 1)).kind == "invalid"


def test_unknown_tool_name_is_echoed_short():
    action = parse_tool_call(call("x" * 10**6, {}), tools={"python"})
    assert action.kind == "invalid" and action.tool_name == "x" * 10**6
    assert len(action.error) < 200 and "(1000000 characters)" in action.error


def test_last_tag_matches_the_non_overlapping_regex():
    """`last_tag` is the last match of `<(search|answer)>(.*?)</\\1>` (its reference)."""
    reference = re.compile(r"<(search|answer)>(.*?)</\1>", re.DOTALL)
    pieces = ["<search>", "</search>", "<answer>", "</answer>", "x", " ", "<", ">", "/",
              "</", "search"]
    rng = random.Random(0)
    for _ in range(20_000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randrange(14)))
        matches = [(m.group(1), m.group(2)) for m in reference.finditer(text)]
        assert last_tag(text, ("search", "answer")) == (matches[-1] if matches else None)


def megabyte(unit: str) -> str:
    return unit * -(-10**6 // len(unit))


# Shapes that made the regex parsers quadratic, as 1 MB actions, and their parsed kinds.
MEGABYTE_ACTIONS = {
    "unclosed search tags": (megabyte("<search>"), "invalid"),
    "unclosed tool calls": (megabyte("<tool_call>"), "invalid"),
    "alternating unclosed tags": (megabyte("<search><answer><tool_call>"), "invalid"),
    "closing tags of the other kind": (megabyte("<search></answer>"), "invalid"),
    "many complete tags": (megabyte("<answer>a</answer><search>b</search>"), "search"),
    "one huge query": ("<search>" + megabyte("q ") + "</search>", "search"),
    "unclosed tags before an answer": (megabyte("<search>") + "<answer>x</answer>",
                                       "answer"),
}


@pytest.mark.parametrize("name", MEGABYTE_ACTIONS)
def test_a_megabyte_action_parses_within_a_second(name):
    # Linear parsing takes ~0.01-0.3 s here; the quadratic regexes took minutes.
    text, kind = MEGABYTE_ACTIONS[name]
    assert len(text) >= 10**6
    for parse in (parse_search_r1, parse_tool_call):
        start = time.perf_counter()
        action = parse(text)
        elapsed = time.perf_counter() - start
        assert elapsed < 1.0, f"{parse.__name__} took {elapsed:.2f} s"
        if parse is parse_search_r1:
            assert action.kind == kind
