"""Code task files: HumanEval, MBPP and stdin/stdout rows load into tasks whose
canonical solutions score 1.0, whose prompt alone scores 0.0, and where a solution
failing one of three tests scores 2/3; every bad row is an error naming its line and
field."""
import copy
import json

import pytest

from agentjax.core.task import EpisodeLog, TurnLog
from agentjax.envs.code import tasks as code_tasks
from agentjax.data.rows import accept_rows
from agentjax.envs.sandbox import Sandbox
from agentjax.rewards import code
from tests.envs.code.code_files import HUMANEVAL, MBPP, STDIO, write_jsonl, write_parquet

pytestmark = pytest.mark.skipif(code_tasks.os.system("which bwrap > /dev/null") != 0,
                                reason="bubblewrap missing: apt-get install -y bubblewrap")


@pytest.fixture(scope="module")
def sandbox():
    return Sandbox(max_parallel=4)


def load(tmp_path, rows, name="tasks.jsonl"):
    path = tmp_path / name
    write = write_parquet if name.endswith(".parquet") else write_jsonl
    return code_tasks.load_code_tasks(write(path, rows))


def submitted(program: str) -> EpisodeLog:
    log = EpisodeLog(task=None, final_answer=program, done=True, stop_reason="answer")
    log.turns.append(TurnLog(action_text=f"```python\n{program}\n```", kind="answer"))
    return log


def score(task, program, sandbox) -> float:
    return code.tests_score(task, submitted(program), sandbox, timeout_s=5)


def test_humaneval_rows(tmp_path, sandbox):
    tasks, errors = load(tmp_path, HUMANEVAL)
    assert errors == []
    close, strlen, add = tasks
    assert close.task_id == "HumanEval/0" and close.metadata["entry_point"] == "has_close_elements"
    assert close.metadata["format"] == "humaneval" and close.answers == ()
    # Each assert of check() is a hidden test; a check that asserts in a loop is one.
    assert len(close.metadata["tests"]) == 3 and len(add.metadata["tests"]) == 1
    assert strlen.metadata["tests"][1].endswith("check(strlen)\n")
    # The doctest examples are the visible tests.
    assert strlen.metadata["visible_tests"] == ["assert strlen('') == 0",
                                                "assert strlen('abc') == 3"]
    for task, row in zip(tasks, HUMANEVAL):
        assert task.metadata["solution"] == row["prompt"] + row["canonical_solution"]
        # The canonical body continues the prompt; the prompt alone returns None.
        assert score(task, row["canonical_solution"], sandbox) == 1.0
        assert score(task, "", sandbox) == 0.0
    # A whole function, imports of the prompt kept, failing one test in three.
    wrong = ("def has_close_elements(numbers, threshold):\n"
             "    return any(abs(a - b) < threshold for i, a in enumerate(numbers)\n"
             "               for b in numbers[i + 1:]) and threshold < 0.5\n")
    assert score(close, wrong, sandbox) == pytest.approx(2 / 3)
    assert score(strlen, "def strlen(s):\n    return len(s) if s else 1\n",
                 sandbox) == pytest.approx(2 / 3)


def test_mbpp_rows(tmp_path, sandbox):
    tasks, errors = load(tmp_path, MBPP, "mbpp.parquet")
    assert errors == []
    similar, prime, square = tasks
    assert similar.task_id == "2" and similar.metadata["entry_point"] == "similar_elements"
    # Shown: the text and the first test (it names the function).
    assert similar.question.endswith(MBPP[0]["test_list"][0])
    assert similar.metadata["visible_tests"] == MBPP[0]["test_list"][:1]
    # Setup code before every test, the challenge tests hidden too.
    assert square.metadata["tests"][0] == "side = 10\nassert square_perimeter(side) == 40"
    assert len(square.metadata["tests"]) == 4
    for task, row in zip(tasks, MBPP):
        assert score(task, row["code"], sandbox) == 1.0
    assert score(prime, "def is_not_prime(n):\n    return n > 10\n",
                 sandbox) == pytest.approx(2 / 3)
    assert score(prime, MBPP[1]["text"], sandbox) == 0.0


