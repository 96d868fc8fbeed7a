"""The one JSONL reader: each non-blank line of a file, decoded.

A line that is not JSON comes back as its `json.JSONDecodeError` instead of raising, so
each reader keeps its own policy: a corpus or a demonstration file stops at a bad line,
a task file reports it as a bad row and goes on.
"""
from __future__ import annotations

import json
from typing import Any, Iterator


def read_jsonl(path: str) -> Iterator[tuple[int, Any]]:
    """Yields `(0-based line index, value or json.JSONDecodeError)` for each non-blank
    line of the UTF-8 file `path`."""
    with open(path, encoding="utf-8") as f:
        for index, line in enumerate(f):
            if not line.strip():
                continue
            try:
                yield index, json.loads(line)
            except json.JSONDecodeError as err:
                yield index, err
