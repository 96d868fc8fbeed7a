"""Tool-call parsers: for each format a table of model outputs (one call, several, text
around, malformed, cut short) and the calls expected, checked against SGLang's own
parser of the same name where SGLang is installed; never an exception, linear time."""
from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import json
import pathlib
import random
import sys
import time
import types

import hypothesis
import hypothesis.strategies as st
import pytest
from tokenizers import Tokenizer, models
from transformers import PreTrainedTokenizerFast

from agentjax.parsers.actions import MAX_JSON_DEPTH
from agentjax.parsers.tool_calls import (MAX_CALLS, TOOL_PARSERS, ParsedTurn, ToolCall,
                                         detect_tool_parser, parse_tool_calls)
from tests.models.qwen_tokenizers import QWEN3_TEMPLATE, QWEN25_TEMPLATE


@dataclasses.dataclass(frozen=True)
class Case:
    """A model output and what it parses to.

    calls: (name, arguments) or (name, arguments, id) per call; errors: a substring of
    each error message, in order; sglang: whether SGLang's parser of the name gives the
    same calls (False for malformed and cut turns, where SGLang drops or guesses, and
    where noted).
    """

    text: str
    calls: tuple = ()
    content: str = ""
    errors: tuple[str, ...] = ()
    truncated: bool = False
    sglang: bool = True


def call_json(name, arguments, key="arguments"):
    return json.dumps({"name": name, key: arguments})


WEATHER = {"location": "San Francisco, CA, USA"}
# Qwen's function-calling guide (qwen.readthedocs.io, "Function Calling") and the Hermes
# 2 Pro model card: one JSON object per <tool_call> block, on its own lines.
TEMPERATURE = call_json("get_current_temperature", WEATHER)
TEMPERATURE_DATE = call_json("get_temperature_date",
                             {"location": "San Francisco, CA, USA", "date": "2024-10-01"})
HERMES = {
    "one call": Case(f"<tool_call>\n{TEMPERATURE}\n</tool_call>",
                     [("get_current_temperature", WEATHER)]),
    "several calls": Case(
        f"<tool_call>\n{TEMPERATURE}\n</tool_call>\n<tool_call>\n{TEMPERATURE_DATE}\n"
        "</tool_call>",
        [("get_current_temperature", WEATHER),
         ("get_temperature_date", {"location": "San Francisco, CA, USA",
                                   "date": "2024-10-01"})]),
    "text before": Case(f"Let me check the temperature.\n<tool_call>\n{TEMPERATURE}\n"
                        "</tool_call>", [("get_current_temperature", WEATHER)],
                        "Let me check the temperature."),
    "text before and after": Case(
        f"First this.\n<tool_call>\n{TEMPERATURE}\n</tool_call>\nThen I will answer.",
        [("get_current_temperature", WEATHER)], "First this.\n\nThen I will answer."),
    "qwen3 thinking": Case(
        f"<think>\nThe user wants the temperature.\n</think>\n\n<tool_call>\n{TEMPERATURE}"
        "\n</tool_call>", [("get_current_temperature", WEATHER)],
        "<think>\nThe user wants the temperature.\n</think>"),
    "hermes 2 pro key order": Case(
        '<tool_call>\n{"arguments": {"symbol": "TSLA"}, "name": "get_stock_fundamentals"}'
        "\n</tool_call>", [("get_stock_fundamentals", {"symbol": "TSLA"})]),
    "no whitespace": Case(f"<tool_call>{TEMPERATURE}</tool_call>",
                          [("get_current_temperature", WEATHER)]),
    "no call": Case("It is 22 degrees in San Francisco.",
                    content="It is 22 degrees in San Francisco."),
    "a list in one block": Case(f"<tool_call>\n[{TEMPERATURE}, {TEMPERATURE_DATE}]\n"
                                "</tool_call>",
                                [("get_current_temperature", WEATHER),
                                 ("get_temperature_date",
                                  {"location": "San Francisco, CA, USA",
                                   "date": "2024-10-01"})]),
    "parameters key": Case(f"<tool_call>\n{call_json('now', {'tz': 'UTC'}, 'parameters')}"
                           "\n</tool_call>", [("now", {"tz": "UTC"})]),
    "no arguments": Case('<tool_call>\n{"name": "now"}\n</tool_call>', [("now", {})]),
    "unicode arguments": Case(f"<tool_call>\n{call_json('search', {'q': 'Zürich 天气'})}\n"
                              "</tool_call>", [("search", {"q": "Zürich 天气"})]),
    # A sampler that stops at "</tool_call>" leaves it out: the whole JSON is a call.
    "last block unclosed, JSON whole": Case(f"<tool_call>\n{TEMPERATURE}\n",
                                            [("get_current_temperature", WEATHER)]),
    # SGLang passes a string through as the arguments; it is decoded here.
    "arguments as a JSON string": Case(
        '<tool_call>\n{"name": "now", "arguments": "{\\"tz\\": \\"UTC\\"}"}\n</tool_call>',
        [("now", {"tz": "UTC"})], sglang=False),
    "bad JSON": Case('<tool_call>\n{"name": "now", "arguments": {"tz": "UTC"}\n</tool_call>',
                     errors=["<tool_call> is not valid JSON"], sglang=False),
    "no name": Case('<tool_call>\n{"arguments": {"tz": "UTC"}}\n</tool_call>',
                    errors=['non-empty string "name"'], sglang=False),
    "arguments not an object": Case(
        '<tool_call>\n{"name": "now", "arguments": [1, 2]}\n</tool_call>',
        errors=['"arguments" of \'now\' must be a JSON object, got array'], sglang=False),
    "not an object": Case("<tool_call>\n42\n</tool_call>",
                          errors=["must be a JSON object, got number"], sglang=False),
    "bad call between good ones": Case(
        f"<tool_call>\n{TEMPERATURE}\n</tool_call>\n<tool_call>\n{{oops}}\n</tool_call>\n"
        f"<tool_call>\n{TEMPERATURE_DATE}\n</tool_call>",
        [("get_current_temperature", WEATHER),
         ("get_temperature_date", {"location": "San Francisco, CA, USA",
                                   "date": "2024-10-01"})],
        errors=["tool call 2: <tool_call> is not valid JSON"], sglang=False),
    "cut in the arguments": Case(
        'Checking.\n<tool_call>\n{"name": "get_current_temperature", "arguments": {"loc',
        content="Checking.", truncated=True, sglang=False),
    "cut after the tag": Case("Checking.\n<tool_call>", content="Checking.",
                              truncated=True, sglang=False),
    "cut after a whole call": Case(
        f"<tool_call>\n{TEMPERATURE}\n</tool_call>\n<tool_call>\n{{\"name\": \"get_",
        [("get_current_temperature", WEATHER)], truncated=True, sglang=False),
}

