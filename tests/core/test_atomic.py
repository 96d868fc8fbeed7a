"""Atomic writes: a writer that dies part way leaves the previous version (or none)."""
import os
from pathlib import Path

import pytest

from agentjax.core import atomic


class Killed(Exception):
    """Stands for a kill in the middle of a write."""


def test_folder_appears_complete_or_not_at_all(tmp_path):
    path = tmp_path / "export"
    with pytest.raises(Killed):
        with atomic.folder(path) as tmp:
            Path(tmp, "weights").write_text("half")
            raise Killed
    assert not path.exists()
    with atomic.folder(path) as tmp:  # the retry clears the leftover temporary
        assert os.listdir(tmp) == []
        Path(tmp, "weights").write_text("v1")
    assert sorted(os.listdir(tmp_path)) == ["export"]
    with pytest.raises(Killed):
        with atomic.folder(path) as tmp:
            Path(tmp, "weights").write_text("v2, half")
            raise Killed
    assert (path / "weights").read_text() == "v1"
    with atomic.folder(path) as tmp:
        Path(tmp, "other").write_text("v3")
    assert os.listdir(path) == ["other"]  # replaced as a whole
    assert sorted(os.listdir(tmp_path)) == ["export"]


def test_write_text_replaces_the_whole_file(tmp_path):
    path = tmp_path / "final.json"
    atomic.write_json(path, {"a": 1})
    atomic.write_text(path, "short")
    assert path.read_text() == "short"
    assert os.listdir(tmp_path) == ["final.json"]
