"""Runs a sweep here: every unfinished run as its own training process, some at once."""
from __future__ import annotations

import concurrent.futures
import json
import os
import subprocess
from typing import Callable, Sequence

from agentjax.sweep.plan import Run, shell_command


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
