"""Tool-call parsers: a turn written in the model's own tool-calling format in, its calls
out, never an exception.

    turn = parse_tool_calls("hermes", text)          # ParsedTurn
    turn.calls[0].name, turn.calls[0].arguments      # "get_weather", {"city": "Paris"}
    parse_tool_calls("qwen3_coder", text, tools=schemas)   # values typed by the schemas
    detect_tool_parser(tokenizer)                    # "hermes" for a Qwen2.5 template

The formats carry SGLang's and vLLM's parser names and read a turn as SGLang's parser of
that name does (sglang/srt/function_call/*_detector.py): the same output gives the same
calls, name and arguments. Where SGLang is silent or lossy, these are loud:
  * a malformed call (bad JSON, no name, arguments not an object, markup that holds no
    call) is an entry of `errors` saying what was wrong; SGLang logs it and drops the call
    (hermes drops every call of the turn);
  * the text around and between the calls stays in `content`; SGLang keeps only what
    precedes the first call in most formats;
  * a turn that ends inside an unfinished call (cut by max_tokens) is `truncated`, neither
    a call nor an error. Whether the model was cut or ended its turn there, the caller
    knows from the stop reason;
  * names are not checked against the tools (SGLang drops calls to unknown tools): the env
    that holds the tools says which are unknown.

Parsing takes time linear in the text whatever it holds: the policy can write a megabyte
of unclosed tags or brackets, and a regex like SGLang's `<tool_call>\\n(.*?)\\n</tool_call>`
rescans the rest of the text from every unclosed tag. Delimiters are found with
`str.find`, each from where the last search stopped; JSON is decoded by `json`, and a
bracket scanner runs only when decoding failed, to tell a cut value from a bad one.
"""
from __future__ import annotations

import ast
import dataclasses
import json
import math
import re
import threading
import warnings
from typing import Any, Callable, Mapping, Sequence

from agentjax.core.registry import Registry
from agentjax.parsers.actions import MAX_JSON_DEPTH, echo, exceeds_depth, load_json

# OpenAI function schemas, {"type": "function", "function": {"name", "parameters"}} (the
# bare function object is taken too); None when the caller has none.
Tools = Sequence[Mapping[str, Any]] | None


@dataclasses.dataclass(frozen=True)
class ToolCall:
    """One call the model made.

    Attributes:
      name: the function's name, as written.
      arguments: the arguments, a JSON object.
      id: the call id, where the format carries one (mistral); None elsewhere.
    """

    name: str
    arguments: dict
    id: str | None = None


@dataclasses.dataclass(frozen=True)
class ParsedTurn:
    """One assistant turn, read.

    Attributes:
      content: the text around the calls (stripped), the calls' markup removed.
      calls: the well-formed calls, in order.
      errors: one message per malformed call, saying what was wrong.
      truncated: the text ends inside an unfinished call.
    """

    content: str
    calls: tuple[ToolCall, ...]
    errors: tuple[str, ...]
    truncated: bool


@dataclasses.dataclass(frozen=True)
class ToolParser:
    """One tool-calling format.

    Attributes:
      parse: (text, tools) -> ParsedTurn; never raises on the text.
      template_markers: text found in chat templates of the format (any one suffices),
        for `detect_tool_parser`.
    """

    parse: Callable[[str, Tools], ParsedTurn]
    template_markers: tuple[str, ...]


# Registration order is detection order: a more specific format first (Qwen3-Coder's
# template also holds `<tool_call>`).
TOOL_PARSERS: Registry[ToolParser] = Registry("tool parser")


def parse_tool_calls(parser: str, text: str, *, tools: Tools = None) -> ParsedTurn:
    """Reads one assistant turn in the format `parser` (a name of TOOL_PARSERS).

    Args:
      parser: the format's name; an unknown name raises ValueError naming the formats.
      text: the decoded turn.
      tools: the tools' schemas; qwen3_coder types its parameter values by them (the
        other formats write JSON, typed already).
    """
    return TOOL_PARSERS.get(parser).parse(text, tools)


