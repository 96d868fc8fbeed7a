"""Code task files as users have them: HumanEval, MBPP and stdin/stdout rows, JSONL or
parquet, into Tasks the code env runs (env.name="code").

Accepted rows (the format is told by its fields):

* HumanEval: `task_id`, `prompt` (imports, the signature and the docstring of
  `entry_point`), `canonical_solution` (the body that continues the prompt), `test`
  (defines `check(candidate)`), `entry_point`. A program passes when
  `prompt + completion + test + check(entry_point)` runs clean; the agent's code either
  continues the prompt or redefines `entry_point` whole (then it runs after the prompt,
  which keeps its imports). Hidden tests: each `assert` of `check` on its own (partial
  credit; a `check` whose asserts sit inside loops or branches is one test). Visible
  tests: the prompt's doctest examples (`>>> f(x)` and the value on the next line).
* MBPP: `task_id`, `text`, `code` (the reference program), `test_list` (assert
  statements), `test_setup_code`, optional `challenge_test_list`. The agent is shown the
  text and the first test (it names the function); hidden tests are every test, each
  after `test_setup_code`.
* stdin/stdout (the APPS / CodeContests / LiveCodeBench shape): a statement (`question`,
  `problem`, `description` or `question_content`) and cases as lists of inputs and
  outputs: APPS `input_output` {"inputs", "outputs"} (a JSON string or an object),
  CodeContests `public_tests` / `private_tests` / `generated_tests` {"input": [...],
  "output": [...]}, LiveCodeBench `public_test_cases` / `private_test_cases` (lists of
  {"input", "output"}, or JSON strings of them), or plain `inputs` / `outputs`.
  Visible tests: the public cases, else the first case; hidden: all the others' and
  the public ones. A reference program: `solution`, APPS `solutions` (a JSON list; the
  first), CodeContests `solutions` {"language", "solution"} (the first Python 3 one).

Each bad row is a `RowError` naming its line (JSONL: 1-based line number) or row
(parquet: 0-based index) and the field at fault: a missing field, a test that does not
parse, an entry point the prompt (or the MBPP tests) does not define, and — checked in
the sandbox by `verify_solutions`, before any training — a canonical solution that fails
its own tests. A row's canonical solution, where the file has one, is kept as
`metadata["solution"]` (the SFT demonstration of the task).

Task metadata (never shown to the policy but through the env's prompt):
  tests          hidden tests: assertion snippets or {"stdin", "stdout"} cases
  visible_tests  the tests the `run` tool runs
  entry_point    the function to write (None for stdin/stdout tasks)
  prefix         code the agent's program runs after (HumanEval's prompt), "" if none
                 (rewards.code.assemble_program)
  starter        code shown to the agent to complete ("" if none)
  solution       the canonical program (complete, `prefix` included), or None
  format         "humaneval", "mbpp" or "stdio"
"""
from __future__ import annotations

import ast
import builtins
import concurrent.futures
import dataclasses
import doctest
import json
import os
from typing import Any, Callable, Iterable, Mapping, Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from agentjax.core.jsonl import read_jsonl
from agentjax.core.task import Task
from agentjax.data.rows import LoadResult, RowError, load_rows
from agentjax.rewards import code as code_lib

STATEMENT_FIELDS = ("question", "problem", "description", "question_content")
# CodeContests' `solutions.language` code of Python 3.
CODECONTESTS_PYTHON3 = 3


class RowProblem(ValueError):
    """What is wrong with a row, naming the field."""

    def __init__(self, field: str, message: str):
        super().__init__(f"field {field!r}: {message}")


def _text(record: Mapping[str, Any], field: str, *, allow_empty: bool = False) -> str:
    if field not in record or record[field] is None:
        raise RowProblem(field, "missing")
    value = record[field]
    if not isinstance(value, str) or (not allow_empty and not value.strip()):
        raise RowProblem(field, f"must be a non-empty string, got {value!r}"[:200])
    return value


def _parses(source: str, field: str) -> ast.Module:
    try:
        return code_lib.parse_source(source)
    except SyntaxError as err:
        raise RowProblem(field, f"does not parse: {code_lib.syntax_problem(err)}") from None


# --------------------------------------------------------------------------- HumanEval

