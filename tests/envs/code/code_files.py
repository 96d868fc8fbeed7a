"""Code task files in the users' formats, written by the tests: a few HumanEval rows
(the real problems' shape: `prompt` with imports, signature and doctest docstring,
`canonical_solution` continuing it, `test` with METADATA and `check(candidate)`), MBPP
rows (`text`, `code`, `test_list`, `test_setup_code`, `challenge_test_list`) and
stdin/stdout rows (APPS' `input_output`, CodeContests' public/private tests)."""
from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq

HUMANEVAL = [
    {"task_id": "HumanEval/0",
     "prompt": ('from typing import List\n\n\ndef has_close_elements(numbers: List[float], '
                'threshold: float) -> bool:\n    """ Check if in given list of numbers, are '
                'any two numbers closer to each other than\n    given threshold.\n    >>> '
                'has_close_elements([1.0, 2.0, 3.0], 0.5)\n    False\n    >>> '
                'has_close_elements([1.0, 2.8, 3.0, 4.0, 5.0, 2.0], 0.3)\n    True\n    """\n'),
     "canonical_solution": ("    for idx, elem in enumerate(numbers):\n        for idx2, elem2 "
                            "in enumerate(numbers):\n            if idx != idx2:\n"
                            "                distance = abs(elem - elem2)\n                if "
                            "distance < threshold:\n                    return True\n\n"
                            "    return False\n"),
     "test": ("\n\nMETADATA = {\n    'author': 'jt',\n    'dataset': 'test'\n}\n\n\n"
              "def check(candidate):\n    assert candidate([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.3) "
              "== True\n    assert candidate([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.05) == False\n"
              "    assert candidate([1.0, 2.0, 5.9, 4.0, 5.0], 0.95) == True\n\n"),
     "entry_point": "has_close_elements"},
    {"task_id": "HumanEval/23",
     "prompt": ('\n\ndef strlen(string: str) -> int:\n    """ Return length of given string\n'
                "    >>> strlen('')\n    0\n    >>> strlen('abc')\n    3\n    \"\"\"\n"),
     "canonical_solution": "    return len(string)\n",
     "test": ("\n\nMETADATA = {\n    'author': 'jt',\n    'dataset': 'test'\n}\n\n\n"
              "def check(candidate):\n    assert candidate('') == 0\n    assert candidate('x') "
              "== 1\n    assert candidate('asdasnakj') == 9\n"),
     "entry_point": "strlen"},
    {"task_id": "HumanEval/53",
     "prompt": ('\n\ndef add(x: int, y: int):\n    """Add two numbers x and y\n    >>> add(2, '
                '3)\n    5\n    >>> add(5, 7)\n    12\n    """\n'),
     "canonical_solution": "    return x + y\n",
     "test": ("\n\nMETADATA = {}\n\n\ndef check(candidate):\n    import random\n\n"
              "    assert candidate(0, 1) == 1\n    assert candidate(1, 0) == 1\n"
              "    assert candidate(2, 3) == 5\n    for i in range(100):\n"
              "        x, y = random.randint(0, 1000), random.randint(0, 1000)\n"
              "        assert candidate(x, y) == x + y\n\n"),
     "entry_point": "add"},
]

MBPP = [
    {"task_id": 2, "text": "Write a function to find the similar elements from the given "
                           "two tuple lists.",
     "code": ("def similar_elements(test_tup1, test_tup2):\r\n  res = tuple(set(test_tup1) & "
              "set(test_tup2))\r\n  return (res) "),
     "test_list": ["assert similar_elements((3, 4, 5, 6),(5, 7, 4, 10)) == (4, 5)",
                   "assert similar_elements((1, 2, 3, 4),(5, 4, 3, 7)) == (3, 4)",
                   "assert similar_elements((11, 12, 14, 13),(17, 15, 14, 13)) == (13, 14)"],
     "test_setup_code": "", "challenge_test_list": []},
    {"task_id": 3, "text": "Write a python function to identify non-prime numbers.",
     "code": ("import math\r\ndef is_not_prime(n):\r\n    result = False\r\n    for i in "
              "range(2,int(math.sqrt(n)) + 1):\r\n        if n % i == 0:\r\n            "
              "result = True\r\n    return result"),
     "test_list": ["assert is_not_prime(2) == False", "assert is_not_prime(10) == True",
                   "assert is_not_prime(35) == True"],
     "test_setup_code": "", "challenge_test_list": []},
    {"task_id": 17, "text": "Write a function to find the perimeter of a square.",
     "code": "def square_perimeter(a):\r\n  perimeter=4*a\r\n  return perimeter",
     "test_list": ["assert square_perimeter(side) == 40", "assert square_perimeter(5) == 20",
                   "assert square_perimeter(4) == 16"],
     "test_setup_code": "side = 10", "challenge_test_list": ["assert square_perimeter(0) == 0"]},
]

STDIO = [
    {"problem_id": 1, "question": "Read two integers and print their sum.",
     "input_output": json.dumps({"inputs": ["1 2\n", "5 7\n", "-3 3\n"],
                                 "outputs": ["3\n", "12\n", "0\n"]}),
     "solutions": json.dumps(["a, b = map(int, input().split())\nprint(a + b)\n"])},
    {"name": "reverse-words", "description": "Print the words of the line in reverse order.",
     "public_tests": {"input": ["a b c\n"], "output": ["c b a\n"]},
     "private_tests": {"input": ["hello world\n", "x\n"], "output": ["world hello\n", "x\n"]},
     "generated_tests": {"input": [], "output": []},
     "solutions": {"language": [2, 3], "solution": ["int main() {}",
                                                    "print(' '.join(input().split()[::-1]))"]}},
]


def write_jsonl(path, rows) -> str:
    with open(path, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    return str(path)


def write_parquet(path, rows) -> str:
    pq.write_table(pa.Table.from_pylist(rows), path)
    return str(path)
