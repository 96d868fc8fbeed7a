"""An agent's recorded model calls as a trajectory: merged while its prompts extend.

Call k+1 extends call k when its prompt ids start with call k's prompt ids followed by
its completion ids, token for token: the agent kept its history, and the chat template
rendered the earlier turns as they were sampled. The calls then merge into one
segment: the prompt of the first call, each completion an action turn (its log-probs
and weight versions as the engine reported them), and the ids the next prompt adds
after it (the tool results, the next user message, the template's tokens) the
observation that follows it. A call whose prompt does not extend the context so far
(the agent rewrote, trimmed or summarized its history, or called a sub-agent) starts a
new segment; the rollout is then its last segment with the earlier ones in
`Trajectory.segments` (core/trajectory.py).

A call the endpoint recorded as aborted (its client went away, the engine failed or
refused it) has no completion: it is skipped, never trained, and counted.

`merge_calls` also says, in the rollout's metadata, how the merge went: `calls`,
`calls_extended` (calls merged into the segment before them), `merge_reused_tokens`
(the context tokens those calls shared with the segment instead of starting anew),
`calls_aborted`.
"""
from __future__ import annotations

from typing import Sequence

from agentjax.core.task import Task
from agentjax.core.trajectory import Trajectory, Turn
from agentjax.endpoint.sessions import RecordedCall


def _turn(call: RecordedCall) -> Turn:
    return Turn(list(call.completion_ids), [float(p) for p in call.logprobs],
                call.finish_reason, weight_version=call.weight_version,
                logprob_distribution=call.logprob_distribution,
                versions=[int(v) for v in call.versions])


def merge_calls(calls: Sequence[RecordedCall], *, task: Task | None = None,
                group_id: int = 0) -> Trajectory:
    """The rollout of `calls` (module docstring): its last segment, the earlier ones in
    `.segments`. No calls gives an empty trajectory (no turns)."""
    parts: list[Trajectory] = []
    context: list[int] = []
    extended = reused = 0
    answered = [call for call in calls if call.finish_reason != "abort"]
    for call in answered:
        prompt = list(call.prompt_ids)
        if parts and len(prompt) >= len(context) and prompt[:len(context)] == context:
            parts[-1].turns[-1].observation_ids = prompt[len(context):]
            extended += 1
            reused += len(context)
        else:
            parts.append(Trajectory(prompt_ids=prompt, task_id=task.task_id if task else "",
                                    group_id=group_id, task=task))
        parts[-1].turns.append(_turn(call))
        context = prompt + list(call.completion_ids)
    rollout = parts[-1] if parts else Trajectory(
        prompt_ids=[], task_id=task.task_id if task else "", group_id=group_id, task=task)
    rollout.segments = parts[:-1]
    rollout.metadata.update(calls=len(answered), calls_extended=extended,
                            merge_reused_tokens=reused,
                            calls_aborted=len(calls) - len(answered))
    return rollout
