"""Curriculum samplers: which tasks the next RL batch gets.

One small interface: `sample(n) -> list[Task]`,
`update(tasks, successes)` after the rollouts are scored (a task may appear several
times, e.g. once per group member), and `state_dict()` / `load_state_dict()` — JSON-able
and including the sampler's own numpy RNG, so a resumed run draws exactly the batches an
uninterrupted run would have drawn.

* `UniformSampler`: epochs of a seeded permutation (every task once per epoch).
* `LearnabilitySampler`: weights tasks by p(1 - p), p the estimated success rate (a
  Beta(1, 1) prior over exponentially decayed counts), per task or per bucket (e.g.
  hops), so tasks near 50% success (the most GRPO signal) come most often; a floor keeps
  solved and hopeless tasks in play.
* `FailureBufferSampler` (WebRL-style): a fraction of each batch replays failed tasks,
  weighted by how often they failed; a success removes a task from the buffer.
"""
from __future__ import annotations

import hashlib
from typing import Any, Callable, Hashable, Mapping, Protocol, Sequence

import numpy as np

from agentjax.core.registry import Registry
from agentjax.core.task import Task


class Sampler(Protocol):
    def sample(self, n: int) -> list[Task]: ...

    def update(self, tasks: Sequence[Task], successes: Sequence[float]) -> None: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...


def _fingerprint(tasks: Sequence[Task]) -> str:
    return hashlib.sha256("\n".join(t.task_id for t in tasks).encode()).hexdigest()[:16]


def _check_tasks(tasks: Sequence[Task], name: str) -> list[Task]:
    tasks = list(tasks)
    if not tasks:
        raise ValueError(f"{name} needs at least one task")
    ids = [t.task_id for t in tasks]
    if len(set(ids)) != len(ids):
        raise ValueError(f"{name}: task ids must be unique")
    return tasks


class _Base:
    """Task list, id index, own RNG, and the state_dict checks shared by all samplers."""

    def __init__(self, tasks: Sequence[Task], seed: int):
        self.tasks = _check_tasks(tasks, type(self).__name__)
        self._index = {t.task_id: i for i, t in enumerate(self.tasks)}
        self.rng = np.random.default_rng(seed)

    def _indices(self, tasks: Sequence[Task],
                 successes: Sequence[float]) -> list[tuple[int, float]]:
        if len(tasks) != len(successes):
            raise ValueError(f"update: {len(tasks)} tasks but {len(successes)} successes")
        out = []
        for task, success in zip(tasks, successes):
            if task.task_id not in self._index:
                raise ValueError(f"update: task {task.task_id!r} is not in this sampler")
            if not 0.0 <= float(success) <= 1.0:
                raise ValueError(f"update: success must be in [0, 1], got {success}")
            out.append((self._index[task.task_id], float(success)))
        return out

    def _base_state(self) -> dict[str, Any]:
        return {"kind": type(self).__name__, "tasks": _fingerprint(self.tasks),
                "rng": self.rng.bit_generator.state}

    def _load_base(self, state: Mapping[str, Any]) -> None:
        if state.get("kind") != type(self).__name__:
            raise ValueError(f"state_dict is for {state.get('kind')!r}, not {type(self).__name__}")
        if state.get("tasks") != _fingerprint(self.tasks):
            raise ValueError(f"{type(self).__name__}.load_state_dict: the state was saved for a "
                             "different task list (ids or order differ)")
        self.rng.bit_generator.state = state["rng"]


