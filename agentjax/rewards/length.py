"""Length penalties of one episode, computed by `agentjax.rl.shaping`.

Additive terms, always <= 0, so they sum into the composite reward:
  overlong: DAPO soft overlong punishment, in [-factor, 0].
  linear:   -coef * max(0, length - target), floored at -max_penalty (the composite needs
            bounded terms).
  sigmoid:  sigmoid(-(length - target) / tau) - 1, in (-1, 0): what a unit reward loses
            to a multiplicative length discount r * sigmoid(...). Added to an outcome of
            weight 1 it gives exactly the discounted reward when the outcome is 1.

The length is measured from the log in turns, or in tokens by re-encoding each action
with the policy's tokenizer (the trajectory's exact ids are not in the log; re-encoding
can differ from the sampled ids by a token or so at turn boundaries — apply DAPO's
overlong shaping on exact trajectory lengths in the trainer when that matters).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from agentjax.envs.base import EpisodeLog
from agentjax.rl import shaping

LENGTH_UNITS = ("turns", "tokens")
LENGTH_KINDS = ("overlong", "linear", "sigmoid")


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


def length_bounds(kind: str, *, factor: float = 1.0,
                  max_penalty: float = 1.0) -> tuple[float, float]:
    """[low, high] of `length_reward` for `kind`."""
    return {"overlong": (-factor, 0.0), "linear": (-max_penalty, 0.0),
            "sigmoid": (-1.0, 0.0)}[kind]


def length_reward(length: int, *, kind: str, max_len: int | None = None,
                  buffer: int | None = None, factor: float = 1.0, target: int | None = None,
                  coef: float | None = None, max_penalty: float = 1.0,
                  tau: float | None = None) -> float:
    """The length penalty of one episode (module docstring).

    Args:
      length: the episode length (see `episode_length`).
      kind: "overlong", "linear" or "sigmoid".
      max_len: overlong: the maximum length.
      buffer: overlong: the length of the punishment interval before max_len.
      factor: overlong: the penalty at and beyond max_len.
      target: linear / sigmoid: the target length.
      coef: linear: penalty per unit of length beyond target.
      max_penalty: linear: the penalty is floored at -max_penalty.
      tau: sigmoid: temperature.
    """
    if kind not in LENGTH_KINDS:
        raise ValueError(f"length penalty kind must be one of {LENGTH_KINDS}, got {kind!r}")
    lengths = np.asarray([length], np.float32)
    if kind == "overlong":
        if max_len is None or buffer is None:
            raise ValueError("length penalty 'overlong' needs max_len and buffer")
        return float(shaping.overlong_penalty(lengths, max_len=max_len, buffer=buffer,
                                              factor=factor)[0])
    if target is None:
        raise ValueError(f"length penalty {kind!r} needs a target length")
    if kind == "linear":
        penalty = shaping.length_penalty(np.zeros(1, np.float32), lengths, target=target,
                                         kind="linear", coef=coef)
        return max(-max_penalty, float(penalty[0]))
    discounted = shaping.length_penalty(np.ones(1, np.float32), lengths, target=target,
                                        kind="sigmoid", tau=tau)
    return float(discounted[0]) - 1.0
