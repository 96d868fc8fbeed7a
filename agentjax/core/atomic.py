"""Writes that a killed process never leaves half done.

A run is resumed by rerunning it in its workdir, and whatever the rerun reads back
decides what it does next; a file or folder that can exist half-written would let a
kill at the wrong moment change the run. Each writer here builds its output under a
temporary name next to the destination and renames it into place (a rename within one
filesystem is atomic), so readers see the previous version or the complete new one.
The data is flushed to disk before the rename, so a machine crash cannot leave a
complete-looking name over lost data either.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
from typing import Any, Iterator


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_text(path: str | os.PathLike, text: str) -> None:
    """Replaces the file `path` by `text` atomically."""
    path = os.fspath(path)
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync(os.path.dirname(os.path.abspath(path)))


def write_json(path: str | os.PathLike, value: Any) -> None:
    """Replaces the file `path` by `value` as indented json, atomically."""
    write_text(path, json.dumps(value, indent=1))


@contextlib.contextmanager
def folder(path: str | os.PathLike) -> Iterator[str]:
    """Yields a fresh temporary folder to fill; on a normal exit it replaces `path`.

    Leftovers of an earlier killed write are removed first. Replacing an existing
    folder takes two renames (the old one aside, the new one in); only a kill between
    them can leave `path` missing — never partly written — and the writer that runs
    again restores it.
    """
    path = os.path.abspath(os.fspath(path))
    tmp, old = f"{path}.tmp", f"{path}.old"
    for stale in (tmp, old):
        shutil.rmtree(stale, ignore_errors=True)
    os.makedirs(tmp)
    yield tmp
    for dirpath, _, names in os.walk(tmp):
        for name in names:
            _fsync(os.path.join(dirpath, name))
    if os.path.exists(path):
        os.rename(path, old)
    os.rename(tmp, path)
    _fsync(os.path.dirname(path))
    shutil.rmtree(old, ignore_errors=True)
