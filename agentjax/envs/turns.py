"""The turn loop shared by the search and tool-calling envs.

Per `step`: parse the action, then
  * answer -> the episode ends (stop_reason "answer", `log.final_answer` set);
  * the turn reaches `max_turns` -> the episode ends (`final_turn`: stop_reason
    "max_turns"); a search or tool call made on that turn is logged but not run: the
    policy could never see its result;
  * invalid -> a corrective observation; the turn is logged with `valid=False`;
  * otherwise the subclass runs the call (`act`) and fills the observation.
Every turn is appended to `log.turns`; the step reward is always 0 (rewards/ scores
`(task, log)` afterwards).

Native tool calling (`tool_format="native"`): the tools are OpenAI function schemas the
chat template renders (`template_tools`), the turn ends at the model's end-of-turn token
(no stop strings), and the reply is read by the parser `tool_parser` names
(`parsers.tool_calls`). Per `step`:
  * a reply cut by max_tokens inside a call -> kind "truncated" (not a parse error):
    nothing runs, a user message says so;
  * a malformed call (bad JSON, an unknown tool, arguments against the schema) -> kind
    "invalid": nothing of the turn runs, a user message names what was wrong;
  * no call -> the reply's plain content is the final answer (`native_answer`), as an
    OpenAI client reads a reply without tool_calls; an env with an answering tool (the
    code env's `submit`) also ends on that call;
  * otherwise every call runs in order, each result its own `tool` message carrying
    the call's id (the parser's, or `models.chat.call_id` for formats without ids).
The text around the calls stays in the log (`action_text`); the first call is the turn's
`tool_name`/`tool_args`, every call with its result in `extra["calls"]`.

Every observation — tool output, retrieved documents, corrective and error text alike —
leaves `step` through one cap, `max_observation_chars` (head and tail kept, the middle
replaced by a marker, the total within the cap) and as valid UTF-8 (text the policy
wrote, echoed back, may hold lone surrogates that no tokenizer encodes). The turn's
`error` goes through the same cap. Whatever the action text, `step` returns an
observation: malformed input is the policy's mistake to learn from, not an env failure.
"""
from __future__ import annotations

from typing import Any, Mapping

from agentjax.core.task import EpisodeLog, Task, TurnLog
from agentjax.data.demonstrations import Demonstration, DemoTurn
from agentjax.envs.base import StepResult
from agentjax.models import chat
from agentjax.envs.tools import Tool, tool_schema, validate_arguments
from agentjax.parsers.actions import Action, echo, last_tag, load_json
from agentjax.parsers.tool_calls import parse_tool_calls

# Room for a few retrieved documents or a screenful of program output: more only
# spends the episode's token budget, and the agent loop tokenizes every observation.
DEFAULT_MAX_OBSERVATION_CHARS = 8192


