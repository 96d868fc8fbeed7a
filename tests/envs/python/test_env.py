"""PythonEnv: hermes tool calls run in the real sandbox; errors become observations."""
import json

import pytest

from agentjax.core.task import Task
from agentjax.envs.base import Env
from agentjax.envs.python.env import PythonEnv, PythonTool, format_result
from agentjax.envs.sandbox import Sandbox, SandboxResult
from agentjax.envs.tools import register_tool

TASK = Task("sum", "What is the sum of the squares of 1..10?", ("385",))


def call(code=None, name="python", **arguments):
    if code is not None:
        arguments["code"] = code
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": arguments})}\n</tool_call>'


@pytest.fixture(scope="module")
def sandbox():
    return Sandbox(max_parallel=2, memory_mb=256)


@register_tool("test_python_env_upper")
class Upper:
    name = "upper"
    description = "Upper-cases text."
    parameters = {"type": "object", "properties": {"text": {"type": "string"}},
                  "required": ["text"]}

    def __call__(self, arguments):
        return arguments["text"].upper()


class Crashing:
    name = "crash"
    description = "Always fails."
    parameters = {"type": "object", "properties": {}}

    def __call__(self, arguments):
        raise RuntimeError("internal bug")


def test_python_episode(sandbox):
    env = PythonEnv(sandbox=sandbox, max_turns=4)
    assert isinstance(env, Env)
    assert env.stop == ("</tool_call>", "</answer>") and env.observation_role == "tool"
    system, user = env.reset(TASK)
    assert '"name": "python"' in system["content"] and TASK.question in user["content"]
    assert [s["function"]["name"] for s in env.tool_schemas] == ["python"]

    obs, done, reward, info = env.step(
        "I'll compute it.\n" + call("print(sum(i * i for i in range(1, 11)))"))
    assert (obs, done, reward, info["error"]) == ("385", False, 0.0, None)
    turn = env.log.turns[0]
    assert turn.tool_name == "python" and turn.tool_args == {
        "code": "print(sum(i * i for i in range(1, 11)))"}

    obs, done, _, info = env.step(call("import sys\nprint('partial')\n1 / 0"))
    assert not done and obs.startswith("partial\n[stderr]\nTraceback")
    assert obs.endswith("ZeroDivisionError: division by zero\n[exit code 1]")
    assert info["error"] == "python: error: ZeroDivisionError: division by zero"
    assert env.log.turns[1].extra["status"] == "error"

    obs, done, _, info = env.step("<answer>385</answer>")
    assert done and env.log.final_answer == "385" and env.log.stop_reason == "answer"
    assert env.log.num_tool_calls == 2 and env.log.num_invalid == 0


def test_sandbox_limits_reach_the_policy_as_observations(sandbox):
    env = PythonEnv(sandbox, max_turns=5, timeout_s=1, memory_mb=64,
                    max_observation_chars=300)
    env.reset(TASK)
    obs = env.step(call("while True: pass")).observation
    assert obs == "[timed out after 1 s]" and env.log.turns[-1].extra["status"] == "timeout"
    obs = env.step(call("x = bytearray(2**30)")).observation
    assert obs.endswith("MemoryError\n[out of memory: limit 64 MB]")
    obs = env.step(call("print('y' * 10**6)")).observation
    assert len(obs) < 400 and "characters omitted" in obs
    assert obs.endswith("[output limit exceeded: the program was stopped]")
    assert [t.error.split(":")[1].strip() for t in env.log.turns] == [
        "timeout", "oom", "output_limit"]


def test_invalid_calls_get_corrective_observations(sandbox):
    env = PythonEnv(sandbox, max_turns=10, tools=("test_python_env_upper", Crashing()))
    env.reset(TASK)
    cases = [
        ("no tool call here", "no action"),
        ("<tool_call>{not json}</tool_call>", "not valid JSON"),
        (call("1", name="shell"), "unknown tool 'shell'"),
        (call(None), "python: missing required argument(s): code"),
        (call(5), "python: argument 'code' must be of type string"),
        (call("1", extra=2), "python: unexpected argument(s): 'extra'"),
    ]
    for text, error in cases:
        obs, done, _, info = env.step(text)
        assert not done and not info["valid"] and error in info["error"]
        assert obs.startswith(f"Invalid action: {info['error']}")
        assert "(tools: python, upper, crash)" in obs
    assert env.log.num_invalid == len(cases) and env.log.num_tool_calls == 0
    assert env.log.turns[2].extra == {"unknown_tool": "shell"}
    # Extra tools plug in by name and by object; a crashing tool is an observation too.
    assert env.step(call(None, name="upper", text="hi")).observation == "HI"
    obs, done, _, info = env.step(call(None, name="crash"))
    assert not done and obs == "Tool 'crash' failed: RuntimeError: internal bug"
    assert info["error"] == obs


def test_max_turns(sandbox):
    env = PythonEnv(sandbox, max_turns=2)
    env.reset(TASK)
    env.step(call("print(1)"))
    obs, done, _, info = env.step(call("print(2)"))
    assert (obs, done, info["stop_reason"]) == ("", True, "max_turns")
    assert env.log.turns[-1].tool_args == {"code": "print(2)"}


def test_config_building_and_duplicates():
    with pytest.raises(ValueError, match="appears twice"):
        PythonEnv(Sandbox(max_parallel=1), tools=(PythonTool(Sandbox(max_parallel=1)),))
    env = PythonEnv(sandbox={"max_parallel": 1, "timeout_s": 3})
    assert env.tools["python"].sandbox.timeout_s == 3


def test_format_result():
    ok = SandboxResult("ok", 0, "out\n", "warn\n", 0.1)
    assert format_result(ok, 5, 64) == "out\n[stderr]\nwarn"
    assert format_result(SandboxResult("ok", 0, "", "", 0.1), 5, 64) == "(no output)"


class Huge:
    name = "huge"
    description = "Returns a megabyte, or fails with one."
    parameters = {"type": "object", "properties": {"fail": {"type": "boolean"}}}

    def __call__(self, arguments):
        if arguments.get("fail"):
            raise RuntimeError("x" * 2**20)
        return "y" * 2**20


class NotText:
    name = "not_text"
    description = "Returns a number (a broken tool)."
    parameters = {"type": "object", "properties": {}}

    def __call__(self, arguments):
        return 42


def test_every_observation_is_capped(sandbox):
    env = PythonEnv(sandbox, max_turns=10, tools=(Huge(), NotText()),
                    max_observation_chars=300)
    env.reset(TASK)
    actions = [call(None, name="huge"), call(None, name="huge", fail=True),
               call(None, name="n" * 2**20),  # an unknown tool's name is echoed back
               call(None, name="huge", **{"k" * 2**20: 1}), call("print('z' * 10**6)")]
    for action in actions:
        obs, done, _, info = env.step(action)
        assert not done and 0 < len(obs) <= 300 and len(info["error"] or "") <= 300
    obs, _, _, info = env.step(call(None, name="not_text"))
    assert obs == "Tool 'not_text' failed: TypeError: the tool returned int, not str"


def test_lone_surrogate_in_code_is_a_python_error(sandbox):
    code = json.dumps("print('\ud800')")  # JSON escapes decode to a lone surrogate
    env = PythonEnv(sandbox)
    env.reset(TASK)
    obs, done, _, info = env.step(
        f'<tool_call>{{"name": "python", "arguments": {{"code": {code}}}}}</tool_call>')
    assert not done and info["valid"] and "SyntaxError" in obs
    assert info["error"].startswith("python: error")
    obs.encode("utf-8")  # the observation is valid UTF-8
