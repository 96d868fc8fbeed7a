import dataclasses
import subprocess
import sys
import threading
import warnings

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
    # One run for all the tests, its deadline room for each test's, the memory limit
    # passed through.
    assert len(sandbox.calls) == 1
    assert sandbox.calls[0][2] == 3 * (10 + 0.5) + 5 and sandbox.calls[0][3] == 64


def test_failures_say_expected_and_got():
    results = code.run_tests(PROGRAM, ["assert add(2, 2) == 5", "assert add(1, 1) > 2",
                                       "assert add(1, 2) == 3", "add(1)"],
                             SubprocessSandbox())
    assert [r.status for r in results] == ["failed", "failed", "passed", "error"]
    assert (results[0].expected, results[0].got) == ("5", "4")
    assert results[1].expected is None and "AssertionError" in results[1].stderr
    assert "TypeError" in results[3].stderr and "child" not in results[3].stderr


def test_expected_and_got_survive_any_characters():
    """Both sides come back exactly as repr shows them: non-ASCII, newlines, NULs; a NUL
    the program printed itself stays in its stderr."""
    program = "def f():\n    return 'caf\u00e9\\n\\x00 \u2028'\n"
    results = code.run_tests(program, ["assert f() == 'cafe'",
                                       "import sys; sys.stderr.write('a\\x00b'); assert False",
                                       "import sys; sys.stderr.write('\\x00' + '9' * 5000 + "
                                       "'\\x00'); assert False", "pass"],
                             SubprocessSandbox())
    assert (results[0].expected, results[0].got) == ("'cafe'", "'caf\u00e9\\n\\x00 \\u2028'")
    assert results[1].expected is None and results[1].stderr.startswith("a\x00bAssertionError")
    # A length too long to be one does not stop the harness: the next test still runs.
    assert [r.status for r in results[2:]] == ["failed", "passed"]


def test_a_test_child_whose_error_report_fails_still_exits():
    """A program that breaks the traceback module: its test fails, the next one runs."""
    program = "import sys\nsys.modules['traceback'] = None\n"
    results = code.run_tests(program, ["raise ValueError('x')", "pass"], SubprocessSandbox())
    assert [r.status for r in results] == ["error", "passed"]


def test_io_tests_compare_stdout_per_line():
    sandbox = SubprocessSandbox()
    program = "a, b = map(int, input().split())\nprint(a + b)\nprint('done')  \n"
    tests = [{"stdin": "1 2\n", "stdout": "3\ndone\n"}, {"stdin": "5 5", "stdout": "  10\ndone"},
             {"stdin": "1 1", "stdout": "3\ndone"}]
    results = code.run_tests(program, tests, sandbox)
    assert [r.passed for r in results] == [True, True, False]
    assert results[2].stdout == "2\ndone\n"
    # The expected output never enters the sandbox (a digest of the output comes back).
    code.run_tests("print('x')", [{"stdin": "", "stdout": "EXPECTED-OUTPUT"}], sandbox)
    assert "EXPECTED-OUTPUT" not in sandbox.calls[-1][0]


def test_crash_timeout_exit_and_missing_answer_fail():
    sandbox = SubprocessSandbox()
    assert code.tests_pass_fraction("raise SystemExit(3)", ["pass"], sandbox) == 0.0
    # Exiting 0 before the test runs does not pass it.
    assert code.tests_pass_fraction("raise SystemExit(0)", ["assert False"], sandbox) == 0.0
    assert code.tests_pass_fraction("while True: pass", ["pass"], sandbox, timeout_s=0.5) == 0.0
    assert code.tests_pass_fraction(None, ["pass"], sandbox) == 0.0


def test_a_program_that_kills_the_harness_fails_the_tests_not_yet_reported():
    program = "import os, signal\ndef kill():\n    os.kill(os.getppid(), signal.SIGKILL)\n"
    results = code.run_tests(program, ["pass", "kill()", "pass"], SubprocessSandbox())
    assert [r.status for r in results] == ["passed", "not_run", "not_run"]


def test_bad_tests_are_clear_errors():
    with pytest.raises(ValueError, match="empty"):
        code.tests_pass_fraction(PROGRAM, [], SubprocessSandbox())
    with pytest.raises(ValueError, match="stdout"):
        code.tests_pass_fraction(PROGRAM, [{"stdin": "1"}], SubprocessSandbox())
    with pytest.raises(ValueError, match=r"does not parse: .*\(line 1\)"):
        code.run_tests(PROGRAM, ["assert add(1, 2) =="], SubprocessSandbox())


def test_assemble_program_continues_or_follows_the_prefix():
    prefix = "import math\n\ndef f(x):\n    \"\"\"doc\"\"\"\n"
    assert code.assemble_program("    return x\n", prefix=prefix, entry_point="f") == \
        prefix + "    return x\n"
    whole = "def f(x):\n    return math.floor(x)\n"
    assert code.assemble_program(whole, prefix=prefix, entry_point="f") == \
        prefix.rstrip() + "\n\n" + whole
    assert code.assemble_program(whole) == whole


def test_policy_programs_parse_quietly():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a SyntaxWarning would raise here
        assert code.parse_program("x = 1if 1 else 2") is not None
        assert code.parse_program("x = 1x") is None
        assert not code.defines("def f(:", "f") and code.defines("def f(): pass", "f")
    # Too deep for CPython's parser (RecursionError): a program that does not parse.
    assert code.parse_program("x = " + "+".join(["1"] * 100_000)) is None


def test_parse_source_raises_every_failure_as_a_syntax_error(monkeypatch):
    with pytest.raises(SyntaxError, match="nesting too deep"):
        code.parse_source("x = " + "+".join(["1"] * 100_000))
    with pytest.raises(SyntaxError, match="null bytes"):
        code.parse_source("x = 1\0")
    with pytest.raises(ValueError, match="test does not parse: nesting too deep"):
        code.check_test("assert " + "+".join(["1"] * 100_000) + " == 1")
    # CPython 3.11's transient SystemError (python/cpython#106905): retried once, then a
    # syntax error; a test's instrumentation then falls back to the test as written.
    real, calls = code.ast.parse, []

    def flaky(source, mode="exec", fail=1):
        calls.append(source)
        if len(calls) <= fail:
            raise SystemError("AST constructor recursion depth mismatch (before=48, after=53)")
        return real(source, mode=mode)

    monkeypatch.setattr(code.ast, "parse", flaky)
    assert isinstance(code.parse_source("def f(x): return max(x)"), code.ast.Module)
    assert len(calls) == 2
    calls.clear()
    monkeypatch.setattr(code.ast, "parse", lambda s, mode="exec": flaky(s, mode, fail=2))
    assert code.parse_program("def f(x): return max(x)") is None
    calls.clear()
    assert code._instrumented("assert f(1) == 2") == "assert f(1) == 2"
