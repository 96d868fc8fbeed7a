"""validate(config): every key against its rule (RULES), then the combinations of keys
(config/checks.py), before anything is built or compiled. A value no run can use raises
ConfigError, whose one-line message names the key, its value and what is allowed."""
from __future__ import annotations

import re
from typing import Sequence

import ml_collections

from agentjax.config.checks import check_combinations
from agentjax.config.errors import ConfigError, reject
from agentjax.config.schema import RENAMED, RULES, default_config


def validate(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """Checks every key against RULES, then the combinations of keys; returns the config.

    Raises:
      ConfigError: an unknown or renamed key, a wrong type, a value outside its key's
        range, or an impossible combination; the message names the key.
    """
    for where, ref, val in leaves(default_config(), config):
        _check_type(where, ref, val)
        rule = RULES[where]
        if not rule.allows(val):
            # A rule with `why_not` (a structured value) says what is wrong with this one.
            problem = rule.why_not(val) if hasattr(rule, "why_not") else None
            reject(where, val, (f"{problem}; " if problem else "") + f"allowed: {rule.allowed}")
    check_combinations(config)
    return config


def renamed_key_error(key: str, source: str = "") -> ConfigError:
    """The error for a key of RENAMED: `config key 'a.b' [in <source>] was renamed: use
    ...`."""
    where = f" in {source}" if source else ""
    return ConfigError(f"config key {key!r}{where} was renamed: {RENAMED[key]}")


def renamed_in_flags(argv: Sequence[str], error: Exception) -> ConfigError | None:
    """The renamed key behind a failed `--config` flag parse, if one is.

    ml_collections raises AttributeError or KeyError, before validate() runs, for a
    `--config.a.b=value` override of a key the config does not have, and for a config file
    that sets one; scripts/train.py's flag parser asks this first.

    Args:
      argv: the command line.
      error: what the flag parsing raised.

    Returns:
      renamed_key_error of the renamed key an override names, or that the error's
      message names (a config file setting it); None if neither is a renamed key.
    """
    for arg in argv:
        key = arg[len("--config."):].split("=")[0] if arg.startswith("--config.") else ""
        if key in RENAMED:
            return renamed_key_error(key)
    message = str(error)
    for key in RENAMED:
        if re.search(rf"[\"']{re.escape(key.split('.')[-1])}[\"']", message):
            return renamed_key_error(key)
    return None


def leaves(reference: ml_collections.ConfigDict, config, path: str = ""):
    """Yields (dotted key, reference value, value) for every leaf of `config`.

    Raises:
      ConfigError: a key `reference` lacks (a renamed one names its replacement), or a
        value where `reference` has a section.
    """
    for key in config.keys():
        where = f"{path}{key}"
        if key not in reference:
            if where in RENAMED:
                raise renamed_key_error(where)
            raise ConfigError(f"unknown config key {where!r}; known keys under "
                              f"{path or 'the root'}: {sorted(reference.keys())}")
        ref, val = reference[key], config[key]
        if isinstance(ref, ml_collections.ConfigDict):
            if not isinstance(val, (ml_collections.ConfigDict, dict)):
                reject(where, val, "it must be a section")
            yield from leaves(ref, val, where + ".")
        else:
            yield where, ref, val


def _check_type(where, ref, val):
    if isinstance(ref, bool) or isinstance(val, bool):
        ok = isinstance(ref, bool) and isinstance(val, bool)
    elif isinstance(ref, float):
        ok = isinstance(val, (int, float))
    elif isinstance(ref, (tuple, list)):
        ok = isinstance(val, (tuple, list))
    else:
        ok = isinstance(val, type(ref))
    if not ok:
        reject(where, val, f"it must be of type {type(ref).__name__}, not "
                           f"{type(val).__name__}")
