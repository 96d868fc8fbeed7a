"""The metrics file after a resume reads like an uninterrupted run's."""
import json

import pytest

from agentjax.train.metrics import MetricsWriter, read_metrics


def _rows(*steps):
    return "".join(json.dumps({"step": s, "loss": s / 10}) + "\n" for s in steps)


def test_resume_drops_rows_after_the_restored_step_and_a_line_cut_by_a_kill(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(_rows(1, 2, 3) + '{"step": 4, "lo')
    writer = MetricsWriter(str(tmp_path), stage="rl", resume_step=2)
    writer.write(3, {"loss": 0.3})
    assert read_metrics(str(tmp_path)) == [json.loads(line) for line in _rows(1, 2, 3).splitlines()]


def test_a_bad_line_before_the_last_is_an_error(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(_rows(1) + "garbage\n" + _rows(2))
    with pytest.raises(ValueError, match="metrics.jsonl:2"):
        MetricsWriter(str(tmp_path), stage="rl", resume_step=2)
