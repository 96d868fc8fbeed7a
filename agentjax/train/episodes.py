"""What the policy saw and did, written where a user looks: sampled episodes and errors.

    recorder = EpisodeRecorder(workdir, tokenizer, samples=4, tracking=tracking)
    new_errors = recorder.record(step, "rl", trajectories)  # errors.jsonl, samples/*.md

A run whose episodes fail (a template that does not fit the tokenizer, a dead retrieval
server, a reward that cannot score the task) must say so, not print "success 0.000":
every distinct error message is saved once to `<workdir>/errors.jsonl` with the episode
that raised it, and `check_failures` turns "every episode failed" into an exception and
"many failed" into a warning. `samples/<stage>_<step>.md` shows a few episodes per step
as text, segment by segment, with what was trained and what was masked. The run's
trackers (train/tracking.py) get both as tables: the samples of each training step (an
evaluation's, recorded at step 0, stay in samples/) and every error row.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
from typing import Sequence

from agentjax.core.trajectory import Trajectory
from agentjax.train.tracking import Table, Tracking

SAMPLE_CHARS = 4000  # per segment: a runaway observation must not make a huge file


class EpisodesFailed(RuntimeError):
    """Every episode of a rollout failed: training on them would learn nothing."""


def error_key(message: str) -> str:
    """The message with numbers, ids and quoted values masked, so the same error raised
    by many episodes (each with its own ids) counts once."""
    first = (message or "").strip().splitlines()[0] if message else ""
    first = re.sub(r"'[^']*'|\"[^\"]*\"", "'…'", first)
    return re.sub(r"0x[0-9a-fA-F]+|\d+", "N", first)[:300]


def _clip(text: str) -> str:
    if len(text) <= SAMPLE_CHARS:
        return text
    return text[:SAMPLE_CHARS] + f" …[{len(text) - SAMPLE_CHARS} more characters]"


@dataclasses.dataclass(frozen=True)
class Segment:
    """A stretch of an episode's tokens: the prompt, an action or an observation."""

    kind: str  # "prompt", "action" or "observation"
    turn: int  # 1-based; 0 for the prompt
    tokens: int
    trained: bool  # the loss sees it (a trainable action)
    text: str  # decoded, clipped to SAMPLE_CHARS
    finish: str | None = None  # an action's finish reason


def episode_segments(traj: Trajectory, tokenizer) -> list[Segment]:
    """The prompt, then each turn's action (trained or not) and observation (masked); a
    rollout cut into segments (`Trajectory.segments`) has a prompt before each, its turns
    numbered on."""
    def text(ids):
        return _clip(tokenizer.decode(list(ids), skip_special_tokens=False))

    segments, index = [], 0
    for part in [*traj.segments, traj]:
        segments.append(Segment("prompt", 0, len(part.prompt_ids), False,
                                text(part.prompt_ids)))
        for turn in part.turns:
            index += 1
            segments.append(Segment("action", index, len(turn.action_ids), turn.trainable,
                                    text(turn.action_ids), turn.finish_reason))
            if turn.observation_ids:
                segments.append(Segment("observation", index, len(turn.observation_ids),
                                        False, text(turn.observation_ids)))
    return segments


def render_episode(traj: Trajectory, tokenizer,
                   segments: Sequence[Segment] | None = None) -> str:
    """An episode as markdown: prompt, each action (trained or not) and observation
    (masked), then reward components, stop reason and error (`segments`: its
    `episode_segments`, when already made)."""
    meta = traj.metadata
    components = ", ".join(f"{k} {v:.3f}" for k, v in meta.get("reward_components", {}).items())
    lines = [f"reward {traj.final_reward:.3f}" + (f" ({components})" if components else "")
             + f"; stop {meta.get('stop_reason')}; task {traj.task_id!r}"]
    if meta.get("failed"):
        lines.append(f"FAILED: {meta.get('error')}")
    lines.append("")
    for segment in segments or episode_segments(traj, tokenizer):
        if segment.kind == "prompt":
            title = f"prompt ({segment.tokens} tokens, masked)"
        elif segment.kind == "action":
            trained = "trained" if segment.trained else "not trained"
            title = (f"action {segment.turn} ({segment.tokens} tokens, {trained}, "
                     f"finish {segment.finish})")
        else:
            title = f"observation {segment.turn} ({segment.tokens} tokens, masked)"
        lines += [f"#### {title}", "```", segment.text, "```"]
    return "\n".join(lines)


SAMPLE_COLUMNS = ("group", "task_id", "reward", "reward_components", "stop_reason",
                  "failed", "error", "trained_tokens", "masked_tokens", "segments", "text")
ERROR_COLUMNS = ("key", "error", "stage", "step", "stop_reason", "task_id", "episode")


def sample_row(traj: Trajectory, tokenizer) -> list:
    """An episode as a row of SAMPLE_COLUMNS: the reward components and the segments
    (kind, turn, tokens, trained, text, finish) as JSON, the whole episode as markdown
    last."""
    segments = episode_segments(traj, tokenizer)
    meta = traj.metadata
    trained = sum(s.tokens for s in segments if s.trained)
    return [traj.group_id, traj.task_id, float(traj.final_reward),
            json.dumps(meta.get("reward_components", {})), str(meta.get("stop_reason")),
            bool(meta.get("failed")), str(meta.get("error") or ""), trained,
            sum(s.tokens for s in segments) - trained,
            json.dumps([dataclasses.asdict(s) for s in segments]),
            render_episode(traj, tokenizer, segments)]