def split_check(test: str, entry_point: str) -> list[str]:
    """HumanEval's `test` as hidden tests: one per top-level `assert` of `check` (each
    with the statements before it), so a solution earns partial credit; the whole of it
    (`test` then `check(entry_point)`) when `check` asserts inside a loop or branch."""
    tree = code_lib.parse_source(test)
    whole = [f"{test.rstrip()}\n\ncheck({entry_point})\n"]
    checks = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "check"]
    if not checks:
        return whole
    check = checks[-1]
    body = check.body
    nested = any(isinstance(inner, ast.Assert) for stmt in body if not isinstance(stmt, ast.Assert)
                 for inner in ast.walk(stmt))
    asserts = [i for i, stmt in enumerate(body) if isinstance(stmt, ast.Assert)]
    if nested or len(asserts) < 2:
        return whole
    tests = []
    for i in asserts:
        kept = [stmt for j, stmt in enumerate(body) if j < i and not isinstance(stmt, ast.Assert)]
        single = ast.FunctionDef(name=check.name, args=check.args, body=kept + [body[i]],
                                 decorator_list=[], returns=None, type_comment=None,
                                 type_params=[])
        module = ast.Module(body=[single if n is check else n for n in tree.body],
                            type_ignores=[])
        tests.append(f"{ast.unparse(ast.fix_missing_locations(module))}\n\n"
                     f"check({entry_point})\n")
    return tests


def doctest_tests(prompt: str) -> list[str]:
    """The prompt's doctest examples as assertions (`>>> f(1)` / `2`: `assert f(1) == 2`),
    those whose expected value is a Python expression."""
    tests = []
    try:
        examples = doctest.DocTestParser().get_examples(prompt)
    except ValueError:
        return tests
    for example in examples:
        source = example.source.strip()
        # The last example of a docstring runs into its closing quotes.
        lines = example.want.splitlines()
        ends = [i for i, line in enumerate(lines) if line.strip()[:3] in ('"""', "'''")]
        want = "\n".join(lines[:ends[0]] if ends else lines).strip()
        if not want or "\n" in source:
            continue
        try:
            code_lib.parse_source(want, mode="eval")
            code_lib.parse_source(source, mode="eval")
        except SyntaxError:
            continue
        tests.append(f"assert {source} == {want}")
    return tests


def _humaneval(record: Mapping[str, Any]) -> dict[str, Any]:
    prompt = _text(record, "prompt")
    entry = _text(record, "entry_point").strip()
    test = _text(record, "test")
    _parses(prompt, "prompt")
    tree = _parses(test, "test")
    if not any(isinstance(n, ast.FunctionDef) and n.name == "check" for n in tree.body):
        raise RowProblem("test", "defines no check(candidate)")
    if not code_lib.defines(prompt, entry):
        raise RowProblem("entry_point", f"{entry!r} is not a function the prompt defines")
    solution = None
    if record.get("canonical_solution") is not None:
        body = _text(record, "canonical_solution")
        solution = prompt + body
        _parses(solution, "canonical_solution")
    return dict(question=prompt, tests=split_check(test, entry),
                visible_tests=doctest_tests(prompt), entry_point=entry, prefix=prompt,
                starter=prompt, solution=solution, format="humaneval")


# --------------------------------------------------------------------------- MBPP

