"""Outcome rewards for question answering: SQuAD-normalized exact match and token F1.

As in Search-R1, the prediction is the text inside the LAST `<answer>...</answer>` the
policy wrote; it is scored against every acceptable target (aliases) and the best
score counts.
"""
from __future__ import annotations

import collections
import re
import string
from typing import Sequence

from agentjax.core.task import EpisodeLog
from agentjax.parsers.actions import last_tag

_ARTICLES_RE = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)


def normalize_answer(text: str) -> str:
    """SQuAD normalization: lowercase, drop punctuation and articles, collapse spaces."""
    text = _ARTICLES_RE.sub(" ", text.lower().translate(_PUNCTUATION))
    return " ".join(text.split())


def extract_answer(text: str) -> str | None:
    """The content of the last `<answer>...</answer>` in `text` (stripped), else None;
    in linear time (`parsers.actions.last_tag`), however many unclosed tags the policy wrote."""
    match = last_tag(text, ("answer",))
    return match[1].strip() if match else None


def episode_answer(log: EpisodeLog) -> str | None:
    """The episode's final answer: the last `<answer>` across all policy turns.

    Falls back to `log.final_answer` for envs whose answers are not tagged (e.g. a
    `final_answer` tool call); None when the policy never answered.
    """
    for turn in reversed(log.turns):
        answer = extract_answer(turn.action_text)
        if answer is not None:
            return answer
    return log.final_answer


def exact_match(prediction: str | None, targets: Sequence[str]) -> float:
    """1.0 when the normalized prediction equals any normalized target, else 0.0.

    Args:
      prediction: the predicted answer; None (no answer) scores 0.
      targets: acceptable answers; an empty list scores 0.
    """
    if prediction is None:
        return 0.0
    pred = normalize_answer(prediction)
    return float(any(pred == normalize_answer(t) for t in targets))


def f1_score(prediction: str | None, targets: Sequence[str]) -> float:
    """SQuAD token F1 of the prediction, maximized over the targets.

    Args:
      prediction: the predicted answer; None (no answer) scores 0.
      targets: acceptable answers; an empty list scores 0.
    """
    if prediction is None:
        return 0.0
    pred_tokens = normalize_answer(prediction).split()
    best = 0.0
    for target in targets:
        target_tokens = normalize_answer(target).split()
        common = collections.Counter(pred_tokens) & collections.Counter(target_tokens)
        overlap = sum(common.values())
        if overlap == 0:
            continue
        precision, recall = overlap / len(pred_tokens), overlap / len(target_tokens)
        best = max(best, 2 * precision * recall / (precision + recall))
    return best
