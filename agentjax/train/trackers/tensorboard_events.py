"""TensorBoard event files: every stage's scalars in <workdir>/tb, tagged `<stage>/<key>`
at the stage's step (log.tensorboard)."""
from __future__ import annotations

import glob
import math
import os
import struct
import time
from typing import Iterator, Mapping

from agentjax.train.trackers.base import TRACKERS, Held, RunInfo, Table

FOLDER = "tb"  # in the workdir


def scalars(folder: str) -> Iterator[tuple[str, int, float]]:
    """(tag, step, value) of every scalar in the event files under `folder`, oldest
    file first. An event file is TFRecords (uint64 length, its masked CRC-32C, an
    `Event` protobuf, its masked CRC-32C); a record cut short or damaged (a kill
    mid-write) ends its file."""
    from tensorboardX.proto import event_pb2
    from tensorboardX.record_writer import masked_crc32c

    for path in sorted(glob.glob(os.path.join(folder, "events.out.tfevents.*"))):
        with open(path, "rb") as f:
            data = f.read()
        pos = 0
        while pos + 12 <= len(data):
            header, (header_crc,) = data[pos:pos + 8], struct.unpack("<I", data[pos + 8:pos + 12])
            (length,) = struct.unpack("<Q", header)
            body = data[pos + 12:pos + 12 + length]
            crc = data[pos + 12 + length:pos + 16 + length]
            if (masked_crc32c(header) != header_crc or len(crc) < 4
                    or struct.unpack("<I", crc)[0] != masked_crc32c(body)):
                break
            pos += 16 + length
            event = event_pb2.Event()
            event.ParseFromString(body)
            for value in event.summary.value:
                yield value.tag, event.step, value.simple_value


class TensorBoardEvents:
    """Scalars only: the tables are in the workdir as files already (samples/,
    errors.jsonl, final.json). Flushed at every row for a live TensorBoard; what a
    kill left unwritten is sent again by the resumed run, which reads the folder's
    event files back first and drops the scalars they hold."""

    durable_on_return = False  # tensorboardX writes from a queue of its own

    def __init__(self, folder: str):
        self.folder, self.where, self._writer, self.held = folder, folder, None, Held()
        # Imported on the thread that makes the run's trackers, not the tracker's own:
        # CPython 3.11 compiling on two threads at once can fail (`SystemError: AST
        # constructor recursion depth mismatch`), and the training run imports meanwhile.
        import tensorboardX  # noqa: F401
        import tensorboardX.record_writer  # noqa: F401

    def new_run_id(self) -> None:
        return None

    def start(self, run_id: str | None) -> None:
        from tensorboardX import SummaryWriter

        self.held = Held((tag, step) for tag, step, _ in scalars(self.folder))
        # Event files are named by the second they were opened in: a rerun within that
        # second must neither replace the file before it nor sort before it.
        self._writer = SummaryWriter(self.folder, filename_suffix=f".{time.time_ns()}")
        return None

    def log_metrics(self, stage: str, step: int, metrics: Mapping[str, float]) -> None:
        for key, value in self.held.new(step, metrics).items():
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