class UniformSampler(_Base):
    """Every task once per epoch, in a fresh seeded order each epoch.

    Args:
      tasks: the task pool (unique ids).
      seed: seed of the sampler's RNG.
    """

    def __init__(self, tasks: Sequence[Task], *, seed: int = 0):
        super().__init__(tasks, seed)
        self._order = self.rng.permutation(len(self.tasks)).tolist()
        self._pos = 0
        self.epoch = 0

    def sample(self, n: int) -> list[Task]:
        out = []
        while len(out) < n:
            if self._pos == len(self._order):
                self._order, self._pos = self.rng.permutation(len(self.tasks)).tolist(), 0
                self.epoch += 1
            take = self._order[self._pos:self._pos + n - len(out)]
            self._pos += len(take)
            out.extend(self.tasks[i] for i in take)
        return out

    def update(self, tasks: Sequence[Task], successes: Sequence[float]) -> None:
        self._indices(tasks, successes)  # validates; uniform sampling ignores outcomes

    def state_dict(self) -> dict[str, Any]:
        return {**self._base_state(), "order": list(self._order), "pos": self._pos,
                "epoch": self.epoch}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._load_base(state)
        self._order, self._pos, self.epoch = list(state["order"]), state["pos"], state["epoch"]


def _draw(rng: np.random.Generator, weights: np.ndarray, n: int) -> list[int]:
    """n indices with probability proportional to weights, distinct while possible."""
    out: list[int] = []
    while len(out) < n:
        k = min(n - len(out), len(weights))
        picked = rng.choice(len(weights), size=k, replace=False, p=weights / weights.sum())
        out.extend(picked.tolist())
    return out