# The Qwen3-Coder chat template's own example and calls it renders: one function per
# <tool_call>, each parameter on its own lines, typed by the tool's schema.
CODER_TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {
            "city": {"type": "string"}, "days": {"type": "integer"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city"]}}},
    {"type": "function", "function": {"name": "run", "parameters": {
        "type": "object", "properties": {"code": {"type": "string"},
                                         "timeout": {"type": "number"}}}}},
    {"type": "function", "function": {"name": "configure", "parameters": {
        "type": "object", "properties": {
            "verbose": {"type": "boolean"}, "ratio": {"type": "number"},
            "tags": {"type": "array", "items": {"type": "string"}},
            "options": {"type": "object"}, "limit": {"type": ["integer", "null"]},
            "mode": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
            "level": {"enum": [1, 2, 3]}}}}},
]


def coder_call(name, **parameters):
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in parameters.items())
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


CODE = "def f(x):\n    return x < 2 and x > 0\n\nprint(f(1))"
QWEN3_CODER = {
    "one call": Case(coder_call("get_weather", city="Paris"), [("get_weather",
                                                                {"city": "Paris"})]),
    "typed values": Case(coder_call("get_weather", city="Paris", days="3", unit="celsius"),
                         [("get_weather", {"city": "Paris", "days": 3, "unit": "celsius"})]),
    "every type": Case(
        coder_call("configure", verbose="true", ratio="2.5", tags='["a", "b"]',
                   options='{"depth": 2}', limit="7", mode="4", level="2"),
        [("configure", {"verbose": True, "ratio": 2.5, "tags": ["a", "b"],
                        "options": {"depth": 2}, "limit": 7, "mode": 4, "level": 2})]),
    "null and numbers": Case(coder_call("configure", verbose="null", ratio="3",
                                        limit="seven"),
                             [("configure", {"verbose": None, "ratio": 3,
                                             "limit": "seven"})]),
    "multi-line code": Case(coder_call("run", code=CODE, timeout="1.5"),
                            [("run", {"code": CODE, "timeout": 1.5})]),
    "several calls with text": Case(
        "I'll run both.\n" + coder_call("get_weather", city="Paris") + "\n"
        + coder_call("run", code="print(2)"),
        [("get_weather", {"city": "Paris"}), ("run", {"code": "print(2)"})],
        "I'll run both."),
    "undeclared parameter stays text": Case(coder_call("get_weather", city="Oslo",
                                                       extra="12"),
                                            [("get_weather", {"city": "Oslo",
                                                              "extra": "12"})]),
    "unknown tool: all text": Case(coder_call("search", query="x", k="5"),
                                   [("search", {"query": "x", "k": "5"})]),
    "no parameters": Case("<tool_call>\n<function=now>\n</function>\n</tool_call>",
                          [("now", {})]),
    "parameter left open before the next": Case(
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n<parameter=days>\n2\n"
        "</parameter>\n</function>\n</tool_call>",
        [("get_weather", {"city": "Rome", "days": 2})]),
    "function left open in a closed block": Case(
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n</parameter>\n"
        "</tool_call>", [("get_weather", {"city": "Rome"})]),
    "last block unclosed, function whole": Case(
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n</parameter>\n"
        "</function>\n", [("get_weather", {"city": "Rome"})]),
    "no function": Case("<tool_call>\nget_weather(city='Rome')\n</tool_call>",
                        errors=["<tool_call> holds no <function=NAME>"], sglang=False),
    "function name without '>'": Case("<tool_call>\n<function=get_weather\n</tool_call>",
                                      errors=["has no '>' after the name"], sglang=False),
    "parameter name without '>'": Case(
        "<tool_call>\n<function=get_weather>\n<parameter=city\nRome\n</parameter>\n"
        "</function>\n</tool_call>", errors=["a parameter of 'get_weather' has no '>'"],
        sglang=False),
    # SGLang reads the open function as a call with what it has so far.
    "cut in a value": Case("Checking.\n<tool_call>\n<function=get_weather>\n<parameter=city>"
                           "\nPar", content="Checking.", truncated=True, sglang=False),
    "cut after the tag": Case("<tool_call>\n", truncated=True, sglang=False),
}