def detect_tool_parser(tokenizer) -> str:
    """The format of the tokenizer's chat template, as a name of TOOL_PARSERS.

    Raises:
      ValueError: the tokenizer has no chat template, or its template names no known
        format; the message lists the names to choose from.
    """
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, Mapping):  # named templates ("default", "tool_use")
        template = "\n".join(t for t in template.values() if isinstance(t, str))
    choose = f"set env.tool_parser to one of {', '.join(TOOL_PARSERS.names())}"
    if not isinstance(template, str) or not template:
        raise ValueError(f"cannot detect the tool-call format: the tokenizer has no chat "
                         f"template; {choose}")
    for name in TOOL_PARSERS:
        if any(marker in template for marker in TOOL_PARSERS.get(name).template_markers):
            return name
    markers = ", ".join(repr(m) for name in TOOL_PARSERS
                        for m in TOOL_PARSERS.get(name).template_markers)
    raise ValueError(f"cannot detect the tool-call format: the chat template holds none of "
                     f"{markers} (a template without tool calls, like SmolLM2's?); {choose}")


class _Turn:
    """What a parser has read so far; `result()` is the ParsedTurn."""

    def __init__(self):
        self.content: list[str] = []
        self.calls: list[ToolCall] = []
        self.errors: list[str] = []
        self.truncated = False
        self._attempts = 0  # calls seen, well-formed or not: errors name them by number

    def error(self, problem: str) -> None:
        self._attempts += 1
        self.errors.append(f"tool call {self._attempts}: {problem}")

    def add(self, name: Any, arguments: Any, call_id: Any = None) -> None:
        """Adds the call, or the error that says why it is none. Missing arguments are
        `{}`; arguments written as a JSON-encoded string (some models do) are decoded."""
        if not isinstance(name, str) or not name.strip():
            return self.error('needs a non-empty string "name"')
        if arguments is None:
            arguments = {}
        if isinstance(arguments, str):
            arguments, problem = load_json(arguments)
            if problem:
                return self.error(f'"arguments" string is not valid JSON ({problem})')
        if not isinstance(arguments, dict):
            return self.error(f'"arguments" of {echo(name)} must be a JSON object, '
                              f"got {_json_type(arguments)}")
        if exceeds_depth(arguments, MAX_JSON_DEPTH):
            return self.error(f"arguments nested deeper than {MAX_JSON_DEPTH} levels")
        self._attempts += 1
        self.calls.append(ToolCall(name, arguments, call_id if isinstance(call_id, str)
                                   and call_id else None))

    def add_object(self, value: Any, with_id: bool = False) -> None:
        """Adds a call written as a JSON object {"name", "arguments" or "parameters"}."""
        if not isinstance(value, dict):
            return self.error(f"must be a JSON object, got {_json_type(value)}")
        # SGLang reads "parameters" (Llama's word) first, then "arguments".
        arguments = value.get("parameters") or value.get("arguments")
        self.add(value.get("name"), arguments, value.get("id") if with_id else None)

    def result(self) -> ParsedTurn:
        return ParsedTurn("".join(self.content).strip(), tuple(self.calls),
                          tuple(self.errors), self.truncated)


def _json_type(value: Any) -> str:
    for kind, name in ((bool, "boolean"), (dict, "object"), (list, "array"),
                       (str, "string"), ((int, float), "number")):
        if isinstance(value, kind):
            return name
    return "null" if value is None else type(value).__name__


def _split_blocks(text: str, opening: str, closing: str
                  ) -> tuple[list[str], list[str], str | None]:
    """(outside, bodies, tail) of `text` cut at `opening ... closing` blocks.

    Pairs as the regex `opening(.*?)closing` does left to right: an opening pairs with the
    first closing after it, and openings inside a body are part of it. `tail` is what
    follows an opening that has no closing (None when every block closed); `outside`
    holds the text between blocks.
    """
    outside, bodies, pos = [], [], 0
    while (at := text.find(opening, pos)) >= 0:
        outside.append(text[pos:at])
        start = at + len(opening)
        end = text.find(closing, start)
        if end < 0:
            return outside, bodies, text[start:]
        bodies.append(text[start:end])
        pos = end + len(closing)
    outside.append(text[pos:])
    return outside, bodies, None


