"""RFT sets and preference pairs as JSONL: token ids and action masks (text for reading).

An episode (a row of an RFT set, or each side of a pair) is one JSON object:

    {"token_ids": [int, ...], "action_mask": [0 | 1, ...],
     "task_id": str, "reward": float, "text": str}

`token_ids` is the whole episode exactly as the policy saw it (prompt, actions,
observations); `action_mask` is 1 on the tokens trained on (the policy's own actions) and
0 elsewhere; the first token is never trained (nothing predicts it). `task_id`, `reward`
and `text` are optional; `text` is written for people and never read back: the ids are
the data (re-tokenizing decoded text can change them). A pair is

    {"chosen": episode, "rejected": episode, "task_id": str,
     "level": "trajectory" | "turn", "shared_tokens": int}

where `shared_tokens` leading tokens are the same on both sides (a turn-level pair's
prompt and the turns before the one it diverges at; checked on reading). A user can
write either file by hand; a row that is not valid stops reading with an
`OfflineDataError` naming the file, the line and what is wrong.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from agentjax.core import atomic
from agentjax.core.jsonl import read_jsonl
from agentjax.core.trajectory import Trajectory, Turn

EPISODE_KEYS = ("token_ids", "action_mask", "task_id", "reward", "text")
PAIR_KEYS = ("chosen", "rejected", "task_id", "level", "shared_tokens")
# "trajectory": two episodes of one task; "turn": two that share a prefix token for
# token and diverge at one agent turn (agents/branching.py).
PAIR_LEVELS = ("trajectory", "turn")


class OfflineDataError(ValueError):
    """A row of an RFT set or pair file that cannot be used; the message names the file
    and the line (1-based)."""


@dataclasses.dataclass
class PreferencePair:
    """Two episodes of one task, the chosen one preferred over the rejected one.

    Attributes:
      chosen / rejected: the episodes (their action masks say what is trained).
      task_id: the task both were sampled for.
      level: one of PAIR_LEVELS.
      shared_tokens: how many leading token ids the two share.
    """

    chosen: Trajectory
    rejected: Trajectory
    task_id: str = ""
    level: str = "trajectory"
    shared_tokens: int = 0


def trajectory_from_tokens(token_ids: Sequence[int], action_mask: Sequence[int], *,
                           task_id: str = "", reward: float = 0.0) -> Trajectory:
    """The Trajectory with these ids and mask: the tokens before the first masked one
    are its prompt, each run of mask-1 tokens a turn's action and the mask-0 run after
    it that turn's observation (behavior log-probs 0: no policy sampled them here)."""
    ids = np.asarray(token_ids, np.int64)
    mask = np.asarray(action_mask, bool)
    starts = np.flatnonzero(mask & ~np.concatenate([[False], mask[:-1]]))
    ends = np.flatnonzero(mask & ~np.concatenate([mask[1:], [False]])) + 1
    turn_bounds = list(zip(starts, ends, list(starts[1:]) + [len(ids)]))
    turns = [Turn([int(t) for t in ids[a:b]], [0.0] * int(b - a), "stop",
                  [int(t) for t in ids[b:c]]) for a, b, c in turn_bounds]
    prompt_end = int(starts[0]) if len(starts) else len(ids)
    return Trajectory(prompt_ids=[int(t) for t in ids[:prompt_end]], turns=turns,
                      final_reward=float(reward), task_id=task_id)


def episode_record(traj: Trajectory, tokenizer) -> dict[str, Any]:
    """The JSON object of one episode (module docstring)."""
    ids = traj.token_ids
    return {"task_id": traj.task_id, "reward": traj.total_reward,
            "token_ids": ids.tolist(), "action_mask": traj.action_mask.tolist(),
            "text": tokenizer.decode(ids.tolist(), skip_special_tokens=False)}


def pair_record(pair: PreferencePair, tokenizer) -> dict[str, Any]:
    """The JSON object of one pair (module docstring)."""
    return {"task_id": pair.task_id, "level": pair.level,
            "shared_tokens": pair.shared_tokens,
            "chosen": episode_record(pair.chosen, tokenizer),
            "rejected": episode_record(pair.rejected, tokenizer)}


def _write_rows(path: str, rows: Iterable[Mapping[str, Any]]) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    atomic.write_text(path, "".join(json.dumps(row) + "\n" for row in rows))


def write_episodes(path: str, trajectories: Sequence[Trajectory], tokenizer) -> None:
    """Writes an RFT set, atomically."""
    _write_rows(path, (episode_record(t, tokenizer) for t in trajectories))


def write_pairs(path: str, pairs: Sequence[PreferencePair], tokenizer) -> None:
    """Writes preference pairs, atomically."""
    _write_rows(path, (pair_record(p, tokenizer) for p in pairs))


