"""What the trackers wrote, read back from their local files for the tests; and a fake
tracker that records its calls.

W&B offline: `<workdir>/wandb/offline-run-<time>-<id>/run-<id>.wandb`, one folder per
process that ran (a resumed run adds one with the same id), each the records
`wandb sync` uploads: `wandb_internal_pb2.Record` protobufs, read as wandb-core reads
them (trackers/wandb_run.py: `transaction_log`; wandb 0.31 has no Python reader). In
offline mode W&B writes no config.yaml nor wandb-summary.json. TensorBoard: its event
files (trackers/tensorboard_events.py: `scalars`). MLflow: its own client over the file
store.
"""
from __future__ import annotations

import glob
import json
import os

from agentjax.train.trackers import tensorboard_events, wandb_run


def wandb_runs(workdir) -> list[list]:
    """The records of each offline run folder under `workdir`, oldest first (after the
    process's W&B service is torn down: it may still hold the end of the last file)."""
    import wandb

    wandb.teardown()
    return [list(wandb_run.transaction_log(path)) for path in sorted(
        glob.glob(os.path.join(workdir, "wandb", "offline-run-*", "*.wandb")))]


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


def same_rows(a, b) -> bool:
    """Equal rows, NaN equal to NaN and 0 to 0.0 (W&B writes 0.0 as 0)."""
    def floats(value):
        if isinstance(value, dict):
            return {k: floats(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [floats(v) for v in value]
        return float(value) if isinstance(value, (int, float)) else value

    return json.dumps(floats(a), sort_keys=True) == json.dumps(floats(b), sort_keys=True)


def tensorboard_scalars(folder) -> list[tuple[str, int, float]]:
    """(tag, step, value) of every scalar in the event files under `folder`."""
    return list(tensorboard_events.scalars(str(folder)))


class FakeTracker:
    """Records its calls; `fail_at` (a metrics step) raises there, `block` waits."""

    def __init__(self, run_id="fake-run", fail_at=None, block=None, where="fake server",
                 durable_on_return=True):
        self.calls, self.run_id, self.fail_at, self.block = [], run_id, fail_at, block
        self.where, self.durable_on_return = where, durable_on_return

    def new_run_id(self):
        return None

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
