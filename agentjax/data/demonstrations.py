"""Demonstrations: scripted episodes for SFT, and their JSONL file.

An env's scripted policy (the search world's `ScriptedSearcher`, the code world's
`ScriptedCoder`, a suite's canonical solutions) plays real episodes and records each as a
`Demonstration`: the env's initial messages and the policy turns, every observation
exactly as the env returned it (None after the turn that ended the episode), ready for
`Trajectory.from_demonstration`. A turn marked `trainable=False` (a negative example) is
loss-masked in SFT.
"""
from __future__ import annotations

import dataclasses
import json
from typing import NamedTuple, Sequence

from agentjax.core.jsonl import read_jsonl
from agentjax.core.task import EpisodeLog, Task


class DemoTurn(NamedTuple):
    """One policy turn of a demonstration.

    Attributes:
      action: the action text (what SFT trains on when trainable).
      observation: the env's observation after it, verbatim; None when the env ended the
        episode on this turn (as `Trajectory.from_demonstration` expects).
      trainable: False for negative-example turns (loss-masked in SFT).
    """

    action: str
    observation: str | None
    trainable: bool


@dataclasses.dataclass
class Demonstration:
    """One scripted episode.

    Attributes:
      task: the task.
      messages: the env's initial chat messages.
      turns: the policy turns in order.
      log: the env's EpisodeLog (None when read back from jsonl).
      reward: the episode's reward total (as its demonstrator scored it).
      policy: the demonstrator's name.
    """

    task: Task
    messages: list[dict[str, str]]
    turns: list[DemoTurn]
    log: EpisodeLog | None
    reward: float
    policy: str


def write_demonstrations_jsonl(path: str, demos: Sequence[Demonstration]) -> None:
    """One JSON object per demonstration: task, messages, turns, reward, policy."""
    with open(path, "w", encoding="utf-8") as f:
        for d in demos:
            record = {"task": {"task_id": d.task.task_id, "question": d.task.question,
                               "answers": list(d.task.answers),
                               "data_source": d.task.data_source,
                               "metadata": dict(d.task.metadata)},
                      "messages": d.messages,
                      "turns": [t._asdict() for t in d.turns],
                      "reward": d.reward, "policy": d.policy}
            f.write(json.dumps(record, ensure_ascii=False) + "\n")


def read_demonstrations_jsonl(path: str) -> list[Demonstration]:
    """Reads `write_demonstrations_jsonl` output (log=None).

    Raises:
      ValueError: naming the file and line of a malformed record.
    """
    demos = []
    for index, r in read_jsonl(path):
        try:
            if isinstance(r, json.JSONDecodeError):
                raise r
            t = r["task"]
            task = Task(t["task_id"], t["question"], tuple(t["answers"]),
                        t.get("data_source", ""), t.get("metadata", {}))
            turns = [DemoTurn(str(x["action"]), None if x["observation"] is None
                              else str(x["observation"]), bool(x["trainable"]))
                     for x in r["turns"]]
            demos.append(Demonstration(task, list(r["messages"]), turns, None,
                                       float(r["reward"]), str(r.get("policy", ""))))
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            raise ValueError(f"{path}: line {index + 1}: malformed demonstration "
                             f"({type(err).__name__}: {err})") from None
    return demos
