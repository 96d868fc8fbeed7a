"""Hand-built episode logs for reward tests (what a Search-R1 style env would record)."""
from __future__ import annotations

import re

from agentjax.core.task import EpisodeLog, Task, TurnLog


def turn(action: str, observation: str = "") -> TurnLog:
    """A TurnLog as a search env records it: search/answer parsed, anything else invalid."""
    search = re.fullmatch(r"\s*(?:<think>.*?</think>\s*)?<search>(.*?)</search>\s*", action, re.S)
    answer = re.search(r"<answer>(.*?)</answer>", action, re.S)
    if search:
        return TurnLog(action, "search", tool_name="search",
                       tool_args={"query": search.group(1).strip()}, observation=observation)
    if answer:
        return TurnLog(action, "answer", observation=observation)
    return TurnLog(action, "invalid", valid=False, observation=observation,
                   error="malformed action")


def episode(task: Task, *turns: tuple[str, str] | str) -> EpisodeLog:
    """An EpisodeLog from (action, observation) pairs (a bare string: no observation)."""
    log = EpisodeLog(task=task)
    for t in turns:
        log.turns.append(turn(*t) if isinstance(t, tuple) else turn(t))
    last = log.turns[-1] if log.turns else None
    if last is not None and last.kind == "answer":
        answers = re.findall(r"<answer>(.*?)</answer>", last.action_text, re.S)
        log.final_answer = answers[-1].strip()
        log.done, log.stop_reason = True, "answer"
    return log


TWO_HOP = Task(
    task_id="t2", question="Who is the founder of the employer of Varo Kessin?",
    answers=("Dara Voss",), data_source="synthetic_multihop",
    metadata={"hops": 2, "bridge_entities": ["Quellon Corp"],
              "chain": [{"subject": "Varo Kessin", "relation": "works_for",
                         "object": "Quellon Corp"},
                        {"subject": "Quellon Corp", "relation": "founded_by",
                         "object": "Dara Voss"}]})

OBS_1 = ("<information>Doc 1(Title: Varo Kessin) Varo Kessin works for Quellon Corp."
         "</information>")
OBS_2 = ("<information>Doc 1(Title: Quellon Corp) Quellon Corp was founded by Dara Voss."
         "</information>")
