"""What the trackers wrote, read back from their local files for the tests; and a fake
tracker that records its calls.

W&B offline: `<workdir>/wandb/offline-run-<time>-<id>/run-<id>.wandb`, one folder per
process that ran (a resumed run adds one with the same id). In offline mode W&B writes
no config.yaml nor wandb-summary.json (0.31), and the Python reader of these files is
gone from the package (its Go core reads them), so they are read here: a `.wandb` file
is LevelDB's log format — a 7-byte header (":W&B", magic 0xBEE1, version 0), then
32 KiB blocks of chunks (crc32c, uint16 length, type: 1 full, 2 first, 3 middle, 4
last) — holding one `wandb_internal_pb2.Record` protobuf per record: what `wandb sync`
uploads. TensorBoard: TFRecord files of `Event` protobufs (uint64 length, crc, data,
crc). MLflow: its own client over the file store.
"""
from __future__ import annotations

import glob
import json
import os
import struct

_BLOCK = 32768
_CHUNK_HEADER = 7  # crc32c (4), length (2), type (1)
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def _leveldb_records(data: bytes, start: int):
    pos, pending = start, b""
    while pos + _CHUNK_HEADER <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < _CHUNK_HEADER:  # a block's tail too short for a header is padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + _CHUNK_HEADER])
        if kind == 0:  # zeros to the block's end
            pos += left
            continue
        chunk = data[pos + _CHUNK_HEADER:pos + _CHUNK_HEADER + length]
        pos += _CHUNK_HEADER + length
        if kind == _FULL:
            yield chunk
        elif kind == _FIRST:
            pending = chunk
        elif kind == _MIDDLE:
            pending += chunk
        else:
            yield pending + chunk
            pending = b""


def wandb_runs(workdir) -> list[list]:
    """The records of each offline run folder under `workdir`, oldest first (after the
    process's W&B service is torn down: it may still hold the end of the last file)."""
    import wandb
    from wandb.proto import wandb_internal_pb2

    wandb.teardown()

    runs = []
    for path in sorted(glob.glob(os.path.join(workdir, "wandb", "offline-run-*", "*.wandb"))):
        with open(path, "rb") as f:
            data = f.read()
        assert data[:4] == b":W&B", path
        records = []
        for raw in _leveldb_records(data, _CHUNK_HEADER):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(raw)
            records.append(record)
        runs.append(records)
    return runs


def _values(items) -> dict:
    return {item.key or "/".join(item.nested_key): json.loads(item.value_json)
            for item in items}


def wandb_run_record(records) -> dict:
    """The run record: id, name, group, tags, config (without W&B's own "_wandb")."""
    run = next(r.run for r in records if r.WhichOneof("record_type") == "run")
    config = {k: v for k, v in _values(run.config.update).items() if k != "_wandb"}
    return {"id": run.run_id, "name": run.display_name, "group": run.run_group,
            "tags": list(run.tags), "config": config}


def wandb_history(records) -> list[dict]:
    """The logged rows, W&B's own keys (_step, _runtime, _timestamp) left out."""
    return [{k: v for k, v in _values(r.history.item).items() if not k.startswith("_")}
            for r in records if r.WhichOneof("record_type") == "history"]


def wandb_summary(records) -> dict:
    summary = {}
    for record in records:
        if record.WhichOneof("record_type") == "summary":
            summary.update(_values(record.summary.update))
    return {k: v for k, v in summary.items() if not k.startswith("_")}


def stage_rows(history: list[dict], stage: str) -> list[dict]:
    """A stage's rows as metrics.jsonl has them: `<stage>/step` as "step", the stage's
    prefix dropped (a table's row, its keys `<key>/_type`, `<key>/path`..., included)."""
    prefix = f"{stage}/"
    return [{("step" if k == f"{prefix}step" else k[len(prefix):]): v for k, v in row.items()}
            for row in history if f"{prefix}step" in row]


def wandb_table_steps(history: list[dict], key: str, stage: str) -> list[int]:
    """The `<stage>/step` of each table logged under `key`."""
    return [row[f"{stage}/step"] for row in history if row.get(f"{key}/_type") == "table-file"]


def tensorboard_scalars(folder) -> list[tuple[str, int, float]]:
    """(tag, step, value) of every scalar in the event files under `folder`."""
    from tensorboardX.proto import event_pb2

    scalars = []
    for path in sorted(glob.glob(os.path.join(folder, "events.out.tfevents.*"))):
        with open(path, "rb") as f:
            data = f.read()
        pos = 0
        while pos < len(data):
            (length,) = struct.unpack("<Q", data[pos:pos + 8])
            event = event_pb2.Event()
            event.ParseFromString(data[pos + 12:pos + 12 + length])
            pos += 12 + length + 4
            scalars += [(v.tag, event.step, v.simple_value) for v in event.summary.value]
    return scalars


class FakeTracker:
    """Records its calls; `fail_at` (a metrics step) raises there, `block` waits."""

    def __init__(self, run_id="fake-run", fail_at=None, block=None, where="fake server"):
        self.calls, self.run_id, self.fail_at, self.block = [], run_id, fail_at, block
        self.where = where

    def start(self, run_id):
        self.calls.append(("start", run_id))
        return run_id or self.run_id

    def log_metrics(self, stage, step, metrics):
        if self.block is not None:
            self.block.wait()
        if step == self.fail_at:
            raise ConnectionError("tracking server unreachable\nretrying...")
        self.calls.append(("metrics", stage, step, dict(metrics)))

    def log_table(self, key, step, table):
        self.calls.append(("table", key, step, table.rows))

    def log_summary(self, metrics, step):
        self.calls.append(("summary", step, dict(metrics)))

    def log_artifact(self, folder, name):
        self.calls.append(("artifact", folder, name))

    def finish(self, failed):
        self.calls.append(("finish", failed))

    def steps(self, stage="rl"):
        return [c[2] for c in self.calls if c[0] == "metrics" and c[1] == stage]
