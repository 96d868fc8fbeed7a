"""Where the RL loop's groups come from: rolled out in step (sync) or by a producer
thread that overlaps rollouts with updates (async). The loop is the same for both:

    source = make_source(mode, port, plan, sampler, params, rules=rules, start=step,
                         host=host)
    groups, info = source.next_groups(step)   # prompts_per_step groups, ids 0..P-1
    source.push_weights(params, step + 2)     # after the update (version v: step v's)
    with source.paused():                     # nothing rolls out while this runs
        ...                                   # an evaluation
    host.update(source.state_dict())          # what a resumed run needs
    source.close()

A source sees the run only through its `RolloutPort` (the pool, the training tasks,
sampling per step, a weight push, a weight copy, a log and the groups log; the RL stage,
train/stages/rl.py, builds it) and its `RolloutPlan` (group counts and the async
bounds). `sampler` is the task source (data/curriculum.py), `rules` the group
post-processing both sources share (agents/groups.py).

Versions: the weights after k updates of the run are version k + 1 (version v samples
the episodes of step v, counted from 1); the engine reports, per token, the version
that sampled it (`Turn.versions`). A group's staleness is the learner's version minus
its oldest token's.

Sync (`rollout.mode="sync"`): each step's groups are rolled out under the current
weights (`groups.collect_groups`), so the engine idles while the learner updates and
the learner idles while episodes wait on tools. New weights reach the engine just
before the next rollout (an evaluation in between has sent them already).

Async (`rollout.mode="async"`; AReaL, arXiv 2505.24298): a producer thread with its own
event loop keeps up to `rollout.concurrency` episodes in flight (whole groups) and
queues each finished group; at most `rollout.queue_groups` groups are finished or in
flight at once. The learner takes P = prompts_per_step groups per update, oldest first,
and hands new weights back without waiting for episodes in flight.
  - Staleness, kept by pacing (AReaL's rollout controller): with v the engine's version,
    `taken` the groups the learner took and `live` those started and neither taken nor
    dropped, a group starts only while taken + live < (v + max_staleness) * P. A group
    whose oldest token is more than max_staleness versions behind the learner when
    taken (a straggler) is dropped and counted. With max_staleness=0, exactly the P
    groups of step v start under version v: the synchronous run.
  - Interruption: with `rollout.partial_rollouts`, new weights go to the engine at
    once and episodes in flight continue under them (the JaxEngine swaps between
    decode rounds), their tokens carrying mixed versions; the loss weights each token
    by its own proximal / behavior ratio (`rl.offpolicy`). Without it, the producer
    starts nothing while new weights wait, and swaps them in once the episodes in
    flight have finished: every episode is sampled by one version.
  - Seeds: the n-th drawn group samples exactly as the synchronous run's group n % P
    of step n // P would (same sampling seed and group id); tasks are drawn P at a
    time, as the synchronous run draws them.
  - Resume (checkpointed, not regenerated: which groups a run trained depends on
    timing): the host state holds the sampler's state after the last draw and the
    groups drawn but not yet trained (in flight, queued, or drawn and not started),
    as (draw index, task id). A resumed run rolls those out first, with their own
    seeds, under the restored weights, then draws on: every drawn task is trained
    exactly once or dropped (counted), none twice.
  - A failure in the producer stops the learner with its error (`RolloutProducerError`,
    or the engine's `EnginesUnavailable` as it is; the loop checkpoints first).

Both sources append to `<workdir>/trained_groups.jsonl` one row per step: the task ids
trained and dropped.
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import heapq
import threading
import time
from typing import Any, Callable, Sequence

import numpy as np

from agentjax.agents.pool import RolloutPool
from agentjax.core.task import Task
from agentjax.engine.protocol import EnginesUnavailable, SamplingParams
from agentjax.engine.clock import EngineClock
from agentjax.core.trajectory import Trajectory
from agentjax.agents.groups import GroupRules, collect_groups, number_groups, seed_index
from agentjax.core.registry import Registry

GROUPS_LOG = "trained_groups.jsonl"


class RolloutProducerError(RuntimeError):
    """The asynchronous producer failed; the run stops with its error."""


@dataclasses.dataclass(frozen=True)
class RolloutPort:
    """What a source uses of the run, and nothing else.

    Attributes:
      pool: runs the episodes; its engine is the one the weights go to.
      tasks: the training tasks (a resumed source finds its pending draws by task id).
      sampling: (step, seed_index) -> the sampling of that draw of `step`.
      push_weights: (params, version) -> None: the engine samples with `params`,
        reporting `version`, from its next call (nothing to send when it holds them).
      copy_weights: params -> a copy the caller's next update cannot donate (the
        async source holds pushed weights past it).
      log: messages.
      record: appends a row to the groups log.
    """

    pool: RolloutPool
    tasks: Sequence[Task]
    sampling: Callable[[int, int], SamplingParams]
    push_weights: Callable[[Any, int], None]
    copy_weights: Callable[[Any], Any]
    log: Callable[[str], None]
    record: Callable[[dict], None]


@dataclasses.dataclass(frozen=True)
class RolloutPlan:
    """How many groups the run trains and how far ahead the async producer may run
    (the rollout section's keys of the same names; module docstring)."""

    prompts_per_step: int
    group_size: int
    total_steps: int
    max_staleness: int
    partial_rollouts: bool
    concurrency: int
    queue_groups: int


class _Source:
    """What both sources share: the engine's initial weights and the groups log."""

    def __init__(self, port: RolloutPort, plan: RolloutPlan, sampler, params, *,
                 rules: GroupRules, start: int):
        self.port, self.sampler, self.rules = port, sampler, rules
        self.per_step, self.group_size = plan.prompts_per_step, plan.group_size
        port.push_weights(params, start + 1)

    def _record(self, step: int, groups, dropped: list[str]) -> None:
        self.port.record({"step": step + 1, "tasks": [g[0].task_id for g in groups],
                          "dropped": dropped})

    def paused(self):
        return contextlib.nullcontext()

    def close(self) -> None:
        pass


SOURCES: Registry[type[_Source]] = Registry("rollout source")


@SOURCES.register("sync")
class SyncSource(_Source):
    """Each step's groups rolled out under the current weights (module docstring)."""

    def __init__(self, port: RolloutPort, plan: RolloutPlan, sampler, params, *,
                 rules: GroupRules, start: int, host: dict):
        super().__init__(port, plan, sampler, params, rules=rules, start=start)
        self._weights = None
        if host.get("rollout", {}).get("pending"):
            port.log(f"warning: {len(host['rollout']['pending'])} groups the "
                     "asynchronous run drew are not trained: rollout.mode changed")

    def next_groups(self, step: int):
        if self._weights is not None:
            self.port.push_weights(*self._weights)
            self._weights = None
        groups, info = collect_groups(
            self.port.pool, self.sampler, self.rules,
            lambda draw: self.port.sampling(step, seed_index(step, draw)),
            prompts=self.per_step, group_size=self.group_size)
        self._record(step, groups, [])
        return groups, info

    def push_weights(self, params, version: int) -> None:
        """Sends `params` with the next rollout (a server pool that went down fails
        there, where the loop's resume point is this step's end)."""
        self._weights = (params, version)

    def state_dict(self) -> dict:
        return {"sampler": self.sampler.state_dict()}


@dataclasses.dataclass
class _Draw:
    """A drawn group: its draw index, task, the engine version it started under, and
    (once finished) its episodes."""

    index: int
    task: Task
    version: int = -1
    episodes: list[Trajectory] | None = None

    def oldest_version(self) -> int:
        """The oldest weight version among the group's action tokens."""
        return min((min(turn.versions) for t in self.episodes for turn in t.turns
                    if turn.versions), default=self.version)

    def __lt__(self, other):  # heap order: draw order
        return self.index < other.index


@SOURCES.register("async")
class AsyncSource(_Source):
    """Groups from a producer thread running ahead of the learner (module docstring)."""

    def __init__(self, port: RolloutPort, plan: RolloutPlan, sampler, params, *,
                 rules: GroupRules, start: int, host: dict):
        super().__init__(port, plan, sampler, params, rules=rules, start=start)
        self.max_staleness = plan.max_staleness
        self.partial, self.concurrency = plan.partial_rollouts, plan.concurrency
        self.queue_limit = plan.queue_groups or (plan.max_staleness + 1) * self.per_step
        self.total = plan.total_steps * self.per_step
        self.clock = EngineClock(port.pool.engine)
        self.pool = port.pool.with_engine(self.clock)
        saved = host.get("rollout", {})
        tasks = {task.task_id: task for task in port.tasks}
        # Everything below is guarded by _cond (learner and producer threads).
        self._cond = threading.Condition()
        self._version = start + 1  # the engine's
        self._taken = start * self.per_step
        self._next_index = saved.get("next_index", self._taken)
        self._dropped = saved.get("dropped", 0)
        self._waiting = [_Draw(index, tasks[task_id]) for index, task_id in
                         saved.get("pending", [])]
        self._running: dict[int, _Draw] = {}
        self._ready: list[_Draw] = []  # a heap: oldest draw first
        self._weights = None  # (params, version) the producer has yet to swap in
        self._paused = self._closing = False
        self._error: BaseException | None = None
        self._tokens = 0
        self._last_return = time.perf_counter()
        self._last_idle = self.clock.idle_s()
        self._loop = asyncio.new_event_loop()
        self._wake = asyncio.Event()
        self._thread = threading.Thread(target=self._run, name="rollout-producer",
                                        daemon=True)
        self._thread.start()

    # ------------------------------------------------------------ the learner's side

    def next_groups(self, step: int):
        """The next P groups (oldest first, stragglers dropped) and the step's rollout
        metrics; waits for them."""
        begin, version = time.perf_counter(), step + 1  # the learner's
        taken, dropped = [], []
        with self._cond:
            while len(taken) < self.per_step:
                self._wait_for(lambda: self._ready)
                draw = heapq.heappop(self._ready)
                # Either way a place in the pipeline is free: the producer may start more.
                self._wake_producer()
                if version - draw.oldest_version() > self.max_staleness:
                    dropped.append(draw)
                    self._dropped += 1
                    continue
                taken.append(draw)
                self._taken += 1
                self.sampler.update([draw.task], [self.rules.success(draw.episodes)])
            queued, tokens, self._tokens = len(self._ready), self._tokens, 0
        now, idle = time.perf_counter(), self.clock.idle_s()
        taken.sort()
        groups = [draw.episodes for draw in taken]
        number_groups(groups)
        self._record(step, groups, [draw.task.task_id for draw in dropped])
        info = {"rollout/rounds": 1, "rollout/kept_groups": len(groups),
                "rollout/queue_groups": queued, "rollout/dropped_groups": len(dropped),
                **staleness_metrics(taken, version),
                "rollout/tokens_per_s": tokens / max(now - self._last_return, 1e-9),
                "time/learner_idle_s": now - begin,
                "time/engine_idle_s": idle - self._last_idle}
        self._last_return, self._last_idle = now, idle
        return groups, info

    def push_weights(self, params, version: int) -> None:
        """Hands `version` to the producer and returns (a copy, `port.copy_weights`: the
        caller's next update may donate `params` before the producer swaps them in; an
        evaluation sends the same weights again, under the same version)."""
        staged = self.port.copy_weights(params)
        with self._cond:
            self._weights = (staged, version)
        self._wake_producer()

    @contextlib.contextmanager
    def paused(self):
        """Nothing in flight and the newest weights in the engine while the body runs."""
        with self._cond:
            self._paused = True
        self._wake_producer()
        with self._cond:
            self._wait_for(lambda: not self._running and self._weights is None)
        try:
            yield
        finally:
            with self._cond:
                self._paused = False
            self._wake_producer()

    def state_dict(self) -> dict:
        with self._cond:
            pending = sorted(self._waiting + list(self._running.values()) + self._ready)
            return {"sampler": self.sampler.state_dict(),
                    "rollout": {"next_index": self._next_index, "dropped": self._dropped,
                                "pending": [[d.index, d.task.task_id] for d in pending]}}

    def close(self) -> None:
        with self._cond:
            self._closing = True
        self._wake_producer()
        self._thread.join(timeout=60)

    def _wait_for(self, predicate) -> None:
        """Waits (holding _cond) until `predicate()`; raises the producer's failure."""
        while True:
            if isinstance(self._error, EnginesUnavailable):
                raise self._error
            if self._error is not None:
                raise RolloutProducerError(
                    f"the rollout producer failed: {type(self._error).__name__}: "
                    f"{self._error}") from self._error
            if predicate():
                return
            if not self._thread.is_alive():
                raise RolloutProducerError("the rollout producer thread ended")
            self._cond.wait(timeout=1.0)

    def _wake_producer(self) -> None:
        with contextlib.suppress(RuntimeError):  # its loop is closed: nothing to wake
            self._loop.call_soon_threadsafe(self._wake.set)

    # ------------------------------------------------------------ the producer thread

    def _run(self) -> None:
        try:
            self._loop.run_until_complete(self._produce())
        except BaseException as error:  # noqa: BLE001 - handed to the learner
            with self._cond:
                self._error = error
                self._cond.notify_all()
        finally:
            self._loop.close()

    async def _produce(self) -> None:
        running: set[asyncio.Task] = set()
        try:
            while not self._closing:
                with self._cond:
                    swap = self._weights if (self.partial or not self._running) else None
                if swap is not None:
                    # In this thread: the engine's session routing is not thread-safe.
                    self.port.push_weights(*swap)
                    with self._cond:
                        self._version = swap[1]
                        if self._weights is swap:
                            self._weights = None
                        self._cond.notify_all()
                    continue
                with self._cond:
                    started = self._start_due()
                for draw in started:
                    task = asyncio.ensure_future(self._roll_out(draw))
                    running.add(task)
                    task.add_done_callback(running.discard)
                await self._wake.wait()
                self._wake.clear()
        finally:
            for task in running:
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)

    def _start_due(self) -> list[_Draw]:
        """Moves the groups that may start now (pacing, queue and concurrency bounds)
        from waiting to running; holds _cond."""
        started = []
        if self._paused or (self._weights is not None and not self.partial):
            return started
        bound = min((self._version + self.max_staleness) * self.per_step, self.total)
        while True:
            live = len(self._running) + len(self._ready)
            if (self._taken + live >= bound or live >= self.queue_limit
                    or (len(self._running) + 1) * self.group_size > self.concurrency):
                return started
            if not self._waiting:
                self._waiting = [_Draw(self._next_index + i, task) for i, task in
                                 enumerate(self.sampler.sample(self.per_step))]
                self._next_index += self.per_step
            draw = self._waiting.pop(0)
            draw.version = self._version
            self._running[draw.index] = draw
            started.append(draw)

    async def _roll_out(self, draw: _Draw) -> None:
        step = draw.index // self.per_step
        try:
            [episodes] = await self.pool.collect(
                [draw.task], self.group_size,
                sampling=self.port.sampling(step, seed_index(step)),
                first_group_id=draw.index % self.per_step)
            [episodes], _ = self.rules.finish([episodes])
        except Exception as error:  # noqa: BLE001 - handed to the learner
            with self._cond:
                self._error = error
                self._cond.notify_all()
            return
        with self._cond:
            draw.episodes = episodes
            del self._running[draw.index]
            heapq.heappush(self._ready, draw)
            self._tokens += sum(t.num_action_tokens for t in episodes)
            self._cond.notify_all()
        self._wake.set()


