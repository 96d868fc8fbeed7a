"""Weights & Biases (log.wandb): one W&B run per training run, its id in the workdir's
tracking.json, its local files under <workdir>/wandb (offline mode: `wandb sync` them
later, in order). Every stage plots against its own step (`<stage>/step`, defined as
the x-axis of `<stage>/*`); tables are W&B tables, the report's numbers the run summary,
artifacts W&B artifacts of type "model"."""
from __future__ import annotations

import re
import secrets
from typing import Mapping

from agentjax.train.trackers.base import TRACKERS, RunInfo, Table

class WandbRun:
    def __init__(self, section, info: RunInfo):
        self.section, self.info = section, info
        self.where = f"{section.entity or '(default entity)'}/{section.project}"
        self._run, self._axes = None, set()

    def start(self, run_id: str | None) -> str:
        import wandb

        s, info = self.section, self.info
        run_id = run_id or secrets.token_hex(6)
        # console="off": W&B would wrap stdout and stderr (the progress bars) otherwise;
        # quiet: no history and summary printed at the end; create_new: a run of
        # someone else's in this process is left alone.
        self._run = wandb.init(
            project=s.project, entity=s.entity or None, name=info.name,
            group=info.group or None, tags=list(info.tags) or None,
            config=info.config, id=run_id, resume="allow", mode=s.mode, dir=info.workdir,
            reinit="create_new", settings=wandb.Settings(console="off", quiet=True))
        return run_id

    def _axis(self, stage: str) -> str:
        axis = f"{stage}/step"
        if stage not in self._axes:
            self._run.define_metric(axis)
            self._run.define_metric(f"{stage}/*", step_metric=axis)
            self._axes.add(stage)
        return axis

    def log_metrics(self, stage: str, step: int, metrics: Mapping[str, float]) -> None:
        self._run.log({self._axis(stage): step, **metrics})

    def log_table(self, key: str, step: int | None, table: Table) -> None:
        import wandb

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
