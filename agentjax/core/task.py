"""The task and episode record every layer shares: a `Task` is what an episode is asked,
an `EpisodeLog` (of `TurnLog`s) is everything its env saw. Reward functions are pure
functions of `(task, log)`, so an episode can be re-scored offline or relabeled
(hindsight) without running it again."""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping


@dataclasses.dataclass(frozen=True)
class Task:
    """One problem for the agent.

    Attributes:
      task_id: stable unique id (used for grouping, curriculum statistics, relabeling).
      question: the user-facing question / instruction text.
      answers: acceptable final answers (aliases); empty when a verifier decides (code
        tasks: their tests, in metadata; envs/code/tasks.py).
      data_source: dataset name (Search-R1's `data_source`), e.g. "synthetic_multihop".
      metadata: task-specific extras, e.g. {"hops": 2, "bridge_entities": [...],
        "tests": [...]} — never shown to the policy, except "prompt": the chat messages
        a dataset prescribes (a Search-R1 parquet's `prompt` column), which the search
        env shows instead of its instruction.
    """

    task_id: str
    question: str
    answers: tuple[str, ...] = ()
    data_source: str = ""
    metadata: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class TurnLog:
    """What happened in one policy turn.

    Attributes:
      action_text: the decoded text the policy produced this turn.
      kind: parsed action kind: "search", "answer", "tool_call", "invalid", ...
      tool_name: the tool called (None when the turn called no tool).
      tool_args: the parsed arguments of the call.
      valid: whether the action parsed and named a known tool.
      observation: the text the env returned (empty when the episode ended).
      error: an error message when the tool failed or the action was malformed.
      retrieved: ids or titles of documents retrieved this turn (search envs).
      extra: anything else an env wants rewards or diagnostics to see.
    """

    action_text: str
    kind: str
    tool_name: str | None = None
    tool_args: Mapping[str, Any] | None = None
    valid: bool = True
    observation: str = ""
    error: str | None = None
    retrieved: tuple[str, ...] = ()
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class EpisodeLog:
    """The env's record of one episode; rewards are functions of (task, log)."""

    task: Task
    turns: list[TurnLog] = dataclasses.field(default_factory=list)
    final_answer: str | None = None
    done: bool = False
    # "answer" | "max_turns" | "token_budget" | "timeout" | "error" | ... (set by the
    # env or by the agent loop, whichever ended the episode).
    stop_reason: str | None = None

    @property
    def num_tool_calls(self) -> int:
        return sum(t.tool_name is not None for t in self.turns)

    @property
    def num_invalid(self) -> int:
        return sum(not t.valid for t in self.turns)
