"""Code outcome reward: the fraction of a task's tests that the policy's program passes.

Programs run through a sandbox: any object with
`run(code, *, stdin, timeout_s, memory_mb, files) -> SandboxResult(status, exit_code,
stdout, stderr, duration_s)` (agentjax.envs.sandbox.Sandbox, or a fake in tests).

A test is either an assertion snippet (str) appended to the program — it passes when the
run ends with status "ok" and exit code 0 — or an I/O case `{"stdin": ..., "stdout": ...}`
that passes when the program's stdout equals the expected one up to surrounding
whitespace on each line.
"""
from __future__ import annotations

import concurrent.futures
import re
from typing import Any, Mapping, Protocol, Sequence

_FENCE_RE = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.DOTALL)


class SandboxLike(Protocol):
    def run(self, code: str, *, stdin: str = "", timeout_s: float, memory_mb: int,
            files: Mapping[str, str] | None = None) -> Any: ...


def extract_code(text: str) -> str:
    """The last fenced code block of `text` (```python ... ```), else `text` itself."""
    blocks = _FENCE_RE.findall(text)
    return blocks[-1] if blocks else text


def _normalize_output(text: str) -> list[str]:
    return [line.strip() for line in text.strip().splitlines()]


def _passes(sandbox: SandboxLike, code: str, test: str | Mapping[str, str], *,
            timeout_s: float, memory_mb: int) -> bool:
    if isinstance(test, str):
        result = sandbox.run(f"{code}\n\n{test}\n", stdin="", timeout_s=timeout_s,
                             memory_mb=memory_mb, files=None)
        return result.status == "ok" and result.exit_code == 0
    if not isinstance(test, Mapping) or "stdout" not in test:
        raise ValueError(f"a code test must be an assertion string or a mapping with "
                         f"'stdout' (and optional 'stdin'); got {test!r}")
    result = sandbox.run(code, stdin=test.get("stdin", ""), timeout_s=timeout_s,
                         memory_mb=memory_mb, files=None)
    return (result.status == "ok" and result.exit_code == 0
            and _normalize_output(result.stdout) == _normalize_output(test["stdout"]))


def tests_pass_fraction(code: str | None, tests: Sequence[str | Mapping[str, str]],
                        sandbox: SandboxLike, *, timeout_s: float = 5.0,
                        memory_mb: int = 512, max_workers: int = 4) -> float:
    """Fraction of `tests` the program passes, each test in its own sandbox run.

    Args:
      code: the program (None: no answer, scores 0).
      tests: assertion snippets and/or {"stdin", "stdout"} cases; must be non-empty.
      sandbox: object with the Sandbox.run signature (module docstring).
      timeout_s: wall-clock limit per run.
      memory_mb: memory limit per run.
      max_workers: concurrent sandbox runs.
    """
    if not tests:
        raise ValueError("tests_pass_fraction: `tests` is empty; a code task needs tests")
    if code is None:
        return 0.0
    with concurrent.futures.ThreadPoolExecutor(max_workers=max_workers) as pool:
        passed = list(pool.map(
            lambda t: _passes(sandbox, code, t, timeout_s=timeout_s, memory_mb=memory_mb),
            tests))
    return sum(passed) / len(tests)
