"""CodeEnv: the policy writes a program, runs it against the visible tests, reads what
failed, fixes it, and submits.

Actions (hermes-style tool calls, as the python env):
  `<tool_call>{"name": "run", "arguments": {"code": "..."}}</tool_call>` runs the program
      against the task's visible tests in the sandbox; the observation (a `tool` chat
      turn) says how many passed and, for each failure, the assertion or the input,
      expected vs got, the stderr, a timeout — each clipped;
  `<tool_call>{"name": "submit", "arguments": {"code": "..."}}</tool_call>`, or a turn
      whose last fenced block (```python ... ```) is the program, ends the episode with
      that final program (`log.final_answer`).
Native format (`tool_format="native"`): `run` and `submit` are ordinary schemas the
model's chat template renders, the reply is read by the parser `tool_parser` names, and a
`submit` call, or a reply without calls whose last fenced block is the program, ends the
episode (envs/turns.py).
On the last allowed turn (`max_turns`), a `run` call has no turn left to read its result:
with `submit_at_limit` its program is submitted (stop_reason "submitted_at_limit"), the
latest program the policy wrote, as SWE-agent submits the working tree when an agent
exits on its step or cost limit ("autosubmission"); without it the episode ends with no
program (stop_reason "max_turns", reward 0). The format reward still counts only a
submission the policy made (`rewards.code.code_format_score`).
The hidden tests are run by the reward (`rewards.code.tests_score`), never by the env:
nothing of them reaches the policy. A HumanEval-style task's program runs after the
task's prompt (`rewards.code.assemble_program`), so the policy may complete the body or
write the whole function.

Limits: each test has `timeout_s` and `memory_mb` (address space); an episode's `run`
calls together may use `episode_time_s` seconds of sandbox time, after which `run`
answers that the budget is spent.
"""
from __future__ import annotations

import functools
import json
from typing import Any, Callable, Mapping, Sequence

from agentjax.core.task import Task, TurnLog
from agentjax.parsers.actions import Action, invalid, parse_tool_call
from agentjax.envs.python.env import sandbox_from
from agentjax.envs.sandbox import Sandbox
from agentjax.envs.tools import describe_tools, validate_arguments
from agentjax.envs.turns import NATIVE, TurnEnv, check_instruction, clip, fill_question
from agentjax.rewards import code as code_lib

DEFAULT_INSTRUCTION = (
    "Write a Python program that solves the problem. Run it against the examples with "
    "the run tool, read what failed, fix it; then give the final program in a "
    "```python block (or call submit).\n{question}\n"
)
# For a tiny model trained from scratch: it learns the protocol from demonstrations.
MINIMAL_INSTRUCTION = "{question}\n"

_CODE_PARAMETERS = {
    "type": "object",
    "properties": {"code": {"type": "string", "description": "the whole Python program"}},
    "required": ["code"],
    "additionalProperties": False,
}


class _CodeTool:
    """A tool's schema as the system prompt shows it (the env runs it)."""

    def __init__(self, name: str, description: str):
        self.name, self.description, self.parameters = name, description, _CODE_PARAMETERS


TOOL_FORMATS = ("hermes_prompt", NATIVE)

TOOLS = {
    "run": _CodeTool("run", "Runs the program against the problem's examples; returns "
                            "which failed and why."),
    "submit": _CodeTool("submit", "Submits the final program (ends the episode)."),
}


def system_prompt(submit_at_limit: bool = True) -> str:
    return (f"You can call tools. Their JSON function schemas:\n{describe_tools(TOOLS)}\n"
            "To call a tool, write one JSON object with its name and arguments between "
            "<tool_call> and </tool_call>. The result comes back in the next message. "
            "The final program is the one you submit, or the last ```python block of "
            "your last message" + ("; a program you run on your last turn is submitted."
                                   if submit_at_limit else "."))


def problem_text(task: Task) -> str:
    """What the policy reads: the statement, and the code to complete when there is."""
    starter = task.metadata.get("starter", "")
    if starter:
        return f"Complete this function:\n```python\n{starter.rstrip()}\n```"
    return task.question


def run_call(code: str) -> str:
    """The action text of a `run` tool call."""
    return ('<tool_call>{"name": "run", "arguments": {"code": ' + json.dumps(code)
            + "}}</tool_call>")


def final_block(code: str) -> str:
    """The action text of a final program in a fenced block."""
    return f"```python\n{code.rstrip()}\n```"


