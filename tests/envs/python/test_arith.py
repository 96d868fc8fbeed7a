import ast
import operator

import pytest

from agentjax.envs.python.arith import make_arith_splits
from agentjax.rewards.math import math_answer_match

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def reference_value(expression: str) -> int:
    """Python's own parse of the expression (precedence included), evaluated."""
    def ev(node):
        if isinstance(node, ast.BinOp):
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        return node.value
    return ev(ast.parse(expression, mode="eval").body)


def test_answers_are_exact_and_splits_disjoint():
    train, test = make_arith_splits(300, 50, seed=1, num_operands=(2, 5), max_digits=3)
    assert len(train) == 300 and len(test) == 50
    assert not {t.question for t in train} & {t.question for t in test}
    for t in train + test:
        assert t.answers == (str(reference_value(t.metadata["expression"])),)
        assert t.question == f"What is {t.metadata['expression']}?"
        assert math_answer_match(rf"\boxed{{{t.answers[0]}}}", t.answers) == 1.0
    assert {"*"} <= {c for t in train for c in t.metadata["expression"]}
    assert make_arith_splits(300, 50, seed=1, num_operands=(2, 5), max_digits=3) == (train, test)


def test_bad_settings():
    with pytest.raises(ValueError, match="operators"):
        make_arith_splits(1, 1, operators="/")
    with pytest.raises(ValueError, match="num_operands"):
        make_arith_splits(1, 1, num_operands=(1, 2))
    with pytest.raises(ValueError, match="distinct expressions"):
        make_arith_splits(82, 0, num_operands=(2, 2), max_digits=1, operators="+")
