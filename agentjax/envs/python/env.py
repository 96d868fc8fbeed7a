"""PythonEnv: tool calling with a sandboxed `python` tool (code / maths).

Formats (`tool_format`):
  "hermes_prompt" (default): the tools' schemas written into a system message by hand;
      the policy writes `<tool_call>{"name": "python", "arguments": {"code": "..."}}
      </tool_call>` and gets the program's output back as a `tool` chat turn;
      `<answer>…</answer>` ends the episode.
  "native": the schemas go to the model's chat template, the reply is read by the
      parser `tool_parser` names, several calls a turn run in order, and a reply with
      no call is the final answer (envs/turns.py). More tools plug in by name (`tools=("calculator",)` builds them with
`make_tool`). The verifier reward (unit tests, answer match) is computed by rewards/
from `(task, log)`.
"""
from __future__ import annotations

import functools
from typing import Any, Mapping, Sequence

from agentjax.core.task import Task, TurnLog
from agentjax.parsers.actions import Action, parse_tool_call
from agentjax.envs.sandbox import Sandbox, SandboxResult
from agentjax.envs.tools import (Tool, ToolError, make_tool, register_tool, tool_schema,
                                 tools_system_prompt, validate_arguments)
from agentjax.envs.turns import NATIVE, TurnEnv, check_instruction, clip, fill_question

TOOL_FORMATS = ("hermes_prompt", NATIVE)

DEFAULT_INSTRUCTION = (
    "Solve the problem. You may run Python code with the python tool; print the values "
    "you need to see. Give the final answer between <answer> and </answer>.\n"
    "Problem: {question}\n"
)


@functools.lru_cache(maxsize=1)
def default_sandbox() -> Sandbox:
    """One Sandbox shared by every env and tool built without their own."""
    return Sandbox()


def sandbox_from(spec: Sandbox | Mapping[str, Any] | None) -> Sandbox:
    """A Sandbox from a Sandbox, a dict of Sandbox kwargs (config) or None (the shared
    default)."""
    if spec is None:
        return default_sandbox()
    if isinstance(spec, Mapping):
        return Sandbox(**spec)
    return spec


@register_tool("python")
class PythonTool:
    """Runs a Python program in the sandbox and returns what it printed.

    Args:
      sandbox: a Sandbox, a dict of Sandbox kwargs (from config), or None for the shared
        default sandbox.
      timeout_s: wall-clock limit per call.
      memory_mb: address-space limit per call.
      max_output_chars: the observation is cut to this many characters (head and tail
        kept, see `turns.clip`).

    Raises ToolError (the env shows its text to the policy) when the program fails, times
    out, runs out of memory or prints too much; `ToolError.extra` holds the status.
    """

    name = "python"
    description = ("Runs a Python 3 program (standard library only, no network, nothing "
                   "kept between calls) and returns its stdout and stderr.")
    parameters = {
        "type": "object",
        "properties": {"code": {"type": "string", "description": "the program to run"}},
        "required": ["code"],
        "additionalProperties": False,
    }

    def __init__(self, sandbox: Sandbox | Mapping[str, Any] | None = None, *,
                 timeout_s: float = 5.0, memory_mb: int = 512, max_output_chars: int = 2000):
        self.sandbox = sandbox_from(sandbox)
        self.timeout_s = timeout_s
        self.memory_mb = memory_mb
        self.max_output_chars = max_output_chars

    def __call__(self, arguments: Mapping[str, Any]) -> str:
        result = self.sandbox.run(arguments["code"], timeout_s=self.timeout_s,
                                  memory_mb=self.memory_mb)
        text = clip(format_result(result, self.timeout_s, self.memory_mb),
                    self.max_output_chars)
        if result.status != "ok":
            stderr_lines = result.stderr.strip().splitlines()
            summary = result.status + (f": {stderr_lines[-1]}" if stderr_lines else "")
            raise ToolError(text, summary=summary, extra={
                "status": result.status, "exit_code": result.exit_code,
                "duration_s": result.duration_s})
        return text