# Llama 3.1 / 3.2 model cards and prompt-format guide: a JSON object {"name",
# "parameters"}, after <|python_tag|> or alone; SGLang's parser takes ";" between calls.
CONDITIONS = {"location": "San Francisco, CA", "unit": "Fahrenheit"}
CONDITIONS_CALL = call_json("get_current_conditions", CONDITIONS, "parameters")
LLAMA3_JSON = {
    "one call": Case(CONDITIONS_CALL, [("get_current_conditions", CONDITIONS)]),
    "python tag": Case("<|python_tag|>" + CONDITIONS_CALL,
                       [("get_current_conditions", CONDITIONS)]),
    "several calls": Case(CONDITIONS_CALL + ";" + call_json("now", {}, "parameters"),
                          [("get_current_conditions", CONDITIONS), ("now", {})]),
    "several calls spaced": Case(
        "<|python_tag|>" + CONDITIONS_CALL + "; " + call_json("now", {"tz": "UTC"},
                                                             "parameters"),
        [("get_current_conditions", CONDITIONS), ("now", {"tz": "UTC"})]),
    "text before the tag": Case("Let me look that up. <|python_tag|>" + CONDITIONS_CALL,
                                [("get_current_conditions", CONDITIONS)],
                                "Let me look that up."),
    "text after": Case(CONDITIONS_CALL + " I will tell you when it answers.",
                       [("get_current_conditions", CONDITIONS)],
                       "I will tell you when it answers."),
    "arguments key": Case(call_json("now", {"tz": "UTC"}), [("now", {"tz": "UTC"})]),
    "no call": Case("It is sunny.", content="It is sunny."),
    # SGLang wants the JSON at the very start when there is no tag.
    "leading newline": Case("\n" + CONDITIONS_CALL, [("get_current_conditions",
                                                      CONDITIONS)], sglang=False),
    "bad JSON": Case('<|python_tag|>{"name": "now", "parameters": {"tz": }}',
                     errors=["not valid JSON"], sglang=False),
    "built-in tool call": Case('<|python_tag|>brave_search.call(query="weather")',
                               errors=["is not followed by a JSON object"], sglang=False),
    "no name": Case('{"parameters": {"tz": "UTC"}}', errors=['non-empty string "name"'],
                    sglang=False),
    "bad call then good": Case('{"name": "now", "parameters": [1]};' + CONDITIONS_CALL,
                               [("get_current_conditions", CONDITIONS)],
                               errors=["must be a JSON object, got array"], sglang=False),
    "cut": Case('<|python_tag|>{"name": "get_current_conditions", "parameters": {"loc',
                truncated=True, sglang=False),
    "cut after the tag": Case("Checking. <|python_tag|>", content="Checking.",
                              truncated=True, sglang=False),
}

