"""Code outcome reward: run a program against a task's tests, per test, in the sandbox.

Programs run through a sandbox: any object with
`run(code, *, stdin, timeout_s, memory_mb, files) -> SandboxResult(status, exit_code,
stdout, stderr, duration_s)` (agentjax.envs.sandbox.Sandbox, or a fake in tests).

A test is either an assertion snippet (str) run after the program in the program's
namespace — it passes when it raises nothing — or an I/O case `{"stdin": ..., "stdout":
...}` that passes when the program, fed `stdin`, exits 0 and prints the expected stdout
up to surrounding whitespace on each line.

All of a program's tests run in ONE sandbox run (a sandbox start costs more than most
tests): a harness process forks one child per test, which runs the program and the test
with its own wall-clock deadline and output cap; after each test every process the
child left is killed, so a test that hangs, forks, floods its output or exhausts its
memory fails alone and the next test starts clean. The harness makes itself
non-dumpable and closes its report channel in the children, so a program cannot write
or forge the results; an I/O case's expected output never enters the sandbox (the
harness reports a hash of what the program printed). A program that kills the harness
fails every test not yet reported. Within its own process a program can always defeat
an assertion (an object equal to everything); an I/O case it cannot.
"""
from __future__ import annotations

import ast
import collections
import dataclasses
import hashlib
import json
import re
import signal
import threading
import warnings
from typing import Any, Mapping, Protocol, Sequence

from agentjax.core.task import EpisodeLog, Task
from agentjax.rewards.outcome import episode_answer

_FENCE_RE = re.compile(r"```(?:python|py|Python|python3)?[ \t]*\n(.*?)```", re.DOTALL)

# What a test that failed or never ran reports (TestResult.status): the program ran and
# the test failed ("failed": assertion or wrong output), or the program crashed, ran out
# of time, memory or output room, or the harness was gone before the test ran.
STATUSES = ("passed", "failed", "error", "timeout", "oom", "output_limit", "not_run")
# Characters of a test's stdout / stderr the harness reports back (head and tail).
REPORTED_CHARS = 600
# Bytes of stdout or stderr a test may write before it is stopped.
TEST_OUTPUT_BYTES = 256 * 1024


class SandboxLike(Protocol):
    def run(self, code: str, *, stdin: str = "", timeout_s: float, memory_mb: int,
            files: Mapping[str, str] | None = None) -> Any: ...


@dataclasses.dataclass(frozen=True)
class TestResult:
    """How one test went.

    Attributes:
      passed: whether it passed.
      status: one of STATUSES.
      stdout, stderr: what the test printed (head and tail, REPORTED_CHARS each).
      expected, got: for an assertion `assert X == Y` that failed, repr(Y) and repr(X).
      duration_s: the test's wall-clock seconds.
    """

    passed: bool
    status: str
    stdout: str = ""
    stderr: str = ""
    expected: str | None = None
    got: str | None = None
    duration_s: float = 0.0


def extract_code(text: str) -> str:
    """The last fenced code block of `text` (```python ... ```), else `text` itself."""
    blocks = _FENCE_RE.findall(text)
    return blocks[-1] if blocks else text


def last_fenced_block(text: str) -> str | None:
    """The last fenced code block of `text`, or None when it has none."""
    blocks = _FENCE_RE.findall(text)
    return blocks[-1] if blocks else None


def parse_source(source: str, mode: str = "exec") -> ast.AST:
    """`ast.parse`, with every way of not parsing raised as SyntaxError. Nesting too deep
    for the parser raises RecursionError or MemoryError in CPython, a null byte
    ValueError. CPython 3.11 also raises SystemError ("AST constructor recursion depth
    mismatch", python/cpython#106905) now and then for source that parses — a
    2-line program in one of our runs — so that is retried once before it counts."""
    for attempt in range(2):
        try:
            return ast.parse(source, mode=mode)
        except SyntaxError:
            raise
        except (RecursionError, MemoryError):
            raise SyntaxError("nesting too deep for the parser") from None
        except ValueError as err:
            raise SyntaxError(str(err)) from None
        except SystemError as err:
            if attempt:
                raise SyntaxError(f"the parser failed: {err}") from None


