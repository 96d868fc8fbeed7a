"""scripts/bench/trace_summary.py: a device line's busy time is the union of its ops'
intervals, ops are summed by name, and a trace without a device falls back to the host's
XLA threads; checked by hand on small Perfetto traces written here."""
import gzip
import json
import os
import sys

import pytest

from tests.scripts.test_train import ROOT

sys.path.insert(0, os.path.join(ROOT, "scripts", "bench"))
import trace_summary  # noqa: E402


def _write(tmp_path, events):
    folder = tmp_path / "plugins" / "profile" / "run"
    folder.mkdir(parents=True)
    with gzip.open(folder / "perfetto_trace.json.gz", "wt") as f:
        json.dump({"displayTimeUnit": "ns", "traceEvents": events}, f)
    return str(tmp_path)


def _meta(pid, process, threads):
    events = [{"ph": "M", "pid": pid, "name": "process_name", "args": {"name": process}}]
    events += [{"ph": "M", "pid": pid, "tid": tid, "name": "thread_name", "args": {"name": name}}
               for tid, name in threads.items()]
    return events


def _op(pid, tid, name, ts, dur):
    return {"ph": "X", "pid": pid, "tid": tid, "name": name, "ts": ts, "dur": dur}


def test_device_lines_busy_time_and_ops_by_hand(tmp_path):
    events = (_meta(1, "/host:CPU", {7: "python"}) + _meta(2, "/device:GPU:0", {3: "Stream #14"})
              + [_op(1, 7, "host work", 0, 5000),
                 # Busy [0, 300] and [500, 1000] us of a 1000 us span: 800 us, 80%; the
                 # op nested in another adds nothing to the busy time.
                 _op(2, 3, "attention", 0, 200), _op(2, 3, "matmul", 100, 200),
                 _op(2, 3, "attention", 500, 500), _op(2, 3, "matmul", 600, 100)])
    lines = trace_summary.device_lines(trace_summary.load_events(_write(tmp_path, events)))
    assert list(lines) == [("/device:GPU:0", "Stream #14")]
    text = trace_summary.summary(str(tmp_path), top=1)
    assert "| /device:GPU:0 Stream #14 | 4 | 0.80 | 1.00 | 80% |" in text
    # attention: 2 ops, 700 us, 350 us each, 700 / 800 of the busy time; matmul is cut.
    assert "| attention | 2 | 0.70 | 350.0 | 87.5% |" in text and "| matmul |" not in text


def test_without_a_device_the_hosts_xla_threads_are_summarized(tmp_path):
    events = (_meta(1, "/host:CPU", {7: "python", 8: "tf_XLAEigen/1"})
              + [_op(1, 7, "host work", 0, 5000), _op(1, 8, "fusion", 10, 40)])
    lines = trace_summary.device_lines(trace_summary.load_events(_write(tmp_path, events)))
    assert list(lines) == [("/host:CPU", "tf_XLAEigen/1")]


def test_a_folder_without_a_perfetto_trace_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="create_perfetto_trace=True"):
        trace_summary.load_events(str(tmp_path))
