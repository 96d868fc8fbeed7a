"""Timing for benchmarks on a shared machine: warm-up, interleaved repeats, the best of
several runs with their spread, and a ratio only where the effect exceeds the noise.

Load from other processes comes and goes during a benchmark. Timing the baseline's
repeats in one block and the case's in another lets a burst of load (or a compilation)
land on one side only, where it reads as an effect. So:
- every candidate runs once untimed first (compilations, allocators, thread pools), and a
  compile counter, when given, must not move during a timed run;
- the timed repeats take turns, so load hits every candidate alike, and each round starts
  one candidate later (A B C, B C A, C A B, ...; for two, A B B A A B ...), so none always
  runs first in a round or always right after the same other one;
- each candidate reports its best (minimum) run, timeit's estimator and the least
  disturbed by load, and its spread, (max - min) / min over its runs. The full range,
  not the interquartile range: with the three or so runs a slow benchmark affords, the
  IQR is half the range and lets one lucky run carry a ratio that the next invocation
  does not reproduce; the price is that many repeats on a loaded machine widen it;
- a ratio of two candidates' best runs is printed only when it differs from 1 by more
  than the larger of their spreads; otherwise the text says it is unresolved.

Pure Python (tests/scripts/test_bench_timing.py). The benches import it as a sibling
module: `python scripts/bench/<bench>.py` puts this folder first on sys.path.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Callable, Hashable, Mapping, Sequence, TypeVar

Result = TypeVar("Result")


class CompiledWhileTimed(RuntimeError):
    """A timed run compiled a program: the warm-up missed a shape."""


def interleaved(names: Sequence[Hashable], repeats: int) -> list[Hashable]:
    """The order of the timed runs: `repeats` rounds of every candidate once, round r
    starting at candidate r mod len(names)."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    names = list(names)
    return [names[(start + i) % len(names)] for start in range(repeats)
            for i in range(len(names))]


def measure(candidates: Mapping[Hashable, Callable[[], Result]], repeats: int, *,
            warmup: bool = True,
            compilations: Callable[[], object] | None = None) -> dict[Hashable, list[Result]]:
    """Runs every candidate once untimed (when `warmup`), then `repeats` times in
    interleaved order; returns each candidate's results in the order they ran.

    A candidate returns what it measured (seconds, or seconds with counts of what it
    produced), so set-up it does not want timed stays outside its stopwatch (`timed`
    wraps a plain call). `compilations` returns a snapshot of compile counters; a timed
    run across which the snapshot changes raises CompiledWhileTimed naming the candidate.
    """
    if warmup:
        for call in candidates.values():
            call()
    results = {name: [] for name in candidates}
    for name in interleaved(list(candidates), repeats):
        before = compilations() if compilations is not None else None
        results[name].append(candidates[name]())
        if compilations is not None and (after := compilations()) != before:
            raise CompiledWhileTimed(
                f"timed run of {name!r} compiled (counters {before} -> {after}): the "
                f"warm-up did not meet every shape this run met")
    return results


def timed(call: Callable[[], object]) -> Callable[[], float]:
    """A candidate for `measure`: the seconds one `call()` takes."""
    def seconds() -> float:
        start = time.perf_counter()
        call()
        return time.perf_counter() - start
    return seconds


def percent(fraction: float) -> str:
    """0.123 -> '12%', 0.0123 -> '1.2%'."""
    return f"{fraction:.0%}" if fraction >= 0.1 else f"{fraction:.1%}"


@dataclasses.dataclass(frozen=True)
class Runs:
    """Costs of one candidate's repeated runs (seconds, or seconds per unit of work):
    lower is better."""

    costs: tuple[float, ...]

    def __post_init__(self):
        if not self.costs or min(self.costs) <= 0:
            raise ValueError(f"Runs needs positive costs, got {self.costs}")

    @property
    def best(self) -> float:
        return min(self.costs)

    @property
    def spread(self) -> float | None:
        """(max - min) / min; None for a single run (no measure of its noise)."""
        if len(self.costs) < 2:
            return None
        return (max(self.costs) - self.best) / self.best

    def spread_text(self) -> str:
        return "one run" if self.spread is None else percent(self.spread)

    def per(self, units: Sequence[float]) -> Runs:
        """Costs per unit of work: run i's cost divided by units[i]."""
        if len(units) != len(self.costs):
            raise ValueError(f"{len(units)} unit counts for {len(self.costs)} runs")
        return Runs(tuple(cost / unit for cost, unit in zip(self.costs, units)))


@dataclasses.dataclass(frozen=True)
class Ratio:
    """numerator.best / denominator.best, resolved when its distance from 1 (the larger
    best over the smaller, minus 1) exceeds the larger of the two spreads."""

    value: float
    effect: float
    spread: float | None

    @classmethod
    def of(cls, numerator: Runs, denominator: Runs) -> Ratio:
        value = numerator.best / denominator.best
        spreads = (numerator.spread, denominator.spread)
        spread = None if None in spreads else max(spreads)
        return cls(value, max(value, 1 / value) - 1, spread)

    @property
    def resolved(self) -> bool:
        return self.spread is not None and self.spread < self.effect

    def text(self, digits: int = 2) -> str:
        """'1.23x', or why the ratio is not printed."""
        if self.spread is None:
            return f"unresolved: one run, no spread (effect {percent(self.effect)})"
        if not self.resolved:
            return (f"unresolved: spread {percent(self.spread)} >= effect "
                    f"{percent(self.effect)}")
        return f"{self.value:.{digits}f}x"