def syntax_problem(err: SyntaxError) -> str:
    """What a SyntaxError of `parse_source` says, with its line when it has one."""
    return err.msg if err.lineno is None else f"{err.msg} (line {err.lineno})"


def parse_program(source: str) -> ast.Module | None:
    """The syntax tree of a policy's program, None when it does not parse
    (`parse_source`); quietly (a policy writes `1x` often enough: Python's SyntaxWarnings
    would flood the run's log). A policy's babble must not fail its episode."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SyntaxWarning)
        try:
            return parse_source(source)
        except SyntaxError:
            return None


def defines(source: str, name: str) -> bool:
    """Whether `source` parses and defines a top-level function `name`."""
    tree = parse_program(source)
    if tree is None:
        return False
    return any(isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name
               for node in tree.body)


def assemble_program(code: str, *, prefix: str = "", entry_point: str | None = None) -> str:
    """The program the tests run: the agent's `code` after a task's `prefix` (HumanEval's
    prompt: imports, signature, docstring) — appended when it redefines `entry_point`,
    continuing the prompt otherwise (a completion of the function's body)."""
    if not prefix:
        return code
    if entry_point and defines(code, entry_point):
        return f"{prefix.rstrip()}\n\n{code}"
    return prefix + code


def normalize_output(text: str) -> str:
    """Output as compared: each line stripped, leading and trailing blank lines dropped."""
    return "\n".join(line.strip() for line in text.strip().splitlines())


def output_digest(text: str) -> str:
    return hashlib.sha256(normalize_output(text).encode("utf-8", "surrogatepass")).hexdigest()


def check_test(test: Any) -> None:
    """Raises ValueError naming what is wrong with a test (module docstring)."""
    if isinstance(test, str):
        try:
            parse_source(test)
        except SyntaxError as err:
            raise ValueError(f"test does not parse: {syntax_problem(err)}: "
                             f"{test[:200]!r}") from None
        return
    if (not isinstance(test, Mapping) or not isinstance(test.get("stdout"), str)
            or not isinstance(test.get("stdin", ""), str)):
        raise ValueError(f"a code test must be an assertion string or a mapping with "
                         f"'stdout' (and optional 'stdin') strings; got {test!r}"[:300])


def _instrumented(test: str) -> str:
    """`assert X == Y` as code that keeps both sides (`__got__`, `__want__`) for the
    failure report; any other snippet unchanged."""
    try:
        tree = parse_source(test)
    except SyntaxError:
        return test
    if (len(tree.body) != 1 or not isinstance(tree.body[0], ast.Assert)
            or not isinstance(tree.body[0].test, ast.Compare)
            or len(tree.body[0].test.ops) != 1 or not isinstance(tree.body[0].test.ops[0], ast.Eq)):
        return test
    compare = tree.body[0].test
    return (f"__got__ = ({ast.unparse(compare.left)})\n"
            f"__want__ = ({ast.unparse(compare.comparators[0])})\n"
            "assert __got__ == __want__\n")


# Runs inside the sandbox as main.py; SPEC is spliced in as a Python literal, and each
# test's report comes back as one line, the repr of a dict (read with ast.literal_eval).
_HARNESS = r'''
# Only what every run needs is imported up front (each run pays the harness's start-up):
# no json, re or enum; hashlib and traceback when a test needs them.
import ctypes, os, select, sys, time
_libc = ctypes.CDLL(None)
_libc.prctl(4, 0, 0, 0, 0)   # PR_SET_DUMPABLE 0: no test can ptrace us or open our fds
_libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER: orphans come back to us to reap
SPEC = __SPEC__
REPORT = os.fdopen(os.dup(1), "w")
os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
KEEP = SPEC["keep"]


def clip(data):
    text = data.decode("utf-8", "replace")
    if len(text) <= 2 * KEEP:
        return text
    return text[:KEEP] + "\n...[%d characters omitted]...\n" % (len(text) - 2 * KEEP) + text[-KEEP:]


def normalized_digest(data):
    import hashlib
    text = data.decode("utf-8", "surrogateescape")
    lines = [line.strip() for line in text.strip().splitlines()]
    return hashlib.sha256("\n".join(lines).encode("utf-8", "surrogateescape")).hexdigest()


def child(test, stdin_fd, out_w, err_w):
    os.setpgid(0, 0)
    os.dup2(stdin_fd, 0)
    os.dup2(out_w, 1)
    os.dup2(err_w, 2)
    os.closerange(3, 65536)
    scope = {"__name__": "__main__", "__builtins__": __builtins__}
    code = 0
    try:
        exec(compile(SPEC["program"], "solution.py", "exec"), scope)
        if test["kind"] == "assert":
            exec(compile(test["code"], "test.py", "exec"), scope)
    except SystemExit as exit_:
        if test["kind"] == "assert":  # the test never ran
            sys.stderr.write("the program exited before the test ran\n")
            code = 3
        else:
            code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    except AssertionError as error:
        if "__got__" in scope and "__want__" in scope:
            try:
                want, got = repr(scope["__want__"]), repr(scope["__got__"])
                sys.stderr.write("\x00%d\x00%s%s" % (len(want), want, got))
            except BaseException:
                pass
        else:
            sys.stderr.write("AssertionError" + (": %s" % error if str(error) else "") + "\n")
        code = 1
    except BaseException as error:
        # From the program's own frames on: the harness's frame is no help to its author.
        import traceback
        traceback.print_exception(type(error), error, error.__traceback__.tb_next)
        code = 1
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:
        code = code or 1
    os._exit(code)


def kill_descendants():
    # Orphans are reparented to us (subreaper): killing our children until none is left
    # kills every process a test started, and nothing else (/proc may be the host's).
    me = os.getpid()
    while True:
        children = []
        for name in os.listdir("/proc"):
            if name.isdigit():
                try:
                    with open("/proc/%s/stat" % name) as f:
                        if int(f.read().rsplit(")", 1)[1].split()[1]) == me:
                            children.append(int(name))
                except (OSError, ValueError, IndexError):
                    pass
        if not children:
            return
        for pid in children:
            try:
                os.kill(pid, SPEC["sigkill"])
            except OSError:
                pass
        for pid in children:
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass


def read_available(fd, chunks, sizes):
    """Reads what `fd` holds now; False at end of file."""
    while True:
        try:
            data = os.read(fd, 65536)
        except BlockingIOError:
            return True
        if not data:
            return False
        chunks[fd].append(data)
        sizes[fd] += len(data)
        if sizes[fd] > SPEC["max_output_bytes"]:
            return True


def run_one(index, test):
    stdin_fd = os.open(os.devnull, os.O_RDONLY)
    if test["kind"] == "io":
        path = "/tmp/stdin-%d" % index
        with open(path, "wb") as f:
            f.write(test["stdin"].encode("utf-8", "surrogatepass"))
        os.close(stdin_fd)
        stdin_fd = os.open(path, os.O_RDONLY)
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:
        try:
            child(test, stdin_fd, out_w, err_w)
        finally:  # whatever escapes it, the child never returns into the harness's loop
            os._exit(1)
    for fd in (stdin_fd, out_w, err_w):
        os.close(fd)
    for fd in (out_r, err_r):
        os.set_blocking(fd, False)
    chunks, sizes, killed, status = {out_r: [], err_r: []}, {out_r: 0, err_r: 0}, None, None
    deadline = start + SPEC["timeout_s"]
    open_fds = [out_r, err_r]
    while status is None:
        left = deadline - time.monotonic()
        if left <= 0:
            killed = "timeout"
            break
        if open_fds:
            ready, _, _ = select.select(open_fds, [], [], min(left, 0.02))
            for fd in ready:
                if not read_available(fd, chunks, sizes):
                    open_fds.remove(fd)
        else:
            time.sleep(min(left, 0.002))
        if max(sizes.values()) > SPEC["max_output_bytes"]:
            killed = "output_limit"
            break
        done, code = os.waitpid(pid, os.WNOHANG)
        if done:
            status = code
            for fd in list(open_fds):  # what it wrote before it exited
                read_available(fd, chunks, sizes)
    kill_descendants()  # the test itself when it was stopped, and what it left behind
    for fd in (out_r, err_r):
        os.close(fd)
    duration = time.monotonic() - start
    stdout, stderr = b"".join(chunks[out_r]), b"".join(chunks[err_r])
    expected = got = None
    # The child's last words on a failed `assert got == want`: NUL, len(want), NUL, want, got.
    head, _, pair = stderr.rpartition(b"\x00")
    head, _, length = head.rpartition(b"\x00")
    pair = pair.decode("utf-8", "replace")
    if length.isdigit() and len(length) <= 9 and int(length) <= len(pair):
        stderr, expected, got = head, pair[:int(length)], pair[int(length):]
    exit_code = None
    if killed is None:
        exit_code = 128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        if exit_code == 128 + SPEC["sigxcpu"]:
            killed = "timeout"
    return {"index": index, "killed": killed, "exit_code": exit_code,
            "digest": normalized_digest(stdout) if test["kind"] == "io" else None,
            "stdout": clip(stdout),
            "stderr": clip(stderr), "expected": expected, "got": got,
            "duration_s": duration}


for index, test in enumerate(SPEC["tests"]):
    REPORT.write(repr(run_one(index, test)) + "\n")
    REPORT.flush()
'''

_OOM_MARKERS = ("MemoryError", "Cannot allocate memory")


def harness_program(program: str, tests: Sequence[Any], *, timeout_s: float,
                    max_output_bytes: int = TEST_OUTPUT_BYTES) -> str:
    """The sandbox program that runs `program` against every test (module docstring)."""
    spec = {"program": program, "timeout_s": float(timeout_s), "keep": REPORTED_CHARS,
            "max_output_bytes": int(max_output_bytes),
            "sigkill": int(signal.SIGKILL), "sigxcpu": int(signal.SIGXCPU),
            "tests": [{"kind": "assert", "code": _instrumented(t)} if isinstance(t, str)
                      else {"kind": "io", "stdin": str(t.get("stdin", ""))} for t in tests]}
    return _HARNESS.replace("__SPEC__", repr(spec), 1)


def _result(test: Any, report: Mapping[str, Any]) -> TestResult:
    fields = dict(stdout=report["stdout"], stderr=report["stderr"],
                  expected=report.get("expected"), got=report.get("got"),
                  duration_s=float(report["duration_s"]))
    if report["killed"]:
        return TestResult(False, report["killed"], **fields)
    if report["exit_code"] != 0:
        oom = any(m in report["stderr"] for m in _OOM_MARKERS)
        failed = report.get("expected") is not None or (
            isinstance(test, str) and "AssertionError" in report["stderr"])
        return TestResult(False, "oom" if oom else "failed" if failed else "error", **fields)
    if isinstance(test, str):
        return TestResult(True, "passed", **fields)
    passed = report["digest"] == output_digest(test["stdout"])
    return TestResult(passed, "passed" if passed else "failed", **fields)


def run_tests(program: str | None, tests: Sequence[str | Mapping[str, str]],
              sandbox: SandboxLike, *, timeout_s: float = 5.0, memory_mb: int = 512,
              max_output_bytes: int = TEST_OUTPUT_BYTES) -> list[TestResult]:
    """Runs `program` against each test in one sandbox run (module docstring).

    Args:
      program: the program (None: no program; every test is "not_run").
      tests: assertion snippets and/or {"stdin", "stdout"} cases; must be non-empty.
      sandbox: object with the Sandbox.run signature (module docstring).
      timeout_s: wall-clock limit of each test.
      memory_mb: address-space limit of each test's process.
      max_output_bytes: stdout (and stderr) a test may write before it is stopped.

    Returns:
      One TestResult per test, in order.
    """
    if not tests:
        raise ValueError("run_tests: `tests` is empty; a code task needs tests")
    for test in tests:
        check_test(test)
    if program is None:
        return [TestResult(False, "not_run") for _ in tests]
    harness = harness_program(program, tests, timeout_s=timeout_s,
                              max_output_bytes=max_output_bytes)
    # Room for every test's deadline, the harness's start and its cleanup after each.
    run = sandbox.run(harness, stdin="", timeout_s=len(tests) * (timeout_s + 0.5) + 5.0,
                      memory_mb=memory_mb, files=None)
    reports = {}
    for line in run.stdout.splitlines():
        try:
            report = ast.literal_eval(line)
            reports[int(report["index"])] = report
        except (ValueError, SyntaxError, KeyError, TypeError):
            break  # a cut line: the harness was stopped mid-report
    return [_result(test, reports[i]) if i in reports else
            TestResult(False, "not_run", stderr=run.stderr[-REPORTED_CHARS:])
            for i, test in enumerate(tests)]


def tests_pass_fraction(code: str | None, tests: Sequence[str | Mapping[str, str]],
                        sandbox: SandboxLike, *, timeout_s: float = 5.0,
                        memory_mb: int = 512) -> float:
    """Fraction of `tests` the program passes (`run_tests`; None: no program, 0)."""
    results = run_tests(code, tests, sandbox, timeout_s=timeout_s, memory_mb=memory_mb)
    return sum(r.passed for r in results) / len(results)


class _ResultCache:
    """Recent `run_tests` results by (program, tests, limits): the fraction and the
    all-or-nothing outcome of one episode (both logged) run its tests once."""

    def __init__(self, size: int):
        self._size = size
        self._items: collections.OrderedDict = collections.OrderedDict()
        self._lock = threading.Lock()

    def get(self, key, compute):
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key]
        value = compute()
        with self._lock:
            self._items[key] = value
            while len(self._items) > self._size:
                self._items.popitem(last=False)
        return value