# Mistral-7B-Instruct-v0.3's model card (tokenizer v3: [TOOL_CALLS] and a JSON array) and
# v11+ models (Mistral-Small-3.2, Devstral: [TOOL_CALLS]name[ARGS]{...} per call).
PARIS = {"location": "Paris, France", "format": "celsius"}
MISTRAL = {
    "array, one call": Case(
        '[TOOL_CALLS] [{"name": "get_current_weather", "arguments": '
        '{"location": "Paris, France", "format": "celsius"}}]',
        [("get_current_weather", PARIS)]),
    "array, several calls with ids": Case(
        '[TOOL_CALLS] [{"name": "get_current_weather", "arguments": {"location": '
        '"Paris, France", "format": "celsius"}, "id": "abcDEF123"}, {"name": "now", '
        '"arguments": {}, "id": "xyz789XYZ"}]',
        [("get_current_weather", PARIS, "abcDEF123"), ("now", {}, "xyz789XYZ")]),
    "array after text": Case(
        'Let me check. [TOOL_CALLS] [{"name": "now", "arguments": {"tz": "UTC"}}]',
        [("now", {"tz": "UTC"})], "Let me check."),
    "named, one call": Case('[TOOL_CALLS]get_current_weather[ARGS]{"location": '
                            '"Paris, France", "format": "celsius"}',
                            [("get_current_weather", PARIS)]),
    "named, several calls": Case(
        '[TOOL_CALLS]get_current_weather[ARGS]{"location": "Paris, France", "format": '
        '"celsius"}[TOOL_CALLS]now[ARGS]{}',
        [("get_current_weather", PARIS), ("now", {})]),
    "named after text": Case('I will look.[TOOL_CALLS]now[ARGS]{"tz": "UTC"}',
                             [("now", {"tz": "UTC"})], "I will look."),
    # SGLang reads "now[CALL_ID]a1b2c3d4e" as the name.
    "named with a call id": Case('[TOOL_CALLS]now[CALL_ID]a1b2c3d4e[ARGS]{"tz": "UTC"}',
                                 [("now", {"tz": "UTC"}, "a1b2c3d4e")], sglang=False),
    # A decoder that drops special tokens leaves no [ARGS] (vLLM reads it so).
    "named without [ARGS]": Case('[TOOL_CALLS]now{"tz": "UTC"}', [("now", {"tz": "UTC"})],
                                 sglang=False),
    "no call": Case("Paris is sunny.", content="Paris is sunny."),
    "bad JSON": Case('[TOOL_CALLS] [{"name": "now", "arguments": {"tz": "UTC",}}]',
                     errors=["[TOOL_CALLS] is not valid JSON"], sglang=False),
    "no name": Case('[TOOL_CALLS] [{"arguments": {}}]', errors=['non-empty string "name"'],
                    sglang=False),
    "named, arguments not an object": Case('[TOOL_CALLS]now[ARGS]"UTC"',
                                           errors=["are not a JSON object"], sglang=False),
    "named, empty name": Case('[TOOL_CALLS][ARGS]{"tz": "UTC"}',
                              errors=['non-empty string "name"'], sglang=False),
    "cut in the array": Case('[TOOL_CALLS] [{"name": "get_current_weather", "arguments": '
                             '{"location": "Pa', truncated=True, sglang=False),
    "cut in the name": Case("[TOOL_CALLS]get_curr", truncated=True, sglang=False),
    "cut after a whole call": Case('[TOOL_CALLS]now[ARGS]{}[TOOL_CALLS]get_current_weather'
                                   '[ARGS]{"loc', [("now", {})], truncated=True,
                                   sglang=False),
}

LONG_CODE = "print(f(x='1')]" + "\n" * 2 + "y = ')]'\n" * 600
# Llama 4's and the Llama 3.2 pythonic templates: "[func_name1(params_name1=
# params_value1, ...), func_name2(params)]"; Llama 4 may wrap it in python_start/end.
PYTHONIC = {
    "one call": Case('[get_weather(city="San Francisco", metric="celsius")]',
                     [("get_weather", {"city": "San Francisco", "metric": "celsius"})]),
    "several calls": Case("[get_weather(city='Boston'), calculate_route(start='Boston', "
                          "end='New York')]",
                          [("get_weather", {"city": "Boston"}),
                           ("calculate_route", {"start": "Boston", "end": "New York"})]),
    "llama 4 markers": Case('<|python_start|>[get_weather(city="Paris")]<|python_end|>',
                            [("get_weather", {"city": "Paris"})]),
    "text around": Case('Sure. [get_weather(city="Paris")] Done.',
                        [("get_weather", {"city": "Paris"})], "Sure.  Done."),
    "literal values": Case(
        "[configure(n=3, ratio=0.5, on=True, off=None, tags=['a', 'b'], "
        "opts={'depth': 2, 'name': \"x\"})]",
        [("configure", {"n": 3, "ratio": 0.5, "on": True, "off": None, "tags": ["a", "b"],
                        "opts": {"depth": 2, "name": "x"}})]),
    "no arguments": Case("[now()]", [("now", {})]),
    # SGLang's pattern wants the name right after "[".
    "multi-line": Case('[\n  get_weather(city="Paris"),\n  now()\n]',
                       [("get_weather", {"city": "Paris"}), ("now", {})], sglang=False),
    # Longer than the first window the list's end is looked for in, with "')]" inside.
    "long code in triple quotes": Case("[run_code(code='''" + LONG_CODE + "''')]",
                                       [("run_code", {"code": LONG_CODE})]),
    "no call": Case("See [1] and the list [a, b].", content="See [1] and the list [a, b]."),
    # SGLang takes only constants: it drops a call with a negative number.
    "negative number": Case("[move(dx=-3, dy=+2.5)]", [("move", {"dx": -3, "dy": 2.5})],
                            sglang=False),
    "positional argument": Case("[get_weather(city='Paris', 'celsius')]",
                                errors=["is not a Python list of calls"], sglang=False),
    "not a literal": Case("[get_weather(city=home)]",
                          errors=["argument values must be literals"], sglang=False),
    "not only calls": Case("[get_weather(city='Paris'), 'and then']",
                           errors=["is not a list of calls"], sglang=False),
    "a method": Case("[now(), brave_search.call(query='x')]", [("now", {})],
                     errors=["'brave_search.call' is not a plain function name"],
                     sglang=False),
    "cut": Case('Sure. [get_weather(city="San Fr', content="Sure.", truncated=True,
                sglang=False),
}