_DECODER = json.JSONDecoder()
# Outside a JSON string: a quote or a run of brackets; inside one: a quote or a backslash.
_JSON_STRUCTURE = re.compile(r'"|[\[{]+|[\]}]+')
_JSON_STRING_END = re.compile(r'["\\]')


def _decode_json(text: str, start: int) -> tuple[Any, int, str | None]:
    """(value, end, problem) of the JSON value at text[start] ("{" or "[").

    end is -1 when the value's brackets do not close before the text ends (a cut value);
    problem says why a closed value is not JSON any tool can take.
    """
    try:
        value, end = _DECODER.raw_decode(text, start)
    except (ValueError, RecursionError):  # JSONDecodeError is a ValueError
        end = _json_end(text, start)
        if end < 0:
            return None, -1, None
        value, problem = load_json(text[start:end])
        return value, end, problem or "not valid JSON"
    if exceeds_depth(value, MAX_JSON_DEPTH):
        return None, end, f"nested deeper than {MAX_JSON_DEPTH} levels"
    return value, end, None


def _json_end(text: str, start: int) -> int:
    """The end of the bracketed value at text[start] (string-aware), or -1 if it stays
    open to the end of the text. Brackets of either kind count alike: a mismatch is for
    the decoder to report."""
    depth, pos = 0, start
    while match := _JSON_STRUCTURE.search(text, pos):
        pos, run = match.end(), match.group()
        if run == '"':
            while (quote := _JSON_STRING_END.search(text, pos)) and quote.group() == "\\":
                pos = quote.end() + 1
            if quote is None:
                return -1
            pos = quote.end()
        elif run[0] in "[{":
            depth += len(run)
        elif depth <= len(run):
            return match.start() + depth
        else:
            depth -= len(run)
    return -1


# hermes (Qwen2.5, Qwen3, Hermes 2 Pro): <tool_call>\n{"name": ..., "arguments": {...}}
# \n</tool_call>, one block per call; a block may also hold a JSON list of calls.
_TOOL_CALL, _TOOL_CALL_END = "<tool_call>", "</tool_call>"


def _parse_hermes(text: str, tools: Tools) -> ParsedTurn:
    del tools  # JSON carries its types
    turn = _Turn()
    outside, bodies, tail = _split_blocks(text, _TOOL_CALL, _TOOL_CALL_END)
    turn.content += outside
    for body in bodies:
        _hermes_block(body, turn)
    if tail is not None:
        # An unclosed last block whose JSON is whole is a call, as for SGLang (a sampler
        # that stops at "</tool_call>" leaves it out); otherwise the turn was cut in it.
        if load_json(tail.strip())[1] is None:
            _hermes_block(tail, turn)
        else:
            turn.truncated = True
    return turn.result()


def _hermes_block(body: str, turn: _Turn) -> None:
    value, problem = load_json(body.strip())
    if problem:
        return turn.error(f"<tool_call> is not valid JSON ({problem})")
    if not isinstance(value, list):
        return turn.add_object(value)
    if not value:
        return turn.error("<tool_call> holds an empty list")
    for item in value:
        turn.add_object(item)


# qwen3_coder (Qwen3-Coder): <tool_call>\n<function=NAME>\n<parameter=P>\nvalue\n
# </parameter>\n</function>\n</tool_call>; values are text, typed by the tool's schema.
_FUNCTION, _FUNCTION_END = "<function=", "</function>"
_PARAMETER, _PARAMETER_END = "<parameter=", "</parameter>"
_STRING_TYPES = ("string", "str", "text", "varchar", "char", "enum")
_INTEGER_PREFIXES = ("int", "uint", "long", "short", "unsigned")
_BOOLEAN_TYPES = ("boolean", "bool", "binary")


def _parse_qwen3_coder(text: str, tools: Tools) -> ParsedTurn:
    turn = _Turn()
    outside, bodies, tail = _split_blocks(text, _TOOL_CALL, _TOOL_CALL_END)
    turn.content += outside
    properties = _tool_properties(tools)
    for body in bodies:
        _xml_block(body, properties, turn, closed=True)
    if tail is not None:
        _xml_block(tail, properties, turn, closed=False)
    return turn.result()


