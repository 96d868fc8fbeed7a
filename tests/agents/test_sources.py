"""The asynchronous rollout source against a scripted pool: pacing keeps the staleness
bound, stragglers are dropped and counted, interruption mixes versions only when
allowed, pausing empties the pipeline, a producer failure stops the learner, and a
resumed source trains every task exactly as often as an uninterrupted one."""
import asyncio
import os
import collections
import threading
import time

import numpy as np
import pytest

from agentjax.data.curriculum import make_sampler
from agentjax.core.task import Task
from agentjax.engine.protocol import SamplingParams
from agentjax.core.trajectory import Trajectory, Turn
from agentjax.agents.groups import GroupRules
from agentjax.train.metrics import StepLog, read_step_log
from agentjax.agents.sources import (GROUPS_LOG, RolloutPlan, RolloutPort,
                                     RolloutProducerError, _Draw, make_source,
                                     staleness_metrics)

TASKS = [Task(f"t{i:02d}", f"question {i}", answers=("a",)) for i in range(40)]


class _Engine:
    """Records the weight versions it was given."""

    def __init__(self):
        self.version = None
        self.swaps = []

    def update_weights(self, weights, *, version=None):
        self.version = version
        self.swaps.append(version)


class _Pool:
    """Each episode: one turn sampled at once, a tool wait of `delays[task_id]` seconds
    (tasks in `held` wait until `release` is set), and one more turn; every token
    reports the engine's version when sampled."""

    def __init__(self, engine, delays=None, held=(), fail=()):
        self.engine = self.weights = engine
        self.delays = delays or {}
        self.held, self.fail = set(held), set(fail)
        self.release = threading.Event()
        self.running = self.most_running = 0
        self.calls = []

    def with_engine(self, engine):
        self.engine = engine
        return self

    async def collect(self, tasks, group_size, *, sampling, first_group_id):
        [task] = tasks
        self.calls.append((task.task_id, sampling.seed, first_group_id))
        self.running += 1
        self.most_running = max(self.most_running, self.running)
        try:
            if task.task_id in self.fail:
                raise OSError(f"tool broke on {task.task_id}")
            first = self.weights.version
            await asyncio.sleep(self.delays.get(task.task_id, 0.0))
            while task.task_id in self.held and not self.release.is_set():
                await asyncio.sleep(0.002)
            return [[Trajectory(
                prompt_ids=[1], task_id=task.task_id, task=task,
                turns=[Turn([5, 6], [-1.0, -1.0], "stop", versions=[first, first]),
                       Turn([7], [-1.0], "stop", versions=[self.weights.version])],
                metadata={"reward_components": {"exact_match": float(member % 2)}})
                for member in range(group_size)]]
        finally:
            self.running -= 1


class _Run:
    """What a source is handed by the RL stage, on the scripted pool: its port (pool,
    tasks, sampling, weight push, copy, log, groups log), its plan, and the run's
    folder."""

    def __init__(self, folder, *, total_steps=6, pool_kwargs=None, **plan):
        self.folder = folder
        self.engine = _Engine()
        self.pool = _Pool(self.engine, **(pool_kwargs or {}))
        self.plan = RolloutPlan(**{"prompts_per_step": 2, "group_size": 2,
                                   "total_steps": total_steps, "partial_rollouts": False,
                                   "queue_groups": 0, **plan})

    def port(self, start=0) -> RolloutPort:
        log = StepLog(os.path.join(self.folder, GROUPS_LOG), resume_step=start)
        return RolloutPort(
            pool=self.pool, tasks=TASKS,
            sampling=lambda step, seed_index: SamplingParams(seed=seed_index),
            push_weights=lambda params, version: self.engine.update_weights(
                params, version=version),
            copy_weights=lambda params: {k: v.copy() for k, v in params.items()},
            log=print, record=log.append)


def _source(run, start=0, host=None):
    sampler = make_sampler("uniform", TASKS, seed=0)
    return make_source("async", run.port(start), run.plan, sampler, {"w": np.zeros(2)},
                       rules=GroupRules("exact_match"), start=start, host=host or {})