def _check_keys(record: Any, allowed: tuple[str, ...], required: tuple[str, ...],
                what: str) -> None:
    if not isinstance(record, dict):
        raise ValueError(f"{what} must be a JSON object, got {type(record).__name__}")
    unknown = sorted(set(record) - set(allowed))
    if unknown:
        raise ValueError(f"{what} has unknown keys {unknown}; allowed: {list(allowed)}")
    missing = [k for k in required if k not in record]
    if missing:
        raise ValueError(f"{what} lacks {missing}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _episode(record: Any, what: str, *, vocab_size: int | None,
             max_tokens: int | None) -> Trajectory:
    """The Trajectory of an episode object, or ValueError saying what is wrong."""
    _check_keys(record, EPISODE_KEYS, ("token_ids", "action_mask"), what)
    ids, mask = record["token_ids"], record["action_mask"]
    if not isinstance(ids, list) or len(ids) < 2 or not all(
            _is_int(t) and t >= 0 for t in ids):
        raise ValueError(f"{what}.token_ids must be a list of at least 2 token ids (ints "
                         ">= 0)")
    if vocab_size is not None and max(ids) >= vocab_size:
        raise ValueError(f"{what}.token_ids has id {max(ids)}, outside the vocabulary of "
                         f"{vocab_size}")
    if max_tokens is not None and len(ids) > max_tokens:
        raise ValueError(f"{what} has {len(ids)} tokens, more than rollout.max_tokens="
                         f"{max_tokens}")
    if not isinstance(mask, list) or len(mask) != len(ids) or not all(
            _is_int(m) and m in (0, 1) for m in mask):
        raise ValueError(f"{what}.action_mask must be a list of {len(ids)} zeros and ones "
                         "(one per token id)")
    if mask[0]:
        raise ValueError(f"{what}.action_mask[0] is 1, but nothing predicts the first "
                         "token: it must be 0")
    if not any(mask):
        raise ValueError(f"{what}.action_mask has no 1: nothing to train on")
    reward = record.get("reward", 0.0)
    if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(
            reward):
        raise ValueError(f"{what}.reward must be a finite number, got {reward!r}")
    for key in ("task_id", "text"):
        if not isinstance(record.get(key, ""), str):
            raise ValueError(f"{what}.{key} must be a string")
    return trajectory_from_tokens(ids, mask, task_id=record.get("task_id", ""),
                                  reward=reward)


def _pair(record: Any, *, vocab_size: int | None, max_tokens: int | None) -> PreferencePair:
    _check_keys(record, PAIR_KEYS, ("chosen", "rejected"), "the pair")
    chosen, rejected = (_episode(record[side], side, vocab_size=vocab_size,
                                 max_tokens=max_tokens) for side in ("chosen", "rejected"))
    level, shared = record.get("level", "trajectory"), record.get("shared_tokens", 0)
    if level not in PAIR_LEVELS:
        raise ValueError(f"level must be one of {list(PAIR_LEVELS)}, got {level!r}")
    chosen_ids, rejected_ids = record["chosen"]["token_ids"], record["rejected"]["token_ids"]
    if not _is_int(shared) or not 0 <= shared < min(len(chosen_ids), len(rejected_ids)):
        raise ValueError(f"shared_tokens must be an integer in [0, the shorter side's "
                         f"length), got {shared!r}")
    if chosen_ids[:shared] != rejected_ids[:shared]:
        first = next(i for i, (a, b) in enumerate(zip(chosen_ids, rejected_ids)) if a != b)
        raise ValueError(f"shared_tokens is {shared} but the sides differ at token {first}")
    if (chosen_ids, record["chosen"]["action_mask"]) == (
            rejected_ids, record["rejected"]["action_mask"]):
        raise ValueError("chosen and rejected are the same episode: no preference")
    if not isinstance(record.get("task_id", ""), str):
        raise ValueError("task_id must be a string")
    return PreferencePair(chosen, rejected, task_id=record.get("task_id", ""), level=level,
                          shared_tokens=shared)


def _read(path: str, parse) -> list:
    rows = []
    for index, value in read_jsonl(path):
        try:
            if isinstance(value, json.JSONDecodeError):
                raise ValueError(f"not JSON ({value.msg})")
            rows.append(parse(value))
        except ValueError as error:
            raise OfflineDataError(f"{path}: line {index + 1}: {error}") from None
    if not rows:
        raise OfflineDataError(f"{path}: no rows")
    return rows


def read_episodes(path: str, *, vocab_size: int | None = None,
                  max_tokens: int | None = None) -> list[Trajectory]:
    """An RFT set's episodes. `vocab_size` / `max_tokens` (when given) bound the ids
    and the length. Raises OfflineDataError at the first invalid row."""
    return _read(path, lambda r: _episode(r, "the episode", vocab_size=vocab_size,
                                          max_tokens=max_tokens))


def read_pairs(path: str, *, vocab_size: int | None = None,
               max_tokens: int | None = None) -> list[PreferencePair]:
    """A pair file's pairs (bounds as `read_episodes`). Raises OfflineDataError at the
    first invalid row."""
    return _read(path, lambda r: _pair(r, vocab_size=vocab_size, max_tokens=max_tokens))
