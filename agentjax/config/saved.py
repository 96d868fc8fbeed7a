"""The config a run saved: `<workdir>/config.json`, read back over today's schema."""
from __future__ import annotations

import json
import os

import ml_collections

from agentjax.config.schema import RENAMED, default_config
from agentjax.config.validation import renamed_key_error


def is_run_folder(workdir: str) -> bool:
    """Whether `workdir` holds a run: the config.json every run saves first."""
    return os.path.isfile(os.path.join(workdir, "config.json"))


def load_saved(path: str) -> ml_collections.ConfigDict:
    """The config a run saved (`<workdir>/config.json`) over today's defaults: keys added
    since take their defaults, keys removed since are dropped (with a printed warning
    naming them).

    Raises:
      ConfigError: the file sets a renamed key (the message names the new one).
    """
    with open(path) as f:
        saved = json.load(f)
    config = default_config()

    def known(reference, values, prefix=""):
        kept, dropped = {}, []
        for key, value in values.items():
            if prefix + key in RENAMED:
                raise renamed_key_error(prefix + key, source=path)
            if key not in reference:
                dropped.append(prefix + key)
            elif isinstance(value, dict) and isinstance(reference[key], ml_collections.ConfigDict):
                kept[key], more = known(reference[key], value, f"{prefix}{key}.")
                dropped += more
            else:
                kept[key] = value
        return kept, dropped

    kept, dropped = known(config, saved)
    if dropped:
        print(f"warning: {path} has keys this version no longer has, ignored: "
              f"{', '.join(dropped)}")
    config.update(kept)
    return config
