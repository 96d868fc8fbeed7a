"""Task files read row by row: a bad row is a `RowError` next to the tasks that loaded,
never a silent drop, and a run decides what to do with the bad rows (`accept_rows`).

Each env's loaders (the search world's Search-R1 files, the code world's task files)
parse one row into a Task and leave the bookkeeping here: a row that is no object,
does not parse or repeats a task id becomes a RowError naming where it is in the file.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping, NamedTuple

from agentjax.core.task import Task


class RowError(NamedTuple):
    """A row that did not load: its 0-based index in the file and why."""

    index: int
    message: str


class LoadResult(NamedTuple):
    """Tasks that loaded and the rows that did not (unpacks as `tasks, errors`)."""

    tasks: list[Task]
    errors: list[RowError]


def load_rows(rows: Iterable[tuple[int, Any]], path: str,
              parse: Callable[[Mapping, int], Task], *,
              where: Callable[[int], str] = lambda index: f"row {index}",
              repeated: Callable[[str], ValueError] = lambda task_id: ValueError(
                  f"duplicate task id {task_id!r}")) -> LoadResult:
    """The Tasks of a file's rows ((index, record or the ValueError reading it raised)),
    each through `parse(record, index)`; a row that is no object, does not parse or
    repeats a task id is a RowError naming `where(index)` in the file."""
    tasks, errors, seen = [], [], set()
    for index, row in rows:
        try:
            if isinstance(row, Exception):
                raise row
            if not isinstance(row, Mapping):
                raise ValueError(f"row is a {type(row).__name__}, not an object")
            task = parse(row, index)
            if task.task_id in seen:
                raise repeated(task.task_id)
        except ValueError as err:
            errors.append(RowError(index, f"{path} {where(index)}: {err}"))
            continue
        seen.add(task.task_id)
        tasks.append(task)
    return LoadResult(tasks, errors)


def accept_rows(loaded: LoadResult, path: str, *, skip_bad_rows: bool) -> list[Task]:
    """The tasks of a loaded file under data.skip_bad_rows: bad rows are an error naming
    the first few, or (skip_bad_rows) skipped with a warning that counts them.

    Raises:
      ValueError: a bad row without skip_bad_rows, or no usable task at all.
    """
    if loaded.errors:
        shown = "; ".join(e.message for e in loaded.errors[:5])
        message = f"{len(loaded.errors)} of the rows of {path} do not load ({shown})"
        if not skip_bad_rows:
            raise ValueError(f"{message}; fix them, or set data.skip_bad_rows=True to skip them")
        print(f"warning: {message}; skipped (data.skip_bad_rows)")
    if not loaded.tasks:
        raise ValueError(f"no usable task in {path}")
    return list(loaded.tasks)