TABLES = {"hermes": HERMES, "qwen3_coder": QWEN3_CODER, "llama3_json": LLAMA3_JSON,
          "mistral": MISTRAL, "pythonic": PYTHONIC}
CASES = [(parser, name) for parser, table in TABLES.items() for name in table]


def parse(parser: str, case: Case) -> ParsedTurn:
    return parse_tool_calls(parser, case.text,
                            tools=CODER_TOOLS if parser == "qwen3_coder" else None)


def expected_calls(case: Case) -> tuple[ToolCall, ...]:
    return tuple(ToolCall(*call) for call in case.calls)


@pytest.mark.parametrize("parser, name", CASES)
def test_model_outputs_parse_to_the_expected_calls(parser, name):
    case = TABLES[parser][name]
    turn = parse(parser, case)
    assert turn.calls == expected_calls(case)
    assert turn.content == case.content
    assert turn.truncated == case.truncated
    assert len(turn.errors) == len(case.errors), turn.errors
    for error, expected in zip(turn.errors, case.errors):
        assert expected in error, (error, expected)


def test_every_format_has_each_kind_of_case():
    for parser, table in TABLES.items():
        cases = table.values()
        assert any(len(c.calls) == 1 and not c.errors for c in cases), parser
        assert any(len(c.calls) > 1 for c in cases), parser
        assert any(c.content and c.calls for c in cases), parser
        assert any(c.errors for c in cases), parser
        assert any(c.truncated for c in cases), parser
        assert sum(c.sglang for c in cases) >= 5, parser


def test_registry_names():
    assert set(TOOL_PARSERS.names()) == {"hermes", "qwen3_coder", "llama3_json", "mistral",
                                         "pythonic"}
    with pytest.raises(ValueError, match="unknown tool parser 'gpt-oss'.*hermes"):
        parse_tool_calls("gpt-oss", "text")


def test_bare_function_schemas_type_values_too():
    text = coder_call("get_weather", city="Paris", days="3")
    bare = [tool["function"] for tool in CODER_TOOLS]
    assert parse_tool_calls("qwen3_coder", text, tools=bare).calls == (
        ToolCall("get_weather", {"city": "Paris", "days": 3}),)
    assert parse_tool_calls("qwen3_coder", text).calls == (  # no schemas: all text
        ToolCall("get_weather", {"city": "Paris", "days": "3"}),)


def test_arguments_deeper_than_the_json_limit_are_an_error():
    deep = "[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH
    texts = {"hermes": f'<tool_call>{{"name": "f", "arguments": {{"a": {deep}}}}}</tool_call>',
             "qwen3_coder": coder_call("configure", tags=deep),
             "llama3_json": f'{{"name": "f", "parameters": {{"a": {deep}}}}}',
             "mistral": f'[TOOL_CALLS]f[ARGS]{{"a": {deep}}}',
             "pythonic": f"[f(a={deep})]"}
    for parser, text in texts.items():
        turn = parse_tool_calls(parser, text, tools=CODER_TOOLS)
        assert not turn.calls and len(turn.errors) == 1, (parser, turn)
        assert "nested deeper than" in turn.errors[0], (parser, turn.errors)


def test_a_turn_is_read_up_to_max_calls():
    many = {"hermes": f"<tool_call>{TEMPERATURE}</tool_call>",
            "qwen3_coder": coder_call("get_weather", city="Paris"),
            "llama3_json": CONDITIONS_CALL + ";",
            "mistral": "[TOOL_CALLS]now[ARGS]{}",
            "pythonic": "[now()] "}
    for parser, unit in many.items():
        turn = parse_tool_calls(parser, unit * (MAX_CALLS + 5), tools=CODER_TOOLS)
        assert len(turn.calls) == MAX_CALLS, parser
        assert turn.errors == (f"more than {MAX_CALLS} tool calls in one turn: the rest "
                               "were not read",), parser
        # Malformed calls count too: the errors of an adversarial turn stay few.
        bad = parse_tool_calls(parser, unit.replace("now", "").replace(
            "get_weather", "").replace("get_current_conditions", "") * 10_000)
        assert len(bad.errors) <= MAX_CALLS + 1, parser


# detect_tool_parser reads the chat template. Qwen's are the real ones; of the others,
# the lines that name the format, verbatim (Qwen3-Coder-30B-A3B-Instruct,
# Llama-3.1-8B-Instruct, Llama-4-Scout-17B-16E-Instruct, Mistral-7B-Instruct-v0.3), and
# SmolLM2-135M-Instruct's whole template, which has no tools.
QWEN3_CODER_LINE = ("{{- '\\n<tool_call>\\n<function=' + tool_call.name + '>\\n' }}"
                    "{{- '<parameter=' + args_name + '>\\n' }}")
