"""The turn loop shared by the search and tool-calling envs.

Per `step`: parse the action, then
  * answer -> the episode ends (stop_reason "answer", `log.final_answer` set);
  * the turn reaches `max_turns` -> the episode ends (stop_reason "max_turns"); a search
    or tool call made on that turn is logged but not run: the policy could never see
    its result;
  * invalid -> a corrective observation; the turn is logged with `valid=False`;
  * otherwise the subclass runs the call (`act`) and fills the observation.
Every turn is appended to `log.turns`; the step reward is always 0 (rewards/ scores
`(task, log)` afterwards).
"""
from __future__ import annotations

from agentjax.envs.base import EpisodeLog, StepResult, Task, TurnLog
from agentjax.envs.parsers import Action


class TurnEnv:
    """Base class; subclasses define `stop`, `observation_role`, `initial_messages`,
    `parse`, `corrective_observation` and `act`.

    Args:
      max_turns: policy turns per episode (>= 1), the answering turn included.
    """

    stop: tuple[str, ...]
    observation_role: str | None

    def __init__(self, max_turns: int):
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        self.max_turns = int(max_turns)
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
            self._finish("max_turns")
        elif action.kind == "invalid":
            turn.observation = self.corrective_observation(action)
        else:
            self.act(action, turn)
        self.log.turns.append(turn)
        info = {"turn": len(self.log.turns), "kind": turn.kind, "valid": turn.valid,
                "error": turn.error, "stop_reason": self.log.stop_reason}
        return StepResult(turn.observation, self.log.done, 0.0, info)

    def _finish(self, reason: str) -> None:
        self.log.done = True
        self.log.stop_reason = reason

    # Subclass hooks ------------------------------------------------------------------

    def initial_messages(self, task: Task) -> list[dict[str, str]]:
        raise NotImplementedError

    def parse(self, action_text: str) -> Action:
        raise NotImplementedError

    def corrective_observation(self, action: Action) -> str:
        raise NotImplementedError

    def act(self, action: Action, turn: TurnLog) -> None:
        """Runs a valid search/tool call; sets `turn.observation` (and `error`,
        `retrieved`, `extra` as they apply)."""
        raise NotImplementedError


def fill_question(instruction: str, question: str) -> str:
    """Puts the question into an instruction template at its `{question}` slot (plain
    replacement, so other braces in the template need no escaping)."""
    return instruction.replace("{question}", question)


def check_instruction(instruction: str, name: str = "instruction") -> str:
    if "{question}" not in instruction:
        raise ValueError(f"{name} must contain a {{question}} placeholder")
    return instruction
