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

Every observation — tool output, retrieved documents, corrective and error text alike —
leaves `step` through one cap, `max_observation_chars` (head and tail kept, the middle
replaced by a marker, the total within the cap) and as valid UTF-8 (text the policy
wrote, echoed back, may hold lone surrogates that no tokenizer encodes). The turn's
`error` goes through the same cap. Whatever the action text, `step` returns an
observation: malformed input is the policy's mistake to learn from, not an env failure.
"""
from __future__ import annotations

from agentjax.core.task import EpisodeLog, Task, TurnLog
from agentjax.envs.base import StepResult
from agentjax.parsers.actions import Action

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