def _train(source, steps, start=0, during=None):
    """Runs the learner's side for `steps`: takes groups, 'updates', pushes weights
    (version v for step v, counted from 1)."""
    rows = []
    for step in range(start, start + steps):
        groups, info = source.next_groups(step)
        rows.append((groups, info))
        if during is not None:
            during(step, source)
        source.push_weights({"w": np.full(2, step + 1.0)}, step + 2)
    return rows


def test_staleness_zero_trains_each_step_on_its_own_draws(tmp_path):
    """max_staleness=0: step k (from 0) trains the k-th P tasks drawn, sampled under
    version k + 1 with the synchronous run's seeds and group ids."""
    run = _Run(tmp_path, max_staleness=0, concurrency=8)
    source = _source(run)
    rows = _train(source, 6)
    source.close()
    order = make_sampler("uniform", TASKS, seed=0)
    for step, (groups, info) in enumerate(rows):
        assert [g[0].task_id for g in groups] == [t.task_id for t in order.sample(2)]
        assert [t.group_id for g in groups for t in g] == [0, 0, 1, 1]
        assert {v for g in groups for t in g for turn in t.turns for v in turn.versions} \
            == {step + 1}
        assert info["rollout/staleness_max"] == 0 and info["rollout/dropped_groups"] == 0
    # The seed of step k's round 0 and the group's place in its step, as collect_groups.
    assert [(seed, gid) for _, seed, gid in run.pool.calls] == [
        (100 * (i // 2), i % 2) for i in range(12)]
    assert run.engine.swaps[:6] == list(range(1, 7))  # version 7 may come after close


@pytest.mark.parametrize("partial", [False, True])
def test_pacing_keeps_every_trained_token_within_the_bound(tmp_path, partial):
    delays = {t.task_id: d for t, d in zip(TASKS, np.random.default_rng(0).uniform(
        0, 0.02, len(TASKS)))}
    run = _Run(tmp_path, total_steps=10, max_staleness=2, concurrency=4,
               partial_rollouts=partial, pool_kwargs={"delays": delays})
    source = _source(run)
    rows = _train(source, 10)
    source.close()
    for _, info in rows:
        assert info["rollout/staleness_max"] <= 2
        assert info["rollout/queue_groups"] <= 6  # (max_staleness + 1) x P
    assert run.pool.most_running <= 2  # concurrency 4 = two groups of 2
    dropped = sum(info["rollout/dropped_groups"] for _, info in rows)
    if not partial:
        # New weights wait until no episode is in flight, so the learner cannot get
        # more than max_staleness versions ahead of a running group: none is dropped.
        assert dropped == 0
        assert all(info["rollout/mixed_version_frac"] == 0 for _, info in rows)
    # Groups start in draw order: the first 20 + dropped drawn were trained or dropped.
    log = read_step_log(str(tmp_path / GROUPS_LOG))
    trained = [task for row in log for task in row["tasks"]]
    drawn = make_sampler("uniform", TASKS, seed=0).sample(20 + dropped)
    assert len(trained) == 20 and len(trained) + dropped == len(
        set(trained) | {task for row in log for task in row["dropped"]})
    assert set(trained) | {task for row in log for task in row["dropped"]} == {
        t.task_id for t in drawn}


def test_a_straggler_past_the_bound_is_dropped_and_counted(tmp_path):
    """The first group waits on its tool while the learner runs ahead (interruption
    on, so new weights do not wait for it): taken 3 versions later, it is dropped."""
    first = make_sampler("uniform", TASKS, seed=0).sample(1)[0].task_id
    run = _Run(tmp_path, total_steps=8, max_staleness=1, concurrency=8,
               partial_rollouts=True, pool_kwargs={"held": {first}})

    def release(step, source):
        if step == 3:
            run.pool.release.set()

    source = _source(run)
    rows = _train(source, 8, during=release)
    state = source.state_dict()
    source.close()
    dropped = [info["rollout/dropped_groups"] for _, info in rows]
    assert sum(dropped) == 1 and state["rollout"]["dropped"] == 1
    assert all(info["rollout/staleness_max"] <= 1 for _, info in rows)
    log = read_step_log(str(tmp_path / GROUPS_LOG))
    assert [row["dropped"] for row in log if row["dropped"]] == [[first]]
    assert first not in [task for row in log for task in row["tasks"]]


def test_paused_means_nothing_in_flight_and_the_newest_weights(tmp_path):
    delays = {t.task_id: 0.01 for t in TASKS}
    run = _Run(tmp_path, total_steps=6, max_staleness=2, concurrency=8,
               pool_kwargs={"delays": delays})

    def evaluate(step, source):
        source.push_weights({"w": np.zeros(2)}, step + 2)
        with source.paused():
            assert run.pool.running == 0 and run.engine.version == step + 2
            seen = len(run.pool.calls)
            threading.Event().wait(0.05)
            assert len(run.pool.calls) == seen  # nothing started while paused

    source = _source(run)
    _train(source, 6, during=evaluate)
    source.close()


def test_a_producer_failure_stops_the_learner_with_its_error(tmp_path):
    order = make_sampler("uniform", TASKS, seed=0).sample(4)
    run = _Run(tmp_path, max_staleness=1, concurrency=8,
               pool_kwargs={"fail": {order[3].task_id}})
    source = _source(run)
    with pytest.raises(RolloutProducerError, match=f"OSError: tool broke on "
                                                   f"{order[3].task_id}"):
        _train(source, 6)
    source.close()


def test_a_resumed_source_trains_every_task_as_often_as_an_uninterrupted_one(tmp_path):
    """Killed after step 3 (the checkpoint's host state taken while groups were in
    flight and queued), then resumed by a fresh source: the tasks trained over the 8
    steps are those of the uninterrupted run, each as often."""
    delays = {t.task_id: d for t, d in zip(TASKS, np.random.default_rng(1).uniform(
        0, 0.03, len(TASKS)))}

    def run(folder):
        return _Run(tmp_path / folder, total_steps=8, max_staleness=8, concurrency=6,
                    queue_groups=6, partial_rollouts=True, pool_kwargs={"delays": delays})

    whole = _source(run("whole"))
    _train(whole, 8)
    whole.close()
    snapshot = {}

    def checkpoint(step, source):
        if step == 2:
            time.sleep(0.05)  # the producer runs ahead: groups in flight and queued
            snapshot.update({"step": 3, **source.state_dict()})

    killed = _source(run("resumed"))
    _train(killed, 5, during=checkpoint)  # trains on past the checkpoint, then dies
    killed.close()
    assert snapshot["rollout"]["pending"]  # groups were in flight or queued
    resumed = _source(run("resumed"), start=3, host=snapshot)
    _train(resumed, 5, start=3)
    resumed.close()

    def trained(folder):
        rows = read_step_log(str(tmp_path / folder / GROUPS_LOG))
        assert [row["step"] for row in rows] == list(range(1, 9))
        return collections.Counter(task for row in rows for task in row["tasks"])

    assert trained("resumed") == trained("whole")
    assert sum(trained("whole").values()) == 16 and max(trained("whole").values()) == 1


def test_staleness_metrics_by_hand():
    """Learner at version 5: one group of two episodes, one sampled by versions 3 and
    5, one by 5 only; a turn without versions counts the group's start version."""
    episodes = [
        Trajectory(prompt_ids=[1], turns=[Turn([1, 2], [0.0] * 2, "stop", versions=[3, 3]),
                                          Turn([3], [0.0], "stop", versions=[5])]),
        Trajectory(prompt_ids=[1], turns=[Turn([4], [0.0], "stop", versions=[5]),
                                          Turn([5, 6], [0.0] * 2, "stop")]),
    ]
    draw = _Draw(0, TASKS[0], version=4, episodes=episodes)
    assert draw.oldest_version() == 3
    metrics = staleness_metrics([draw], version=5)
    # Versions behind per action token: 2, 2, 0 | 0, 1, 1.
    assert metrics == {"rollout/staleness_mean": 1.0, "rollout/staleness_max": 2.0,
                       "rollout/old_token_frac": 4 / 6, "rollout/mixed_version_frac": 1.0}
