"""The run in the experiment trackers researchers compare runs in (TensorBoard, Weights &
Biases, MLflow): one tracker run per training run, every stage's metrics rows at their
steps, held-out evaluations, the final report, sampled episodes and errors as tables,
the exported policy as an artifact.

    tracking = Tracking.start(config, workdir, enabled=is_main, log=runtime.log)
    tracking.log_row("rl", step, row)               # MetricsWriter, after metrics.jsonl
    tracking.log_evaluation("sft", step, metrics)   # keys as given ("sft/success_greedy")
    tracking.log_samples("rl", step, table)         # train/episodes.py
    tracking.log_errors(table)                      # every error row so far
    tracking.log_report(results, table, step)
    tracking.log_artifact(folder, "hf", step)
    tracking.close(failed=False)

A stage's metric `key` is `<stage>/<key>` in the trackers ("rl/reward/mean", "sft/nll"),
each stage with its own x-axis `<stage>/step`: the stages' step counters all start at 1.

The local files are the record; a tracker only mirrors them, never stops the run nor
makes it wait on a server: each tracker works on a thread of its own, in call order,
and the first error it raises (a server that cannot be reached, a missing login, the
workdir's tracking.json unwritable) is one warning, after which the run goes on without
it. `close` waits for them at most CLOSE_TIMEOUT_S.

Resume: <workdir>/tracking.json keeps, per tracker, its run id (a rerun in the workdir
continues the same tracker run, unless the tracker is somewhere else now: another
server, project or experiment) and the last step of each stream its store has made
durable (a stage's rows, its samples, an evaluation, the error rows): when the call
returned for a synchronous client (MLflow), only once the run finished for one that
buffers (W&B, TensorBoard), as a kill loses what it had not written. A call at a step
the tracker has durably is skipped; the rows a resumed stage keeps in its
metrics.jsonl are passed again (MetricsWriter), so rows a kill kept from a tracker, or
rows of a run that turned a tracker on later, reach it too, and a tracker continuing
its run reads back what its own store holds (`trackers.Held`: W&B's transaction logs
or server, MLflow's metric history, TensorBoard's event files) and drops those values:
after a kill at any point, each row is in each tracker once. A tracker keeps what it
took first: for a step redone after the last checkpoint, the values of the run that
first logged it (equal, but for timings: runs are reproducible).
"""
from __future__ import annotations

import json
import os
import queue
import threading
import time
from typing import Any, Callable, Mapping

import ml_collections

from agentjax.core import atomic
from agentjax.train.trackers import TRACKERS, RunInfo, Table, Tracker

STATE_FILE = "tracking.json"  # in the workdir
CLOSE_TIMEOUT_S = 120.0  # what `close` waits for the trackers together
ERRORS = "errors"  # the stream of the error rows (errors.jsonl)


def flat_config(config: ml_collections.ConfigDict | Mapping) -> dict[str, Any]:
    """{"algo.lr": 1e-6, ...}: every leaf of `config` under its dotted key."""
    flat = {}

    def walk(node: Mapping, prefix: str) -> None:
        for key, value in node.items():
            if isinstance(value, (ml_collections.ConfigDict, Mapping)):
                walk(value, f"{prefix}{key}.")
            else:
                flat[f"{prefix}{key}"] = value

    walk(config, "")
    return flat


def run_info(config: ml_collections.ConfigDict, workdir: str) -> RunInfo:
    tags = tuple(tag.strip() for tag in config.log.tags.split(",") if tag.strip())
    return RunInfo(workdir=workdir, name=config.log.name or os.path.basename(workdir),
                   group=config.log.group, tags=tags, config=flat_config(config))


