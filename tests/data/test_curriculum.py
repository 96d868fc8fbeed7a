import collections
import json

import pytest

from agentjax.data import curriculum
from agentjax.core.task import Task

TASKS = [Task(f"t{i}", f"q{i}", ("a",), metadata={"hops": 1 + i % 3}) for i in range(12)]


def _resumes_exactly(make, feed):
    """Runs 3 rounds, snapshots (through JSON), runs 3 more; a fresh sampler loaded from
    the snapshot must draw the same 3 later rounds."""
    sampler = make()
    for _ in range(3):
        feed(sampler, sampler.sample(5))
    state = json.loads(json.dumps(sampler.state_dict()))
    later = []
    for _ in range(3):
        batch = sampler.sample(5)
        later.append([t.task_id for t in batch])
        feed(sampler, batch)
    resumed = make(seed=99)  # a different seed: everything must come from the state
    resumed.load_state_dict(state)
    again = []
    for _ in range(3):
        batch = resumed.sample(5)
        again.append([t.task_id for t in batch])
        feed(resumed, batch)
    assert later == again


def _feed(sampler, batch):
    # Deterministic outcomes: tasks t0..t3 always succeed, t4..t7 fail, the rest alternate.
    sampler.update(batch, [1.0 if int(t.task_id[1:]) < 4 else 0.0 if int(t.task_id[1:]) < 8
                           else float(len(t.task_id) % 2) for t in batch])


@pytest.mark.parametrize("name, kwargs", [
    ("uniform", {}), ("learnability", {}), ("learnability", {"bucket": "hops"}),
    ("failure_buffer", {"replay_fraction": 0.4, "capacity": 3})])
def test_resume_continues_exactly(name, kwargs):
    _resumes_exactly(lambda seed=0: curriculum.make_sampler(name, TASKS, seed=seed, **kwargs),
                     _feed)


def test_uniform_covers_every_task_once_per_epoch():
    sampler = curriculum.UniformSampler(TASKS, seed=1)
    drawn = [t.task_id for t in sampler.sample(12 * 3 + 2)]
    for epoch in range(3):
        assert sorted(drawn[12 * epoch:12 * (epoch + 1)]) == sorted(t.task_id for t in TASKS)
    assert sampler.epoch == 3
    assert drawn[:12] != drawn[12:24]  # a fresh order each epoch


def test_learnability_prefers_fifty_percent_tasks():
    sampler = curriculum.LearnabilitySampler(TASKS, seed=0, decay=1.0, floor=0.01)
    easy, hard, mid = TASKS[0], TASKS[1], TASKS[2]
    for _ in range(20):
        sampler.update([easy, hard, mid, mid], [1.0, 0.0, 1.0, 0.0])
    p = sampler.success_rate()
    assert p[0] == pytest.approx(21 / 22) and p[1] == pytest.approx(1 / 22)
    assert p[2] == pytest.approx(0.5)
    w = sampler.weights()
    assert w[0] == pytest.approx(21 / 22 * 1 / 22 + 0.01) and w[1] == pytest.approx(w[0])
    assert w[2] == pytest.approx(0.26) and w[3] == pytest.approx(0.26)  # unseen = 50%
    draws = 4000
    counts = collections.Counter(t.task_id for _ in range(draws) for t in sampler.sample(1))
    for i, task in enumerate(TASKS):
        assert counts[task.task_id] / draws == pytest.approx(w[i] / w.sum(), abs=0.015)
    batch = sampler.sample(8)
    assert len({t.task_id for t in batch}) == 8  # distinct within a batch


def test_learnability_buckets_share_estimates_and_decay_forgets():
    sampler = curriculum.LearnabilitySampler(TASKS, bucket="hops", decay=0.5)
    sampler.update([TASKS[0]], [1.0])  # hops 1
    p = sampler.success_rate()
    assert all(p[i] == pytest.approx(2 / 3) for i in range(0, 12, 3))
    assert all(p[i] == 0.5 for i in range(1, 12, 3))
    sampler.update([TASKS[3]], [0.0])  # same bucket: counts decay, then add
    assert sampler.success_rate()[0] == pytest.approx((1 + 0.5) / (2 + 1.5))
    with pytest.raises(ValueError, match="bucket 'level'"):
        curriculum.LearnabilitySampler(TASKS, bucket="level")


def test_failure_buffer_replays_failures_and_forgets_successes():
    sampler = curriculum.FailureBufferSampler(TASKS, seed=0, replay_fraction=0.5, capacity=2)
    assert len(sampler.sample(4)) == 4 and not sampler.buffer
    sampler.update([TASKS[0], TASKS[1], TASKS[0]], [0.0, 0.0, 0.0])
    assert sampler.buffer == {"t1": 1.0, "t0": 2.0}
    batch = sampler.sample(4)
    assert {t.task_id for t in batch[:2]} == {"t0", "t1"}  # round(0.5 * 4) from the buffer
    sampler.update([TASKS[2]], [0.0])  # over capacity: the lightest (t1, then t2) goes
    assert sampler.buffer == {"t0": 2.0, "t2": 1.0}
    sampler.update([TASKS[0]], [1.0])
    assert sampler.buffer == {"t2": 1.0}
    assert sampler.sample(4)[0].task_id == "t2"


def test_errors():
    sampler = curriculum.UniformSampler(TASKS)
    with pytest.raises(ValueError, match="not in this sampler"):
        sampler.update([Task("zz", "q")], [1.0])
    with pytest.raises(ValueError, match="2 tasks but 1"):
        sampler.update(TASKS[:2], [1.0])
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        sampler.update(TASKS[:1], [2.0])
    with pytest.raises(ValueError, match="different task list"):
        curriculum.UniformSampler(TASKS[:-1]).load_state_dict(sampler.state_dict())
    with pytest.raises(ValueError, match="not LearnabilitySampler"):
        curriculum.LearnabilitySampler(TASKS).load_state_dict(sampler.state_dict())
    with pytest.raises(ValueError, match="unique"):
        curriculum.UniformSampler(TASKS + TASKS[:1])
    with pytest.raises(ValueError, match="unknown curriculum sampler"):
        curriculum.make_sampler("fancy", TASKS)
    with pytest.raises(ValueError, match="at least one task"):
        curriculum.UniformSampler([])
