"""Metric sinks (jsonl, the experiment trackers, console progress bar) for the trainer.

`MetricsWriter.write(step, metrics)` appends one json line per call to
`<folder>/metrics.jsonl` (on resume the rows after the restored step, and a last line
a kill cut short, are dropped, so a resumed run's file reads like an uninterrupted one)
and hands the row to the run's trackers (train/tracking.py: TensorBoard, W&B, MLflow).
`StepLog` is that file without the scalar filter, for other per-step records (the
trained groups).
"""
from __future__ import annotations

import json
import math
import os
from typing import Mapping

import numpy as np

from agentjax.core import atomic
from agentjax.train.tracking import Tracking


def _scalar(value):
    value = np.asarray(value)
    if value.size != 1:
        return None
    value = value.item()
    return value if isinstance(value, (int, float, bool)) else None


class StepLog:
    """A JSONL file of rows with a "step" key, one appended per call.

    Args:
      path: the file; its folder is created if missing.
      resume_step: on resume, rows with `step > resume_step` (written after the
        checkpoint the run restarts from) are dropped so the file has no duplicates.
      enabled: False on non-zero processes of a multi-host run.

    Attributes:
      kept: the rows kept from an earlier run of the workdir.
    """

    def __init__(self, path: str, *, resume_step: int = 0, enabled: bool = True):
        self.path, self.enabled, self.kept = path, enabled, []
        if not enabled:
            return
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        if os.path.exists(path):
            self.kept = [row for row in _read_rows(path) if row["step"] <= resume_step]
            atomic.write_text(path, "".join(json.dumps(row) + "\n" for row in self.kept))

    def append(self, row: Mapping[str, object]) -> None:
        if self.enabled:
            with open(self.path, "a") as f:
                f.write(json.dumps(row) + "\n")


class MetricsWriter:
    """Writes a stage's metrics to `<folder>/metrics.jsonl` and the run's trackers.

    Args:
      folder: the stage's folder; created if missing.
      stage: the stage's name in the trackers (its keys are `<stage>/<key>` there).
      tracking: the run's trackers (None: none). The rows kept on resume are passed to
        them again: each takes the steps it has not taken yet (train/tracking.py).
      resume_step: on resume, lines with `step > resume_step` (written after the
        checkpoint the run restarts from) are dropped so the file has no duplicates.
      enabled: False on non-zero processes of a multi-host run.
    """

    def __init__(self, folder: str, *, stage: str, tracking: Tracking | None = None,
                 resume_step: int = 0, enabled: bool = True):
        self.enabled, self.stage = enabled, stage
        self.tracking = tracking or Tracking()
        self._log = StepLog(os.path.join(folder, "metrics.jsonl"), resume_step=resume_step,
                            enabled=enabled)
        self.path = self._log.path
        for row in self._log.kept:
            self.tracking.log_row(stage, row["step"], {k: _number(v) for k, v in row.items()})

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
            self._log.append({k: v if math.isfinite(v) else str(v) for k, v in row.items()})
            self.tracking.log_row(self.stage, step, row)
        return row


def _number(value):
    """A metrics.jsonl value as written: "nan", "inf" and "-inf" are floats."""
    return float(value) if isinstance(value, str) else value


def _read_rows(path: str) -> list[dict]:
    """The rows of a metrics file. A run killed while appending leaves its last line
    cut short: that line is dropped (its step is redone on resume); a bad line anywhere
    else is an error."""
    with open(path) as f:
        lines = f.readlines()
    rows = []
    for number, line in enumerate(lines, 1):
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            if number < len(lines):
                raise ValueError(f"{path}:{number}: not a json line: {line[:200]!r}") from None
    return rows


def read_metrics(workdir: str) -> list[dict]:
    """Reads back `<workdir>/metrics.jsonl` (for sweeps, reports and tests)."""
    return read_step_log(os.path.join(workdir, "metrics.jsonl"))


def read_step_log(path: str) -> list[dict]:
    """Reads back a `StepLog` file."""
    return _read_rows(path)
