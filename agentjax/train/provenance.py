"""What a workdir records of how its run came about: the code each start ran, and the
config changes accepted when it resumed, with the step from which each applied.

    changes = check_resume(config, workdir, allowed)      # config/resume.py
    ...                                                   # runtime, suite, policy built
    record_start(config, runtime, changes)

  code_versions.jsonl    a row per start: the stage and step it starts from, agentjax's
                         package version and, in a git checkout, the commit and whether
                         the tree had uncommitted changes; a start under another commit
                         than the one before is a warning naming both
  config_changes.jsonl   a row per key a resume changed (config/resume.py): the stage and
                         step it applies after; the first metrics row the resumed stage
                         writes carries `config/changes` (how many keys), and the run's
                         final report lists every change
"""
from __future__ import annotations

import datetime
import importlib.metadata
import json
import os
import subprocess
from typing import Iterable

import ml_collections

import agentjax
from agentjax.config.resume import CHANGES_FILE, Change, read_changes
from agentjax.core import atomic
from agentjax.train.checkpoint import latest_committed_step
from agentjax.train.runtime import CHECKPOINTS, Runtime

CODE_VERSIONS = "code_versions.jsonl"
_CHECKOUT = os.path.dirname(os.path.dirname(os.path.abspath(agentjax.__file__)))



def record_changes(workdir: str, changes: Iterable[Change], *, stage: str,
                   step: int) -> None:
    """Adds a row per change to <workdir>/config_changes.jsonl (rewritten atomically):
    the change applies after `step` of `stage`."""
    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    rows = [{"stage": stage, "step": step, "key": c.key, "old": c.old, "new": c.new,
             "time": now} for c in changes]
    if rows:
        atomic.write_text(os.path.join(workdir, CHANGES_FILE), "".join(
            json.dumps(row) + "\n" for row in read_changes(workdir) + rows))


def code_version() -> dict:
    """{"version": agentjax's installed version (None from a bare source tree),
    "commit": the git commit of the checkout agentjax is imported from (None outside
    one, or without git), "dirty": whether tracked files differ from it (None outside
    one)}."""
    try:
        version = importlib.metadata.version("agentjax")
    except importlib.metadata.PackageNotFoundError:
        version = None
    commit = dirty = None
    try:
        top = _git("rev-parse", "--show-toplevel")
        # Only agentjax's own checkout: an install inside another project's tree is not.
        if top is not None and os.path.samefile(top, _CHECKOUT):
            commit = _git("rev-parse", "HEAD")
            status = _git("status", "--porcelain", "--untracked-files=no")
            dirty = None if status is None else bool(status)
    except OSError:  # no git
        pass
    return {"version": version, "commit": commit, "dirty": dirty}


def _git(*args: str) -> str | None:
    result = subprocess.run(["git", "-C", _CHECKOUT, *args], capture_output=True, text=True,
                            timeout=30)
    return result.stdout.strip() if result.returncode == 0 else None


def stages(config: ml_collections.ConfigDict, workdir: str) -> list[tuple[str, str, int]]:
    """(name, folder, steps) of the stages the run trains, in order."""
    found = []
    if not config.init_from:
        for name in ("pretrain", "sft"):
            if config[name].steps:
                found.append((name, os.path.join(workdir, name), config[name].steps))
    if config.stage != "sft":
        found.append((config.stage, workdir, config.total_steps))
    return found


def resume_point(config: ml_collections.ConfigDict, workdir: str) -> tuple[str, str, int]:
    """(stage, its folder, step) a start continues after: the last committed checkpoint
    of the latest stage that has one (the next stage's step 0 when that stage is done),
    or the first stage's step 0."""
    order = stages(config, workdir)
    point = (*order[0][:2], 0)
    for index, (name, folder, steps) in enumerate(order):
        step = latest_committed_step(os.path.join(folder, CHECKPOINTS))
        if step is None:
            break
        point = (name, folder, step)
        if step >= steps and index + 1 < len(order):
            point = (*order[index + 1][:2], 0)
    return point


def record_start(config: ml_collections.ConfigDict, runtime: Runtime,
                 changes: list[Change] | None) -> None:
    """Records this start (module docstring). `changes`: what check_resume accepted
    (None: a new run)."""
    stage, folder, step = resume_point(config, runtime.workdir)
    if changes:
        runtime.log(f"resuming with config changes after {stage} step {step}: "
                    + "; ".join(str(c) for c in changes))
        runtime.config_changes[folder] = len(changes)
    if not runtime.is_main:
        return
    version = code_version()
    path = os.path.join(runtime.workdir, CODE_VERSIONS)
    starts = read_code_versions(runtime.workdir)
    if starts and starts[-1]["commit"] != version["commit"]:
        runtime.log(f"warning: this run's last start ran agentjax commit "
                    f"{_describe(starts[-1])}; it resumes under commit {_describe(version)}")
    if changes:
        record_changes(runtime.workdir, changes, stage=stage, step=step)
    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    starts.append({"stage": stage, "step": step, **version, "time": now})
    atomic.write_text(path, "".join(json.dumps(row) + "\n" for row in starts))


def read_code_versions(workdir: str) -> list[dict]:
    """The rows of <workdir>/code_versions.jsonl, one per start ([] before the first)."""
    path = os.path.join(workdir, CODE_VERSIONS)
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f]


def _describe(version: dict) -> str:
    if version["commit"] is None:
        return f"unknown (not a git checkout; package version {version['version']})"
    return version["commit"] + (" with uncommitted changes" if version["dirty"] else "")


def changes_report(workdir: str) -> str:
    """The changes every resume of the run accepted, one line each ("" when none)."""
    return "\n".join(f"config changed on resume after {row['stage']} step {row['step']}: "
                     f"{row['key']} {row['old']!r} -> {row['new']!r} ({row['time']})"
                     for row in read_changes(workdir))
