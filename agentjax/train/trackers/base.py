"""What every experiment tracker is: the `Tracker` protocol train/tracking.py drives,
the run's identity (`RunInfo`), the tables it logs, and the registry of trackers."""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Protocol

import ml_collections

from agentjax.core.registry import Registry


@dataclasses.dataclass(frozen=True)
class Table:
    """Rows of values under named columns (str, int, float, bool)."""

    columns: tuple[str, ...]
    rows: list[list[Any]]

    def as_dict(self) -> dict:
        """pandas' "split" orient: what MLflow's own tables are."""
        return {"columns": list(self.columns), "data": self.rows}


@dataclasses.dataclass(frozen=True)
class RunInfo:
    """What every tracker names its run by.

    Attributes:
      workdir: the run folder (a tracker's local files go under it).
      name: the run's name (log.name, default the workdir's folder name).
      group: the run's group ('' for none): a sweep's name.
      tags: the run's tags: a sweep arm's 'key=value' overrides.
      config: the full config, flattened to dotted keys.
    """

    workdir: str
    name: str
    group: str
    tags: tuple[str, ...]
    config: dict[str, Any]


class Tracker(Protocol):
    """One tracker's run. Its methods are called on the tracker's thread, in call order;
    any may raise (the tracker is then dropped with one warning).

    Attributes:
      where: where its runs are (a server and project, a folder): a resumed run whose
        tracker is somewhere else starts a new tracker run there.
    """

    where: str

    def start(self, run_id: str | None) -> str | None:
        """Opens a new run (None) or continues run `run_id`; returns its id (None: this
        tracker has no run to continue, as event files)."""

    def log_metrics(self, stage: str, step: int, metrics: Mapping[str, float]) -> None:
        """`metrics` (full keys) at `step` of `stage`'s x-axis."""

    def log_table(self, key: str, step: int | None, table: Table) -> None:
        """`table` under `key` (at `step` of the stage `key` starts with, if not None);
        a later table under the same key without a step replaces it."""

    def log_summary(self, metrics: Mapping[str, float], step: int) -> None:
        """The run's final numbers."""

    def log_artifact(self, folder: str, name: str) -> None:
        """`folder` (an exported model) as the run's artifact `name`."""

    def finish(self, failed: bool) -> None:
        """Closes the run, marked failed or finished."""


# name -> (config, run info) -> its Tracker, or None when the config leaves it off.
TRACKERS: Registry[Callable[[ml_collections.ConfigDict, RunInfo], Tracker | None]] = (
    Registry("experiment tracker"))