def describe_failure(test: Any, result: code_lib.TestResult, *, timeout_s: float,
                     memory_mb: int, max_chars: int) -> str:
    """One failed test as the policy reads it."""
    if isinstance(test, str):
        lines = [f"FAILED: {clip(test.strip(), max_chars)}"]
    else:
        lines = [f"FAILED: input {clip(test.get('stdin', ''), max_chars)!r}",
                 f"expected output: {clip(test['stdout'], max_chars)!r}",
                 f"got: {clip(result.stdout, max_chars)!r}"]
    if result.expected is not None:
        lines += [f"expected: {clip(result.expected, max_chars)}",
                  f"got: {clip(result.got or '', max_chars)}"]
    status = {"timeout": f"timed out after {timeout_s:g} s",
              "oom": f"out of memory (limit {memory_mb} MB)",
              "output_limit": "printed too much: stopped",
              "not_run": "the program stopped the test harness"}.get(result.status)
    if status:
        lines.append(status)
    if result.stderr.strip():
        lines.append("stderr: " + clip(result.stderr.strip(), max_chars))
    return "\n".join(lines)


def run_report(tests: Sequence[Any], results: Sequence[code_lib.TestResult], *,
               timeout_s: float, memory_mb: int, max_failures: int, max_chars: int) -> str:
    """The `run` observation: how many passed, then the first failures."""
    passed = sum(r.passed for r in results)
    lines = [f"{passed} of {len(results)} tests passed."]
    failures = [(t, r) for t, r in zip(tests, results) if not r.passed]
    for test, result in failures[:max_failures]:
        lines.append(describe_failure(test, result, timeout_s=timeout_s,
                                      memory_mb=memory_mb, max_chars=max_chars))
    if len(failures) > max_failures:
        lines.append(f"({len(failures) - max_failures} more failed)")
    return "\n".join(lines)


