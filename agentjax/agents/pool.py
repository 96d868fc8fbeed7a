"""RolloutPool: many agent episodes in flight at once, grouped for GRPO.

Episodes run as asyncio tasks (at most `concurrency` at a time); env construction,
`reset`, `step` and the reward function run in a thread pool, so while one episode waits
on a slow tool the engine keeps batching the other episodes' generation requests: tool
latency must not idle the sampler.

`collect(tasks, group_size, sampling=...)` returns one list of `group_size` trajectories per task, in
task order. Every group is complete: an episode whose env factory, env, engine or reward
function raises, or that runs past `episode_timeout_s`, is returned flagged
(`metadata["failed"]`, `["stop_reason"]`, `["error"]`), never dropped, and the pool
keeps going — except when the engine raises `EnginesUnavailable` (no server left to
sample from): `collect` raises it, for the trainer to checkpoint and exit. A thread running a hung env call cannot be killed; the pool stops waiting
for it at the timeout and the thread finishes (or not) on its own — size `tool_workers`
with that in mind.

What an episode is, is the pool's one seam: `runner` plays one (an `EpisodeRunner`);
the default plays an env with the agent loop (`run_episode`) and scores it with
`reward_fn`, and a user's agent behind the OpenAI-compatible endpoint is another
(envs/openai_agent). Groups, seeds, timeouts, concurrency and progress are the pool's
either way.

KV reuse across turns: give the JaxEngine at least `concurrency` slots (`max_slots`);
with fewer, parked sessions are evicted while their tools run and re-prefilled later.
"""
from __future__ import annotations

import asyncio
import copy
import dataclasses
import itertools
import time
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Any, Callable, Mapping, Protocol, Sequence

import numpy as np

from agentjax.core.task import EpisodeLog, Task
from agentjax.envs.base import Env
from agentjax.agents.loop import EpisodeLimits, describe_error, run_episode
from agentjax.engine.protocol import Engine, SamplingParams
from agentjax.core.trajectory import Trajectory

RewardFn = Callable[[Task, EpisodeLog], tuple[float, Mapping[str, float]]]


class EpisodeRunner(Protocol):
    """Plays one episode; returns it as a Trajectory, its failures flagged in metadata
    (never raised, but `EnginesUnavailable`), its reward set. `limits.timeout_s` bounds
    it; `executor` is the pool's thread pool for blocking calls."""

    async def __call__(self, engine: Engine, tokenizer, task: Task, sampling: SamplingParams,
                       limits: EpisodeLimits, *, group_id: int,
                       executor: Executor) -> Trajectory: ...


@dataclasses.dataclass(frozen=True)
class PoolProgress:
    """A snapshot handed to the progress hook after every finished episode.

    Attributes:
      episodes_total: episodes requested by this `collect` call.
      episodes_done: episodes finished (failed ones included).
      in_flight: episodes running now.
      failed: finished episodes flagged as failed.
      generated_tokens: action tokens sampled so far in this call.
      elapsed_s: seconds since the call started.
    """

    episodes_total: int
    episodes_done: int
    in_flight: int
    failed: int
    generated_tokens: int
    elapsed_s: float

    @property
    def tokens_per_s(self) -> float:
        return self.generated_tokens / self.elapsed_s if self.elapsed_s > 0 else 0.0


