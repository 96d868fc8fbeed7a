"""Ablation sweeps: a config's arms x seeds, run here or on a cluster, then a report.

A config file (`configs/X.py`) defines, next to `get_config(arg=None)`,

    def sweep(name) -> list[dict]:   # [{"name": "kl0", "overrides": {"algo.kl_coef": 0.0}}, ...]

Each arm is crossed with the seeds (`seed` and `data.world_seed` set to each seed) into
runs. A run is one `scripts/train.py` process with its own workdir
`<out>/<arm>/seed<seed>`; it writes `metrics.jsonl` while training and `final.json`
(flat final numbers) when done, so a run with a final.json is finished and a sweep can
be resumed by starting it again. `scripts/sweep.py` is the command line:

    python scripts/sweep.py --config configs/grpo_search.py --sweep group_size \
        --seeds 0,1,2 --parallel 2 --out runs/group_size

The report (`<out>/report.md`) tabulates the final metrics per arm (mean ± sample std
over seeds, and every seed's value) and plots training curves per arm (mean over seeds,
min-max band) as PNGs.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import copy
import dataclasses
import importlib.util
import json
import math
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import ml_collections

SEED_KEYS = ("seed", "data.world_seed")
DEFAULT_METRICS = ("eval/success_sampled", "eval/success_greedy")
DEFAULT_CURVES = ("reward/mean", "eval/success_sampled")
TRAIN_SCRIPT = str(Path(__file__).resolve().parents[2] / "scripts" / "train.py")
_ARM_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.=+-]*$")


@dataclasses.dataclass(frozen=True)
class Run:
    """One training process of a sweep.

    Attributes:
      arm: the arm's name (a path component of the workdir).
      seed: the seed this run sets `seed` and `data.world_seed` to.
      overrides: dotted config key -> value, the arm's and the seed's.
      workdir: the run's folder.
    """

    arm: str
    seed: int
    overrides: Mapping[str, Any]
    workdir: str

    @property
    def name(self) -> str:
        return f"{self.arm}/seed{self.seed}"


# ------------------------------------------------------------------------- configs


def split_config_arg(config_arg: str) -> tuple[str, str | None]:
    """`"configs/X.py:variant"` -> ("configs/X.py", "variant"); no colon -> variant None."""
    path, sep, variant = config_arg.partition(":")
    return path, (variant if sep else None)


def load_config_module(path: str):
    """Imports a config file by path.

    Args:
      path: the config file (`configs/X.py`).

    Raises:
      ValueError: the file does not exist.
    """
    if not os.path.isfile(path):
        raise ValueError(f"--config {path!r}: no such file")
    spec = importlib.util.spec_from_file_location(f"sweep_config_{Path(path).stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def config_of(module, variant: str | None) -> ml_collections.ConfigDict:
    """`module.get_config(variant)`, called as absl's config flags call it."""
    return module.get_config() if variant is None else module.get_config(variant)


def set_dotted(config: ml_collections.ConfigDict, key: str, value: Any) -> None:
    """Sets `config.a.b = value` for `key="a.b"`, as `--config.a.b=value` would.

    Raises:
      ValueError: the key does not exist, or the value's type does not fit the field.
    """
    parent, node = None, config
    for name in key.split("."):
        if not isinstance(node, ml_collections.ConfigDict) or name not in node:
            raise ValueError(f"unknown config key {key!r}")
        parent, node = node, node[name]
    try:
        parent[name] = value
    except TypeError as e:  # ConfigDict's type safety: e.g. a str for a float field
        raise ValueError(f"config key {key!r}: {e}") from None


def check_overrides(config: ml_collections.ConfigDict, overrides: Mapping[str, Any],
                    where: str) -> None:
    """Applies `overrides` to a copy of `config`, so a bad key fails before any run.

    Args:
      config: the config the runs start from.
      overrides: dotted key -> value.
      where: names the arm in the error message.
    """
    trial = copy.deepcopy(config)
    for key, value in overrides.items():
        try:
            set_dotted(trial, key, value)
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None


def validate_arms(arms: Any, where: str) -> list[dict]:
    """Checks the shape of `sweep(name)`'s result; returns it as a list.

    Args:
      arms: what the config's `sweep` returned.
      where: names the config and sweep in error messages.

    Raises:
      ValueError: not a non-empty list of {"name": str, "overrides": dict} with unique,
        path-safe names.
    """
    if not isinstance(arms, (list, tuple)) or not arms:
        raise ValueError(f"{where}: sweep must return a non-empty list of arms, got {arms!r}")
    seen = set()
    for arm in arms:
        if not isinstance(arm, Mapping) or set(arm) != {"name", "overrides"}:
            raise ValueError(f"{where}: each arm must be a dict with exactly 'name' and "
                             f"'overrides', got {arm!r}")
        name = arm["name"]
        if not isinstance(name, str) or not _ARM_NAME.match(name):
            raise ValueError(f"{where}: arm name {name!r} must match {_ARM_NAME.pattern} "
                             f"(it names a folder)")
        if name in seen:
            raise ValueError(f"{where}: arm name {name!r} appears twice")
        seen.add(name)
        if not isinstance(arm["overrides"], Mapping):
            raise ValueError(f"{where}: arm {name!r} overrides must be a dict, "
                             f"got {arm['overrides']!r}")
    return list(arms)