def test_stdio_rows(tmp_path, sandbox):
    tasks, errors = load(tmp_path, STDIO)
    assert errors == []
    apps, contest = tasks
    assert apps.metadata["visible_tests"] == [{"stdin": "1 2\n", "stdout": "3\n"}]
    assert len(apps.metadata["tests"]) == 3 and apps.metadata["entry_point"] is None
    assert contest.question == STDIO[1]["description"]
    assert contest.metadata["solution"] == STDIO[1]["solutions"]["solution"][1]  # Python 3
    assert [t["stdin"] for t in contest.metadata["visible_tests"]] == ["a b c\n"]
    for task in tasks:
        assert score(task, task.metadata["solution"], sandbox) == 1.0
    assert score(apps, "a, b = map(int, input().split())\nprint(abs(a) + b)",
                 sandbox) == pytest.approx(2 / 3)


def test_canonical_solutions_are_verified_in_the_sandbox(tmp_path, sandbox):
    rows = copy.deepcopy(HUMANEVAL[:2])
    rows[1]["canonical_solution"] = "    return len(string) + 1\n"
    path = write_jsonl(tmp_path / "he.jsonl", rows)
    tasks, errors = code_tasks.load_code_tasks(path)
    kept, failed = code_tasks.verify_solutions(tasks, sandbox, path=path)
    assert [t.task_id for t in kept] == ["HumanEval/0"]
    assert len(failed) == 1
    assert failed[0].message.startswith(f"{path} line 2: field 'canonical_solution': the "
                                        "canonical solution fails 3 of its 3 tests")


BAD_ROWS = [
    ({k: v for k, v in HUMANEVAL[1].items() if k != "entry_point"}, "mbpp",
     "field 'entry_point': missing"),
    ({**HUMANEVAL[1], "test": "def check(candidate)\n    assert candidate('') == 0"}, "",
     "field 'test': does not parse: expected ':' (line 1)"),
    ({**HUMANEVAL[1], "entry_point": "str_len"}, "",
     "field 'entry_point': 'str_len' is not a function the prompt defines"),
    ({**HUMANEVAL[1], "test": "assert True"}, "", "field 'test': defines no check(candidate)"),
    ({**MBPP[0], "test_list": ["assert similar_elements((1,), (1,) == (1,)"]}, "",
     "field 'test_list[0]': does not parse"),
    ({**MBPP[0], "test_list": ["assert " + "+".join(["1"] * 100_000) + " == 1"]}, "",
     "field 'test_list[0]': does not parse: nesting too deep for the parser"),
    ({**MBPP[0], "code": "def other(a, b): pass"}, "",
     "field 'code': does not define 'similar_elements'"),
    ({k: v for k, v in MBPP[0].items() if k != "text"}, "", "field 'text': missing"),
    ({**STDIO[0], "input_output": json.dumps({"inputs": ["1"], "outputs": []})}, "",
     "field 'input_output': has 1 inputs but 0 outputs"),
    ({**STDIO[0], "input_output": "{not json"}, "", "field 'input_output': is not JSON"),
    ({"question": "What?"}, "", "not a code task row"),
]


@pytest.mark.parametrize("row,_,message", BAD_ROWS, ids=[m for _, _, m in BAD_ROWS])
def test_a_bad_row_is_an_error_naming_its_line_and_field(tmp_path, row, _, message):
    path = write_jsonl(tmp_path / "bad.jsonl", [HUMANEVAL[0], row])
    tasks, errors = code_tasks.load_code_tasks(path)
    assert [t.task_id for t in tasks] == ["HumanEval/0"]
    assert len(errors) == 1 and errors[0].message.startswith(f"{path} line 2: ")
    assert message in errors[0].message


def test_skip_bad_rows_counts_them_and_without_it_nothing_trains(tmp_path, capsys):
    path = write_jsonl(tmp_path / "bad.jsonl", [HUMANEVAL[0], {"question": "?"}, HUMANEVAL[1],
                                                HUMANEVAL[1]])
    loaded = code_tasks.load_code_tasks(path)
    with pytest.raises(ValueError, match=r"2 of the rows of .* do not load \(.* line 2: "
                                         r"not a code task row.*line 4: field 'task_id': "
                                         r"'HumanEval/23' is repeated\); fix them"):
        accept_rows(loaded, path, skip_bad_rows=False)
    assert len(accept_rows(loaded, path, skip_bad_rows=True)) == 2
    assert "2 of the rows" in capsys.readouterr().out
