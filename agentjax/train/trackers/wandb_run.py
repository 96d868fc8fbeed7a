"""Weights & Biases (log.wandb): one W&B run per training run, its id in the workdir's
tracking.json, its local files under <workdir>/wandb (offline mode: `wandb sync` them
later, in order). Every stage plots against its own step (`<stage>/step`, defined as
the x-axis of `<stage>/*`); tables are W&B tables, the report's numbers the run summary,
artifacts W&B artifacts of type "model".

What W&B holds survives a kill only once written: `run.log` hands a record to W&B's
service (wandb-core), which appends it to the run's transaction log
(`<sync dir>/run-<id>.wandb`, the file `wandb sync` uploads) through a LevelDB log
writer that keeps the current 32 KiB block in memory and writes it when it fills,
every `x_transaction_log_flush_interval` (15 s) and when the run finishes (wandb-core:
core/internal/transactionlog/writer.go, stream/writer.go; wandb/sdk/wandb_settings.py).
The SDK offers no call that waits for that write, so a row counts as taken only once
`finish` returned, and a resumed run reads back what this run's transaction logs
(offline) or the server (online) hold and drops it from what it sends again.
"""
from __future__ import annotations

import glob
import json
import os
import re
import secrets
import struct
import zlib
from typing import Any, Iterator, Mapping

from agentjax.train.trackers.base import TRACKERS, Held, RunInfo, Table