def _xml_block(body: str, properties: dict, turn: _Turn, closed: bool) -> None:
    """The functions of one <tool_call> block. In a closed block a function left open
    runs to the block's end (as SGLang reads it); in the unclosed last block it means the
    turn was cut there."""
    pos, found = 0, False
    while (at := body.find(_FUNCTION, pos)) >= 0:
        found, start = True, at + len(_FUNCTION)
        end = body.find(_FUNCTION_END, start)
        if end < 0 and not closed:
            turn.truncated = True
            return
        function, pos = ((body[start:], len(body)) if end < 0
                         else (body[start:end], end + len(_FUNCTION_END)))
        _xml_function(function, properties, turn)
    if not found:
        if closed:
            turn.error("<tool_call> holds no <function=NAME>")
        else:
            turn.truncated = True


def _xml_function(function: str, properties: dict, turn: _Turn) -> None:
    name_end = function.find(">")
    if name_end < 0:
        return turn.error(f"<function={echo(function)} has no '>' after the name")
    name, schema = function[:name_end], properties.get(function[:name_end], {})
    arguments = {}
    for parameter, value in _xml_parameters(function[name_end + 1:]):
        if parameter is None:
            return turn.error(f"a parameter of {echo(name)} has no '>' after its name")
        arguments[parameter] = _typed_value(value, schema.get(parameter, _UNDECLARED))
    turn.add(name, arguments)


def _xml_parameters(text: str) -> list[tuple[str | None, str]]:
    """(name, value) of each <parameter=NAME>value</parameter>, None for a name without
    '>'. As SGLang's regex `<parameter=(.*?)(?:</parameter>|(?=<parameter=)|$)`: a value
    also ends where the next parameter opens, or at the text's end (before a final
    newline, as `$` matches); one newline is dropped at each end of the value."""
    found = []
    at, close = text.find(_PARAMETER), text.find(_PARAMETER_END)
    while at >= 0:
        start = at + len(_PARAMETER)
        following = text.find(_PARAMETER, start)
        if 0 <= close < start:
            close = text.find(_PARAMETER_END, start)
        ends = [p for p in (close, following) if p >= 0]
        end = min(ends) if ends else len(text) - (text.endswith("\n") and len(text) > start)
        segment = text[start:end]
        name_end = segment.find(">")
        if name_end < 0:
            found.append((None, segment))
        else:
            value = segment[name_end + 1:]
            value = value[1:] if value.startswith("\n") else value
            found.append((segment[:name_end], value[:-1] if value.endswith("\n") else value))
        at = following  # the next parameter, whether this one closed or not
    return found


_UNDECLARED = object()


def _typed_value(value: str, schema: Any) -> Any:
    """The parameter's value converted by its schema's type, as SGLang converts it: text
    that fails to convert stays text, except a boolean, which is true only for 'true'."""
    if value.lower() == "null":
        return None
    if schema is _UNDECLARED:
        return value
    kind = str(_schema_type(schema) or "string").strip().lower()
    if kind in _STRING_TYPES:
        return value
    if kind.startswith(_INTEGER_PREFIXES):
        try:
            return int(value)
        except ValueError:
            return value
    if kind.startswith(("num", "float")):
        try:
            number = float(value)
        except ValueError:
            return value
        integral = "." not in value and "e" not in value.lower() and number.is_integer()
        return int(number) if integral else number
    if kind in _BOOLEAN_TYPES:
        return value.lower() == "true"
    if kind in ("object", "array", "arr") or kind.startswith(("dict", "list")):
        decoded, problem = load_json(value)
        if problem is None:
            return decoded
    return _python_literal(value)


_LITERAL_LOCK = threading.Lock()  # catch_warnings swaps the process's warning filters


def _python_literal(value: str) -> Any:
    """`ast.literal_eval(value)` as JSON (tuples as lists), else the text itself."""
    try:
        with _LITERAL_LOCK, warnings.catch_warnings():
            warnings.simplefilter("ignore")  # invalid escapes ("\d") only warn
            literal = ast.literal_eval(value)
        return json.loads(json.dumps(literal))
    # Whatever the text provokes: SyntaxError, ValueError (also int digit limits),
    # TypeError (a set), MemoryError and RecursionError (deep nesting).
    except Exception:  # noqa: BLE001 - any failure leaves the text as it is
        return value


