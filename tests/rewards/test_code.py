import dataclasses
import subprocess
import sys
import threading

import pytest

from agentjax.rewards import code


@dataclasses.dataclass
class Result:
    status: str
    exit_code: int
    stdout: str
    stderr: str
    duration_s: float = 0.0


class SubprocessSandbox:
    """Runs code in a plain python subprocess (no isolation): the Sandbox.run contract."""

    def __init__(self):
        self.calls = []
        self._lock = threading.Lock()

    def run(self, code_text, *, stdin="", timeout_s, memory_mb, files=None):
        with self._lock:
            self.calls.append((code_text, stdin, timeout_s, memory_mb))
        try:
            p = subprocess.run([sys.executable, "-c", code_text], input=stdin, text=True,
                               capture_output=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return Result("timeout", -9, "", "")
        return Result("ok" if p.returncode == 0 else "error", p.returncode, p.stdout, p.stderr)


PROGRAM = "def add(a, b):\n    return a + b\n"


def test_extract_code_prefers_the_last_fenced_block():
    text = "first\n```python\nx = 1\n```\nthen\n```\ny = 2\n```\n"
    assert code.extract_code(text) == "y = 2\n"
    assert code.extract_code("print(1)") == "print(1)"


def test_assertion_tests_pass_fraction():
    sandbox = SubprocessSandbox()
    tests = ["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(2, 2) == 5"]
    got = code.tests_pass_fraction(PROGRAM, tests, sandbox, timeout_s=10, memory_mb=64)
    assert got == pytest.approx(2 / 3)
    # Each test ran in its own run, with the limits passed through.
    assert len(sandbox.calls) == 3
    assert all(c[2] == 10 and c[3] == 64 for c in sandbox.calls)


def test_io_tests_compare_stdout_per_line():
    sandbox = SubprocessSandbox()
    program = "a, b = map(int, input().split())\nprint(a + b)\nprint('done')  \n"
    tests = [{"stdin": "1 2\n", "stdout": "3\ndone\n"}, {"stdin": "5 5", "stdout": "  10\ndone"},
             {"stdin": "1 1", "stdout": "3\ndone"}]
    assert code.tests_pass_fraction(program, tests, sandbox) == pytest.approx(2 / 3)


def test_crash_timeout_and_missing_answer_fail():
    sandbox = SubprocessSandbox()
    assert code.tests_pass_fraction("raise SystemExit(3)", ["pass"], sandbox) == 0.0
    assert code.tests_pass_fraction("while True: pass", ["pass"], sandbox, timeout_s=0.5) == 0.0
    assert code.tests_pass_fraction(None, ["pass"], sandbox) == 0.0


def test_bad_tests_are_clear_errors():
    with pytest.raises(ValueError, match="empty"):
        code.tests_pass_fraction(PROGRAM, [], SubprocessSandbox())
    with pytest.raises(ValueError, match="stdout"):
        code.tests_pass_fraction(PROGRAM, [{"stdin": "1"}], SubprocessSandbox())


def test_real_sandbox():
    from agentjax.envs.sandbox import Sandbox, SandboxUnavailableError
    try:
        sandbox = Sandbox()
    except SandboxUnavailableError as err:
        pytest.skip(f"bubblewrap unavailable: {err}")
    tests = ["assert add(1, 2) == 3", "assert add(2, 2) == 5",
             "import socket; socket.create_connection(('1.1.1.1', 53), timeout=1)"]
    assert code.tests_pass_fraction(PROGRAM, tests, sandbox, timeout_s=10) == pytest.approx(1 / 3)