class RolloutPool:
    """Runs groups of episodes concurrently against one engine.

    Args:
      engine: the rollout engine shared by all episodes.
      env_factory: builds a fresh env per episode (called in a worker thread).
      tokenizer: the policy's tokenizer.
      limits: per-episode bounds (`timeout_s` is overridden by episode_timeout_s).
      concurrency: most episodes in flight at once.
      reward_fn: `reward_fn(task, env.log) -> (total, components)`; sets each
        trajectory's final_reward and metadata["reward_components"]. None leaves the
        final reward at 0 (turn rewards from the env still count).
      episode_timeout_s: wall-clock limit per episode (None: limits.timeout_s).
      tool_workers: threads for env and reward calls (default: concurrency).
      progress: called with a PoolProgress after every finished episode.
      runner: plays one episode (None: `env_episode`, the env and the agent loop).
    """

    def __init__(
        self,
        engine: Engine,
        env_factory: Callable[[], Env],
        tokenizer,
        *,
        limits: EpisodeLimits = EpisodeLimits(),
        concurrency: int = 64,
        reward_fn: RewardFn | None = None,
        episode_timeout_s: float | None = None,
        tool_workers: int | None = None,
        progress: Callable[[PoolProgress], Any] | None = None,
        runner: EpisodeRunner | None = None,
    ):
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        self.engine = engine
        self.env_factory = env_factory
        self.tokenizer = tokenizer
        self.limits = dataclasses.replace(
            limits, timeout_s=episode_timeout_s if episode_timeout_s is not None
            else limits.timeout_s)
        self.concurrency = concurrency
        self.reward_fn = reward_fn
        self.progress = progress
        self.runner = runner or self.env_episode
        self._executor = ThreadPoolExecutor(
            max_workers=tool_workers or concurrency, thread_name_prefix="rollout-env")
        self._group_ids = itertools.count()

    def with_engine(self, engine: Engine) -> "RolloutPool":
        """A pool with this one's settings and worker threads around another engine
        (e.g. an `EngineClock` over this one's); closing either closes both."""
        other = copy.copy(self)
        other.engine = engine
        return other

    def close(self) -> None:
        """Releases the worker threads (threads stuck in hung env calls are abandoned) and
        what the episode runner holds (an agent runner's local server)."""
        self._executor.shutdown(wait=False, cancel_futures=True)
        close_runner = getattr(self.runner, "close", None)
        if close_runner is not None:
            close_runner()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def collect_sync(self, tasks: Sequence[Task], group_size: int, *,
                     sampling: SamplingParams | Sequence[SamplingParams],
                     first_group_id: int | None = None) -> list[list[Trajectory]]:
        """`collect` for callers without an event loop."""
        return asyncio.run(self.collect(tasks, group_size, sampling=sampling,
                                        first_group_id=first_group_id))

    async def collect(self, tasks: Sequence[Task], group_size: int, *,
                      sampling: SamplingParams | Sequence[SamplingParams],
                      first_group_id: int | None = None) -> list[list[Trajectory]]:
        """Runs `group_size` episodes per task; returns the groups in task order.

        Args:
          tasks: the tasks, one group each.
          group_size: episodes per task (the GRPO group size G).
          sampling: sampling parameters of every turn, or one per member of a group
            (group_size of them). With a seed, each episode samples with its own seed
            derived from (seed, group id, member index): reproducible, yet the members
            of a group differ.
          first_group_id: the groups get ids first_group_id, first_group_id + 1, ...
            (which, with a seeded `sampling`, fix every episode's seed: a resumed run
            passes the same ids to get the same episodes); None continues the pool's
            own running count.
        """
        if group_size < 1:
            raise ValueError(f"group_size must be >= 1, got {group_size}")
        members = ([sampling] * group_size if isinstance(sampling, SamplingParams)
                   else list(sampling))
        if len(members) != group_size:
            raise ValueError(f"{len(members)} sampling parameters for groups of {group_size}")
        semaphore = asyncio.Semaphore(self.concurrency)
        stats = {"done": 0, "in_flight": 0, "failed": 0, "tokens": 0}
        total = len(tasks) * group_size
        start = time.perf_counter()

        async def one(task: Task, group_id: int, member: int) -> Trajectory:
            async with semaphore:
                stats["in_flight"] += 1
                try:
                    traj = await self._episode(task, members[member], group_id, member)
                finally:
                    stats["in_flight"] -= 1
            stats["done"] += 1
            stats["failed"] += bool(traj.metadata.get("failed"))
            stats["tokens"] += sum(len(t.action_ids) for part in [*traj.segments, traj]
                                   for t in part.turns)
            if self.progress is not None:
                self.progress(PoolProgress(
                    total, stats["done"], stats["in_flight"], stats["failed"],
                    stats["tokens"], time.perf_counter() - start))
            return traj

        group_ids = ([next(self._group_ids) for _ in tasks] if first_group_id is None
                     else list(range(first_group_id, first_group_id + len(tasks))))
        episodes = [asyncio.ensure_future(one(task, group_id, member))
                    for task, group_id in zip(tasks, group_ids) for member in range(group_size)]
        try:
            flat = await asyncio.gather(*episodes)
        except BaseException:  # EnginesUnavailable (or a cancel): the rest stop with it
            for episode in episodes:
                episode.cancel()
            raise
        return [list(flat[i * group_size:(i + 1) * group_size]) for i in range(len(tasks))]

    async def _episode(self, task: Task, sampling: SamplingParams, group_id: int,
                       member: int) -> Trajectory:
        """One episode of the group's member, with its own seed."""
        if sampling.seed is not None:
            sampling = dataclasses.replace(sampling, seed=episode_seed(sampling.seed, group_id,
                                                                       member))
        return await self.runner(self.engine, self.tokenizer, task, sampling, self.limits,
                                 group_id=group_id, executor=self._executor)

    async def env_episode(self, engine: Engine, tokenizer, task: Task,
                          sampling: SamplingParams, limits: EpisodeLimits, *, group_id: int,
                          executor: Executor) -> Trajectory:
        """The default `EpisodeRunner`: an env from `env_factory` played by the agent loop,
        plus its reward; every failure comes back as a flagged trajectory."""
        loop = asyncio.get_running_loop()
        try:
            env = await loop.run_in_executor(executor, self.env_factory)
        except Exception as error:  # noqa: BLE001
            return Trajectory(
                prompt_ids=[], task_id=task.task_id, group_id=group_id, task=task,
                metadata={"stop_reason": "env_error", "failed": True,
                          "error": f"env_factory failed: {describe_error(error)}",
                          "num_turns": 0, "env_log": None})
        traj = await run_episode(engine, env, task, sampling, limits, tokenizer,
                                 group_id=group_id, executor=executor)
        if self.reward_fn is not None and traj.metadata.get("env_log") is not None:
            try:
                total, components = await loop.run_in_executor(
                    executor, self.reward_fn, task, traj.metadata["env_log"])
                traj.final_reward = float(total)
                traj.metadata["reward_components"] = dict(components)
            except Exception as error:  # noqa: BLE001
                traj.metadata.update(failed=True, reward_error=describe_error(error),
                                     error=traj.metadata.get("error") or
                                     f"reward_fn failed: {describe_error(error)}")
        return traj


def episode_seed(seed: int, group_id: int, member: int) -> int:
    """A 31-bit seed for one episode, derived from the pool's seed and its position."""
    state = np.random.SeedSequence([seed, group_id, member]).generate_state(1)[0]
    return int(state & 0x7FFFFFFF)
