"""The sweep report: final metrics per arm (mean ± std over seeds) and training curves."""
from __future__ import annotations

import json
import math
import os
import re
from typing import Any, Mapping, Sequence

from agentjax.sweep.launch import is_finished, read_final
from agentjax.sweep.plan import Run

DEFAULT_METRICS = ("eval/success_sampled", "eval/success_greedy")
DEFAULT_CURVES = ("reward/mean", "eval/success_sampled")


def as_number(value: Any) -> float | None:
    """A metric value as float ("nan"/"inf" strings included); None if not a number."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return None
    try:
        return float(value)
    except ValueError:
        return None


def read_metric_rows(workdir: str) -> list[dict]:
    """`<workdir>/metrics.jsonl` rows with a step; unparsable lines (a run killed
    mid-write) are skipped, a missing file gives []."""
    rows = []
    try:
        with open(os.path.join(workdir, "metrics.jsonl")) as f:
            for line in f:
                try:
                    row = json.loads(line)
                except ValueError:
                    continue
                if isinstance(row, dict) and as_number(row.get("step")) is not None:
                    rows.append(row)
    except OSError:
        pass
    return rows


def run_state(run: Run) -> str:
    """"finished", "failed" (started, no final.json) or "pending" (never started)."""
    if is_finished(run):
        return "finished"
    started = any(os.path.exists(os.path.join(run.workdir, name))
                  for name in ("stdout.log", "metrics.jsonl"))
    return "failed" if started else "pending"


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (ddof=1; 0 for a single value)."""
    n = len(values)
    mean = sum(values) / n
    var = sum((v - mean) ** 2 for v in values) / (n - 1) if n > 1 else 0.0
    return mean, math.sqrt(var)


def _fmt(value: float) -> str:
    return f"{value:.4g}"


def seed_cell(run: Run, final: dict | None, metric: str) -> str:
    """One run's value of `metric`, or why there is none ("failed", "pending", "missing")."""
    if final is None:
        return run_state(run)
    value = as_number(final.get(metric))
    return "missing" if value is None else _fmt(value)


def arm_cell(runs: Sequence[Run], finals: Mapping[str, dict | None], metric: str) -> str:
    """`mean ± std` of `metric` over an arm's finished seeds; notes how many when some
    are absent; otherwise the reason no seed has a value."""
    values = [as_number(finals[r.name].get(metric)) for r in runs if finals[r.name] is not None]
    values = [v for v in values if v is not None]
    if not values:
        states = {seed_cell(r, finals[r.name], metric) for r in runs}
        return "/".join(sorted(states))
    mean, std = mean_std(values)
    cell = _fmt(mean) if len(values) == 1 else f"{_fmt(mean)} ± {_fmt(std)}"
    return cell if len(values) == len(runs) else f"{cell} (n={len(values)}/{len(runs)})"


def by_arm(runs: Sequence[Run]) -> dict[str, list[Run]]:
    """Runs grouped by arm, in sweep order."""
    groups: dict[str, list[Run]] = {}
    for run in runs:
        groups.setdefault(run.arm, []).append(run)
    return groups


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def results_tables(runs: Sequence[Run], metrics: Sequence[str]) -> str:
    """Markdown: per-arm mean ± std of the final metrics, then every run's values."""
    finals = {run.name: read_final(run.workdir) for run in runs}
    summary = [[arm, ",".join(str(r.seed) for r in arm_runs),
                *(arm_cell(arm_runs, finals, m) for m in metrics)]
               for arm, arm_runs in by_arm(runs).items()]
    per_seed = [[run.arm, str(run.seed), run_state(run),
                 *(seed_cell(run, finals[run.name], m) for m in metrics)] for run in runs]
    return "\n\n".join([
        "## Final metrics (mean ± sample std over seeds)",
        markdown_table(["arm", "seeds", *metrics], summary),
        "## Per seed",
        markdown_table(["arm", "seed", "status", *metrics], per_seed)])


def curve(run: Run, metric: str) -> dict[float, float]:
    """step -> value of `metric` in a run's metrics.jsonl (rows lacking it skipped)."""
    points = {}
    for row in read_metric_rows(run.workdir):
        value = as_number(row.get(metric))
        if value is not None:
            points[float(row["step"])] = value
    return points


def arm_curve(runs: Sequence[Run], metric: str):
    """(steps, mean, min, max) over an arm's seeds at every step any seed logged;
    None when no seed logged `metric`."""
    curves = [c for c in (curve(run, metric) for run in runs) if c]
    if not curves:
        return None
    steps = sorted(set().union(*curves))
    at = [[c[s] for c in curves if s in c] for s in steps]
    return (steps, [sum(v) / len(v) for v in at], [min(v) for v in at], [max(v) for v in at])


def plot_file_name(metric: str) -> str:
    return "curve_" + re.sub(r"[^A-Za-z0-9_.-]+", "_", metric) + ".png"


def plot_curves(runs: Sequence[Run], metric: str, path: str) -> bool:
    """Writes one PNG: a line per arm (mean over seeds) with its min-max band.

    Returns:
      False (and writes nothing) when no run logged `metric`.
    """
    lines = {arm: arm_curve(arm_runs, metric) for arm, arm_runs in by_arm(runs).items()}
    lines = {arm: line for arm, line in lines.items() if line is not None}
    if not lines:
        return False
    # Imported only when there is something to plot: matplotlib takes seconds to import.
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for arm, (steps, mean, low, high) in lines.items():
        (line,) = ax.plot(steps, mean, label=arm)
        ax.fill_between(steps, low, high, color=line.get_color(), alpha=0.2)
    ax.set_xlabel("step")
    ax.set_ylabel(metric)
    ax.set_title(f"{metric} (mean over seeds, min-max band)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True


def write_report(runs: Sequence[Run], out: str, *, title: str,
                 metrics: Sequence[str] = DEFAULT_METRICS,
                 curves: Sequence[str] = DEFAULT_CURVES) -> str:
    """Writes `<out>/report.md` and a PNG per curve metric with data; returns the tables.

    Args:
      runs: the sweep's runs.
      out: the sweep's folder.
      title: the report's heading.
      metrics: final.json keys to tabulate.
      curves: metrics.jsonl keys to plot against step.
    """
    os.makedirs(out, exist_ok=True)
    tables = results_tables(runs, metrics)
    sections = [f"# {title}", tables, "## Curves"]
    for metric in curves:
        name = plot_file_name(metric)
        if plot_curves(runs, metric, os.path.join(out, name)):
            sections.append(f"![{metric}]({name})")
        else:
            sections.append(f"No run logged `{metric}`.")
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write("\n\n".join(sections) + "\n")
    return tables
