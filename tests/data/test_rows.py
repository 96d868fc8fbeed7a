"""Row-by-row loading: every bad row is a RowError naming where it is, never a drop."""
import pytest

from agentjax.core.task import Task
from agentjax.data.rows import LoadResult, RowError, accept_rows, load_rows


def _parse(row, index):
    if not row.get("question"):
        raise ValueError("no question")
    return Task(row.get("id", f"t-{index}"), row["question"], ("a",))


def test_each_bad_row_is_an_error_next_to_the_tasks_that_loaded():
    rows = enumerate([{"question": "q0"}, ["not", "an", "object"], {"question": ""},
                      ValueError("invalid JSON: {"), {"id": "t-0", "question": "again"},
                      {"question": "q5"}])
    tasks, errors = load_rows(rows, "f.jsonl", _parse, where=lambda i: f"line {i + 1}")
    assert [t.task_id for t in tasks] == ["t-0", "t-5"]
    assert errors == [RowError(1, "f.jsonl line 2: row is a list, not an object"),
                      RowError(2, "f.jsonl line 3: no question"),
                      RowError(3, "f.jsonl line 4: invalid JSON: {"),
                      RowError(4, "f.jsonl line 5: duplicate task id 't-0'")]


def test_accept_rows_fails_on_bad_rows_unless_told_to_skip_them(capsys):
    loaded = LoadResult([Task("t-0", "q", ("a",))], [RowError(1, "f.jsonl row 1: no question")])
    with pytest.raises(ValueError, match=r"1 of the rows of f.jsonl do not load \(f.jsonl row 1"):
        accept_rows(loaded, "f.jsonl", skip_bad_rows=False)
    assert accept_rows(loaded, "f.jsonl", skip_bad_rows=True) == loaded.tasks
    assert "skipped (data.skip_bad_rows)" in capsys.readouterr().out
    with pytest.raises(ValueError, match="no usable task in f.jsonl"):
        accept_rows(LoadResult([], loaded.errors), "f.jsonl", skip_bad_rows=True)