def _tool_properties(tools: Tools) -> dict[str, dict]:
    """Function name -> its parameters' schemas (top-level "properties", or those of
    its anyOf / oneOf / allOf branches)."""
    properties = {}
    for tool in tools or ():
        function = tool.get("function", tool)
        properties[function.get("name")] = _schema_properties(function.get("parameters"))
    return properties


def _schema_properties(schema: Any) -> dict:
    if not isinstance(schema, Mapping):
        return {}
    if isinstance(schema.get("properties"), Mapping):
        return dict(schema["properties"])
    merged = {}
    for keyword in ("anyOf", "oneOf", "allOf"):
        for branch in schema.get(keyword) or ():
            for name, value in _schema_properties(branch).items():
                merged.setdefault(name, value)
    return merged


_ENUM_TYPES = {type(None): "null", bool: "boolean", int: "integer", float: "number",
               str: "string", list: "array", dict: "object"}


def _schema_type(schema: Any) -> Any:
    """The main type of a JSON schema as SGLang infers it (its utils'
    infer_type_from_json_schema): "type" (the first non-null of a list), then the
    branches of anyOf / oneOf (their common type; string where they differ), enum values,
    allOf, "properties" (object), "items" (array); None when nothing says."""
    if not isinstance(schema, Mapping):
        return None
    kind = schema.get("type")
    if isinstance(kind, str):
        return kind
    if isinstance(kind, list) and kind:
        return next((k for k in kind if k != "null"), "string")
    branches = schema.get("anyOf") or schema.get("oneOf")
    if isinstance(branches, list):
        kinds = [k for k in map(_schema_type, branches) if k]
        distinct = set(map(str, kinds))
        if len(distinct) == 1:
            return kinds[0]
        if len(distinct) == 2 and "null" in distinct:
            return next(k for k in kinds if k != "null")
        if kinds:
            return "string" if "string" in distinct else kinds[0]
    if isinstance(schema.get("enum"), list):
        kinds = {_ENUM_TYPES.get(type(v)) for v in schema["enum"]} - {None}
        return kinds.pop() if len(kinds) == 1 else "string"
    if isinstance(schema.get("allOf"), list):
        return next((k for k in map(_schema_type, schema["allOf"]) if k and k != "string"),
                    "string")
    if "properties" in schema:
        return "object"
    if "items" in schema:
        return "array"
    return None


# llama3_json (Llama 3.1 / 3.2 / 3.3 JSON tool calls): an optional <|python_tag|>, then
# {"name": ..., "parameters": {...}} objects separated by ";" (SGLang's llama3 parser).
_PYTHON_TAG = "<|python_tag|>"


def _parse_llama3_json(text: str, tools: Tools) -> ParsedTurn:
    del tools
    turn = _Turn()
    tag = text.find(_PYTHON_TAG)
    if tag >= 0:
        turn.content.append(text[:tag])
        region = text[tag + len(_PYTHON_TAG):]
    elif text.lstrip().startswith("{"):
        region = text.lstrip()
    else:
        turn.content.append(text)
        return turn.result()
    pos = _skip_space(region, 0)
    if pos == len(region):
        turn.truncated = True  # cut right after <|python_tag|>
    elif region[pos] != "{":
        turn.error(f"{_PYTHON_TAG} is not followed by a JSON object "
                   '{"name": ..., "parameters": {...}} (built-in tool calls and code are '
                   f"not parsed): {echo(region[pos:].strip())}")
        return turn.result()
    while pos < len(region) and region[pos] == "{":
        value, end, problem = _decode_json(region, pos)
        if end < 0:
            turn.truncated = True
            return turn.result()
        if problem:
            turn.error(f"not valid JSON ({problem})")
        else:
            turn.add_object(value)
        pos = _skip_space(region, end)
        if not region.startswith(";", pos):
            break
        pos = _skip_space(region, pos + 1)
    turn.content.append(region[pos:])  # text after the calls, as SGLang keeps it
    return turn.result()


_SPACE = re.compile(r"\s*")


