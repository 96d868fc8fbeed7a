import json

from agentjax.core.jsonl import read_jsonl


def test_blank_lines_are_skipped_and_bad_lines_come_back_as_errors(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"a": 1}\n\n  \nnot json\n[2]\n', encoding="utf-8")
    rows = list(read_jsonl(str(path)))
    assert [index for index, _ in rows] == [0, 3, 4]
    assert rows[0][1] == {"a": 1} and rows[2][1] == [2]
    assert isinstance(rows[1][1], json.JSONDecodeError)
