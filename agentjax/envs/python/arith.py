"""Synthetic arithmetic tasks for the python-tool env, answer-matchable.

"What is 4821 * 307 - 5515?" — integers with a few operators, big enough that running
Python beats mental arithmetic. Deterministic from a seed; train and test questions are
disjoint. Answers are exact integers (checked by `rewards.math.math_answer_match`).
"""
from __future__ import annotations

import numpy as np

from agentjax.core.task import Task

DATA_SOURCE = "synthetic_arith"


def _value(operands: list[int], ops: list[str]) -> int:
    """Evaluates with the usual precedence: `*` binds tighter than `+` and `-`."""
    terms, signs, term = [], ["+"], operands[0]
    for op, x in zip(ops, operands[1:]):
        if op == "*":
            term *= x
        else:
            terms.append(term)
            signs.append(op)
            term = x
    terms.append(term)
    return sum(t if s == "+" else -t for s, t in zip(signs, terms))


def make_arith_splits(num_train: int, num_test: int, *, seed: int = 0,
                      num_operands: tuple[int, int] = (2, 4), max_digits: int = 4,
                      operators: str = "+-*") -> tuple[list[Task], list[Task]]:
    """Train and test arithmetic tasks with no question in both.

    Args:
      num_train: training tasks.
      num_test: held-out tasks.
      seed: everything is a function of it.
      num_operands: inclusive range of operand counts per expression.
      max_digits: operands have 1..max_digits digits.
      operators: the operators to draw from (subset of "+-*").
    """
    if not operators or set(operators) - set("+-*"):
        raise ValueError(f"operators must be a non-empty subset of '+-*', got {operators!r}")
    low, high = num_operands
    if not 2 <= low <= high:
        raise ValueError(f"num_operands must satisfy 2 <= low <= high, got {num_operands}")
    if max_digits < 1:
        raise ValueError(f"max_digits must be >= 1, got {max_digits}")
    rng = np.random.default_rng([seed, 7])
    seen: set[str] = set()
    tasks: list[Task] = []
    attempts = 0
    while len(tasks) < num_train + num_test:
        attempts += 1
        if attempts > 100 * (num_train + num_test):
            raise ValueError(f"could not draw {num_train + num_test} distinct expressions "
                             "with these settings; allow more digits or operands")
        n = int(rng.integers(low, high + 1))
        operands = [int(rng.integers(1, 10 ** int(rng.integers(1, max_digits + 1))))
                    for _ in range(n)]
        ops = [operators[rng.integers(len(operators))] for _ in range(n - 1)]
        expression = " ".join([str(operands[0])]
                              + [f"{o} {x}" for o, x in zip(ops, operands[1:])])
        if expression in seen:
            continue
        seen.add(expression)
        split = "test" if len(tasks) < num_test else "train"
        index = len(tasks) if split == "test" else len(tasks) - num_test
        tasks.append(Task(task_id=f"arith{seed}-{split}-{index:05d}",
                          question=f"What is {expression}?",
                          answers=(str(_value(operands, ops)),), data_source=DATA_SOURCE,
                          metadata={"expression": expression, "split": split}))
    return tasks[num_test:], tasks[:num_test]