def _skip_space(text: str, pos: int) -> int:
    return _SPACE.match(text, pos).end()


# mistral: [TOOL_CALLS] then a JSON array of {"name", "arguments", "id"?} (tokenizers
# before v11: Mistral-7B-Instruct-v0.3, Mistral-Nemo), or, from v11 (Mistral-Small-3.1+,
# Magistral, Devstral), [TOOL_CALLS]name[ARGS]{...} per call, with [CALL_ID]id before
# [ARGS] where the template writes ids.
_TOOL_CALLS, _ARGS, _CALL_ID = "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"


def _parse_mistral(text: str, tools: Tools) -> ParsedTurn:
    del tools
    turn = _Turn()
    pieces = text.split(_TOOL_CALLS)
    turn.content.append(pieces[0])
    for i, piece in enumerate(pieces[1:], 1):
        last = i == len(pieces) - 1
        start = _skip_space(piece, 0)
        if piece.startswith(("[", "{"), start):
            _mistral_json(piece, start, last, turn)
        else:
            _mistral_named(piece, last, turn)
    return turn.result()


def _mistral_json(piece: str, start: int, last: bool, turn: _Turn) -> None:
    value, end, problem = _decode_json(piece, start)
    if end < 0:
        return _cut(turn, last, f"{_TOOL_CALLS} JSON is not closed before the next "
                                f"{_TOOL_CALLS}")
    turn.content.append(piece[end:])
    if problem:
        return turn.error(f"{_TOOL_CALLS} is not valid JSON ({problem})")
    if isinstance(value, list) and not value:
        return turn.error(f"{_TOOL_CALLS} holds an empty list")
    for item in value if isinstance(value, list) else [value]:
        turn.add_object(item, with_id=True)


def _mistral_named(piece: str, last: bool, turn: _Turn) -> None:
    args = piece.find(_ARGS)
    if args >= 0:
        head, start = piece[:args], args + len(_ARGS)
    else:  # a decoder that drops special tokens leaves name{...}, as vLLM reads it
        start = piece.find("{")
        if start < 0:
            return _cut(turn, last, f"{_TOOL_CALLS}{echo(piece.strip())} has no "
                                    f"{_ARGS}{{...}} after the name")
        head = piece[:start]
    name, _, call_id = head.partition(_CALL_ID)
    start = _skip_space(piece, start)
    if start == len(piece):
        return _cut(turn, last, f"{_TOOL_CALLS}{echo(name.strip())} has no arguments")
    if piece[start] not in "[{":
        return turn.error(f"the arguments of {echo(name.strip())} are not a JSON object: "
                          f"{echo(piece[start:])}")
    value, end, problem = _decode_json(piece, start)
    if end < 0:
        return _cut(turn, last, f"the arguments of {echo(name.strip())} are not closed "
                                f"before the next {_TOOL_CALLS}")
    turn.content.append(piece[end:])
    if problem:
        return turn.error(f"the arguments of {echo(name.strip())} are not valid JSON "
                          f"({problem})")
    turn.add(name.strip(), value, call_id.strip())


def _cut(turn: _Turn, last: bool, problem: str) -> None:
    """An unfinished call: the turn was cut if it is the last, else it is malformed."""
    if last:
        turn.truncated = True
    else:
        turn.error(problem)


# pythonic (Llama 4, Llama 3.2 / 3.3 pythonic templates): [f(a=1, b="x"), g()], read by
# Python's parser; argument values are literals. Llama 4 may wrap the list in
# <|python_start|> ... <|python_end|>.
_PYTHON_MARKERS = ("<|python_start|>", "<|python_end|>")
# A list that opens with a call taking no or named arguments, as SGLang's pattern wants.
_CALL_LIST = re.compile(r"\[[A-Za-z]\w*\((?=\s*\)|\s*[A-Za-z_]\w*\s*=)")
_PYTHON_STRUCTURE = re.compile(r"'''|\"\"\"|['\"]|[\[({]+|[\])}]+")
_PYTHON_STRING_END = {q: re.compile(r"\\|" + re.escape(q)) for q in ("'", '"', "'''", '"""')}


