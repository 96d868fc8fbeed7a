"""A sweep's plan: its arms (from the config's `sweep(name)`) x seeds as runs, and the
training command of each."""
from __future__ import annotations

import copy
import dataclasses
import importlib.util
import os
import re
import shlex
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

import ml_collections

from agentjax.config import RENAMED
from agentjax.config.validation import renamed_key_error

SEED_KEYS = ("seed", "data.world_seed")
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
      ValueError: the key does not exist (a renamed key names its new one), or the
        value's type does not fit the field.
    """
    if key in RENAMED:
        raise renamed_key_error(key)
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


def has_key(config: ml_collections.ConfigDict, key: str) -> bool:
    """Whether the dotted `key` is a key of `config`."""
    node = config
    for name in key.split("."):
        if not isinstance(node, ml_collections.ConfigDict) or name not in node:
            return False
        node = node[name]
    return True


TRACKING_KEYS = ("log.name", "log.group", "log.tags")
TAG_CHARS = 64  # what log.tags allows per tag


def tracking_overrides(config: ml_collections.ConfigDict, group: str, run: Run) -> dict:
    """The run's name, group and tags in the experiment trackers: its arm and seed, the
    sweep (`group`), and a 'key=value' tag per override of the arm and the seed (the
    trackers line the arms up by them); {} for a config without those keys.

    A tag's commas become ';' (log.tags is comma-separated)."""
    if not all(has_key(config, key) for key in TRACKING_KEYS):
        return {}
    # Every seed key holds the seed: the first one's tag says it.
    tagged = {k: v for k, v in run.overrides.items() if k not in SEED_KEYS[1:]}
    tags = [f"arm={run.arm}"] + [f"{key}={format_value(value)}".replace(",", ";")
                                 for key, value in tagged.items()]
    return {"log.name": run.name, "log.group": group,
            "log.tags": ",".join(tag[:TAG_CHARS] for tag in tags)}


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