def format_result(result: SandboxResult, timeout_s: float, memory_mb: int) -> str:
    """What the policy sees of a run: stdout, stderr, and how it ended when not ok."""
    parts = [result.stdout.rstrip("\n")] if result.stdout else []
    if result.stderr:
        parts.append("[stderr]\n" + result.stderr.rstrip("\n"))
    status = {
        "ok": None,
        "error": f"[exit code {result.exit_code}]",
        "timeout": f"[timed out after {timeout_s:g} s]",
        "oom": f"[out of memory: limit {memory_mb} MB]",
        "output_limit": "[output limit exceeded: the program was stopped]",
    }[result.status]
    if status:
        parts.append(status)
    return "\n".join(parts) if parts else "(no output)"


class PythonEnv(TurnEnv):
    """Multi-turn tool use with a sandboxed python tool.

    Args:
      sandbox: Sandbox, dict of Sandbox kwargs, or None (the shared default sandbox).
      max_turns: policy turns per episode, the answering turn included.
      tools: further tools, as Tool objects or registered names (built with `make_tool`).
      timeout_s, memory_mb: limits of each python call.
      max_observation_chars: every observation (tool output, errors, corrections) is
        cut to this many characters.
      instruction: user prompt template with a `{question}` slot.
      tool_format: "hermes_prompt" or "native" (module docstring).
      tool_parser: the native mode's parser name, or "auto" (from the tokenizer).

    Attributes:
      tools: name -> Tool; `tool_schemas` lists their function schemas for chat templates
        that take `tools=` (the system message already describes them).
    """

    stop = ("</tool_call>", "</answer>")
    observation_role = "tool"

    def __init__(self, sandbox: Sandbox | Mapping[str, Any] | None = None, *,
                 max_turns: int = 4, tools: Sequence[Tool | str] = (),
                 timeout_s: float = 5.0, memory_mb: int = 512,
                 max_observation_chars: int = 2000, instruction: str = DEFAULT_INSTRUCTION,
                 tool_format: str = "hermes_prompt", tool_parser: str = "auto"):
        super().__init__(max_turns, max_observation_chars)
        if tool_format not in TOOL_FORMATS:
            raise ValueError(f"tool_format must be one of {TOOL_FORMATS}, got {tool_format!r}")
        self.tool_format, self.tool_parser = tool_format, tool_parser
        if tool_format == NATIVE:
            self.stop = ()  # the turn ends at the template's end-of-turn token
        python = PythonTool(sandbox, timeout_s=timeout_s, memory_mb=memory_mb,
                            max_output_chars=max_observation_chars)
        built = [python] + [make_tool(t) if isinstance(t, str) else t for t in tools]
        self.tools: dict[str, Tool] = {}
        for tool in built:
            if tool.name in self.tools:
                raise ValueError(f"tools: {tool.name!r} appears twice")
            self.tools[tool.name] = tool
        self.instruction = check_instruction(instruction)

    @property
    def tool_schemas(self) -> list[dict[str, Any]]:
        return [tool_schema(t) for t in self.tools.values()]

    def initial_messages(self, task: Task) -> list[dict[str, str]]:
        user = {"role": "user", "content": fill_question(self.instruction, task.question)}
        if self.tool_format == NATIVE:
            return [user]  # the template renders the tools
        return [{"role": "system", "content": tools_system_prompt(self.tools)}, user]

    def native_tools(self) -> dict[str, Tool]:
        return self.tools

    def parse(self, action_text: str) -> Action:
        action = parse_tool_call(action_text, tools=self.tools)
        if action.kind == "tool_call":
            problem = validate_arguments(self.tools[action.tool_name].parameters,
                                         action.arguments)
            if problem:
                return Action(kind="invalid", error=f"{action.tool_name}: {problem}")
        return action

    def corrective_observation(self, action: Action) -> str:
        names = ", ".join(self.tools)
        return (f"Invalid action: {action.error}. Call a tool with <tool_call>"
                '{"name": "<tool>", "arguments": {...}}</tool_call> '
                f"(tools: {names}) or answer with <answer>...</answer>.")

    def act(self, action: Action, turn: TurnLog) -> None:
        tool = self.tools[action.tool_name]
        try:
            observation = tool(action.arguments)
            if not isinstance(observation, str):
                raise TypeError(f"the tool returned {type(observation).__name__}, not str")
            turn.observation = observation
        except ToolError as e:
            turn.observation = str(e)
            turn.error = f"{tool.name}: {e.summary}"
            turn.extra.update(e.extra)
        except Exception as e:  # a broken tool must not end the run
            turn.observation = f"Tool {tool.name!r} failed: {type(e).__name__}: {e}"
            turn.error = turn.observation