def _pick(trajectories: Sequence[Trajectory], count: int) -> list[Trajectory]:
    """`count` episodes from different groups, a failed one first when there is one."""
    failed = [t for t in trajectories if t.metadata.get("failed")][:1]
    picked, groups = list(failed), {t.group_id for t in failed}
    for traj in trajectories:
        if len(picked) >= count:
            break
        if traj.group_id not in groups:
            picked.append(traj)
            groups.add(traj.group_id)
    return picked[:count]


class EpisodeRecorder:
    """Writes sampled episodes and first-seen errors under `workdir`.

    Args:
      workdir: the run folder.
      tokenizer: decodes episodes into text.
      samples: episodes written per recorded step (0: none).
      enabled: False on non-zero processes of a multi-host run.
      tracking: the run's trackers, which get the samples and errors as tables (None:
        none).
    """

    def __init__(self, workdir: str, tokenizer, *, samples: int, enabled: bool = True,
                 tracking: Tracking | None = None):
        self.workdir, self.tokenizer = workdir, tokenizer
        self.samples, self.enabled = samples, enabled
        self.tracking = tracking or Tracking()
        self.errors_path = os.path.join(workdir, "errors.jsonl")
        self.errors: list[dict] = []
        if os.path.exists(self.errors_path):  # a resumed run reports only new errors
            with open(self.errors_path) as f:
                self.errors = [json.loads(line) for line in f if line.strip()]
            self._track_errors()
        self.seen: set[str] = {row["key"] for row in self.errors}

    def _track_errors(self) -> None:
        self.tracking.log_errors(Table(ERROR_COLUMNS, [[row.get(c) for c in ERROR_COLUMNS]
                                                       for row in self.errors]))

    def record(self, step: int, stage: str, trajectories: Sequence[Trajectory]) -> list[str]:
        """Saves the step's samples and its not-yet-seen errors; returns those errors'
        messages (for printing)."""
        new = []
        for traj in trajectories:
            message = traj.metadata.get("error") if traj.metadata.get("failed") else None
            if not message or error_key(message) in self.seen:
                continue
            self.seen.add(error_key(message))
            new.append(message)
            if self.enabled:
                row = {"key": error_key(message), "error": message, "stage": stage,
                       "step": step, "stop_reason": traj.metadata.get("stop_reason"),
                       "task_id": traj.task_id, "episode": render_episode(traj, self.tokenizer)}
                with open(self.errors_path, "a") as f:
                    f.write(json.dumps(row) + "\n")
                self.errors.append(row)
        if new and self.enabled:
            self._track_errors()
        if self.enabled and self.samples:
            folder = os.path.join(self.workdir, "samples")
            os.makedirs(folder, exist_ok=True)
            episodes = _pick(trajectories, self.samples)
            rows = [sample_row(traj, self.tokenizer) for traj in episodes]
            body = [f"# {stage} step {step}: {len(episodes)} of {len(trajectories)} episodes"]
            for traj, row in zip(episodes, rows):
                body += ["", f"## episode of group {traj.group_id}", "", row[-1]]
            with open(os.path.join(folder, f"{stage}_{step:06d}.md"), "w") as f:
                f.write("\n".join(body) + "\n")
            if step > 0:
                self.tracking.log_samples(stage, step, Table(SAMPLE_COLUMNS, rows))
        return new


def failure_summary(trajectories: Sequence[Trajectory], limit: int = 3) -> str:
    """The most frequent distinct errors of `trajectories`, with counts."""
    counts: dict[str, tuple[int, str]] = {}
    for traj in trajectories:
        if traj.metadata.get("failed"):
            message = str(traj.metadata.get("error"))
            key = error_key(message)
            count, example = counts.get(key, (0, message))
            counts[key] = (count + 1, example)
    top = sorted(counts.values(), key=lambda item: -item[0])[:limit]
    return "; ".join(f"{count} x {example.strip().splitlines()[0][:300]}"
                     for count, example in top)


def check_failures(trajectories: Sequence[Trajectory], *, where: str, fatal: bool,
                   warn_fraction: float = 0.1) -> str | None:
    """A warning when more than `warn_fraction` of the episodes failed, else None.

    Raises:
      EpisodesFailed: every episode failed and `fatal` (the first rollout of a run, an
        evaluation): nothing could be learned from or measured on them.
    """
    failed = sum(bool(t.metadata.get("failed")) for t in trajectories)
    if trajectories and failed == len(trajectories) and fatal:
        raise EpisodesFailed(
            f"{where}: all {failed} episodes failed, so there is nothing to learn from or "
            f"measure. Errors: {failure_summary(trajectories)} (episodes in errors.jsonl)")
    if failed > warn_fraction * len(trajectories):
        return (f"{where}: {failed} of {len(trajectories)} episodes failed (errors, not "
                f"wrong answers): {failure_summary(trajectories)}")
    return None