# A .wandb file: a 7-byte header (":W&B", magic 0xBEE1, version 0), then LevelDB's log
# format: 32 KiB blocks of chunks, each a header (CRC-32 (IEEE) of its type and data,
# uint16 length, type: 1 full, 2 first, 3 middle, 4 last) and data; a record is one
# `wandb_internal_pb2.Record` protobuf in one or more chunks (wandb-core:
# core/pkg/leveldb/record.go).
HEADER = b":W&B\xe1\xbe\x00"
BLOCK = 32768
CHUNK_HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def transaction_log(path: str) -> Iterator:
    """The `Record`s a .wandb file holds, as wandb-core reads them: a chunk with a bad
    checksum or cut short (a kill mid-write) is skipped with the rest of its block."""
    from wandb.proto import wandb_internal_pb2

    with open(path, "rb") as f:
        data = f.read()
    if data[:len(HEADER)] != HEADER:
        raise ValueError(f"{path}: not a W&B transaction log (header {data[:7]!r})")
    pos, pending = len(HEADER), None
    while pos + CHUNK_HEADER <= len(data):
        block_end = (pos // BLOCK + 1) * BLOCK
        if block_end - pos < CHUNK_HEADER:  # a block's tail too short for a chunk
            pos = block_end
            continue
        checksum, length, kind = struct.unpack("<IHB", data[pos:pos + CHUNK_HEADER])
        start, end = pos + CHUNK_HEADER, pos + CHUNK_HEADER + length
        if (checksum, length, kind) == (0, 0, 0) or end > min(block_end, len(data)) or (
                zlib.crc32(data[start - 1:end]) != checksum):
            pos, pending = block_end, None  # zeros to the block's end, or damage
            continue
        pos, chunk = end, data[start:end]
        if kind in (FULL, FIRST):
            pending = chunk
        elif pending is not None:  # a middle or last chunk of the record begun
            pending += chunk
        if kind in (FULL, LAST) and pending is not None:
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            yield record
            pending = None


def history_values(record) -> dict[str, Any]:
    """A history record's values by key (a table's by its key)."""
    return {item.key or item.nested_key[0]: json.loads(item.value_json)
            for item in record.history.item}


def held_entries(rows) -> Iterator[tuple[str, int]]:
    """(key, step) of each value of history `rows` (dicts) logged at a stage's step."""
    for row in rows:
        for key in row:
            step = row.get(f"{key.split('/')[0]}/step")
            if not key.startswith("_") and step is not None and not key.endswith("/step"):
                yield key, int(step)

class WandbRun:
    def __init__(self, section, info: RunInfo):
        self.section, self.info = section, info
        self.where = f"{section.entity or '(default entity)'}/{section.project}"
        self._run, self._axes, self.held = None, set(), Held()
        # Imported on the thread that makes the run's trackers, not the tracker's own:
        # CPython 3.11 compiling on two threads at once can fail (`SystemError: AST
        # constructor recursion depth mismatch`), and the training run imports meanwhile.
        import wandb  # noqa: F401
        import wandb.sdk.wandb_init  # noqa: F401

    durable_on_return = False  # the transaction log is written in blocks (module docstring)

    def new_run_id(self) -> str:
        return secrets.token_hex(6)

    def start(self, run_id: str | None) -> str:
        import wandb

        s, info = self.section, self.info
        run_id = run_id or self.new_run_id()
        # console="off": W&B would wrap stdout and stderr (the progress bars) otherwise;
        # quiet: no history and summary printed at the end; create_new: a run of
        # someone else's in this process is left alone.
        self._run = wandb.init(
            project=s.project, entity=s.entity or None, name=info.name,
            group=info.group or None, tags=list(info.tags) or None,
            config=info.config, id=run_id, resume="allow", mode=s.mode, dir=info.workdir,
            reinit="create_new", settings=wandb.Settings(console="off", quiet=True))
        if self._run.resumed or self._run.offline:  # a new online run holds nothing
            self.held = Held(held_entries(self._history(run_id)))
        return run_id

    def _history(self, run_id: str) -> Iterator[dict[str, Any]]:
        """The rows W&B holds of run `run_id`: on the server (online), else in the
        transaction logs of the earlier processes (this one's file is still empty)."""
        settings = self._run.settings
        if not self._run.offline:
            import wandb

            api = wandb.Api(overrides={"base_url": settings.base_url})
            yield from api.run(self._run.path).scan_history(page_size=1000, use_cache=False)
            return
        mine = os.path.realpath(settings.sync_file)
        for path in sorted(glob.glob(os.path.join(settings.wandb_dir, f"*run-*-{run_id}",
                                                  f"run-{run_id}.wandb"))):
            if os.path.realpath(path) != mine:
                yield from (history_values(record) for record in transaction_log(path)
                            if record.WhichOneof("record_type") == "history")

    def _axis(self, stage: str) -> str:
        axis = f"{stage}/step"
        if stage not in self._axes:
            self._run.define_metric(axis)
            self._run.define_metric(f"{stage}/*", step_metric=axis)
            self._axes.add(stage)
        return axis

    def log_metrics(self, stage: str, step: int, metrics: Mapping[str, float]) -> None:
        metrics = self.held.new(step, metrics)
        if metrics:
            self._run.log({self._axis(stage): step, **metrics})

    def log_table(self, key: str, step: int | None, table: Table) -> None:
        import wandb

        if step is not None and self.held.holds(key, step):
            return
        row = {key: wandb.Table(columns=list(table.columns), data=table.rows)}
        if step is not None:
            row[self._axis(key.split("/")[0])] = step
        self._run.log(row)

    def log_summary(self, metrics: Mapping[str, float], step: int) -> None:
        self._run.summary.update(dict(metrics))

    def log_artifact(self, folder: str, name: str) -> None:
        import wandb

        artifact = wandb.Artifact(re.sub(r"[^\w.-]", "-", f"{self.info.name}-{name}"),
                                  type="model")
        artifact.add_dir(folder)
        self._run.log_artifact(artifact)

    def finish(self, failed: bool) -> None:
        self._run.finish(exit_code=1 if failed else 0)


@TRACKERS.register("wandb")
def wandb_run(config, info: RunInfo) -> WandbRun | None:
    return None if config.log.wandb.mode == "disabled" else WandbRun(config.log.wandb, info)
