"""A seeded corpus of hostile action strings, and a runner that checks every path from
an action to an observation and a reward holds up against it.

    actions = fuzz_actions(seed=0, count=300)          # [(category, action text)]
    result = run_fuzz(actions)                         # FuzzResult
    result.counts["huge"]                              # (tried, held, seconds)

A case *held* when, for the parsers (every tool-call format of
parsers/tool_calls.py too), `SearchEnv.step` (tags and tool-call formats),
`PythonEnv.step` and the composite reward over each resulting episode log: no exception
escaped, every observation came back as valid UTF-8 within its env's
`max_observation_chars`, and each step took less than `max_step_s`. Used by
tests/envs/test_fuzz.py and the reliability benchmark.
"""
from __future__ import annotations

import dataclasses
import json
import random
import time
from typing import Callable

from agentjax.core.task import Task
from agentjax.parsers.actions import parse_search_r1, parse_tool_call
from agentjax.parsers.tool_calls import TOOL_PARSERS, parse_tool_calls
from agentjax.envs.python.env import PythonEnv, default_sandbox
from agentjax.envs.retrieval import BM25Retriever
from agentjax.envs.sandbox import Sandbox
from agentjax.envs.search.env import SearchEnv
from agentjax.rewards.composite import RewardFn, make_reward_fn
from tests.envs.conftest import world_records

MEGABYTE = 2**20
TAGS = ("search", "answer", "tool_call", "think", "information")
TASK = Task("fuzz", "Which company does the person born in Thornbury work for?",
            ("Acme Dynamics",), metadata={"bridge_entities": ["Dumont"]})

# Programs a policy might run to hurt the host or the run; the sandbox must contain each
# and the env must report it as an observation.
HOSTILE_PROGRAMS = (
    "while True: pass",
    "import os\nwhile True: os.fork()",
    "x = []\nwhile True: x.append(' ' * 2**20)",
    "print('x' * 10**7)",
    "import sys\nsys.stderr.write('e' * 10**7)",
    "import os, signal\nos.kill(1, signal.SIGKILL)",
    "print(open('/etc/shadow').read())",
    "import sys\nsys.exit(3)",
    "def f(): return f()\nf()",
    "open('big', 'wb').write(b'0' * 2**30)",
    "import socket\nsocket.create_connection(('1.1.1.1', 80), timeout=1)",
    "import time\ntime.sleep(60)",
    "print(input())",
    "print('\\ud800')",
    "print('a\\x00b')",
    "import sys\nsys.stdout.buffer.write(bytes(range(256)))",
    "raise SystemExit('\\udcff' * 10)",
    "import ctypes\nctypes.string_at(0)",
    "exec('(' * 10**6)",
    "",
)


def fuzz_actions(seed: int, count: int) -> list[tuple[str, str]]:
    """`count` hostile actions as (category, text), the same for the same seed.

    Categories are drawn with the weights of `GENERATORS`; "huge" (about 1 MB each) and
    "hostile_python" (one sandbox run each) are kept rare, as each costs most.
    """
    rng = random.Random(seed)
    names = list(GENERATORS)
    weights = [GENERATORS[n][0] for n in names]
    cases = []
    for _ in range(count):
        name = rng.choices(names, weights)[0]
        cases.append((name, GENERATORS[name][1](rng)))
    return cases


def _tag(rng: random.Random, closing: bool | None = None) -> str:
    closing = rng.random() < 0.5 if closing is None else closing
    return f"<{'/' if closing else ''}{rng.choice(TAGS)}>"


def _tool_call(name, arguments) -> str:
    return f'<tool_call>{json.dumps({"name": name, "arguments": arguments})}</tool_call>'


def _random_bytes(rng: random.Random) -> str:
    # surrogateescape turns every invalid UTF-8 byte into a lone surrogate, as a
    # careless byte-level decoder could.
    data = rng.randbytes(rng.randrange(2000))
    return data.decode("utf-8", "surrogateescape")