class LearnabilitySampler(_Base):
    """Prefers tasks whose estimated success rate is near 50%.

    p = (1 + s) / (2 + t) with s, t the decayed success and trial counts of the task's
    bucket; weight = p (1 - p) + floor.

    Args:
      tasks: the task pool (unique ids).
      seed: seed of the sampler's RNG.
      bucket: what shares one estimate: None (each task), a metadata key such as
        "hops" (one rate per hop count), or a function task -> hashable key.
      decay: counts are multiplied by this before each update of their bucket, so the
        estimate follows the improving policy (1.0: plain counts).
      floor: weight added to every task (keeps solved/hopeless tasks sampled).
    """

    def __init__(self, tasks: Sequence[Task], *, seed: int = 0,
                 bucket: str | Callable[[Task], Hashable] | None = None, decay: float = 0.9,
                 floor: float = 0.02):
        super().__init__(tasks, seed)
        if not 0.0 < decay <= 1.0:
            raise ValueError(f"LearnabilitySampler: decay must be in (0, 1], got {decay}")
        if floor <= 0.0:
            raise ValueError(f"LearnabilitySampler: floor must be > 0, got {floor}")
        if isinstance(bucket, str):
            key = bucket
            missing = [t.task_id for t in self.tasks if key not in t.metadata]
            if missing:
                raise ValueError(f"LearnabilitySampler: bucket {key!r} is not in the metadata "
                                 f"of tasks {missing[:3]}")
            bucket = lambda t: t.metadata[key]  # noqa: E731
        keys = [bucket(t) if bucket else t.task_id for t in self.tasks]
        self._bucket_keys = list(dict.fromkeys(keys))
        key_index = {k: i for i, k in enumerate(self._bucket_keys)}
        self._bucket_of = np.array([key_index[k] for k in keys])
        self.successes = np.zeros(len(self._bucket_keys))
        self.trials = np.zeros(len(self._bucket_keys))
        self.decay, self.floor = decay, floor

    def success_rate(self) -> np.ndarray:
        """Per-task estimated success rate."""
        return ((1.0 + self.successes) / (2.0 + self.trials))[self._bucket_of]

    def weights(self) -> np.ndarray:
        """Per-task sampling weight p (1 - p) + floor (unnormalized)."""
        p = self.success_rate()
        return p * (1.0 - p) + self.floor

    def sample(self, n: int) -> list[Task]:
        return [self.tasks[i] for i in _draw(self.rng, self.weights(), n)]

    def update(self, tasks: Sequence[Task], successes: Sequence[float]) -> None:
        by_bucket: dict[int, list[float]] = {}
        for i, success in self._indices(tasks, successes):
            by_bucket.setdefault(int(self._bucket_of[i]), []).append(success)
        for b, values in by_bucket.items():
            self.successes[b] = self.decay * self.successes[b] + sum(values)
            self.trials[b] = self.decay * self.trials[b] + len(values)

    def state_dict(self) -> dict[str, Any]:
        return {**self._base_state(), "successes": self.successes.tolist(),
                "trials": self.trials.tolist()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._load_base(state)
        if len(state["successes"]) != len(self.successes):
            raise ValueError("LearnabilitySampler.load_state_dict: bucket count differs")
        self.successes = np.asarray(state["successes"], float)
        self.trials = np.asarray(state["trials"], float)


class FailureBufferSampler(_Base):
    """Replays failed tasks (WebRL's self-evolving curriculum, simplified).

    Each batch takes round(replay_fraction * n) tasks from the failure buffer (without
    replacement, probability proportional to failure weight; fewer if the buffer is
    small) and the rest from a uniform epoch sampler. A failure (success < threshold)
    adds `failure_weight` to the task's weight; a success removes it; beyond `capacity`
    the lightest (then oldest) entry is evicted.

    Args:
      tasks: the task pool (unique ids).
      seed: seed of the sampler's RNG (the inner uniform sampler gets seed + 1).
      replay_fraction: share of each batch drawn from the buffer, in [0, 1].
      capacity: most tasks kept in the buffer.
      threshold: a success value below this is a failure.
      failure_weight: weight added per failure.
    """

    def __init__(self, tasks: Sequence[Task], *, seed: int = 0, replay_fraction: float = 0.25,
                 capacity: int = 1024, threshold: float = 0.5, failure_weight: float = 1.0):
        super().__init__(tasks, seed)
        if not 0.0 <= replay_fraction <= 1.0:
            raise ValueError(f"FailureBufferSampler: replay_fraction must be in [0, 1], "
                             f"got {replay_fraction}")
        if capacity < 1:
            raise ValueError(f"FailureBufferSampler: capacity must be >= 1, got {capacity}")
        self.uniform = UniformSampler(self.tasks, seed=seed + 1)
        self.replay_fraction, self.capacity = replay_fraction, capacity
        self.threshold, self.failure_weight = threshold, failure_weight
        self.buffer: dict[str, float] = {}  # task id -> weight, in insertion order

    def sample(self, n: int) -> list[Task]:
        k = min(int(round(self.replay_fraction * n)), len(self.buffer))
        replay = []
        if k:
            ids = list(self.buffer)
            weights = np.array([self.buffer[i] for i in ids])
            picked = self.rng.choice(len(ids), size=k, replace=False, p=weights / weights.sum())
            replay = [self.tasks[self._index[ids[j]]] for j in picked]
        return replay + self.uniform.sample(n - k)

    def update(self, tasks: Sequence[Task], successes: Sequence[float]) -> None:
        for i, success in self._indices(tasks, successes):
            task_id = self.tasks[i].task_id
            if success >= self.threshold:
                self.buffer.pop(task_id, None)
                continue
            self.buffer[task_id] = self.buffer.pop(task_id, 0.0) + self.failure_weight
            if len(self.buffer) > self.capacity:
                lightest = min(self.buffer, key=self.buffer.__getitem__)  # first = oldest
                del self.buffer[lightest]

    def state_dict(self) -> dict[str, Any]:
        return {**self._base_state(), "uniform": self.uniform.state_dict(),
                "buffer": [[k, v] for k, v in self.buffer.items()]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._load_base(state)
        self.uniform.load_state_dict(state["uniform"])
        self.buffer = {k: float(v) for k, v in state["buffer"]}


SAMPLERS: Registry[Callable[..., Sampler]] = Registry("curriculum sampler")
SAMPLERS.register("uniform")(UniformSampler)
SAMPLERS.register("learnability")(LearnabilitySampler)
SAMPLERS.register("failure_buffer")(FailureBufferSampler)


def make_sampler(name: str, tasks: Sequence[Task], **kwargs: Any) -> Sampler:
    """The sampler registered as `name` ("uniform", "learnability", "failure_buffer")."""
    return SAMPLERS.get(name)(tasks, **kwargs)
