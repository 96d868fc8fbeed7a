import fractions

import pytest

from agentjax.rewards import math as math_lib


def test_extract_boxed_handles_nesting_and_takes_the_last():
    assert math_lib.extract_boxed(r"x \boxed{1} y \boxed{\frac{3}{4}} z") == r"\frac{3}{4}"
    assert math_lib.extract_boxed(r"\boxed{unclosed") is None
    assert math_lib.extract_boxed("none") is None


@pytest.mark.parametrize("text, value", [
    ("42", 42), ("-7", -7), ("1,234", 1234), ("3.50", fractions.Fraction(7, 2)),
    ("3/4", fractions.Fraction(3, 4)), (r"\frac{3}{4}", fractions.Fraction(3, 4)),
    (r"\dfrac{-1}{2}", fractions.Fraction(-1, 2)), ("$12", 12), ("12.", 12),
    (".5", fractions.Fraction(1, 2)),
])
def test_parse_number(text, value):
    assert math_lib.parse_number(text) == value


@pytest.mark.parametrize("text", ["x", "1/0", "3 apples", "", "1e5e"])
def test_parse_number_rejects_non_numbers(text):
    assert math_lib.parse_number(text) is None


@pytest.mark.parametrize("answer, targets, expected", [
    (r"so \boxed{0.75}", ["3/4"], 1.0),
    ("0.75", [r"\frac{3}{4}"], 1.0),
    ("1,000", ["1000"], 1.0),
    ("0.7500001", ["0.75"], 0.0),          # exact rational comparison, no tolerance
    (r"\boxed{The X + 1}", ["x + 1"], 1.0),  # text compares after SQuAD normalization
    (r"\boxed{Paris}", ["paris"], 1.0),
    ("41", ["42", "43"], 0.0),
    (None, ["1"], 0.0),
])
def test_math_answer_match(answer, targets, expected):
    assert math_lib.math_answer_match(answer, targets) == expected