_UNICODE_RANGES = ((0x0, 0x7F), (0x80, 0x7FF), (0x300, 0x36F), (0x590, 0x6FF),
                   (0x200B, 0x200F), (0x202A, 0x202E), (0xD800, 0xDFFF), (0xE000, 0xF8FF),
                   (0xFFF0, 0xFFFF), (0x1F300, 0x1FAFF), (0x10FF00, 0x10FFFF))


def _unicode(rng: random.Random) -> str:
    chars = [chr(rng.randint(*rng.choice(_UNICODE_RANGES))) for _ in range(rng.randrange(500))]
    for _ in range(rng.randrange(4)):
        chars.insert(rng.randrange(len(chars) + 1), _tag(rng))
    return "".join(chars)


def _nested_tags(rng: random.Random) -> str:
    depth = rng.randrange(1, 200)
    opened = [rng.choice(TAGS) for _ in range(depth)]
    inner = rng.choice(["x", "", " q ", '{"name": "search", "arguments": {"query": "q"}}'])
    closed = [f"</{t}>" for t in reversed(opened)]
    if rng.random() < 0.5:  # close in the wrong order
        rng.shuffle(closed)
    return "".join(f"<{t}>" for t in opened) + inner + "".join(closed)


def _unbalanced_tags(rng: random.Random) -> str:
    parts = []
    for _ in range(rng.randrange(1, 60)):
        parts.append(rng.choice([_tag(rng), _tag(rng), "text", " ", "<", ">", "</", "/>",
                                 "<search", "answer>", "\n"]))
    return "".join(parts)


def _repeated_tags(rng: random.Random) -> str:
    unit = "".join(_tag(rng) for _ in range(rng.randrange(1, 4))) + rng.choice(["", "q"])
    return unit * rng.randrange(1000, 50_000)