def _parse_pythonic(text: str, tools: Tools) -> ParsedTurn:
    del tools
    turn = _Turn()
    for marker in _PYTHON_MARKERS:
        text = text.replace(marker, "")
    pos = 0
    while match := _CALL_LIST.search(text, pos):
        end = _python_end(text, match.start())
        if end < 0:
            turn.content.append(text[pos:match.start()])
            turn.truncated = True
            return turn.result()
        turn.content.append(text[pos:match.start()])
        _python_calls(text[match.start():end], turn)
        pos = end
    turn.content.append(text[pos:])
    return turn.result()


def _python_end(text: str, start: int) -> int:
    """The end of the bracketed Python expression at text[start], or -1 if it stays open
    to the end of the text (string-aware)."""
    depth, pos = 0, start
    while match := _PYTHON_STRUCTURE.search(text, pos):
        pos, run = match.end(), match.group()
        if run[0] in "'\"":
            ending = _PYTHON_STRING_END[run]
            while (close := ending.search(text, pos)) and close.group() == "\\":
                pos = close.end() + 1
            if close is None:
                return -1
            pos = close.end()
        elif run[0] in "[({":
            depth += len(run)
        elif depth <= len(run):
            return match.start() + depth
        else:
            depth -= len(run)
    return -1


def _python_calls(source: str, turn: _Turn) -> None:
    try:
        with _LITERAL_LOCK, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tree = ast.parse(source, mode="eval")
    except (SyntaxError, ValueError, MemoryError, RecursionError) as error:
        reason = error.msg if isinstance(error, SyntaxError) else str(error)
        return turn.error(f"{echo(source)} is not a Python list of calls ({reason})")
    if not (isinstance(tree.body, ast.List)
            and all(isinstance(e, ast.Call) for e in tree.body.elts)):
        return turn.error(f"{echo(source)} is not a list of calls f(a=1)")
    for call in tree.body.elts:
        if not isinstance(call.func, ast.Name):
            turn.error(f"{echo(ast.unparse(call.func))} is not a plain function name")
        elif call.args or any(k.arg is None for k in call.keywords):
            turn.error(f"{call.func.id}: arguments must be given by name (name=value)")
        else:
            try:
                arguments = {k.arg: _literal(k.value) for k in call.keywords}
            except ValueError as error:
                turn.error(f"{call.func.id}: {error}")
            else:
                turn.add(call.func.id, arguments)


def _literal(node: ast.AST) -> Any:
    """A JSON value from a Python literal: None, True, numbers (negative ones too),
    strings, lists and dicts with string keys; ValueError for anything else."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _literal(node.operand)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{ast.unparse(node)[:40]!r} is not a literal")
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.Constant):
        value = node.value
        if value is None or isinstance(value, (bool, int, str)) or (
                isinstance(value, float) and math.isfinite(value)):
            return value
        raise ValueError(f"{value!r:.40} has no JSON form")
    if isinstance(node, ast.List):
        return [_literal(e) for e in node.elts]
    if isinstance(node, ast.Dict):
        if not all(isinstance(k, ast.Constant) and isinstance(k.value, str)
                   for k in node.keys):
            raise ValueError("dict keys must be strings")
        return {k.value: _literal(v) for k, v in zip(node.keys, node.values)}
    raise ValueError(f"argument values must be literals, got {ast.unparse(node)[:40]!r}")


TOOL_PARSERS.register("qwen3_coder")(ToolParser(_parse_qwen3_coder, (_FUNCTION,)))
TOOL_PARSERS.register("hermes")(ToolParser(_parse_hermes, (_TOOL_CALL,)))
TOOL_PARSERS.register("mistral")(ToolParser(_parse_mistral, (_TOOL_CALLS,)))
# Llama 4's and the Llama 3.2 pythonic templates ask for "[func_name1(params_name1=...".
TOOL_PARSERS.register("pythonic")(ToolParser(_parse_pythonic, ("[func_name1(",)))
# Llama 3.1's template asks for 'the format {"name": function name, "parameters":
# dictionary of argument name and its value}' and writes built-in calls after the tag.
TOOL_PARSERS.register("llama3_json")(ToolParser(
    _parse_llama3_json, ('"parameters": dictionary of argument name', _PYTHON_TAG)))
