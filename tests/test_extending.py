"""docs/extending.md's worked examples run as written: every ```python block, in a fresh
interpreter (the registries are process-wide, and an example's registration must not
reach the other tests), in one scratch folder per page where a block that starts with
`# file: <path>` is written to that path instead."""
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "extending.md"
BLOCK = re.compile(r"^## (?P<section>.+?)$|^```python\n(?P<code>.*?)^```$", re.M | re.S)


def _sections() -> dict[str, list[str]]:
    sections, current = {}, None
    for match in BLOCK.finditer(PAGE.read_text()):
        if match["section"]:
            current = match["section"]
        else:
            sections.setdefault(current, []).append(match["code"])
    return sections


def test_every_extension_point_has_an_example():
    assert set(_sections()) == {"A tool", "A reward component", "A policy loss",
                                "An advantage estimator", "An env", "A recipe"}


@pytest.mark.parametrize("section", sorted(_sections()))
def test_the_example_runs(section, tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), os.environ.get("PYTHONPATH", "")]), "JAX_PLATFORMS": "cpu"}
    for code in _sections()[section]:
        first, _, rest = code.partition("\n")
        if first.startswith("# file: "):
            path = tmp_path / first.removeprefix("# file: ").strip()
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(rest)
            continue
        result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                                capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, f"{section}:\n{result.stderr[-3000:]}"
