"""Tool-call shaping: small, capped bonuses and penalties on tool use.

    score = valid_bonus * min(valid calls, max_bonus_calls)
            - duplicate_penalty * consecutive duplicate calls
            - invalid_penalty * invalid actions (malformed or unknown tool)

clipped to [-cap, cap]. Two calls are duplicates when they name the same tool with the
same arguments after whitespace/case normalization of string values; only back-to-back
repeats count (a repeat after another call may be a deliberate re-check). Shaping must
stay far smaller than the outcome (typically 0.1 : 1), or the policy learns the shaping
instead of the task — the composite enforces it.
"""
from __future__ import annotations

import json
from typing import Any

from agentjax.core.task import EpisodeLog, TurnLog


def _call_key(turn: TurnLog) -> str:
    def norm(value: Any) -> Any:
        if isinstance(value, str):
            return " ".join(value.lower().split())
        if isinstance(value, dict):
            return {k: norm(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [norm(v) for v in value]
        return value

    return json.dumps([turn.tool_name, norm(dict(turn.tool_args or {}))], sort_keys=True,
                      default=str)


def tool_call_counts(log: EpisodeLog) -> dict[str, int]:
    """Counts of valid tool calls, consecutive duplicate calls and invalid actions."""
    valid = duplicates = invalid = 0
    previous = None
    for turn in log.turns:
        if not turn.valid:
            invalid += 1
            previous = None
            continue
        if turn.tool_name is None:
            previous = None
            continue
        valid += 1
        key = _call_key(turn)
        duplicates += key == previous
        previous = key
    return {"valid": valid, "duplicate": duplicates, "invalid": invalid}


def tool_shaping(log: EpisodeLog, *, valid_bonus: float = 0.1, max_bonus_calls: int = 1,
                 duplicate_penalty: float = 0.05, invalid_penalty: float = 0.3,
                 cap: float = 0.5) -> float:
    """Capped tool-use shaping of one episode (module docstring).

    Args:
      log: the episode.
      valid_bonus: bonus per valid call, for at most `max_bonus_calls` calls.
      max_bonus_calls: how many valid calls earn the bonus.
      duplicate_penalty: penalty per consecutive duplicate call.
      invalid_penalty: penalty per malformed action or unknown tool.
      cap: the score is clipped to [-cap, cap].
    """
    if cap < 0:
        raise ValueError(f"tool_shaping: cap must be >= 0, got {cap}")
    counts = tool_call_counts(log)
    score = (valid_bonus * min(counts["valid"], max_bonus_calls)
             - duplicate_penalty * counts["duplicate"]
             - invalid_penalty * counts["invalid"])
    return min(cap, max(-cap, score))