LLAMA31_LINE = ("{{- 'Respond in the format {\"name\": function name, \"parameters\": "
                "dictionary of argument name and its value}.' }}")
LLAMA4_LINE = ('{{- "You have access to the following functions. To call functions, '
               'please respond with a python list of the calls. Respond in the format '
               '[func_name1(params_name1=params_value1, params_name2=params_value2...), '
               'func_name2(params)] " }}')
MISTRAL_LINE = '{{- "[TOOL_CALLS] [" }}'
SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
    "Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}")


def tokenizer_with(template) -> PreTrainedTokenizerFast:
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel({"<unk>": 0}, unk_token="<unk>")))
    tokenizer.chat_template = template
    return tokenizer


@pytest.mark.parametrize("template, parser", [
    (QWEN25_TEMPLATE, "hermes"),
    (QWEN3_TEMPLATE, "hermes"),
    (QWEN3_CODER_LINE + QWEN3_TEMPLATE, "qwen3_coder"),
    (LLAMA31_LINE, "llama3_json"),
    (LLAMA4_LINE, "pythonic"),
    (MISTRAL_LINE, "mistral"),
    ({"default": SMOLLM2_TEMPLATE, "tool_use": QWEN25_TEMPLATE}, "hermes"),
])
def test_detect_tool_parser_reads_the_template(template, parser):
    assert detect_tool_parser(tokenizer_with(template)) == parser


@pytest.mark.parametrize("template, problem", [
    (SMOLLM2_TEMPLATE, "holds none of"),
    (None, "has no chat template"),
])
def test_detect_tool_parser_names_the_choices_when_it_cannot_tell(template, problem):
    with pytest.raises(ValueError, match=problem) as error:
        detect_tool_parser(tokenizer_with(template))
    assert "set env.tool_parser to one of" in str(error.value)
    assert all(name in str(error.value) for name in TOOL_PARSERS.names())