_HIDDEN_RESULTS = _ResultCache(4096)


def episode_program(task: Task, log: EpisodeLog) -> str | None:
    """The program an episode submitted, as its tests run it: the last `<answer>` or
    the env's final answer, its last fenced block if it has one, after the task's
    prefix (`assemble_program`); None when it submitted nothing."""
    answer = episode_answer(log)
    if answer is None:
        return None
    return assemble_program(extract_code(answer), prefix=task.metadata.get("prefix", ""),
                            entry_point=task.metadata.get("entry_point"))


def hidden_test_results(task: Task, log: EpisodeLog, sandbox: SandboxLike, *,
                        timeout_s: float, memory_mb: int) -> list[TestResult]:
    """The episode's program against `task.metadata["tests"]` (cached: module
    docstring of `_ResultCache`)."""
    if "tests" not in task.metadata:
        raise ValueError(f"task {task.task_id!r} has no metadata['tests'] for a tests reward")
    tests = task.metadata["tests"]
    program = episode_program(task, log)
    key = (program, json.dumps(tests, sort_keys=True), timeout_s, memory_mb)
    return _HIDDEN_RESULTS.get(key, lambda: run_tests(
        program, tests, sandbox, timeout_s=timeout_s, memory_mb=memory_mb))


def tests_score(task: Task, log: EpisodeLog, sandbox: SandboxLike, *,
                all_or_nothing: bool = False, timeout_s: float = 5.0,
                memory_mb: int = 512) -> float:
    """The fraction of the hidden tests the episode's program passes, or (all_or_nothing)
    1.0 when it passes all of them and 0.0 otherwise."""
    results = hidden_test_results(task, log, sandbox, timeout_s=timeout_s, memory_mb=memory_mb)
    fraction = sum(r.passed for r in results) / len(results)
    return float(fraction == 1.0) if all_or_nothing else fraction


def code_format_score(log: EpisodeLog) -> float:
    """0.5 * (valid actions / turns) + 0.5 * [the episode ended with a program that
    parses] — the code env's counterpart of `format.format_score`."""
    if not log.turns:
        return 0.0
    valid = sum(t.valid for t in log.turns) / len(log.turns)
    program = log.final_answer
    finished = (program is not None and log.stop_reason == "answer"
                and parse_program(program) is not None)
    return 0.5 * valid + 0.5 * float(finished)
