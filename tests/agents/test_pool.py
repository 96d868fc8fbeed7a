"""RolloutPool: complete groups, overlapping tools, failures flagged, bounded time."""
import dataclasses
import threading
import time

import pytest

from agentjax.core.task import Task
from agentjax.agents.loop import EpisodeLimits
from agentjax.engine.protocol import EnginesUnavailable, SamplingParams
from agentjax.agents.pool import PoolProgress, RolloutPool, episode_seed
from tests.agents.fakes import ScriptedEngine, ToyEnv

TASKS = [Task(f"t{i}", f"question {i}") for i in range(4)]
SEARCH, ANSWER = "<search>capital of France</search>", "<answer>Paris</answer>"


def _two_turns(tokenizer):
    """Turn 1 searches; turn 2 (the context holds an observation) answers."""
    information = tokenizer.convert_tokens_to_ids("<information>")
    return lambda context, index: ANSWER if information in context else SEARCH


SAMPLING = SamplingParams(max_new_tokens=32)


def _reward(task, log):
    correct = float(log.final_answer == "Paris")
    return correct, {"outcome": correct, "tool_calls": log.num_tool_calls}


def test_collect_returns_complete_ordered_groups_with_rewards(tokenizer):
    engine = ScriptedEngine(tokenizer, _two_turns(tokenizer))
    seen = []
    with RolloutPool(engine, ToyEnv, tokenizer, concurrency=8, reward_fn=_reward,
                     progress=seen.append) as pool:
        groups = pool.collect_sync(TASKS, group_size=3, sampling=SAMPLING)
        more = pool.collect_sync(TASKS[:1], group_size=2, sampling=SAMPLING)
    assert [len(g) for g in groups] == [3, 3, 3, 3]
    for task, group in zip(TASKS, groups):
        assert {t.task_id for t in group} == {task.task_id}
        assert len({t.group_id for t in group}) == 1
        for traj in group:
            assert traj.final_reward == 1.0 and not traj.metadata["failed"]
            assert traj.metadata["reward_components"] == {"outcome": 1.0, "tool_calls": 1}
            assert len(traj.turns) == 2
    group_ids = [g[0].group_id for g in groups] + [more[0][0].group_id]
    assert len(set(group_ids)) == 5  # unique across collect calls
    assert len(seen) == 12 + 2 and all(isinstance(p, PoolProgress) for p in seen)
    last = seen[11]  # the end of the first collect call
    assert (last.episodes_total, last.episodes_done, last.in_flight) == (12, 12, 0)
    assert [p.episodes_done for p in seen[:12]] == list(range(1, 13))
    assert last.generated_tokens == sum(
        len(turn.action_ids) for g in groups for t in g for turn in t.turns)
    assert last.tokens_per_s > 0


def test_a_pool_with_another_engine_keeps_its_settings(tokenizer):
    engine = ScriptedEngine(tokenizer, _two_turns(tokenizer))
    other = ScriptedEngine(tokenizer, _two_turns(tokenizer))
    with RolloutPool(engine, ToyEnv, tokenizer, concurrency=2, reward_fn=_reward) as pool:
        rebound = pool.with_engine(other)
        [group] = rebound.collect_sync(TASKS[:1], group_size=2, sampling=SAMPLING)
    assert pool.engine is engine and not engine.requests and len(other.requests) == 4
    assert rebound.concurrency == 2 and group[0].final_reward == 1.0


