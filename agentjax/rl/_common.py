"""Argument checks and dtype handling shared by the rl numerics.

chex does the shape work; its AssertionError is re-raised as a ValueError that names the
offending argument, so a bad call says which argument is wrong. All checks run at trace
time (shapes and Python values are static), never on traced values.
"""
from __future__ import annotations

from collections.abc import Iterable

import chex
import jax
import jax.numpy as jnp


def check_rank(name: str, x, rank: int | set[int]) -> None:
    """Raise ValueError naming `name` unless `x` has `rank` (an int or a set of ints)."""
    try:
        chex.assert_rank(x, rank)
    except AssertionError as err:
        raise ValueError(f"{name} has shape {jnp.shape(x)}, expected rank {rank}: {err}") from None


def check_same_shape(**arrays) -> None:
    """Raise ValueError unless all keyword arrays have the first one's shape."""
    (first_name, first), *rest = arrays.items()
    for name, x in rest:
        if jnp.shape(x) != jnp.shape(first):
            raise ValueError(
                f"{name} has shape {jnp.shape(x)} but {first_name} has shape {jnp.shape(first)}"
            )


def check_tokens(**arrays) -> None:
    """Raise ValueError unless every keyword array is [B, T] with one common shape."""
    for name, x in arrays.items():
        check_rank(name, x, 2)
    check_same_shape(**arrays)


def check_integer(name: str, x) -> None:
    """Raise ValueError naming `name` unless `x` has an integer dtype."""
    if not jnp.issubdtype(jnp.asarray(x).dtype, jnp.integer):
        raise ValueError(f"{name} must have an integer dtype, got {jnp.asarray(x).dtype}")


def check_choice(name: str, value, choices: Iterable[str]) -> None:
    """Raise ValueError naming `name` unless `value` is one of `choices`."""
    choices = tuple(choices)
    if value not in choices:
        raise ValueError(f"unknown {name}={value!r}; expected one of {choices}")


def check_positive_int(name: str, value) -> None:
    """Raise ValueError naming `name` unless `value` is a Python int > 0."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive Python int, got {value!r}")


def check_range(name: str, value, *, low=None, high=None, low_open=False) -> None:
    """Check a static (Python number) hyper-parameter lies in [low, high] (or (low, high]).

    Traced values cannot be inspected at trace time and are accepted unchecked.
    """
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return
    if low is not None and (value <= low if low_open else value < low):
        bound = f"> {low}" if low_open else f">= {low}"
        raise ValueError(f"{name} must be {bound}, got {value!r}")
    if high is not None and value > high:
        raise ValueError(f"{name} must be <= {high}, got {value!r}")


def as_float(*xs):
    """Cast arrays to their common floating dtype (at least float32; float64 only if enabled)."""
    dtype = jax.dtypes.canonicalize_dtype(jnp.result_type(*xs, jnp.float32))
    return [jnp.asarray(x, dtype) for x in xs]
