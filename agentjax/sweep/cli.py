"""The `scripts/sweep.py` command line."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Sequence

from agentjax.sweep.launch import is_finished, run_all
from agentjax.sweep.plan import (
    TRAIN_SCRIPT,
    Run,
    expand,
    load_arms,
    override_flags,
    parse_seeds,
    shell_command,
    split_config_arg,
    tracking_overrides,
    train_command,
)
from agentjax.sweep.report import DEFAULT_CURVES, DEFAULT_METRICS, write_report


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
        arms, config = load_arms(args.config, args.sweep)
        runs = expand(arms, parse_seeds(args.seeds), args.out)
    except ValueError as e:
        print(f"sweep.py: {e}", file=sys.stderr)
        return 2
    group = f"{Path(split_config_arg(args.config)[0]).stem}-{args.sweep}"

    def command(run: Run) -> list[str]:
        # Before the extra arguments, which may set the tracker keys themselves.
        tracking = override_flags(tracking_overrides(config, group, run))
        return train_command(run, args.config, train_script=args.train_script,
                             python=args.python, extra_args=[*tracking, *args.extra])

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