class _Progress:
    """<workdir>/tracking.json: per tracker, {"run_id": ..., "where": ..., "done": {stream:
    last step its store has made durable}}, rewritten atomically whenever that grows
    (from the trackers' threads: each changes only its own entry, under the lock)."""

    def __init__(self, path: str):
        self.path, self._lock = path, threading.Lock()
        self.state: dict[str, dict] = _read_state(path) if os.path.exists(path) else {}

    def of(self, tracker: str) -> dict:
        with self._lock:
            return self.state.setdefault(tracker, {"run_id": None, "done": {}})

    def update(self, tracker: str, *, run: tuple[str | None, str] | None = None,
               done: Mapping[str, int] | None = None) -> None:
        """Records a new run (id, where; the old run's progress is forgotten) or the
        last durable step of streams."""
        with self._lock:
            mine = self.state[tracker]
            if run is not None:
                (mine["run_id"], mine["where"]), mine["done"] = run, {}
            else:
                mine["done"].update(done)
            atomic.write_json(self.path, self.state)


def _read_state(path: str) -> dict:
    with open(path) as f:
        try:
            state = json.load(f)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}: not json ({error}); it holds the tracker runs' ids "
                             "and progress (delete it to start new tracker runs)") from None
    def well_formed(entry) -> bool:
        return (isinstance(entry, dict) and isinstance(entry.get("done"), dict)
                and all(isinstance(step, int) for step in entry["done"].values()))

    if not isinstance(state, dict) or not all(map(well_formed, state.values())):
        raise ValueError(f"{path}: expected {{tracker: {{'run_id': ..., 'done': {{stream: "
                         f"step}}}}}}, got {str(state)[:200]} (delete it to start new "
                         "tracker runs)")
    return state


class _Worker:
    """One tracker on a thread of its own, started at once: the tracker's run starts
    (seconds, for W&B's service) while the training run builds its model."""

    _STOP = object()

    def __init__(self, name: str, tracker: Tracker, progress: _Progress,
                 log: Callable[[str], None]):
        self.name, self.tracker, self.progress, self.log = name, tracker, progress, log
        self.mine = progress.of(name)
        self.failed = False
        # stream -> the last step handed to the tracker; of those, the ones not yet
        # durable (recorded in tracking.json once the tracker finished).
        self.taken: dict[str, int] = {}
        self._unsaved: dict[str, int] = {}
        self._queue: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._work, name=f"tracker-{name}",
                                        daemon=True)
        self._thread.start()

    def submit(self, stream: str | None, step: int | None, call: Callable[[Tracker], None]):
        """Runs `call(tracker)` unless the tracker took `stream` at `step` or later."""
        self._queue.put((stream, step, call))

    def stop(self, failed: bool) -> None:
        self._queue.put((None, None, lambda tracker: self._finish(failed)))
        self._queue.put(self._STOP)

    def join(self, timeout_s: float) -> bool:
        """Whether the thread finished within `timeout_s`."""
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def _work(self) -> None:
        self._guarded(self._start)
        while True:
            item = self._queue.get()
            if item is self._STOP:
                return
            stream, step, call = item
            if self.failed or (stream is not None and step <= self.taken.get(stream, -1)):
                continue
            self._guarded(lambda: self._take(stream, step, call))

    def _take(self, stream: str | None, step: int | None, call: Callable[[Tracker], None]):
        call(self.tracker)
        if stream is not None:
            self.taken[stream] = step
            if self.tracker.durable_on_return:
                self.progress.update(self.name, done={stream: step})
            else:
                self._unsaved[stream] = step

    def _finish(self, failed: bool) -> None:
        self.tracker.finish(failed)
        if self._unsaved:
            self.progress.update(self.name, done=self._unsaved)

    def _start(self) -> None:
        where = self.tracker.where
        if self.mine.get("where", where) != where:
            self.log(f"{self.name}: the run's tracker is now {where} (was "
                     f"{self.mine['where']}): a new {self.name} run there")
            self.progress.update(self.name, run=(None, where))
        if self.mine["run_id"] is None and (chosen := self.tracker.new_run_id()) is not None:
            self.progress.update(self.name, run=(chosen, where))
        run_id = self.tracker.start(self.mine["run_id"])
        if run_id != self.mine["run_id"] or "where" not in self.mine:
            self.progress.update(self.name, run=(run_id, where))
        self.taken = dict(self.mine["done"])

    def _guarded(self, fn: Callable[[], None]) -> bool:
        if self.failed:
            return False
        try:
            fn()
            return True
        except Exception as error:  # a tracker must never stop the run
            self.failed = True
            first = str(error).strip().splitlines()[0][:500] if str(error).strip() else ""
            self.log(f"warning: {self.name}: {type(error).__name__}: {first}; the run goes "
                     f"on without {self.name} (metrics.jsonl and the workdir's other files "
                     "have everything)")
            return False


