"""ConfigError, the one error a config no run can use raises, and how scripts report it."""
from __future__ import annotations

import functools
import sys
from typing import Callable


class ConfigError(ValueError):
    """A config value no run can use. The message is one line naming the key, the value
    and what is allowed; the scripts print it as `error: <message>` and exit with
    status 2, without a traceback."""


def exit_on_config_error(main: Callable) -> Callable:
    """Wraps a script's `main(argv)`: a ConfigError prints `error: <message>` on stderr
    (one line, no traceback) and exits with status 2, before anything is built."""

    @functools.wraps(main)
    def guarded(argv):
        try:
            return main(argv)
        except ConfigError as error:
            print(f"error: {error}", file=sys.stderr)
            sys.exit(2)

    return guarded


def reject(key: str, value, requirement: str):
    """Raises the ConfigError `config key '<key>' is <value>; <requirement>`."""
    raise ConfigError(f"config key {key!r} is {value!r}; {requirement}")