def test_slow_tools_overlap(tokenizer):
    latency, episodes = 0.1, 16
    engine = ScriptedEngine(tokenizer, _two_turns(tokenizer), latency_s=0.005)
    with RolloutPool(engine, lambda: ToyEnv(tool_latency_s=latency), tokenizer,
                     concurrency=episodes) as pool:
        start = time.perf_counter()
        groups = pool.collect_sync(TASKS, group_size=episodes // len(TASKS), sampling=SAMPLING)
        elapsed = time.perf_counter() - start
    assert sum(len(g) for g in groups) == episodes
    # 16 episodes x 2 tool calls x 0.1 s = 3.2 s one at a time; concurrently ~0.2 s.
    assert elapsed < 0.5 * episodes * 2 * latency, elapsed
    assert engine.max_in_flight >= episodes // 2


def test_raising_hanging_and_unbuildable_envs_are_flagged_never_dropped(tokenizer):
    release = threading.Event()
    built = []

    def env_factory():
        index = len(built)
        built.append(index)
        if index % 4 == 0:
            return ToyEnv(fail_on_step=0)      # the tool raises
        if index % 4 == 1:
            return ToyEnv(hang=release)        # the tool never returns
        if index % 4 == 2:
            raise OSError("sandbox unavailable")
        return ToyEnv()

    def reward(task, log):
        if log.final_answer is None:
            raise ValueError("no answer to grade")
        return 1.0, {}

    engine = ScriptedEngine(tokenizer, _two_turns(tokenizer))
    pool = RolloutPool(engine, env_factory, tokenizer, concurrency=4, reward_fn=reward,
                       episode_timeout_s=0.5, limits=EpisodeLimits(max_turns=3))
    try:
        start = time.perf_counter()
        groups = pool.collect_sync(TASKS[:2], group_size=4, sampling=SAMPLING)
        elapsed = time.perf_counter() - start
    finally:
        release.set()
        pool.close()
    assert elapsed < 5.0
    trajs = [t for g in groups for t in g]
    assert len(trajs) == 8
    reasons = sorted(t.metadata["stop_reason"] for t in trajs)
    assert reasons.count("answer") == 2 and reasons.count("timeout") == 2
    assert reasons.count("env_error") == 4  # 2 raising tools + 2 unbuildable envs
    for traj in trajs:
        ok = traj.metadata["stop_reason"] == "answer"
        assert traj.metadata["failed"] == (not ok)
        assert (traj.final_reward == 1.0) == ok
        if not ok:
            assert traj.metadata["error"]
    assert any("sandbox unavailable" in t.metadata["error"] for t in trajs if
               t.metadata["failed"])
    assert any("no answer to grade" in t.metadata.get("reward_error", "") for t in trajs)


def test_pool_validates_arguments(tokenizer):
    engine = ScriptedEngine(tokenizer, _two_turns(tokenizer))
    with pytest.raises(ValueError, match="concurrency"):
        RolloutPool(engine, ToyEnv, tokenizer, concurrency=0)
    with RolloutPool(engine, ToyEnv, tokenizer) as pool:
        with pytest.raises(ValueError, match="group_size"):
            pool.collect_sync(TASKS, group_size=0, sampling=SAMPLING)


def test_seeded_pool_gives_each_member_its_own_reproducible_seed(tokenizer):
    def seeds():
        engine = ScriptedEngine(tokenizer, _two_turns(tokenizer))
        with RolloutPool(engine, ToyEnv, tokenizer) as pool:
            pool.collect_sync(TASKS[:2], group_size=3, sampling=SamplingParams(seed=11))
        return sorted({r.sampling.seed for r in engine.requests})

    first = seeds()
    assert len(first) == 6 and first == seeds()


def test_engines_unavailable_ends_the_collect_instead_of_flagging_episodes(tokenizer):
    def script(context, index):
        if index == 5:
            raise EnginesUnavailable("no SGLang server answered: http://h1:30000")
        return _two_turns(tokenizer)(context, index)

    engine = ScriptedEngine(tokenizer, script, latency_s=0.01)
    with RolloutPool(engine, ToyEnv, tokenizer, concurrency=4) as pool:
        with pytest.raises(EnginesUnavailable, match="h1:30000"):
            pool.collect_sync(TASKS, group_size=2, sampling=SAMPLING)
    # Every episode that started (and so opened a session) was stopped and ended it.
    started = {r.session_id for r in engine.requests}
    assert started and started == set(engine.ended_sessions)


def test_each_member_of_a_group_may_sample_its_own_way(tokenizer):
    engine = ScriptedEngine(tokenizer, _two_turns(tokenizer))
    hot = SamplingParams(max_new_tokens=32, temperature=1.0, seed=7)
    cold = dataclasses.replace(hot, temperature=0.0)
    with RolloutPool(engine, ToyEnv, tokenizer, concurrency=4) as pool:
        [group] = pool.collect_sync(TASKS[:1], 3, sampling=[hot, hot, cold], first_group_id=5)
        mixed = [(r.sampling.temperature, r.sampling.seed) for r in engine.requests]
        [alone] = pool.collect_sync(TASKS[:1], 2, sampling=hot, first_group_id=5)
        hot_alone = {(r.sampling.temperature, r.sampling.seed)
                     for r in engine.requests[len(mixed):]}
        with pytest.raises(ValueError, match="2 sampling parameters for groups of 3"):
            pool.collect_sync(TASKS[:1], 3, sampling=[hot, cold])
    assert len(group) == 3 and len(alone) == 2 and len(mixed) == 6  # two turns each
    # Members 0 and 1 sample as a group of hot members alone does (seeds by member).
    assert {pair for pair in mixed if pair[0] == 1.0} == hot_alone and len(hot_alone) == 2
    assert [pair for pair in mixed if pair[0] == 0.0] == [(0.0, episode_seed(7, 5, 2))] * 2
