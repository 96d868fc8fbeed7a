"""A rerun in a workdir that holds a run resumes it; this decides whether the rerun's
config may resume it, before anything is built.

    changes = check_resume(config, workdir, allowed=["optim.lr"])   # ConfigError, or
    ...                                                              # the accepted changes
    # train/provenance.py records them once the resume point is known

The config in effect in a workdir is its config.json (the config the run started with,
never rewritten) with the changes accepted on each resume applied in order
(config_changes.jsonl, a row per key and resume: the stage and step the change applies
after, the key, the old and the new value, the time). A rerun's config is compared with
it key by key: a key whose rule (schema.ON_RESUME) refuses the change stops the rerun
with one line naming every such key with both values and the two ways out — another
workdir, or `--allow_config_change=key1,key2` to accept those keys by name. Keys that do
not change the experiment (where the run logs, evaluates, checkpoints, which servers it
uses) change freely, and every accepted change is recorded.

Import-light, as the rest of agentjax.config: scripts/train.py runs this before jax is
imported.
"""
from __future__ import annotations

import dataclasses
import difflib
import json
import os
from typing import Any, Iterable

import ml_collections

from agentjax.config.errors import ConfigError
from agentjax.config.saved import is_run_folder, load_saved
from agentjax.config.schema import KEYS, ON_RESUME

CHANGES_FILE = "config_changes.jsonl"
ROW_FIELDS = {"stage", "step", "key", "old", "new", "time"}
# What a run writes once its config has passed set-up and work began: from then on a
# rerun in the workdir resumes the run (before that, it starts it again).
WORK_STARTED = ("init_model", "pretrain", "sft", "checkpoints", "final.json")


@dataclasses.dataclass(frozen=True)
class Change:
    """A key whose value the rerun changes: the value in effect and the new one."""

    key: str
    old: Any
    new: Any

    def __str__(self) -> str:
        return f"{self.key} {self.old!r} -> {self.new!r}"


def holds_a_run(workdir: str) -> bool:
    """Whether a rerun in `workdir` resumes a run: it has config.json and work began
    under it (WORK_STARTED)."""
    return is_run_folder(workdir) and any(
        os.path.exists(os.path.join(workdir, name)) for name in WORK_STARTED)


def read_changes(workdir: str) -> list[dict]:
    """The rows of <workdir>/config_changes.jsonl ([] without the file).

    Raises:
      ConfigError: a line that is not a change row (the file is written atomically:
        only an edit by hand makes one), named with its file and line.
    """
    path = os.path.join(workdir, CHANGES_FILE)
    if not os.path.exists(path):
        return []
    rows = []
    with open(path) as f:
        for number, line in enumerate(f, 1):
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                row = None
            if not isinstance(row, dict) or not ROW_FIELDS <= row.keys():
                raise ConfigError(f"{path}:{number}: not a config change row (fields "
                                  f"{sorted(ROW_FIELDS)}): {line[:200]!r}")
            rows.append(row)
    return rows


def config_in_effect(workdir: str) -> ml_collections.ConfigDict:
    """<workdir>/config.json (over today's schema: saved.load_saved) with the changes
    of config_changes.jsonl applied in order."""
    config = load_saved(os.path.join(workdir, "config.json"))
    for row in read_changes(workdir):
        if row["key"] in KEYS:  # a key this version no longer has: load_saved named it
            _set(config, row["key"], row["new"])
    return config


def differences(old: ml_collections.ConfigDict, new: ml_collections.ConfigDict
                ) -> list[Change]:
    """Every schema key whose value differs between two configs, in schema order
    (compared as config.json stores them: tuples as lists, 1 equal to 1.0)."""
    old_values, new_values = (_flat(json.loads(c.to_json_best_effort())) for c in (old, new))
    return [Change(key, old_values[key], new_values[key]) for key in KEYS
            if old_values[key] != new_values[key]]


def check_resume(config: ml_collections.ConfigDict, workdir: str,
                 allowed: Iterable[str] = ()) -> list[Change] | None:
    """The changes a rerun of `config` in `workdir` makes to the run there (None when
    `workdir` holds no run to resume: the rerun starts it).

    Args:
      config: the rerun's config, validated.
      workdir: the run folder.
      allowed: keys whose change the caller accepts whatever their rule
        (--allow_config_change).

    Raises:
      ConfigError: a key of `allowed` is not a config key; or keys whose change would
        make the run another experiment differ: one line naming each with its old and
        new value, and the ways out.
    """
    allowed = set(allowed)
    for key in sorted(allowed - set(KEYS)):
        # 'algo.lr' means a learning rate: keys of the same name first.
        close = ([k for k in KEYS if k.split(".")[-1] == key.split(".")[-1]]
                 or difflib.get_close_matches(key, KEYS, n=1))
        raise ConfigError(f"--allow_config_change names {key!r}, which is not a config key"
                          + (f"; did you mean {' or '.join(map(repr, close))}?"
                             if close else ""))
    if not holds_a_run(workdir):
        return None
    changes = differences(config_in_effect(workdir), config)
    refused = [(change, why) for change in changes
               if change.key not in allowed
               and (why := ON_RESUME[change.key].refusal(change.old, change.new, config))
               is not None]
    if refused:
        named = "; ".join(f"{change} ({why})" if why else str(change)
                          for change, why in refused)
        raise ConfigError(
            f"{workdir} holds a run whose config this rerun changes: {named}. Resuming "
            "would train one run under two experiments: start it in a new --workdir, or "
            "accept the change with --allow_config_change="
            + ",".join(change.key for change, _ in refused))
    return changes


def _flat(values: dict, prefix: str = "") -> dict:
    flat = {}
    for key, value in values.items():
        if isinstance(value, dict):
            flat.update(_flat(value, f"{prefix}{key}."))
        else:
            flat[prefix + key] = value
    return flat


def _set(config: ml_collections.ConfigDict, key: str, value) -> None:
    *sections, name = key.split(".")
    node = config
    for section in sections:
        node = node[section]
    node[name] = value