def megabyte(unit: str) -> str:
    return unit * -(-10**6 // len(unit))


# Shapes that make backtracking or rescanning parsers quadratic, as 1 MB turns.
ADVERSARIAL = {
    "unclosed tool_call tags": megabyte("<tool_call>"),
    "unclosed tool_call newline tags": megabyte("<tool_call>\n"),
    "closing tags only": megabyte("</tool_call>"),
    "unclosed functions": "<tool_call>" + megabyte("<function=f>"),
    "unclosed parameters": "<tool_call><function=f>" + megabyte("<parameter=a>") + "</tool_call>",
    "parameters without names": "<tool_call><function=f>" + megabyte("<parameter=")
                                + "</function></tool_call>",
    "many closed blocks": megabyte(f"<tool_call>{TEMPERATURE}</tool_call>"),
    "tool_calls markers": megabyte("[TOOL_CALLS]"),
    "tool_calls arrays": megabyte("[TOOL_CALLS] ["),
    "tool_calls args": megabyte("[TOOL_CALLS]f[ARGS]{"),
    "python tags": megabyte("<|python_tag|>"),
    "deep braces": "<|python_tag|>" + megabyte("{"),
    "deep brackets": megabyte("["),
    "nested keys": "[TOOL_CALLS]f[ARGS]" + megabyte('{"a":'),
    "alternating brackets": "[TOOL_CALLS] [" + megabyte("[]"),
    "unterminated strings": "[TOOL_CALLS] [" + megabyte('"\\'),
    "call lists": megabyte("[f("),
    "call lists with strings": megabyte('[f(a="'),
    "call lists with names": megabyte("[f(a=[g(b=1"),
    "triple quotes": "[f(a=" + megabyte("'''"),
    "one huge value": coder_call("run", code=megabyte("x < y > ")),
    "one huge call list": "[f(a=" + repr(megabyte("q")) + ")]",
    "many strings in one list": "[f(a=[" + megabyte('"x", '),
    "many strings in one block": "<tool_call>" + megabyte('"x", '),
}


@pytest.mark.parametrize("shape", ADVERSARIAL)
def test_a_megabyte_of_adversarial_text_parses_within_a_second(shape):
    # Linear parsing takes ~0.001-0.3 s per format here; a quadratic one takes minutes.
    text = ADVERSARIAL[shape]
    assert len(text) >= 10**6
    for parser in TOOL_PARSERS:
        start = time.perf_counter()
        turn = parse_tool_calls(parser, text, tools=CODER_TOOLS)
        elapsed = time.perf_counter() - start
        assert isinstance(turn, ParsedTurn)
        assert elapsed < 1.0, f"{parser} took {elapsed:.2f} s"
        assert all(len(error) < 400 for error in turn.errors), parser


MARKUP = ["<tool_call>", "</tool_call>", "<function=", "</function>", "<parameter=",
          "</parameter>", "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]", "<|python_tag|>",
          "<|python_start|>", '"name"', '"arguments"', '"parameters"', "f(", "a=", "null",
          "true"]


@hypothesis.settings(max_examples=400, deadline=None)
@hypothesis.given(st.lists(st.sampled_from(list("<>/{}[]()\":;=,' \n\\af1") + MARKUP),
                           max_size=30).map("".join))
def test_parsers_never_raise(text):
    for parser in TOOL_PARSERS:
        turn = parse_tool_calls(parser, text, tools=CODER_TOOLS)
        assert isinstance(turn.content, str) and isinstance(turn.truncated, bool)
        assert all(isinstance(c.arguments, dict) and c.name.strip() for c in turn.calls)


# SGLang's parsers of the same names. SGLang's package __init__ imports its server
# (triton, zmq, torch) and sglang.utils imports IPython; the parsers need neither, so
# the packages are entered without running their __init__ and sglang.utils's one
# function the OpenAI protocol module takes is given. Install for these tests:
#   pip install --no-deps sglang && pip install openai partial-json-parser orjson msgspec
SGLANG_DETECTORS = {"hermes": ("hermes_detector", "HermesDetector"),
                    "qwen3_coder": ("qwen3_coder_detector", "Qwen3CoderDetector"),
                    "llama3_json": ("llama32_detector", "Llama32Detector"),
                    "mistral": ("mistral_detector", "MistralDetector"),
                    "pythonic": ("pythonic_detector", "PythonicDetector")}
# SGLang's own "qwen" parser (Qwen25Detector) reads the hermes cases written exactly as
# Qwen's template writes them.
QWEN_FORMAT = ("one call", "several calls", "text before", "qwen3 thinking",
               "hermes 2 pro key order", "parameters key", "unicode arguments")


@pytest.fixture(scope="module")
def sglang():
    """(detector classes by parser name, the Qwen25Detector, the Tool model)."""
    spec = importlib.util.find_spec("sglang")
    if spec is None:
        pytest.skip("SGLang is not installed (pip install --no-deps sglang)")
    root = pathlib.Path(spec.submodule_search_locations[0])
    saved = {name: module for name, module in sys.modules.items()
             if name == "sglang" or name.startswith("sglang.")}
    for package in ("sglang", "sglang.srt", "sglang.srt.function_call",
                    "sglang.srt.entrypoints", "sglang.srt.entrypoints.openai"):
        module = types.ModuleType(package)
        module.__path__ = [str(root.joinpath(*package.split(".")[1:]))]
        sys.modules[package] = module
    utils = types.ModuleType("sglang.utils")
    utils.convert_json_schema_to_str = json.dumps
    sys.modules["sglang.utils"] = utils
    try:
        detectors = {parser: getattr(importlib.import_module(
            f"sglang.srt.function_call.{module}"), cls)
            for parser, (module, cls) in SGLANG_DETECTORS.items()}
        qwen = importlib.import_module("sglang.srt.function_call.qwen25_detector")
        protocol = importlib.import_module("sglang.srt.entrypoints.openai.protocol")
    except ImportError as error:
        pytest.skip(f"SGLang's parsers do not import here: {error}")
    finally:
        for name in [n for n in sys.modules if n == "sglang" or n.startswith("sglang.")]:
            del sys.modules[name]
        sys.modules.update(saved)
    return detectors, qwen.Qwen25Detector, protocol.Tool


def sglang_calls(detector, case: Case, tools: list) -> tuple[tuple[str, dict], ...]:
    result = detector().detect_and_parse(case.text, tools)
    return tuple((c.name, json.loads(c.parameters)) for c in result.calls)


def sglang_tools(tool_model, parser: str, case: Case) -> list:
    """The case's tools as SGLang takes them (it drops calls to tools it was not given)."""
    if parser == "qwen3_coder":
        schemas = [tool["function"] for tool in CODER_TOOLS]
        declared = {schema["name"] for schema in schemas}
        schemas += [{"name": c[0], "parameters": {"type": "object"}} for c in case.calls
                    if c[0] not in declared]
    else:
        schemas = [{"name": c[0], "parameters": {"type": "object"}} for c in case.calls]
    return [tool_model(type="function", function=schema) for schema in schemas]


AGREEING = [(parser, name) for parser, name in CASES if TABLES[parser][name].sglang]


@pytest.mark.parametrize("parser, name", AGREEING)
def test_calls_agree_with_sglangs_parser_of_the_same_name(sglang, parser, name):
    detectors, qwen25, tool_model = sglang
    case = TABLES[parser][name]
    tools = sglang_tools(tool_model, parser, case)
    ours = tuple((c.name, c.arguments) for c in parse(parser, case).calls)
    assert ours == sglang_calls(detectors[parser], case, tools)
    if parser == "hermes" and name in QWEN_FORMAT:
        assert ours == sglang_calls(qwen25, case, tools)


def random_value(rng: random.Random, depth: int = 0):
    """A JSON value such as tool arguments hold: text with markup and escapes in it,
    numbers, booleans, null, lists and objects."""
    kinds = ["text", "int", "float", "bool", "null"] + (["list", "dict"] if depth < 3 else [])
    kind = rng.choice(kinds)
    if kind == "text":
        return "".join(rng.choice(["a", "Z", " ", "\n", "<", ">", '"', "'", "\\", "{", "]",
                                   "é", "天", "\t", "x=1", "#"])
                       for _ in range(rng.randrange(12)))
    if kind == "int":
        return rng.randrange(0, 10**6)
    if kind == "float":
        return rng.randrange(1, 10**4) / 8
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "null":
        return None
    if kind == "list":
        return [random_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {f"k{i}": random_value(rng, depth + 1) for i in range(rng.randrange(4))}


def random_calls(rng: random.Random) -> list[tuple[str, dict]]:
    return [(rng.choice(["search", "get_weather", "run_code", "f2"]),
             {rng.choice(["q", "city", "n", "x_1"]) + str(i): random_value(rng)
              for i in range(rng.randrange(4))})
            for _ in range(rng.randrange(1, 4))]


def write_turn(parser: str, rng: random.Random) -> tuple[str, list[tuple[str, dict]]]:
    """A well-formed turn in the format, as the model's template writes calls, and the
    calls it holds."""
    calls = random_calls(rng)
    before = rng.choice(["", "Let me check.\n", "<think>\nplan\n</think>\n\n"])
    if parser == "hermes":
        return before + "\n".join(f"<tool_call>\n{call_json(n, a)}\n</tool_call>"
                                  for n, a in calls), calls
    if parser == "llama3_json":
        return (rng.choice(["", "<|python_tag|>"])
                + ";".join(call_json(n, a, "parameters") for n, a in calls)), calls
    if parser == "mistral":
        if rng.random() < 0.5:
            return before + "[TOOL_CALLS] " + json.dumps(
                [{"name": n, "arguments": a} for n, a in calls]), calls
        return before + "".join(f"[TOOL_CALLS]{n}[ARGS]{json.dumps(a)}" for n, a in calls), calls
    if parser == "pythonic":  # Python literals: no negative numbers (SGLang drops them)
        calls = [(n, {k: v for k, v in a.items()}) for n, a in calls]
        return before + "[" + ", ".join(
            f"{n}(" + ", ".join(f"{k}={v!r}" for k, v in a.items()) + ")"
            for n, a in calls) + "]", calls
    raise ValueError(parser)


@pytest.mark.parametrize("parser", ["hermes", "llama3_json", "mistral", "pythonic"])
def test_random_well_formed_turns_agree_with_sglang(sglang, parser):
    """Seeded turns as the templates write them: the same calls as SGLang's parser."""
    detectors, _, tool_model = sglang
    rng = random.Random(0)
    for _ in range(150):
        text, calls = write_turn(parser, rng)
        case = Case(text, calls)
        tools = sglang_tools(tool_model, parser, case)
        ours = tuple((c.name, c.arguments) for c in parse_tool_calls(parser, text).calls)
        assert ours == tuple(calls), text
        assert ours == sglang_calls(detectors[parser], case, tools), text


def coder_value(rng: random.Random, schema_type: str):
    """A value of the type, and the text the Qwen3-Coder template writes for it."""
    value = {"string": lambda: random_value(rng, 3) if rng.random() < 0.5 else "line 1\n"
             "  if a < b and c > d:\n    print('x')",
             "integer": lambda: rng.randrange(-10**6, 10**6),
             "number": lambda: rng.randrange(-10**4, 10**4) / 8,
             "boolean": lambda: rng.random() < 0.5,
             "array": lambda: [random_value(rng, 2) for _ in range(rng.randrange(3))],
             "object": lambda: {"k": random_value(rng, 2)}}[schema_type]()
    if schema_type == "string":
        value = str(value)
    if value is None or isinstance(value, (list, dict)):
        return value, json.dumps(value)
    return value, str(value).lower() if isinstance(value, bool) else str(value)


def test_random_qwen3_coder_turns_agree_with_sglang(sglang):
    detectors, _, tool_model = sglang
    properties = {"s": "string", "i": "integer", "n": "number", "b": "boolean",
                  "a": "array", "o": "object"}
    schema = {"name": "typed", "parameters": {"type": "object", "properties": {
        name: {"type": kind} for name, kind in properties.items()}}}
    tools = [{"type": "function", "function": schema}]
    rng = random.Random(0)
    for _ in range(150):
        calls, blocks = [], []
        for _ in range(rng.randrange(1, 4)):
            chosen = rng.sample(sorted(properties), rng.randrange(len(properties) + 1))
            values = {name: coder_value(rng, properties[name]) for name in chosen}
            if any(v[1].strip().lower() == "null" for v in values.values()):
                continue
            calls.append(("typed", {name: v[0] for name, v in values.items()}))
            blocks.append(coder_call("typed", **{name: v[1] for name, v in values.items()}))
        text = rng.choice(["", "I will run it.\n"]) + "\n".join(blocks)
        ours = tuple((c.name, c.arguments)
                     for c in parse_tool_calls("qwen3_coder", text, tools=tools).calls)
        assert ours == tuple(calls), text
        sglang_tools_ = [tool_model(type="function", function=schema)]
        assert ours == sglang_calls(detectors["qwen3_coder"], Case(text), sglang_tools_), text
