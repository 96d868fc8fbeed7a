"""Metric sinks (jsonl, TensorBoard, console progress bar) for the trainer.

`MetricsWriter.write(step, metrics)` appends one json line per call to
`<workdir>/metrics.jsonl` (the file is truncated to `step` on resume, so a resumed
run's file reads like an uninterrupted one) and mirrors scalars to TensorBoard.
"""
from __future__ import annotations

import json
import math
import os
from typing import Mapping

import numpy as np


def _scalar(value):
    value = np.asarray(value)
    if value.size != 1:
        return None
    value = value.item()
    return value if isinstance(value, (int, float, bool)) else None


class MetricsWriter:
    """Writes metrics to `<workdir>/metrics.jsonl` and, optionally, TensorBoard.

    Args:
      workdir: run folder; created if missing.
      tensorboard: also write TensorBoard event files under `<workdir>/tb`.
      resume_step: on resume, lines with `step > resume_step` (written after the
        checkpoint the run restarts from) are dropped so the file has no duplicates.
      enabled: False on non-zero processes of a multi-host run.
    """

    def __init__(self, workdir: str, *, tensorboard: bool = True, resume_step: int = 0,
                 enabled: bool = True):
        self.enabled = enabled
        self.path = os.path.join(workdir, "metrics.jsonl")
        self._tb = None
        if not enabled:
            return
        os.makedirs(workdir, exist_ok=True)
        if os.path.exists(self.path):
            with open(self.path) as f:
                kept = [line for line in f if json.loads(line).get("step", 0) <= resume_step]
            with open(self.path, "w") as f:
                f.writelines(kept)
        if tensorboard:
            from tensorboardX import SummaryWriter
            self._tb = SummaryWriter(os.path.join(workdir, "tb"))

    def write(self, step: int, metrics: Mapping[str, object]) -> dict:
        """Records the scalar entries of `metrics` at `step`; returns what was written."""
        row = {"step": int(step)}
        for key, value in metrics.items():
            value = _scalar(value)
            if value is not None:
                row[key] = value
        if self.enabled:
            # Strict JSON has no NaN/inf: the file spells them as strings, the returned
            # row keeps them as floats (the progress bar formats them).
            line = {k: v if math.isfinite(v) else str(v) for k, v in row.items()}
            with open(self.path, "a") as f:
                f.write(json.dumps(line) + "\n")
            if self._tb is not None:
                for key, value in row.items():
                    if key != "step" and math.isfinite(value):
                        self._tb.add_scalar(key, value, step)
        return row

    def close(self):
        if self._tb is not None:
            self._tb.close()


def read_metrics(workdir: str) -> list[dict]:
    """Reads back `<workdir>/metrics.jsonl` (for sweeps, reports and tests)."""
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]