def _huge(rng: random.Random) -> str:
    shape = rng.choice([
        lambda: "<search>" * (MEGABYTE // 8),
        lambda: "<tool_call>" * (MEGABYTE // 11),
        lambda: "<search>" + "q " * (MEGABYTE // 2) + "</search>",
        lambda: "<answer>" + "a" * MEGABYTE + "</answer>",
        lambda: _tool_call("n" * MEGABYTE, {}),
        lambda: _tool_call("search", {"k" * MEGABYTE: 1}),
        lambda: _tool_call("python", {"code": "x = 1\n" * (MEGABYTE // 6)}),
        lambda: '<tool_call>{"name": "search", "arguments": {"query": ' + "9" * MEGABYTE
                + "}}</tool_call>",
        lambda: "<tool_call>" + "[" * MEGABYTE + "</tool_call>",
        lambda: "<tool_call>" + '{"a":' * (MEGABYTE // 5) + "</tool_call>",
        lambda: "\x00" * MEGABYTE,
    ])
    return shape()


def _null_bytes(rng: random.Random) -> str:
    return rng.choice([
        "<search>\x00</search>",
        "<search>q\x00uery</search>",
        "<answer>\x00</answer>",
        "<sea\x00rch>q</search>",
        '<tool_call>{"name": "search", "arguments": {"query": "\\u0000"}}</tool_call>',
        '<tool_call>{"name": "sea\x00rch", "arguments": {}}</tool_call>',
        _tool_call("python", {"code": "print(1)\x00"}),
        "\x00" * rng.randrange(1, 1000),
    ])


def _malformed_json(rng: random.Random) -> str:
    body = rng.choice([
        "", "{", "}", "{'name': 'search'}", '{"name": "search",}', '{"name": search}',
        '{"name": "search", "arguments": {"query": "q"}', '{"name": NaN}', "null", "[]",
        '"search"', "1e999999", '{"name": 1}', '{"name": ["search"]}',
        '{"name": "search", "arguments": [1]}', '{"name": "search", "arguments": "{bad"}',
        '{"name": "search", "arguments": "{\\"query\\": \\"q\\"}"}',
        '{"name": "search", "name": "python", "arguments": {"code": "print(1)"}}',
        '{"name": "search", "arguments": {"query": "\\ud800"}}',
        '{"name": "python", "arguments": {"code": "\\udcff"}}',
        '{"name": "search", "arguments": {"query": ' + "[" * 5000 + "}}",
        '{"name": "python", "arguments": {"code": "print(1)", "extra": {}}}',
        '{"name": "python", "arguments": {"code": 5}}',
        '{"name": "python", "arguments": {"code": true}}',
        '{"name": "search", "arguments": {"query": ""}}',
        '{"name": "' + "\\" * rng.randrange(1, 50) + '"}',
        '{"name": "search", "arguments": {"query": ' + "1" * 5000 + "}}",
    ])
    return f"<tool_call>{body}</tool_call>"


# The tool-call formats' markup (parsers/tool_calls.py) and the pieces that break it.
_NATIVE_MARKUP = ("<tool_call>", "</tool_call>", "<tool_call>\n", "\n</tool_call>",
                  "<function=", "</function>", "<parameter=", "</parameter>", ">",
                  "[TOOL_CALLS]", "[TOOL_CALLS] [", "[ARGS]", "[CALL_ID]",
                  "<|python_tag|>", "<|python_start|>", "<|python_end|>", ";",
                  "[f(", "a=", ")]", "'''", '"""', "'", '"', "\\", "{", "}", "[", "]", "(",
                  ")", '"name"', '"arguments"', '"parameters"', ":", ",", "python", "null",
                  "true", "1e999", "-1", "\ud800", "\x00", "\n", " ", "x")
# Tool schemas for the formats that type values by them (qwen3_coder).
NATIVE_TOOLS = [{"type": "function", "function": {"name": "python", "parameters": {
    "type": "object", "properties": {"code": {"type": "string"}, "n": {"type": "integer"},
                                     "x": {"type": "number"}, "on": {"type": "boolean"},
                                     "a": {"type": "array"}, "o": {"type": "object"}}}}}]


def _native_tool_calls(rng: random.Random) -> str:
    markup = _NATIVE_MARKUP
    shape = rng.choice([
        lambda: "".join(rng.choice(markup) for _ in range(rng.randrange(1, 80))),
        lambda: rng.choice(markup[:17]) * rng.randrange(1000, 50_000),
        lambda: "<tool_call>\n<function=python>\n" + "".join(
            f"<parameter={rng.choice('noxacq')}>\n{rng.choice(markup)}\n</parameter>\n"
            for _ in range(rng.randrange(1, 20))) + rng.choice(["</function>\n</tool_call>",
                                                                 ""]),
        lambda: "[TOOL_CALLS]" + rng.choice(["python[ARGS]", " [", "python[CALL_ID]ab[ARGS]"])
        + json.dumps({"code": "x" * rng.randrange(10_000), "n": [1] * 100}),
        lambda: "<|python_tag|>" + ";".join(
            json.dumps({"name": "python", "parameters": {"code": rng.choice(markup)}})
            for _ in range(rng.randrange(1, 100))),
        lambda: "[" + ", ".join(f"python(code={rng.choice(markup)!r}, n={rng.randrange(-9, 9)})"
                                for _ in range(rng.randrange(1, 100))) + rng.choice(["]", ""]),
        lambda: "[f(a=" + "[" * rng.randrange(1, 500) + "'x'" * rng.randrange(1, 500),
    ])
    return shape()


def _hostile_python(rng: random.Random) -> str:
    return _tool_call("python", {"code": rng.choice(HOSTILE_PROGRAMS)})


# name -> (weight, generator)
GENERATORS: dict[str, tuple[float, Callable[[random.Random], str]]] = {
    "random_bytes": (12, _random_bytes),
    "unicode": (12, _unicode),
    "nested_tags": (12, _nested_tags),
    "unbalanced_tags": (14, _unbalanced_tags),
    "repeated_tags": (8, _repeated_tags),
    "huge": (3, _huge),
    "null_bytes": (10, _null_bytes),
    "malformed_json": (20, _malformed_json),
    "hostile_python": (4, _hostile_python),
    "native_tool_calls": (12, _native_tool_calls),
}


@dataclasses.dataclass
class FuzzResult:
    """What `run_fuzz` saw.

    Attributes:
      counts: category -> (tried, held, seconds spent on its cases).
      failures: one line per case that did not hold: category, what broke, the action's
        head.
    """

    counts: dict[str, tuple[int, int, float]]
    failures: list[str]


def fuzz_envs(sandbox: Sandbox | None = None) -> list:
    """The envs each action goes through: search with tags, search with tool calls, and
    python (1 s per program, 256 MB)."""
    retriever = BM25Retriever.from_corpus(world_records())
    return [SearchEnv(retriever, max_turns=2),
            SearchEnv(retriever, max_turns=2, action_format="tool_call"),
            PythonEnv(sandbox or default_sandbox(), max_turns=2, timeout_s=1.0, memory_mb=256)]


def fuzz_reward_fn() -> RewardFn:
    """Every reward that reads the policy's text: answers, format, tool use, subgoals."""
    return make_reward_fn({"components": {
        "exact_match": 1.0, "f1": 1.0, "math_match": 1.0, "format": 0.1,
        "tool_shaping": 0.1, "process": 0.1,
        "length": {"weight": 0.1, "penalty": "linear", "target": 1, "coef": 0.1}}})


def run_fuzz(actions: list[tuple[str, str]], *, sandbox: Sandbox | None = None,
             max_step_s: float = 3.0) -> FuzzResult:
    """Runs every action through the parsers, each env of `fuzz_envs` and the rewards.

    Args:
      actions: (category, text) pairs, e.g. from `fuzz_actions`.
      sandbox: the python env's sandbox (None: the shared default).
      max_step_s: a step (parse, env step and rewards for one env) must take less; a
        program that runs into the python env's 1 s limit takes about that long.
    """
    envs, reward_fn = fuzz_envs(sandbox), fuzz_reward_fn()
    counts: dict[str, list] = {}
    failures = []
    for category, action in actions:
        start = time.perf_counter()
        problem = _check_case(action, envs, reward_fn, max_step_s)
        tally = counts.setdefault(category, [0, 0, 0.0])
        tally[0] += 1
        tally[1] += problem is None
        tally[2] += time.perf_counter() - start
        if problem is not None:
            failures.append(f"{category}: {problem}; action {action[:80]!r} "
                            f"({len(action)} characters)")
    return FuzzResult({k: (v[0], v[1], round(v[2], 3)) for k, v in counts.items()}, failures)


def _check_case(action: str, envs: list, reward_fn: RewardFn,
                max_step_s: float) -> str | None:
    """None when the action held everywhere, else what broke."""
    start = time.perf_counter()
    for parser in TOOL_PARSERS:
        try:
            turn = parse_tool_calls(parser, action, tools=NATIVE_TOOLS)
        except Exception as error:  # noqa: BLE001 - what escaped is the finding
            return f"tool parser {parser} raised {type(error).__name__}: {str(error)[:200]}"
        if not all(isinstance(call.arguments, dict) for call in turn.calls):
            return f"tool parser {parser} gave arguments that are not a dict"
    elapsed = time.perf_counter() - start
    if elapsed >= max_step_s:
        return f"the tool parsers took {elapsed:.2f} s"
    for env in envs:
        start = time.perf_counter()
        try:
            parse_search_r1(action)
            parse_tool_call(action, tools={"search", "python"})
            env.reset(TASK)
            observation = env.step(action).observation
            reward_fn(TASK, env.log)
        except Exception as error:  # noqa: BLE001 - what escaped is the finding
            return f"{type(env).__name__} raised {type(error).__name__}: {str(error)[:200]}"
        elapsed = time.perf_counter() - start
        where = f"{type(env).__name__}({getattr(env, 'action_format', 'tool_call')})"
        if not isinstance(observation, str) or len(observation) > env.max_observation_chars:
            return f"{where}: observation of {len(observation)} characters"
        try:
            observation.encode("utf-8")
        except UnicodeEncodeError:
            return f"{where}: observation is not valid UTF-8"
        if elapsed >= max_step_s:
            return f"{where}: step took {elapsed:.2f} s"
    return None
