"""The Env protocol: what the agent loop drives, what rewards read.

An episode is `messages = env.reset(task)`, then `env.step(action_text)` once per policy
turn until `done`. The env keeps an `EpisodeLog` of everything it saw (actions, parsed
tool calls, observations, errors, retrieved documents, the final answer); reward
functions are pure functions of `(task, log)`, so they can be re-scored offline and
relabeled (hindsight) without re-running the episode.

A run builds its env from `config.env.name` through `agentjax.envs.registry.build_suite`
(the suite each `envs/<name>/suite.py` registers in `SUITES`).
"""
from __future__ import annotations

from typing import Any, NamedTuple, Protocol, runtime_checkable

from agentjax.core.task import EpisodeLog, Task


class StepResult(NamedTuple):
    """Result of `Env.step`; unpacks as `(observation, done, reward, info)`."""

    observation: str
    done: bool
    reward: float
    info: dict[str, Any]


@runtime_checkable
class Env(Protocol):
    """A multi-turn environment.

    Attributes:
      stop: stop strings that end a policy turn (kept in the output), e.g.
        ("</search>", "</answer>"); the sampler stops at the first one generated.
      observation_role: None when observations continue the assistant turn as plain
        text (Search-R1 style `<information>...</information>`); a chat role such as
        "tool" or "user" when each observation is a new chat turn (hermes-style tool
        calling), whose token ids come from chat-template diffing.
      log: the current episode's EpisodeLog.

    Native tool calling (optional; an env without these attributes speaks text):
      template_tools: the OpenAI function schemas the chat template renders into the
        prompt (`models.chat`), or None for an env whose format is its own text.
      tool_parser: the tool-call parser reading the policy's reply
        (`parsers.tool_calls.TOOL_PARSERS`); "auto" is resolved by the agent loop from
        the policy's tokenizer before `reset`.
      A native `step` returns in `info["messages"]` the assistant message it parsed
      (content and tool_calls with their ids) and the messages answering it (one tool
      message per call, or a user message), which the loop renders into ids.
    """

    stop: tuple[str, ...]
    observation_role: str | None
    log: EpisodeLog

    def reset(self, task: Task) -> list[dict[str, str]]:
        """Starts an episode; returns the initial chat messages (system + user)."""

    def step(self, action_text: str) -> StepResult:
        """Consumes one policy turn; returns the observation and whether it is done."""