class CodeEnv(TurnEnv):
    """Write, run, fix, submit (module docstring).

    Args:
      sandbox: a Sandbox, a dict of Sandbox kwargs, or None (the shared default sandbox).
      max_turns: policy turns per episode, the submitting one included.
      timeout_s, memory_mb: limits of each test.
      episode_time_s: sandbox seconds all of an episode's `run` calls may use.
      max_failures_shown: failed tests a `run` observation describes.
      max_detail_chars: each part of a failure description (the test, expected, got,
        stderr) is cut to this many characters.
      max_observation_chars: every observation is cut to this many characters.
      submit_at_limit: a `run` call on the last allowed turn submits its program
        (module docstring).
      instruction: user prompt template with a `{question}` slot.
      tool_prompt: a system message describes the tools (`system_prompt`); False for a
        tiny model that learns the protocol from demonstrations (fewer tokens).
      tests_runner: `(program, tests, *, timeout_s, memory_mb) -> [TestResult]` behind
        `run`; default `rewards.code.run_tests` in `sandbox`. (A scripted demonstrator's
        own programs may run in-process: envs/code/world.py.)
      tool_format: "hermes_prompt" (the schemas in a system message, hermes tags) or
        "native" (module docstring).
      tool_parser: the native format's parser name, or "auto" (from the tokenizer).
    """

    answer_tool = "submit"

    stop = ("</tool_call>",)
    observation_role = "tool"

    def __init__(self, sandbox: Sandbox | Mapping[str, Any] | None = None, *,
                 max_turns: int = 4, timeout_s: float = 5.0, memory_mb: int = 512,
                 episode_time_s: float = 60.0, max_failures_shown: int = 3,
                 max_detail_chars: int = 300, max_observation_chars: int = 2000,
                 submit_at_limit: bool = True,
                 instruction: str = DEFAULT_INSTRUCTION, tool_prompt: bool = True,
                 tests_runner: Callable[..., list[code_lib.TestResult]] | None = None,
                 tool_format: str = "hermes_prompt", tool_parser: str = "auto"):
        super().__init__(max_turns, max_observation_chars)
        if tool_format not in TOOL_FORMATS:
            raise ValueError(f"tool_format must be one of {TOOL_FORMATS}, got {tool_format!r}")
        self.tool_format, self.tool_parser = tool_format, tool_parser
        if tool_format == NATIVE:
            self.stop = ()  # the turn ends at the template's end-of-turn token
        if episode_time_s <= 0 or max_failures_shown < 1 or max_detail_chars < 1:
            raise ValueError(f"episode_time_s, max_failures_shown and max_detail_chars must "
                             f"be positive, got {episode_time_s}, {max_failures_shown}, "
                             f"{max_detail_chars}")
        self.sandbox = sandbox_from(sandbox)
        self.timeout_s, self.memory_mb = float(timeout_s), int(memory_mb)
        self.episode_time_s = float(episode_time_s)
        self.max_failures_shown, self.max_detail_chars = max_failures_shown, max_detail_chars
        self.submit_at_limit = bool(submit_at_limit)
        self.instruction = check_instruction(instruction)
        self.tool_prompt = tool_prompt
        self.tests_runner = tests_runner or functools.partial(code_lib.run_tests,
                                                              sandbox=self.sandbox)
        self._time_used = 0.0

    def initial_messages(self, task: Task) -> list[dict[str, str]]:
        self._time_used = 0.0
        user = {"role": "user", "content": fill_question(self.instruction, problem_text(task))}
        if not self.tool_prompt or self.tool_format == NATIVE:
            return [user]  # native: the template renders the tools
        return [{"role": "system", "content": system_prompt(self.submit_at_limit)}, user]

    def parse(self, action_text: str) -> Action:
        action = parse_tool_call(action_text, tools=TOOLS)
        if action.kind == "answer":  # an <answer> tag: its program
            return Action(kind="answer", answer=code_lib.extract_code(action.answer))
        if action.kind == "tool_call":
            problem = validate_arguments(_CODE_PARAMETERS, action.arguments)
            if problem:
                return invalid(f"{action.tool_name}: {problem}")
            if action.tool_name == "submit":
                return Action(kind="answer", answer=action.arguments["code"])
            return action
        block = code_lib.last_fenced_block(action_text)
        if block is not None and "<tool_call>" not in action_text:
            return Action(kind="answer", answer=block)
        return action

    def native_tools(self) -> dict[str, _CodeTool]:
        return TOOLS

    def native_answer(self, content: str, calls: list[dict]) -> str | None:
        submitted = [c for c in calls if c["function"]["name"] == self.answer_tool]
        if submitted:
            return submitted[-1]["function"]["arguments"]["code"]
        return code_lib.last_fenced_block(content)

    def native_call(self, action: Action, text: str) -> tuple[str, dict] | None:
        if action.kind == "answer" and "<tool_call>" in text:  # a `submit` call
            return "submit", {"code": action.answer}
        return super().native_call(action, text)

    def native_final_turn(self, calls: list[dict]) -> None:
        if self.submit_at_limit:  # the last `run` call's program, as final_turn
            self.log.final_answer = calls[-1]["function"]["arguments"]["code"]
            self._finish("submitted_at_limit")
        else:
            self._finish("max_turns")

    def corrective_observation(self, action: Action) -> str:
        return (f"Invalid action: {action.error}. Run a program with <tool_call>"
                '{"name": "run", "arguments": {"code": "..."}}</tool_call>, or give the '
                "final program in a ```python block.")

    def final_turn(self, action: Action) -> None:
        if self.submit_at_limit and action.kind == "tool_call":  # `run`: submit is an answer
            self.log.final_answer = action.arguments["code"]
            self._finish("submitted_at_limit")
        else:
            super().final_turn(action)

    def act(self, action: Action, turn: TurnLog) -> None:
        task = self.log.task
        tests = task.metadata.get("visible_tests") or []
        if not tests:
            turn.observation = "This problem has no examples to run against."
            return
        if self._time_used >= self.episode_time_s:
            turn.observation = (f"The run budget of this episode ({self.episode_time_s:g} s "
                                "of test time) is spent: submit your program.")
            turn.error = "run: episode time budget spent"
            return
        program = code_lib.assemble_program(
            action.arguments["code"], prefix=task.metadata.get("prefix", ""),
            entry_point=task.metadata.get("entry_point"))
        # No more tests' deadlines than the budget has room for.
        timeout_s = min(self.timeout_s, max(self.episode_time_s - self._time_used, 0.1))
        try:
            results = self.tests_runner(program, tests, timeout_s=timeout_s,
                                        memory_mb=self.memory_mb)
        except Exception as e:  # a broken sandbox must not end the run
            turn.observation = f"The run tool failed: {type(e).__name__}: {e}"
            turn.error = turn.observation
            return
        self._time_used += sum(r.duration_s for r in results)
        turn.observation = run_report(tests, results, timeout_s=timeout_s,
                                      memory_mb=self.memory_mb,
                                      max_failures=self.max_failures_shown,
                                      max_chars=self.max_detail_chars)
        passed = sum(r.passed for r in results)
        turn.extra.update(visible_passed=passed, visible_total=len(results))
