"""Anchor states of turns: which turns of a group's episodes saw the same thing.

GiGPO (Feng et al. 2025, "Group-in-Group Policy Optimization for LLM Agent Training",
arXiv 2505.10978) compares a turn with the turns of the same group's other episodes that
acted from the same state (an "anchor state"). Here a turn's state is what the policy was
conditioned on, as exact token ids (never re-tokenized text), keyed one of two ways:

  - "context": every id before the turn's first action token (the prompt, the earlier
    actions and observations). Two turns share an anchor exactly when the policy saw the
    same context, so the comparison is between actions from one state; every episode of
    a group shares turn 1's anchor (the prompt), later turns share one only while the
    episodes agree token for token.
  - "observation": the ids the env appended just before the turn (the prompt for turn
    1), as verl-agent keys GiGPO by the current observation: episodes that reached the
    same observation by different paths are compared. Right for envs whose observation
    is the whole state; wrong where two different states print the same text.

Keys are hashed on the host (BLAKE2b, 128 bits, over the int32 ids, updated as the
episode is read so a turn costs its own new tokens), paired with the episode's group id
(anchors never cross groups, as in verl-agent's step groups) and numbered densely in the
order met, so the device sees a small int array aligned with `collate`'s batch.
"""
from __future__ import annotations

import hashlib
from typing import Sequence

import numpy as np

from agentjax.config.choices import TURN_ANCHORS
from agentjax.core.trajectory import Trajectory


def _turn_digests(traj: Trajectory, key: str) -> list[bytes]:
    """One digest per turn of `traj`: the hash of what came before its action."""
    def digest(ids) -> hashlib.blake2b:
        h = hashlib.blake2b(digest_size=16)
        h.update(np.asarray(ids, np.int32).tobytes())
        return h

    running, before, out = digest(traj.prompt_ids), traj.prompt_ids, []
    for turn in traj.turns:
        out.append((running if key == "context" else digest(before)).digest())
        running.update(np.asarray(turn.action_ids, np.int32).tobytes())
        running.update(np.asarray(turn.observation_ids, np.int32).tobytes())
        before = turn.observation_ids
    return out


def anchor_ids(trajectories: Sequence[Trajectory], shape: tuple[int, int], *,
               key: str = "context") -> np.ndarray:
    """Per-token anchor ids of a collated batch: [B, T] int32, aligned as `collate`.

    A token of turn k (its action and the observation after it, `Trajectory.turn_ids`)
    gets the id of turn k's anchor; prompt tokens and padding rows get -1. Ids are dense
    (0, 1, ... in the order met) and equal exactly when two turns' episodes are in the
    same group and their keys (module docstring) are equal.

    Args:
      trajectories: the batch's episodes, in `collate`'s row order.
      shape: the collated batch's [B, T] (`batch["targets"].shape`); rows past the
        episodes are padding.
      key: "context" or "observation" (module docstring).

    Returns:
      int32 [B, T].
    """
    if key not in TURN_ANCHORS:
        raise ValueError(f"unknown anchor key {key!r}; expected one of {TURN_ANCHORS}")
    rows, length = shape
    if len(trajectories) > rows:
        raise ValueError(f"got {len(trajectories)} trajectories for {rows} rows")
    out = np.full((rows, length), -1, np.int32)
    dense: dict[tuple[int, bytes], int] = {}
    for row, traj in enumerate(trajectories):
        # `Trajectory.turn_ids`, without its per-token Python loop; collate's position t
        # describes token t + 1 (next-token alignment).
        sizes = [len(traj.prompt_ids)] + [len(t.action_ids) + len(t.observation_ids)
                                          for t in traj.turns]
        turn_of_token = np.repeat(np.arange(len(sizes)), sizes)[1:length + 1]
        kept = set(turn_of_token.tolist())
        # Only turns with a token in the row get an id (a truncated row's cut turns do
        # not), so there are at most B x T ids.
        per_turn = [-1] + [dense.setdefault((traj.group_id, d), len(dense))
                           if turn in kept else -1
                           for turn, d in enumerate(_turn_digests(traj, key), start=1)]
        out[row, :len(turn_of_token)] = np.asarray(per_turn, np.int32)[turn_of_token]
    return out
