"""Length penalties of one episode, computed by `agentjax.rl.shaping`.

Additive terms, always <= 0, so they sum into the composite reward:
  linear:   -coef * max(0, length - target), floored at -max_penalty (the composite needs
            bounded terms).
  sigmoid:  sigmoid(-(length - target) / tau) - 1, in (-1, 0): what a unit reward loses
            to a multiplicative length discount r * sigmoid(...). Added to an outcome of
            weight 1 it gives exactly the discounted reward when the outcome is 1.

The length is measured from the log in turns, or in tokens by re-encoding each action
with the policy's tokenizer (the trajectory's exact ids are not in the log; re-encoding
can differ from the sampled ids by a token or so at turn boundaries).

DAPO's soft overlong punishment is not a component here: it is defined on the exact
number of sampled tokens, which only the trajectory has, so it has one home, the group
post-processing (algo.overlong_buffer, algo.overlong_max_len, algo.overlong_factor:
`agents.groups.Overlong`, formula `rl.shaping.overlong_penalty`).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from agentjax.core.task import EpisodeLog
from agentjax.rl import shaping

LENGTH_UNITS = ("turns", "tokens")
LENGTH_KINDS = ("linear", "sigmoid")
OVERLONG_HOME = ("DAPO's overlong shaping counts the exact sampled tokens, so it is the "
                 "trainer's: set algo.overlong_buffer, algo.overlong_max_len and "
                 "algo.overlong_factor (the dapo preset does)")


def episode_length(log: EpisodeLog, *, unit: str = "turns", tokenizer: Any = None) -> int:
    """Length of the policy's part of an episode.

    Args:
      log: the episode.
      unit: "turns" (policy turns) or "tokens" (action tokens, re-encoded).
      tokenizer: object with `encode(text) -> ids`; required for unit="tokens".
    """
    if unit == "turns":
        return len(log.turns)
    if unit == "tokens":
        if tokenizer is None:
            raise ValueError("episode_length(unit='tokens') needs a tokenizer")
        return sum(len(tokenizer.encode(t.action_text)) for t in log.turns)
    raise ValueError(f"length unit must be one of {LENGTH_UNITS}, got {unit!r}")


def check_kind(kind: str) -> None:
    """Raises ValueError unless `kind` is one of LENGTH_KINDS ("overlong": saying where
    DAPO's overlong shaping is)."""
    if kind == "overlong":
        raise ValueError(f"length penalty 'overlong': {OVERLONG_HOME}")
    if kind not in LENGTH_KINDS:
        raise ValueError(f"length penalty kind must be one of {LENGTH_KINDS}, got {kind!r}")


def length_bounds(kind: str, *, max_penalty: float = 1.0) -> tuple[float, float]:
    """[low, high] of `length_reward` for `kind`."""
    return {"linear": (-max_penalty, 0.0), "sigmoid": (-1.0, 0.0)}[kind]


def length_reward(length: int, *, kind: str, target: int | None = None,
                  coef: float | None = None, max_penalty: float = 1.0,
                  tau: float | None = None) -> float:
    """The length penalty of one episode (module docstring).

    Args:
      length: the episode length (see `episode_length`).
      kind: "linear" or "sigmoid".
      target: the target length.
      coef: linear: penalty per unit of length beyond target.
      max_penalty: linear: the penalty is floored at -max_penalty.
      tau: sigmoid: temperature.
    """
    check_kind(kind)
    if target is None:
        raise ValueError(f"length penalty {kind!r} needs a target length")
    lengths = np.asarray([length], np.float32)
    if kind == "linear":
        penalty = shaping.length_penalty(np.zeros(1, np.float32), lengths, target=target,
                                         kind="linear", coef=coef)
        return max(-max_penalty, float(penalty[0]))
    discounted = shaping.length_penalty(np.ones(1, np.float32), lengths, target=target,
                                        kind="sigmoid", tau=tau)
    return float(discounted[0]) - 1.0