def staleness_metrics(draws, version: int) -> dict[str, float]:
    """Versions behind the learner's `version` of the trained action tokens: mean, max
    and the fraction from older weights; the fraction of episodes sampled by several."""
    behind, mixed, episodes = [], 0, 0
    for draw in draws:
        for traj in draw.episodes:
            versions = [v for turn in traj.turns if turn.trainable
                        for v in (turn.versions or [draw.version] * len(turn.action_ids))]
            behind += [version - v for v in versions]
            mixed += len(set(versions)) > 1
            episodes += 1
    behind = np.asarray(behind or [0])
    return {"rollout/staleness_mean": float(behind.mean()),
            "rollout/staleness_max": float(behind.max()),
            "rollout/old_token_frac": float((behind > 0).mean()),
            "rollout/mixed_version_frac": mixed / max(episodes, 1)}


def make_source(mode: str, port: RolloutPort, plan: RolloutPlan, sampler, params, *,
                rules: GroupRules, start: int, host: dict[str, Any]):
    """The source of `mode` (rollout.mode), its sampler state from `host` (a resumed
    run's host state; {} at the start), the engine holding `params` as version
    `start + 1`."""
    if host:
        sampler.load_state_dict(host["sampler"])
    return SOURCES.get(mode)(port, plan, sampler, params, rules=rules, start=start, host=host)