class TurnEnv:
    """Base class; subclasses define `stop`, `observation_role`, `initial_messages`,
    `parse`, `corrective_observation` and `act`.

    Args:
      max_turns: policy turns per episode (>= 1), the answering turn included.
      max_observation_chars: every observation (and turn error) is cut to at most this
        many characters (>= 1; see `clip`).
    """

    stop: tuple[str, ...]
    observation_role: str | None
    tool_format: str = ""  # the env's own format's name, or "native"
    tool_parser: str = "auto"

    def __init__(self, max_turns: int,
                 max_observation_chars: int = DEFAULT_MAX_OBSERVATION_CHARS):
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        if max_observation_chars < 1:
            raise ValueError(f"max_observation_chars must be >= 1, got "
                             f"{max_observation_chars}")
        self.max_turns = int(max_turns)
        self.max_observation_chars = int(max_observation_chars)
        self.log: EpisodeLog | None = None

    def reset(self, task: Task) -> list[dict[str, str]]:
        """Starts an episode for `task`; returns its initial chat messages."""
        self.log = EpisodeLog(task=task)
        return self.initial_messages(task)

    def step(self, action_text: str) -> StepResult:
        """Consumes one policy turn (see module docstring)."""
        if self.log is None:
            raise RuntimeError("call reset(task) before step()")
        if self.log.done:
            raise RuntimeError(f"the episode is over (stop_reason={self.log.stop_reason!r}); "
                               "call reset(task) to start another")
        if self.tool_format == NATIVE:
            return self._native_step(action_text)
        action = self.parse(action_text)
        turn = TurnLog(action_text=action_text, kind=action.kind,
                       valid=action.kind != "invalid", error=action.error)
        if action.kind == "search":
            turn.tool_name, turn.tool_args = "search", {"query": action.query}
        elif action.kind == "tool_call":
            turn.tool_name, turn.tool_args = action.tool_name, dict(action.arguments)
        elif action.kind == "invalid" and action.tool_name is not None:
            turn.extra["unknown_tool"] = action.tool_name

        if action.kind == "answer":
            self.log.final_answer = action.answer
            self._finish("answer")
        elif len(self.log.turns) + 1 >= self.max_turns:
            self.final_turn(action)
        elif action.kind == "invalid":
            turn.observation = self.corrective_observation(action)
        else:
            self.act(action, turn)
        turn.observation = self._bound(turn.observation)
        if turn.error is not None:
            turn.error = self._bound(turn.error)
        self.log.turns.append(turn)
        info = {"turn": len(self.log.turns), "kind": turn.kind, "valid": turn.valid,
                "error": turn.error, "stop_reason": self.log.stop_reason}
        return StepResult(turn.observation, self.log.done, 0.0, info)

    # Native tool calling ------------------------------------------------------------

    @property
    def template_tools(self) -> list[dict[str, Any]] | None:
        """The tools' function schemas in native mode (for the chat template), else None."""
        if self.tool_format != NATIVE:
            return None
        return [tool_schema(t) for t in self.native_tools().values()]

    def _native_step(self, action_text: str) -> StepResult:
        parsed = parse_tool_calls(self.tool_parser, action_text, tools=self.template_tools)
        tools = self.native_tools()
        index = len(self.log.turns)
        calls = chat.tool_calls(parsed.calls, turn=index)
        problems = list(parsed.errors)
        for call in calls:
            problem = self._call_problem(tools, call["function"]["name"],
                                         call["function"]["arguments"])
            if problem:
                problems.append(problem)
        turn = TurnLog(action_text=action_text, kind="tool_call")
        if calls:
            turn.tool_name = calls[0]["function"]["name"]
            turn.tool_args = dict(calls[0]["function"]["arguments"])
        answers: list[dict[str, Any]] = []
        if parsed.truncated:
            turn.kind, turn.error = "truncated", "cut by max_tokens inside a tool call"
            turn.observation = ("Your reply was cut off inside a tool call, so nothing ran. "
                                "Call the tool again with a shorter call.")
        elif problems:
            turn.kind, turn.valid, turn.error = "invalid", False, "; ".join(problems)
            turn.observation = (f"Invalid tool call: {turn.error}. Nothing ran; call the "
                                "tools as described, or reply with the final answer.")
        elif not calls or any(c["function"]["name"] == self.answer_tool for c in calls):
            answer = self.native_answer(parsed.content, calls)
            if answer is None:
                turn.kind, turn.valid = "invalid", False
                turn.error = "no tool call and no answer"
                turn.observation = "Call a tool, or reply with the final answer."
            else:
                turn.kind = "answer"
                self.log.final_answer = answer
                self._finish("answer")
        elif index + 1 >= self.max_turns:
            self.native_final_turn(calls)
        else:
            turn.extra["calls"] = []
            for call in calls:
                result = TurnLog(action_text="", kind="tool_call")
                self.act(self.native_action(call["function"]["name"],
                                            call["function"]["arguments"]), result)
                content = self._bound(result.observation)
                turn.extra["calls"].append({**call["function"], "id": call["id"],
                                            "observation": content, "error": result.error,
                                            "extra": result.extra})
                turn.error = turn.error or result.error
                turn.retrieved += result.retrieved
                answers.append({"role": "tool", "tool_call_id": call["id"],
                                "name": call["function"]["name"], "content": content})
            turn.observation = "\n\n".join(a["content"] for a in answers)
        runnable = turn.kind in ("tool_call", "answer") and calls
        assistant = {"role": "assistant", "content": parsed.content if runnable
                     else action_text}
        if runnable:
            assistant["tool_calls"] = calls
        if not answers and turn.observation:
            answers = [{"role": "user", "content": self._bound(turn.observation)}]
        turn.observation = self._bound(turn.observation)
        if turn.error is not None:
            turn.error = self._bound(turn.error)
        self.log.turns.append(turn)
        info = {"turn": len(self.log.turns), "kind": turn.kind, "valid": turn.valid,
                "error": turn.error, "stop_reason": self.log.stop_reason,
                "messages": [assistant, *answers]}
        return StepResult(turn.observation, self.log.done, 0.0, info)

    def _call_problem(self, tools: Mapping[str, Tool], name: str,
                      arguments: Mapping[str, Any]) -> str | None:
        """Why a native call cannot run (an unknown tool, arguments off its schema)."""
        if name not in tools:
            return f"unknown tool {echo(name)}; available: {', '.join(sorted(tools))}"
        problem = validate_arguments(tools[name].parameters, arguments)
        return f"{name}: {problem}" if problem else None

    def run_tool(self, name: str, arguments: str | Mapping[str, Any]) -> str:
        """One native tool call run as a step runs it: its result as the step's `tool`
        message shows it, or the error it shows. For agents that call this env's tools
        themselves (envs/openai_agent: an agent that takes `env`); `arguments` is the
        JSON object an OpenAI tool call carries, as text or parsed."""
        if isinstance(arguments, str):
            arguments, problem = load_json(arguments)
            if problem:
                return self._bound(f"Invalid tool call: {name}: arguments are not JSON "
                                   f"({problem}). Nothing ran.")
        if not isinstance(arguments, Mapping):
            return self._bound(f"Invalid tool call: {name}: arguments must be a JSON "
                               "object. Nothing ran.")
        problem = self._call_problem(self.native_tools(), name, arguments)
        if problem:
            return self._bound(f"Invalid tool call: {problem}. Nothing ran.")
        result = TurnLog(action_text="", kind="tool_call")
        self.act(self.native_action(name, arguments), result)
        return self._bound(result.observation)

    def _finish(self, reason: str) -> None:
        self.log.done = True
        self.log.stop_reason = reason

    def _bound(self, text: str) -> str:
        return valid_utf8(clip(text, self.max_observation_chars))

    # Subclass hooks ------------------------------------------------------------------

    def initial_messages(self, task: Task) -> list[dict[str, str]]:
        raise NotImplementedError

    def parse(self, action_text: str) -> Action:
        raise NotImplementedError

    def corrective_observation(self, action: Action) -> str:
        raise NotImplementedError

    def final_turn(self, action: Action) -> None:
        """Ends the episode on its last allowed turn, whose action is not an answer."""
        self._finish("max_turns")

    def act(self, action: Action, turn: TurnLog) -> None:
        """Runs a valid search/tool call; sets `turn.observation` (and `error`,
        `retrieved`, `extra` as they apply)."""
        raise NotImplementedError

    # Native-mode hooks.

    answer_tool: str | None = None  # a tool whose call ends the episode (code: "submit")

    def native_tools(self) -> Mapping[str, Tool]:
        """name -> Tool (name, description, parameters) of the native mode."""
        raise NotImplementedError

    def native_action(self, name: str, arguments: Mapping[str, Any]) -> Action:
        """The Action `act` runs for a valid native call."""
        return Action(kind="tool_call", tool_name=name, arguments=dict(arguments))

    def native_answer(self, content: str, calls: list[dict]) -> str | None:
        """The final answer of a turn without calls (its content after any reasoning
        block, an `<answer>` tag's text when it has one) or with a call to `answer_tool`;
        None: no answer."""
        content = content.rpartition("</think>")[2]
        tagged = last_tag(content, ("answer",))
        answer = (tagged[1] if tagged else content).strip()
        return answer or None

    def native_call(self, action: Action, text: str) -> tuple[str, dict] | None:
        """(tool name, arguments) of a parsed text-format action that calls a tool, None
        for one that answers (`native_demonstration`)."""
        if action.kind == "search":
            return "search", {"query": action.query}
        if action.kind == "tool_call":
            return action.tool_name, dict(action.arguments)
        return None

    def native_content(self, observation: str) -> str:
        """A text-format tool observation as the native format's tool message content."""
        return observation

    def native_final_turn(self, calls: list[dict]) -> None:
        """Ends the episode on its last allowed turn, whose calls cannot be answered."""
        self._finish("max_turns")


