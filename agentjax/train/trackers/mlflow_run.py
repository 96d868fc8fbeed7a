"""MLflow (log.mlflow): one MLflow run per training run in experiment
log.mlflow.experiment, its id in the workdir's tracking.json. The flattened config is the
run's params (and config.json an artifact, values unclipped), the group and tags run tags
(a 'key=value' tag as tag key=value); metric keys are `mlflow_key`s; tables are JSON artifacts in pandas' "split" form
(MLflow's own table format), a step's table <key>_<step>.json; the report's numbers are
metrics at the last step.

The client is synchronous: when `log_batch` returns, the tracking server (or the file
store) has the values. A resumed run reads the run's metric history back and drops
the values it holds (a kill between a call's return and tracking.json's update, or
during the call: a file store writes a batch one metric file at a time).

A file store also rewrites a run's meta.yaml in place (truncate, then write) whenever the
run's status changes; a kill in between leaves an empty meta.yaml, and MLflow then can
neither read nor list the run (`search_runs` fails on the whole experiment). So before
each such rewrite the tracker copies meta.yaml atomically beside it (`META_BACKUP`), and a
resumed run whose meta.yaml is empty restores that copy first."""
from __future__ import annotations

import glob
import os
import re
import time
from typing import Mapping

from agentjax.core import atomic
from agentjax.train.trackers.base import TRACKERS, Held, RunInfo, Table

PARAM_CHARS = 6000  # MLflow refuses longer param values
BATCH = 100  # params per log_batch call (MLflow's limit; metrics allow 1000)
META_BACKUP = "meta.yaml.agentjax"  # a file store run's meta.yaml before a rewrite


def mlflow_key(key: str) -> str:
    """A metric or tag key as MLflow takes it: '/' only after the first part (the stage,
    MLflow's chart section), '.' for the others — a file store keeps a metric in a file
    named by its key, so "a/b" could not also have "a/b/c" — and '_' for '=' and the
    other characters MLflow refuses ("rl/eval/success/hops=1" -> "rl/eval.success.hops_1")."""
    head, slash, rest = key.partition("/")
    return re.sub(r"[^/\w.\- ]", "_", head + slash + rest.replace("/", "."))


def param_value(value) -> str:
    """A config value as the MLflow param it is logged as."""
    return str(value)[:PARAM_CHARS]


def run_tags(info: RunInfo) -> dict[str, str]:
    tags = {"group": info.group} if info.group else {}
    for tag in info.tags:
        key, _, value = tag.partition("=")
        tags[mlflow_key(key)] = value
    return tags


class MlflowRun:
    def __init__(self, section, info: RunInfo):
        self.section, self.info = section, info
        self.where = f"{section.tracking_uri} experiment {section.experiment}"
        self._client = self._run_id = None
        self.held = Held(key=mlflow_key)
        # Imported on the thread that makes the run's trackers, not the tracker's own:
        # CPython 3.11 compiling on two threads at once can fail (`SystemError: AST
        # constructor recursion depth mismatch`), and the training run imports meanwhile.
        import mlflow.entities  # noqa: F401
        import mlflow.tracking  # noqa: F401

    durable_on_return = True  # a synchronous client (module docstring)

    def new_run_id(self) -> None:
        return None

    def start(self, run_id: str | None) -> str:
        uri = self.section.tracking_uri
        if uri.startswith("file:"):
            # MLflow 3 refuses a file store unless asked for; a `file:` URI asks for one.
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        self._client = client = MlflowClient(tracking_uri=uri)
        if run_id is not None:
            self._restore_meta(run_id)
            # A file store killed mid-`log_batch` can hold a metric file with no line
            # yet, which `get_run` (and `update_run`, which reads the run first) refuses
            # until the replay appends that metric; `finish` sets the status then.
            try:
                self._save_meta(run_id)
                client.update_run(run_id, status="RUNNING")
            except ValueError:
                pass
            self._run_id = run_id
            # Key by key, as the keys come (so no `get_run`).
            self.held = Held(key=mlflow_key, steps_of=lambda key: [
                metric.step for metric in client.get_metric_history(run_id, key)])
            return run_id
        experiment = client.get_experiment_by_name(self.section.experiment)
        experiment_id = (experiment.experiment_id if experiment is not None
                         else client.create_experiment(self.section.experiment))
        self._run_id = client.create_run(experiment_id, run_name=self.info.name,
                                         tags=run_tags(self.info)).info.run_id
        params = [Param(key, param_value(value)) for key, value in self.info.config.items()]
        for start in range(0, len(params), BATCH):
            client.log_batch(self._run_id, params=params[start:start + BATCH])
        client.log_dict(self._run_id, self.info.config, "config.json")
        return self._run_id

    def _metrics(self, metrics: Mapping[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(mlflow_key(key), float(value), now, step) for key, value in metrics.items()]
        for start in range(0, len(batch), 1000):
            self._client.log_batch(self._run_id, metrics=batch[start:start + 1000])

    def log_metrics(self, stage: str, step: int, metrics: Mapping[str, float]) -> None:
        self._metrics(self.held.new(step, metrics), step)

    def log_table(self, key: str, step: int | None, table: Table) -> None:
        name = key if step is None else f"{key}_{step:06d}"
        self._client.log_dict(self._run_id, table.as_dict(), f"{name}.json")

    def log_summary(self, metrics: Mapping[str, float], step: int) -> None:
        self._metrics(self.held.new(step, metrics), step)

    def log_artifact(self, folder: str, name: str) -> None:
        self._client.log_artifacts(self._run_id, folder, artifact_path=name)

    def finish(self, failed: bool) -> None:
        self._save_meta(self._run_id)
        self._client.set_terminated(self._run_id, "FAILED" if failed else "FINISHED")

    def _meta_path(self, run_id: str) -> str | None:
        """The run's meta.yaml in a file store (<root>/<experiment id>/<run id>/), else
        None (a tracking server or a database keeps its own records whole)."""
        uri = self.section.tracking_uri
        if not uri.startswith("file:"):
            return None
        root = uri.removeprefix("file:").removeprefix("//")
        found = glob.glob(os.path.join(glob.escape(root), "*", run_id, "meta.yaml"))
        return found[0] if found else None

    def _save_meta(self, run_id: str) -> None:
        path = self._meta_path(run_id)
        if path is not None and os.path.getsize(path):
            with open(path) as f:
                atomic.write_text(os.path.join(os.path.dirname(path), META_BACKUP), f.read())

    def _restore_meta(self, run_id: str) -> None:
        path = self._meta_path(run_id)
        backup = path and os.path.join(os.path.dirname(path), META_BACKUP)
        if path is not None and not os.path.getsize(path) and os.path.exists(backup):
            with open(backup) as f:
                atomic.write_text(path, f.read())


@TRACKERS.register("mlflow")
def mlflow_run(config, info: RunInfo) -> MlflowRun | None:
    return MlflowRun(config.log.mlflow, info) if config.log.mlflow.tracking_uri else None
