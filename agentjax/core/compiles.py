"""Every XLA program this process compiles, counted by jitted function and shape bucket.

    with compiles.bucket(rows=16, items=96):      # names the calls this thread makes
        decode(...)
    before = compiles.counts()
    ...
    print(compiles.summary(compiles.since(before)))   # "40 programs: decode 27 (...), ..."

A program is what JAX builds an executable for: a jitted function (or an eager op) at a
new signature of shapes, dtypes, static arguments and shardings. Each costs seconds of
XLA's time (minutes at a real model's size) and keeps its code mapped for the life of
the process, so a process's count is a budget (tests/core/test_compiles.py and the
budget tests of the engine, the server, the rollout bench and the main job).

Counted from JAX's `/jax/core/compile/backend_compile_duration` event, which JAX records
around each executable it obtains for a new signature, whether XLA compiles it or loads
it from the persistent compilation cache: every compile in the process is seen (eager
ops and other libraries' jits too), the count does not depend on what the cache holds,
and a call that reuses an executable records nothing. The alternative, the jitted
functions' own caches, sees only the functions one thinks of asking.

The event names the function, not the shapes: a caller names the shape bucket of its
calls with `bucket(...)` (thread-local: the engine's scheduler threads and the trainer
compile at once), and a compile is counted under the bucket open in its thread.
"""
from __future__ import annotations

import collections
import contextlib
import threading
from typing import Iterator, Mapping

import jax

_EVENT = "/jax/core/compile/backend_compile_duration"
# (function, bucket) -> compiles; bucket: the ((field, value), ...) open at the compile.
_counts: collections.Counter = collections.Counter()
_lock = threading.Lock()
_local = threading.local()


def _function(fun_name: str) -> str:
    """`jit(decode)` -> `decode`."""
    return fun_name[4:-1] if fun_name.startswith("jit(") and fun_name.endswith(")") \
        else fun_name


def _listen(event: str, duration: float, **kwargs) -> None:
    if event == _EVENT:
        key = (_function(kwargs.get("fun_name", "?")), getattr(_local, "bucket", ()))
        with _lock:
            _counts[key] += 1


jax.monitoring.register_event_duration_secs_listener(_listen)


@contextlib.contextmanager
def bucket(**fields) -> Iterator[None]:
    """Counts the compiles of the calls made in this thread inside as of the bucket
    `fields` (e.g. rows=16, items=96), in the order given."""
    outer = getattr(_local, "bucket", ())
    _local.bucket = tuple(fields.items())
    try:
        yield
    finally:
        _local.bucket = outer


def counts() -> collections.Counter:
    """Compiles so far in this process: (function, bucket) -> count."""
    with _lock:
        return collections.Counter(_counts)


def since(before: Mapping) -> collections.Counter:
    """What `counts()` gained since `before` (an earlier `counts()`)."""
    return collections.Counter({key: n - before.get(key, 0) for key, n in counts().items()
                                if n > before.get(key, 0)})


def by_function(programs: Mapping, functions=None) -> dict[str, int]:
    """Program counts per function (of `functions` only, if given), largest first."""
    out = collections.Counter()
    for (function, _), n in programs.items():
        if functions is None or function in functions:
            out[function] += n
    return dict(out.most_common())


def label(fields: tuple) -> str:
    """A bucket as text: "rows=16 items=96"."""
    return " ".join(f"{name}={value}" for name, value in fields)


def summary(programs: Mapping, functions: int = 8) -> str:
    """One line: the total, then the `functions` largest functions, each bucketed one
    split by its first bucket field ("decode 27 (rows=1: 7, rows=16: 20)"), then how
    many programs the other functions compiled."""
    total = sum(programs.values())
    functions_ = by_function(programs)
    parts = []
    for function, n in list(functions_.items())[:functions]:
        split = collections.Counter()
        for (name, fields), count in programs.items():
            if name == function and fields:
                split[label(fields[:1])] += count
        detail = ", ".join(f"{k}: {v}" for k, v in sorted(split.items(), key=_natural))
        parts.append(f"{function} {n}" + (f" ({detail})" if detail else ""))
    rest = list(functions_.values())[functions:]
    if rest:
        parts.append(f"{sum(rest)} in {len(rest)} other functions")
    return f"{total} programs" + (": " + ", ".join(parts) if parts else "")


def _natural(item) -> tuple:
    """Sorts "rows=4" before "rows=16"."""
    name, value = item[0].split("=", 1) if "=" in item[0] else (item[0], "")
    return (name, int(value) if value.isdigit() else 0, value)


def metrics(programs: Mapping, functions=None, prefix: str = "compile/") -> dict[str, int]:
    """Flat numbers for a run's stats: "compile/programs" (the total) and
    "compile/<function>" for each function (of `functions` only, the rest summed as
    "compile/other", if given)."""
    total = sum(programs.values())
    named = by_function(programs, functions)
    out = {f"{prefix}programs": total}
    out.update({f"{prefix}{function}": n for function, n in named.items()})
    if functions is not None:
        out[f"{prefix}other"] = total - sum(named.values())
    return out


class FunctionCounts(Mapping):
    """A live view: compiles so far of the functions named, by function (those not
    compiled yet are absent)."""

    def __init__(self, functions):
        self.functions = frozenset(functions)

    def _now(self) -> dict[str, int]:
        return by_function(counts(), self.functions)

    def __getitem__(self, function: str) -> int:
        return self._now()[function]

    def __iter__(self):
        return iter(self._now())

    def __len__(self) -> int:
        return len(self._now())