NATIVE = "native"


def native_demonstration(demo: Demonstration, env: TurnEnv,
                         native_env: TurnEnv) -> Demonstration:
    """`demo`, written in `env`'s own text format, in native form: each call turn the
    assistant message with its call (the text before the call's markup as content, the
    call id the native env would give) and the tool message holding the observation;
    each answering turn the assistant message with the text. A malformed turn (an
    Agent-FLAN negative example) and the correction after it are left out: a native
    policy's mistakes are other mistakes. `Trajectory.from_demonstration` then writes
    the calls in the policy's own format, so SFT trains the format RL samples in.

    Args:
      demo: the demonstration as its env's format wrote it (observations verbatim).
      env: an env in that format (it parses the actions; nothing runs).
      native_env: the same env in native mode (its initial messages start the episode).
    """
    turns = []
    for turn in demo.turns:
        action = env.parse(turn.action)
        if action.kind == "invalid":
            continue
        call = env.native_call(action, turn.action)
        if call is None:
            turns.append(DemoTurn({"role": "assistant", "content": turn.action}, None,
                                  turn.trainable))
            continue
        name, arguments = call
        ident = chat.call_id(len(turns), 0)
        markup = min((i for i in (turn.action.find("<tool_call>"), turn.action.find("<search>"))
                      if i >= 0), default=len(turn.action))
        assistant = {"role": "assistant", "content": turn.action[:markup].strip(),
                     "tool_calls": [{"id": ident, "type": "function",
                                     "function": {"name": name, "arguments": arguments}}]}
        answers = None if turn.observation is None else [
            {"role": "tool", "tool_call_id": ident, "name": name,
             "content": env.native_content(turn.observation)}]
        turns.append(DemoTurn(assistant, answers, turn.trainable))
    return Demonstration(demo.task, native_env.reset(demo.task), turns, demo.log,
                         demo.reward, demo.policy)


_OMITTED = "\n...[{} characters omitted]...\n"


def clip(text: str, max_chars: int) -> str:
    """Cuts `text` to at most `max_chars` characters, keeping its head and its tail
    (tracebacks end with the useful line) around an omission marker; when the marker
    does not fit, only the head is kept."""
    if len(text) <= max_chars:
        return text
    marker_size = len(_OMITTED.format(len(text)))  # the count has at most this many digits
    keep = max_chars - marker_size
    if keep < 2:
        return text[:max_chars]
    head, tail = keep - keep // 2, keep // 2
    return (text[:head] + _OMITTED.format(len(text) - head - tail)
            + text[len(text) - tail:])


def valid_utf8(text: str) -> str:
    """`text` with each lone surrogate (not encodable as UTF-8) replaced by "?"."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace").decode("utf-8")


def fill_question(instruction: str, question: str) -> str:
    """Puts the question into an instruction template at its `{question}` slot (plain
    replacement, so other braces in the template need no escaping)."""
    return instruction.replace("{question}", question)


def check_instruction(instruction: str, name: str = "instruction") -> str:
    if "{question}" not in instruction:
        raise ValueError(f"{name} must contain a {{question}} placeholder")
    return instruction
