"""TensorBoard event files: every stage's scalars in <workdir>/tb, tagged `<stage>/<key>`
at the stage's step (log.tensorboard)."""
from __future__ import annotations

import math
import os
import time
from typing import Mapping

from agentjax.train.trackers.base import TRACKERS, RunInfo, Table

FOLDER = "tb"  # in the workdir


class TensorBoardEvents:
    """Scalars only: the tables are in the workdir as files already (samples/,
    errors.jsonl, final.json). Written through at every row, so what a kill leaves is on
    disk."""

    def __init__(self, folder: str):
        self.folder, self.where, self._writer = folder, folder, None

    def start(self, run_id: str | None) -> None:
        from tensorboardX import SummaryWriter

        # Event files are named by the second they were opened in: a rerun within that
        # second must neither replace the file before it nor sort before it.
        self._writer = SummaryWriter(self.folder, filename_suffix=f".{time.time_ns()}")
        return None

    def log_metrics(self, stage: str, step: int, metrics: Mapping[str, float]) -> None:
        for key, value in metrics.items():
            if math.isfinite(value):  # TensorBoard plots no NaN or infinity
                self._writer.add_scalar(key, value, step)
        self._writer.flush()

    def log_table(self, key: str, step: int | None, table: Table) -> None:
        pass

    def log_summary(self, metrics: Mapping[str, float], step: int) -> None:
        pass

    def log_artifact(self, folder: str, name: str) -> None:
        pass

    def finish(self, failed: bool) -> None:
        self._writer.close()


@TRACKERS.register("tensorboard")
def tensorboard_events(config, info: RunInfo) -> TensorBoardEvents | None:
    return TensorBoardEvents(os.path.join(info.workdir, FOLDER)) if config.log.tensorboard else None
