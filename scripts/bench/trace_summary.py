"""Where a profiled region's device time went: the ops of a `jax.profiler.trace` (its
Perfetto JSON) on the accelerator's lines, summed by name.

    with jax.profiler.trace(log_dir, create_perfetto_trace=True):
        run()
    print(summary(log_dir))

The device's lines are the trace's processes named "/device:..." (GPU streams, TPU
cores); on CPU there are none and the host's XLA threads are summarized instead. A line's
busy time is the union of its ops' intervals, so nested events (an XLA module around its
kernels) are not counted twice; the gaps between them over the line's span are the time
the device waited for the host.
"""
from __future__ import annotations

import collections
import glob
import gzip
import json
import os


def load_events(log_dir: str) -> list[dict]:
    """The events of the newest Perfetto trace under `log_dir`."""
    paths = sorted(glob.glob(os.path.join(log_dir, "**", "perfetto_trace.json.gz"),
                             recursive=True), key=os.path.getmtime)
    if not paths:
        raise FileNotFoundError(f"no perfetto_trace.json.gz under {log_dir} (was the "
                                f"trace taken with create_perfetto_trace=True?)")
    with gzip.open(paths[-1], "rt") as f:
        trace = json.load(f)
    return trace["traceEvents"] if isinstance(trace, dict) else trace


def _union_length(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if stop > end:
            total += stop - max(start, end)
            end = stop
    return total


def device_lines(events: list[dict]) -> dict[tuple[str, str], list[dict]]:
    """(process name, thread name) -> its complete ("X") events, for the device's
    processes, or the host's XLA threads when the trace has no device."""
    processes, threads = {}, {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "process_name":
            processes[e["pid"]] = e["args"]["name"]
        elif e.get("ph") == "M" and e.get("name") == "thread_name":
            threads[(e["pid"], e["tid"])] = e["args"]["name"]
    lines = collections.defaultdict(list)
    for e in events:
        if e.get("ph") != "X":
            continue
        process = processes.get(e["pid"], str(e["pid"]))
        lines[(process, threads.get((e["pid"], e.get("tid")), str(e.get("tid"))))].append(e)
    on_device = {key: ev for key, ev in lines.items() if key[0].startswith("/device:")}
    return on_device or {key: ev for key, ev in lines.items() if "XLA" in key[1]}


def summary(log_dir: str, top: int = 20) -> str:
    """Per device line: ops, busy ms, span ms, busy share; then the `top` op names by
    summed duration across the lines, with their share of all lines' busy time."""
    lines = device_lines(load_events(log_dir))
    if not lines:
        return "trace: no device or XLA events"
    out = ["| line | ops | busy ms | span ms | busy |", "|---|---|---|---|---|"]
    by_name = collections.defaultdict(lambda: [0, 0.0])
    busy_all = 0.0
    for (process, thread), events in sorted(lines.items()):
        intervals = [(e["ts"], e["ts"] + e.get("dur", 0.0)) for e in events]
        busy = _union_length(intervals)
        span = max(stop for _, stop in intervals) - min(start for start, _ in intervals)
        busy_all += busy
        out.append(f"| {process} {thread} | {len(events)} | {busy / 1e3:.2f} | "
                   f"{span / 1e3:.2f} | {busy / span if span else 0:.0%} |")
        for e in events:
            entry = by_name[e["name"]]
            entry[0] += 1
            entry[1] += e.get("dur", 0.0)
    out += ["", f"top {top} ops by summed duration (share of the lines' busy time):",
            "| op | count | total ms | mean us | share |", "|---|---|---|---|---|"]
    ranked = sorted(by_name.items(), key=lambda item: -item[1][1])[:top]
    for name, (count, total) in ranked:
        out.append(f"| {name[:90]} | {count} | {total / 1e3:.2f} | {total / count:.1f} | "
                   f"{total / busy_all if busy_all else 0:.1%} |")
    return "\n".join(out)
