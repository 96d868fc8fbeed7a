"""Maths answer matching: the last `\\boxed{...}` (or the bare answer) against targets.

Numbers compare by value (integers, decimals, `a/b`, `\\frac{a}{b}`, thousands
separators, a trailing unit-free `.`); anything else compares as SQuAD-normalized text.
"""
from __future__ import annotations

import fractions
import re
from typing import Sequence

from agentjax.rewards.outcome import normalize_answer

_FRAC_RE = re.compile(r"^\\[dt]?frac\{(-?[\d.]+)\}\{(-?[\d.]+)\}$")
_NUMBER_RE = re.compile(r"^[-+]?(\d+(\.\d*)?|\.\d+)(/[-+]?\d+(\.\d*)?)?$")


def extract_boxed(text: str) -> str | None:
    """The content of the last `\\boxed{...}` in `text` (nested braces allowed), else None."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 0, start + len("\\boxed")
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1:j].strip()
    return None


def parse_number(text: str) -> fractions.Fraction | None:
    """The exact value of a numeric answer string, or None when it is not a number."""
    s = text.strip().replace(",", "").replace("$", "").replace(" ", "").rstrip(".")
    m = _FRAC_RE.match(s)
    if m:
        s = f"{m.group(1)}/{m.group(2)}"
    if not _NUMBER_RE.match(s):
        return None
    try:
        return fractions.Fraction(s)
    except (ValueError, ZeroDivisionError):
        return None


def math_answer_match(answer: str | None, targets: Sequence[str]) -> float:
    """1.0 when the answer's value (or normalized text) equals any target's, else 0.0.

    Args:
      answer: the policy's final answer text; its last `\\boxed{}` is used when present.
        None scores 0.
      targets: acceptable answers (numbers as strings, or text).
    """
    if answer is None:
        return 0.0
    candidate = extract_boxed(answer)
    candidate = answer if candidate is None else candidate
    value = parse_number(candidate)
    for target in targets:
        target_value = parse_number(target)
        if value is not None and target_value is not None:
            if value == target_value:
                return 1.0
        elif normalize_answer(candidate) == normalize_answer(target):
            return 1.0
    return 0.0