def _called_function(test: str) -> str | None:
    """The name of the first function an assertion calls (MBPP: the one to write)."""
    for node in ast.walk(code_lib.parse_source(test)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if not hasattr(builtins, node.func.id) and node.func.id != "isclose":
                return node.func.id
    return None


def _string_list(record: Mapping[str, Any], field: str, *, required: bool) -> list[str]:
    value = record.get(field)
    if value is None:
        if required:
            raise RowProblem(field, "missing")
        return []
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise RowProblem(field, f"must be a list of strings, got {value!r}"[:200])
    if required and not value:
        raise RowProblem(field, "is empty")
    for i, item in enumerate(value):
        _parses(item, f"{field}[{i}]")
    return list(value)


def _mbpp(record: Mapping[str, Any]) -> dict[str, Any]:
    text = _text(record, "text")
    tests = _string_list(record, "test_list", required=True)
    challenge = _string_list(record, "challenge_test_list", required=False)
    setup = record.get("test_setup_code") or ""
    if not isinstance(setup, str):
        raise RowProblem("test_setup_code", f"must be a string, got {setup!r}"[:200])
    _parses(setup, "test_setup_code")
    entry = _called_function(tests[0])
    if entry is None:
        raise RowProblem("test_list[0]", "calls no function: nothing names the entry point")
    solution = None
    if record.get("code") is not None:
        solution = _text(record, "code")
        _parses(solution, "code")
        if not code_lib.defines(solution, entry):
            raise RowProblem("code", f"does not define {entry!r}, the function the tests "
                             "call")
    prefixed = [f"{setup}\n{t}" if setup.strip() else t for t in tests + challenge]
    question = f"{text.strip()}\nYour code should pass this test:\n{tests[0]}"
    return dict(question=question, tests=prefixed, visible_tests=prefixed[:1],
                entry_point=entry, prefix="", starter="", solution=solution, format="mbpp")


# --------------------------------------------------------------------------- stdin/stdout

def _json_field(value: Any, field: str) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError as err:
            raise RowProblem(field, f"is not JSON ({err.msg})") from None
    return value


def _cases(inputs: Any, outputs: Any, field: str) -> list[dict[str, str]]:
    if not isinstance(inputs, (list, tuple)) or not isinstance(outputs, (list, tuple)):
        raise RowProblem(field, "needs lists of inputs and outputs")
    if len(inputs) != len(outputs):
        raise RowProblem(field, f"has {len(inputs)} inputs but {len(outputs)} outputs")
    cases = []
    for i, (stdin, stdout) in enumerate(zip(inputs, outputs)):
        if isinstance(stdin, list):  # one line per item, as some exports store them
            stdin = "\n".join(map(str, stdin))
        if isinstance(stdout, list):
            stdout = "\n".join(map(str, stdout))
        if not isinstance(stdin, str) or not isinstance(stdout, str):
            raise RowProblem(field, f"case {i} is not a pair of strings")
        cases.append({"stdin": stdin, "stdout": stdout})
    return cases


def _case_list(value: Any, field: str) -> list[dict[str, str]]:
    """LiveCodeBench's cases: a list of {"input", "output"} (or its JSON string)."""
    value = _json_field(value, field)
    if not isinstance(value, list) or not all(isinstance(c, Mapping) for c in value):
        raise RowProblem(field, "must be a list of {'input', 'output'} objects (LiveCodeBench "
                         "ships private cases compressed: decompress them first)")
    return _cases([c.get("input") for c in value], [c.get("output") for c in value], field)


def _io_split(record: Mapping[str, Any]) -> tuple[list[dict], list[dict], str]:
    """(visible, hidden-only, the field named in errors) of a stdin/stdout row."""
    if record.get("input_output") is not None:
        spec = _json_field(record["input_output"], "input_output")
        if not isinstance(spec, Mapping):
            raise RowProblem("input_output", "must be an object with inputs and outputs")
        if spec.get("fn_name"):
            raise RowProblem("input_output", "call-based cases (fn_name) are not stdin/stdout "
                             "cases; write them as MBPP-style assert tests")
        cases = _cases(spec.get("inputs"), spec.get("outputs"), "input_output")
        return cases[:1], cases[1:], "input_output"
    if any(record.get(f) is not None for f in ("public_tests", "private_tests")):
        groups = {}
        for field in ("public_tests", "private_tests", "generated_tests"):
            value = record.get(field) or {}
            value = _json_field(value, field)
            if not isinstance(value, Mapping):
                raise RowProblem(field, "must be an object {'input': [...], 'output': [...]}")
            groups[field] = _cases(value.get("input") or [], value.get("output") or [], field)
        hidden = groups["private_tests"] + groups["generated_tests"]
        return groups["public_tests"], hidden, "public_tests"
    if record.get("public_test_cases") is not None:
        public = _case_list(record["public_test_cases"], "public_test_cases")
        private = (_case_list(record["private_test_cases"], "private_test_cases")
                   if record.get("private_test_cases") is not None else [])
        return public, private, "public_test_cases"
    if record.get("inputs") is not None or record.get("outputs") is not None:
        cases = _cases(record.get("inputs"), record.get("outputs"), "inputs")
        return cases[:1], cases[1:], "inputs"
    raise RowProblem("input_output", "missing: a stdin/stdout row needs input_output, "
                     "public_tests/private_tests, public_test_cases or inputs/outputs")


def _io_solution(record: Mapping[str, Any]) -> str | None:
    if isinstance(record.get("solution"), str):
        return record["solution"]
    solutions = record.get("solutions")
    if solutions is None:
        return None
    if isinstance(solutions, Mapping):  # CodeContests
        for language, program in zip(solutions.get("language") or [],
                                     solutions.get("solution") or []):
            if language == CODECONTESTS_PYTHON3 and isinstance(program, str):
                return program
        return None
    solutions = _json_field(solutions, "solutions")
    if isinstance(solutions, list) and solutions and isinstance(solutions[0], str):
        return solutions[0]
    raise RowProblem("solutions", "must be a list of programs (or a JSON string of one)")


def _stdio(record: Mapping[str, Any]) -> dict[str, Any]:
    statement_field = next((f for f in STATEMENT_FIELDS if record.get(f) is not None),
                           "question")
    statement = _text(record, statement_field)
    visible, hidden_only, field = _io_split(record)
    tests = visible + hidden_only
    if not tests:
        raise RowProblem(field, "holds no case")
    if not visible:
        visible = tests[:1]
    solution = _io_solution(record)
    if solution is not None:
        _parses(solution, "solution" if "solution" in record else "solutions")
    return dict(question=statement.strip(), tests=tests, visible_tests=visible,
                entry_point=None, prefix="", starter="", solution=solution, format="stdio")


def row_format(record: Mapping[str, Any]) -> str:
    """The row's format (a key of _BUILDERS: "humaneval", "mbpp" or "stdio"), by its
    fields."""
    if "entry_point" in record or "canonical_solution" in record:
        return "humaneval"
    if "test_list" in record:
        return "mbpp"
    if any(f in record for f in ("input_output", "public_tests", "private_tests",
                                 "public_test_cases", "inputs", "outputs")):
        return "stdio"
    raise ValueError("not a code task row: expected HumanEval fields (prompt, test, "
                     "entry_point), MBPP fields (text, test_list) or stdin/stdout cases "
                     f"(input_output, public_tests, inputs/outputs); got {sorted(record)}"[:300])


_BUILDERS: dict[str, Callable[[Mapping[str, Any]], dict[str, Any]]] = {
    "humaneval": _humaneval, "mbpp": _mbpp, "stdio": _stdio}


def code_task_from_record(record: Mapping[str, Any], *, default_id: str,
                          data_source: str) -> Task:
    """One row as a Task (module docstring).

    Raises:
      ValueError: naming the field at fault.
    """
    fields = _BUILDERS[row_format(record)](record)
    task_id = record.get("task_id")
    question = fields.pop("question")
    return Task(task_id=str(task_id) if task_id is not None else default_id,
                question=question, data_source=str(record.get("data_source") or data_source),
                metadata=fields)


def _rows(path: str) -> tuple[Iterable[tuple[int, Any]], Callable[[int], str]]:
    """(index, row or error) of a JSONL or parquet file, and how an index is named."""
    if path.endswith(".parquet"):
        try:
            rows = pq.read_table(path).to_pylist()
        except (pa.ArrowInvalid, OSError) as err:
            raise ValueError(f"{path}: not a readable parquet file: {err}") from err
        return enumerate(rows), lambda i: f"row {i}"
    rows = ((i, ValueError(f"invalid JSON: {row}") if isinstance(row, json.JSONDecodeError)
             else row) for i, row in read_jsonl(path))
    return rows, lambda i: f"line {i + 1}"


def load_code_tasks(path: str) -> LoadResult:
    """Reads a HumanEval / MBPP / stdin-stdout task file (JSONL or parquet) into Tasks;
    every bad row a RowError naming its line or row and field (solutions are checked
    separately, in the sandbox: `verify_solutions`).

    Raises:
      FileNotFoundError: no such file.
    """
    if not os.path.exists(path):
        raise FileNotFoundError(f"no task file at {path}")
    stem = os.path.splitext(os.path.basename(path))[0]
    rows, where = _rows(path)

    def parse(row: Mapping, index: int) -> Task:
        task = code_task_from_record(row, default_id=f"{stem}-{index}", data_source=stem)
        return dataclasses.replace(task, metadata={**task.metadata,
                                                   "source_row": where(index)})
    return load_rows(rows, path, parse, where=where, repeated=lambda task_id: RowProblem(
        "task_id", f"{task_id!r} is repeated"))


def verify_solutions(tasks: Sequence[Task], sandbox, *, path: str, timeout_s: float = 10.0,
                     memory_mb: int = 512, max_workers: int = 8) -> LoadResult:
    """Runs each task's canonical solution against its hidden tests; a task whose
    solution fails any is a RowError naming its line and field.

    Args:
      tasks: from `load_code_tasks(path)`.
      sandbox: a Sandbox (or anything with its `run`).
      path: the file, named in the errors.
      timeout_s, memory_mb: limits of each test.
      max_workers: solutions checked at once.
    """
    def check(task: Task) -> str | None:
        solution = task.metadata.get("solution")
        if solution is None:
            return None
        results = code_lib.run_tests(solution, task.metadata["tests"], sandbox,
                                     timeout_s=timeout_s, memory_mb=memory_mb)
        failed = [i for i, r in enumerate(results) if not r.passed]
        if not failed:
            return None
        first = results[failed[0]]
        field = {"humaneval": "canonical_solution", "mbpp": "code"}.get(
            task.metadata["format"], "solution")
        why = first.stderr.strip().splitlines()[-1:] or [first.status]
        return (f"{path} {task.metadata['source_row']}: field {field!r}: the canonical "
                f"solution fails {len(failed)} of its {len(results)} tests (test "
                f"{failed[0]}: {first.status}: {why[0][:200]})")

    with concurrent.futures.ThreadPoolExecutor(max_workers) as pool:
        problems = list(pool.map(check, tasks))
    kept = [t for t, p in zip(tasks, problems) if p is None]
    errors = [RowError(i, p) for i, p in enumerate(problems) if p is not None]
    return LoadResult(kept, errors)
