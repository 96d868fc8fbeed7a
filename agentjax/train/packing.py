"""Packing several short episodes into one row of a fixed length (SFT batches).

Demonstrations vary from ~100 to ~500 tokens; padding each to the batch's longest wastes
most of the compute on short ones. Packing puts consecutive episodes into one row as
separate segments (segment ids 1, 2, ...; positions restart at 0), which the decoder
keeps apart (a token attends only within its segment), so the loss and gradients are
those of the episodes taken one by one.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from agentjax.core.trajectory import Trajectory, collate

PACKED_KEYS = ("inputs", "targets", "positions", "segment_ids", "action_mask")


def pack(trajectories: Sequence[Trajectory], *, length: int, rows: int,
         pad_id: int) -> tuple[dict[str, np.ndarray], int]:
    """Packs trajectories, in order, into `rows` rows of `length` positions.

    Episodes are placed first-fit in order until the next one does not fit any row;
    an episode longer than `length` is truncated by `collate`'s rule into a row of its
    own.

    Args:
      trajectories: the episodes (e.g. SFT demonstrations), in the order to use them.
      length: positions per row.
      rows: rows per batch.
      pad_id: id written on padding.

    Returns:
      (batch, used): arrays `PACKED_KEYS` of shape [rows, length] (segment_ids number
      the episodes of a row from 1; 0 is padding), and how many leading trajectories
      were packed.
    """
    out = {key: np.zeros((rows, length), np.float32 if key == "action_mask" else np.int32)
           for key in PACKED_KEYS}
    out["inputs"][:] = pad_id
    out["targets"][:] = pad_id
    fill = np.zeros(rows, np.int64)
    segments = np.zeros(rows, np.int64)
    used = 0
    for traj in trajectories:
        row_arrays = collate([traj], buckets=(length,), pad_id=pad_id)
        size = int(row_arrays["segment_ids"][0].sum())
        free = np.flatnonzero(fill + size <= length)
        if not len(free):
            break
        row, start = free[0], fill[free[0]]
        segments[row] += 1
        for key in PACKED_KEYS:
            value = row_arrays[key][0, :size]
            out[key][row, start:start + size] = segments[row] if key == "segment_ids" else value
        fill[row] += size
        used += 1
    return out, used