def load_arms(config_arg: str, sweep_name: str) -> tuple[list[dict], ml_collections.ConfigDict]:
    """The validated arms of `sweep_name` in a config file, and the base config.

    Args:
      config_arg: `configs/X.py[:variant]`.
      sweep_name: the name passed to the config's `sweep`.

    Raises:
      ValueError: missing file or `sweep` function, malformed arms, unknown keys.
    """
    path, variant = split_config_arg(config_arg)
    module = load_config_module(path)
    if not callable(getattr(module, "sweep", None)):
        raise ValueError(f"--config {path!r} defines no sweep(name) function")
    where = f"{path} sweep {sweep_name!r}"
    try:
        arms = module.sweep(sweep_name)
    except (KeyError, ValueError) as e:  # the config's word on an unknown sweep name
        raise ValueError(f"{where}: {e}") from None
    arms = validate_arms(arms, where)
    config = config_of(module, variant)
    check_overrides(config, {key: 0 for key in SEED_KEYS}, f"{path} (the seed axis)")
    for arm in arms:
        check_overrides(config, arm["overrides"], f"{where} arm {arm['name']!r}")
    return arms, config


def parse_seeds(text: str) -> list[int]:
    """`"0,1,2"` -> [0, 1, 2].

    Raises:
      ValueError: an entry is not an integer, or a seed repeats.
    """
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise ValueError(f"--seeds must be comma-separated integers, got {text!r}") from None
    if not seeds or len(set(seeds)) != len(seeds):
        raise ValueError(f"--seeds must list distinct integers, got {text!r}")
    return seeds


def expand(arms: Sequence[Mapping[str, Any]], seeds: Sequence[int], out: str) -> list[Run]:
    """Arms x seeds -> runs (arm-major), each seed setting every key of SEED_KEYS.

    Args:
      arms: validated arms (`load_arms`).
      seeds: the seeds.
      out: the sweep's folder; run workdirs are `<out>/<arm>/seed<seed>`.

    Raises:
      ValueError: an arm overrides a seed key itself (the seed axis owns those keys).
    """
    runs = []
    for arm in arms:
        clash = set(arm["overrides"]) & set(SEED_KEYS)
        if clash:
            raise ValueError(f"arm {arm['name']!r} overrides {sorted(clash)}; the sweep "
                             f"sets these from --seeds")
        for seed in seeds:
            overrides = {**arm["overrides"], **{key: seed for key in SEED_KEYS}}
            runs.append(Run(arm["name"], seed, overrides,
                            os.path.join(out, arm["name"], f"seed{seed}")))
    return runs


# ------------------------------------------------------------------------- commands


def format_value(value: Any) -> str:
    """A config value as `--config.key=<text>` text that absl config flags parse back.

    Raises:
      ValueError: a value type config flags cannot parse (e.g. a dict).
    """
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return value
    if isinstance(value, (tuple, list)):
        return repr(tuple(value))
    raise ValueError(f"cannot pass {type(value).__name__} {value!r} as a config flag")


def override_flags(overrides: Mapping[str, Any]) -> list[str]:
    """`{"algo.kl_coef": 0.0}` -> `["--config.algo.kl_coef=0.0"]`."""
    return [f"--config.{key}={format_value(value)}" for key, value in overrides.items()]


def train_command(run: Run, config_arg: str, *, train_script: str = TRAIN_SCRIPT,
                  python: str = sys.executable, extra_args: Sequence[str] = ()) -> list[str]:
    """The argv of one run.

    Args:
      run: the run.
      config_arg: `configs/X.py[:variant]`, passed through unchanged.
      train_script: path of the train script.
      python: the interpreter.
      extra_args: appended to every run (e.g. `--config.total_steps=10`).
    """
    return [python, train_script, "--config", config_arg, "--workdir", run.workdir,
            *override_flags(run.overrides), *extra_args]


def shell_command(argv: Sequence[str]) -> str:
    """argv as one shell-quoted line."""
    return shlex.join(argv)


# ------------------------------------------------------------------------- running


def read_final(workdir: str) -> dict | None:
    """`<workdir>/final.json` as a dict; None when absent or unreadable (not finished)."""
    try:
        with open(os.path.join(workdir, "final.json")) as f:
            final = json.load(f)
    except (OSError, ValueError):
        return None
    return final if isinstance(final, dict) else None


def is_finished(run: Run) -> bool:
    return read_final(run.workdir) is not None