class Tracking:
    """The run's trackers (module docstring).

    Args:
      trackers: name -> tracker (none: a process that does not write, a tool reading a
        finished run, a test).
      workdir: where tracking.json is (needed with trackers).
      log: where the warnings go.
    """

    def __init__(self, trackers: Mapping[str, Tracker] | None = None, *,
                 workdir: str | None = None, log: Callable[[str], None] = print):
        self.log = log
        self._workers = []
        if trackers:
            os.makedirs(workdir, exist_ok=True)
            progress = _Progress(os.path.join(workdir, STATE_FILE))
            self._workers = [_Worker(name, tracker, progress, log)
                             for name, tracker in trackers.items()]

    @classmethod
    def start(cls, config: ml_collections.ConfigDict, workdir: str, *, enabled: bool,
              log: Callable[[str], None]) -> "Tracking":
        """The trackers `config` turns on, continuing the runs of `workdir`'s
        tracking.json; none unless `enabled` (the main process)."""
        if not enabled:
            return cls(log=log)
        info = run_info(config, workdir)
        trackers = {name: TRACKERS.get(name)(config, info) for name in TRACKERS}
        return cls({name: t for name, t in trackers.items() if t is not None},
                   workdir=workdir, log=log)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(worker.name for worker in self._workers)

    def _submit(self, stream: str | None, step: int | None, call: Callable[[Tracker], None]):
        for worker in self._workers:
            worker.submit(stream, step, call)

    def log_row(self, stage: str, step: int, row: Mapping[str, float]) -> None:
        """A stage's metrics row (its keys without the stage, "step" left out)."""
        metrics = {f"{stage}/{key}": value for key, value in row.items() if key != "step"}
        self._submit(stage, step, lambda t: t.log_metrics(stage, step, metrics))

    def log_evaluation(self, stage: str, step: int, metrics: Mapping[str, float]) -> None:
        """A held-out evaluation outside the stage's rows, at `step` of `stage`'s x-axis;
        its keys as given."""
        metrics = dict(metrics)
        self._submit(f"{stage}/eval", step, lambda t: t.log_metrics(stage, step, metrics))

    def log_samples(self, stage: str, step: int, table: Table) -> None:
        """The episodes `stage` sampled at `step` (one row each)."""
        self._submit(f"{stage}/samples", step,
                     lambda t: t.log_table(f"{stage}/samples", step, table))

    def log_errors(self, table: Table) -> None:
        """Every error row so far (errors.jsonl): the trackers' table of them is replaced
        when it has fewer rows."""
        self._submit(ERRORS, len(table.rows), lambda t: t.log_table(ERRORS, None, table))

    def log_report(self, results: Mapping[str, float], table: Table, step: int) -> None:
        """The final report: its numbers (as final/<key>) and its table, once per `step`
        (the last step of the run)."""
        summary = {f"final/{key}": value for key, value in results.items()}

        def report(tracker: Tracker) -> None:
            tracker.log_summary(summary, step)
            tracker.log_table("report", None, table)

        self._submit("report", step, report)

    def log_artifact(self, folder: str, name: str, step: int) -> None:
        """`folder` as artifact `name`, once per `step` (the step it was exported at)."""
        self._submit(f"artifact/{name}", step, lambda t: t.log_artifact(folder, name))

    def close(self, failed: bool = False, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        """Finishes every tracker run (marked failed when `failed`), waiting at most
        `timeout_s` for all of them."""
        for worker in self._workers:
            worker.stop(failed)
        deadline = time.monotonic() + timeout_s
        for worker in self._workers:
            if not worker.join(max(0.0, deadline - time.monotonic())):
                self.log(f"warning: {worker.name} did not finish within {timeout_s:.0f} s; "
                         "what it had not sent is in the workdir's files")
        self._workers = []
