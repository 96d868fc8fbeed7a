"""Action parsers: every malformed turn becomes an invalid Action, never an exception."""
import json

import hypothesis
import hypothesis.strategies as st
import pytest

from agentjax.envs.parsers import Action, parse_search_r1, parse_tool_call


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