def execute(run: Run, argv: Sequence[str]) -> str:
    """Runs one training process, output appended to `<workdir>/stdout.log`.

    Returns:
      "done", or "failed (<why>)" — never raises for a failing run.
    """
    os.makedirs(run.workdir, exist_ok=True)
    with open(os.path.join(run.workdir, "stdout.log"), "a") as log:
        log.write(f"$ {shell_command(argv)}\n")
        log.flush()
        try:
            code = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL).returncode
        except OSError as e:
            log.write(f"could not start: {e}\n")
            return f"failed (could not start: {e})"
    if code != 0:
        return f"failed (exit {code})"
    return "done" if is_finished(run) else "failed (exit 0 but no final.json)"


def run_all(runs: Sequence[Run], command: Callable[[Run], list[str]], *, parallel: int = 1,
            log: Callable[[str], None] = print) -> dict[str, str]:
    """Runs every unfinished run, `parallel` at a time; finished runs are skipped.

    Args:
      runs: the sweep's runs.
      command: run -> argv.
      parallel: how many processes at once.
      log: receives one progress line per run.

    Returns:
      run name -> "skipped (finished)", "done" or "failed (...)".
    """
    if parallel < 1:
        raise ValueError(f"--parallel must be >= 1, got {parallel}")
    status = {run.name: "skipped (finished)" for run in runs if is_finished(run)}
    pending = [run for run in runs if run.name not in status]
    if status:
        log(f"skipping {len(status)} finished run(s)")
    with concurrent.futures.ThreadPoolExecutor(max_workers=parallel) as pool:
        futures = {pool.submit(execute, run, command(run)): run for run in pending}
        for done, future in enumerate(concurrent.futures.as_completed(futures), 1):
            run = futures[future]
            status[run.name] = future.result()
            log(f"[{done}/{len(pending)}] {run.name}: {status[run.name]} "
                f"(log: {os.path.join(run.workdir, 'stdout.log')})")
    return status


# ------------------------------------------------------------------------- report


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


# ------------------------------------------------------------------------- command line


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="sweep.py", description="Run a config's ablation sweep and report it.",
        epilog="Arguments after `--` are passed to every run, e.g. "
               "`-- --config.total_steps=10`.")
    parser.add_argument("--config", required=True, help="configs/X.py[:variant]")
    parser.add_argument("--sweep", required=True, help="name passed to the config's sweep()")
    parser.add_argument("--seeds", default="0", help="comma-separated seeds (default 0)")
    parser.add_argument("--out", help="sweep folder (default runs/sweeps/<config>-<sweep>)")
    parser.add_argument("--parallel", type=int, default=1, help="runs at once (default 1)")
    parser.add_argument("--print-commands", action="store_true",
                        help="print one shell command per unfinished run and exit")
    parser.add_argument("--report", action="store_true",
                        help="only write the report of existing runs")
    parser.add_argument("--metrics", default=",".join(DEFAULT_METRICS),
                        help="final.json keys to tabulate")
    parser.add_argument("--curves", default=",".join(DEFAULT_CURVES),
                        help="metrics.jsonl keys to plot")
    parser.add_argument("--train-script", default=TRAIN_SCRIPT)
    parser.add_argument("--python", default=sys.executable, help="interpreter for the runs")
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = []
    if "--" in argv:
        argv, extra = argv[:argv.index("--")], argv[argv.index("--") + 1:]
    args = parser.parse_args(argv)
    args.extra = extra
    if args.print_commands and args.report:
        parser.error("--print-commands and --report exclude each other")
    if args.parallel < 1:
        parser.error(f"--parallel must be >= 1, got {args.parallel}")
    if args.out is None:
        stem = Path(split_config_arg(args.config)[0]).stem
        args.out = os.path.join("runs", "sweeps", f"{stem}-{args.sweep}")
    return args


def _names(text: str) -> list[str]:
    return [name.strip() for name in text.split(",") if name.strip()]


def main(argv: Sequence[str] | None = None) -> int:
    """The `scripts/sweep.py` command; returns the exit code (1 when a run failed)."""
    args = parse_args(argv)
    try:
        arms, _ = load_arms(args.config, args.sweep)
        runs = expand(arms, parse_seeds(args.seeds), args.out)
    except ValueError as e:
        print(f"sweep.py: {e}", file=sys.stderr)
        return 2

    def command(run: Run) -> list[str]:
        return train_command(run, args.config, train_script=args.train_script,
                             python=args.python, extra_args=args.extra)

    if args.print_commands:
        unfinished = [run for run in runs if not is_finished(run)]
        if len(unfinished) < len(runs):
            print(f"sweep.py: {len(runs) - len(unfinished)} finished run(s) left out",
                  file=sys.stderr)
        for run in unfinished:
            print(shell_command(command(run)))
        return 0
    status = {} if args.report else run_all(runs, command, parallel=args.parallel)
    print(write_report(runs, args.out, title=f"Sweep `{args.sweep}` of `{args.config}`",
                       metrics=_names(args.metrics), curves=_names(args.curves)))
    print(f"\nreport: {os.path.join(args.out, 'report.md')}")
    return int(any(s.startswith("failed") for s in status.values()))
