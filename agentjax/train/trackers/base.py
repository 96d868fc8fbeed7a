"""What every experiment tracker is: the `Tracker` protocol train/tracking.py drives,
the run's identity (`RunInfo`), the tables it logs, what its store holds of a resumed
run (`Held`), and the registry of trackers."""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterable, Mapping, Protocol

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


class Held:
    """What a tracker's own store holds of the run it continues: the (key, step) of
    every value logged at a step, read back from the store when the run starts. A
    resumed run sends again what its trackers were handed but cannot be sure they kept;
    each tracker drops what it holds already, so a value is in its run once.

    Args:
      entries: (key, step) pairs, keys as the tracker stores them.
      key: a key as the run logs it -> as the tracker stores it.
      steps_of: a stored key -> the steps the store holds it at, asked the first time
        the key comes (a store read one key at a time) instead of `entries`.
    """

    def __init__(self, entries: Iterable[tuple[str, int]] = (),
                 key: Callable[[str], str] = lambda key: key,
                 steps_of: Callable[[str], Iterable[int]] | None = None):
        self._entries, self._key, self._steps_of = set(entries), key, steps_of
        self._asked: set[str] = set()

    def holds(self, key: str, step: int) -> bool:
        stored = self._key(key)
        if self._steps_of is not None and stored not in self._asked:
            self._asked.add(stored)
            self._entries.update((stored, held) for held in self._steps_of(stored))
        return (stored, step) in self._entries

    def new(self, step: int, values: Mapping[str, Any]) -> dict[str, Any]:
        """The entries of `values` at `step` the store does not hold."""
        return {key: value for key, value in values.items() if not self.holds(key, step)}


class Tracker(Protocol):
    """One tracker's run. Its methods are called on the tracker's thread, in call order;
    any may raise (the tracker is then dropped with one warning).

    Attributes:
      where: where its runs are (a server and project, a folder): a resumed run whose
        tracker is somewhere else starts a new tracker run there.
      durable_on_return: whether what a call logged is in the tracker's store when the
        call returns (a synchronous client); if not, only once `finish` returned (a
        tracker that buffers: a kill before loses what it had not written, and the
        resumed run sends it again). Until then the run's tracking.json does not count
        the call as taken.
    """

    where: str
    durable_on_return: bool

    def new_run_id(self) -> str | None:
        """The id of a new run, chosen before it starts (tracking.json records it
        first, so a kill during a slow start leaves no second run), or None: the
        tracker's server gives it at `start`."""

    def start(self, run_id: str | None) -> str | None:
        """Opens a new run (None) or continues run `run_id`, reading back what its store
        holds of it (`Held`); returns its id (None: this tracker has no run to
        continue, as event files: it continues what its folder holds)."""

    def log_metrics(self, stage: str, step: int, metrics: Mapping[str, float]) -> None:
        """`metrics` (full keys) at `step` of `stage`'s x-axis, but those its store
        holds at `step` already."""

    def log_table(self, key: str, step: int | None, table: Table) -> None:
        """`table` under `key` (at `step` of the stage `key` starts with, if not None,
        unless its store holds it there already); a later table under the same key
        without a step replaces it."""

    def log_summary(self, metrics: Mapping[str, float], step: int) -> None:
        """The run's final numbers."""

    def log_artifact(self, folder: str, name: str) -> None:
        """`folder` (an exported model) as the run's artifact `name`."""

    def finish(self, failed: bool) -> None:
        """Closes the run, marked failed or finished."""


# name -> (config, run info) -> its Tracker, or None when the config leaves it off.
TRACKERS: Registry[Callable[[ml_collections.ConfigDict, RunInfo], Tracker | None]] = (
    Registry("experiment tracker"))


