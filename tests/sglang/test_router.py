"""SGLangEngine behind a real sglang-router (the pip package, `python -m
sglang_router.launch_router`): requests through the router, weight syncs, pause and
continue straight to its workers, a worker that fails its load or serves other weights
leaving the router and rejoining with the current weights, sessions pinned by the
routing key. Over fake SGLang workers (tests/sglang/fake_server.py), so each test takes
a fraction of a second once the router runs."""
import asyncio
import collections

import pytest

from agentjax.core.task import Task
from agentjax.agents.loop import EpisodeLimits
from agentjax.agents.pool import RolloutPool
from agentjax.engine.protocol import GenerateRequest, SamplingParams
from agentjax.sglang.client import SGLangEngine
from agentjax.sglang.launch import LocalRouter
from tests.agents.fakes import ToyEnv
from tests.sglang.fake_server import FakeSGLang
from tests.sglang.test_client import FAST, _export

pytest.importorskip("sglang_router.launch_router",
                    reason="sglang-router is not installed (pip install -e '.[dev]')")

# min_group: a new routing key goes to the worker holding the fewest (even, not random).
MANUAL = ["--assignment-mode", "min_group"]


@pytest.fixture(scope="module")
def routed():
    """(two fake workers, a router over them with the manual policy)."""
    with FakeSGLang() as a, FakeSGLang() as b:
        with LocalRouter.start([a.url, b.url], policy="manual", flags=MANUAL) as router:
            yield (a, b), router


@pytest.fixture
def workers(routed):
    """The fake workers reset to a fresh start, the router listing both."""
    (a, b), router = routed
    for fake in (a, b):
        fake.version, fake.fail_updates, fake.fail_generate = "default", False, None
        fake.calls.clear()
        fake.routing_keys.clear()
    assert router.workers() == {a.url, b.url}
    return a, b


def _engine(workers, router, logs, tmp_path, **kwargs):
    return SGLangEngine([w.url for w in workers], router_url=router.url, log=logs.append,
                        weights_dir=str(tmp_path), export_fn=_export, **{**FAST, **kwargs})


def _control_calls(fake):
    return [path for path, _ in fake.calls if path not in ("generate", "close_session")]


def test_requests_go_through_the_router_sessions_keep_their_worker(routed, workers, tmp_path,
                                                                    tokenizer):
    (_, router), (a, b) = routed, workers
    engine = _engine(workers, router, [], tmp_path, server_sessions=True, tokenizer=tokenizer)
    pool = RolloutPool(engine, ToyEnv, tokenizer, concurrency=8,
                       limits=EpisodeLimits(max_turns=3, max_context_tokens=400))

    async def rollout():
        groups = await pool.collect([Task(f"t{i}", f"question {i}") for i in range(4)],
                                    group_size=2, sampling=SamplingParams(max_new_tokens=4))
        await asyncio.sleep(0.3)  # the last episodes' /close_session calls run meanwhile
        return groups

    groups = asyncio.run(rollout())
    pool.close()
    trajectories = [t for group in groups for t in group]
    assert all(not t.metadata["failed"] and len(t.turns) == 3 for t in trajectories)
    # Every turn of an episode went to one worker with the episode as its routing key
    # (the router dropped session_id from the body and forwarded the header).
    keys = {fake.url: collections.Counter(fake.routing_keys) for fake in (a, b)}
    assert sum(keys[a.url].values()) + sum(keys[b.url].values()) == 24
    assert not keys[a.url].keys() & keys[b.url].keys() and None not in keys[a.url]
    assert all(key.startswith("agentjax-session:episode-") for k in keys.values() for key in k)
    # min_group spreads the episodes over both (how evenly depends on when each ends).
    assert len(keys[a.url]) + len(keys[b.url]) == 8 and min(map(len, keys.values())) >= 1
    assert all(count == 3 for k in keys.values() for count in k.values())
    assert all("session_id" not in body and body["model"] is None
               for fake in (a, b) for body in fake.generate_bodies())
    # The router chose the worker, so each session is closed on both.
    closed = [{body["session_id"] for path, body in fake.calls if path == "close_session"}
              for fake in (a, b)]
    assert closed[0] == closed[1] == {key.split(":", 1)[1] for k in keys.values()
                                      for key in k}


def test_weights_reach_the_workers_and_a_failed_one_leaves_the_router(routed, workers,
                                                                      tmp_path):
    (_, router), (a, b) = routed, workers
    logs = []
    engine = _engine(workers, router, logs, tmp_path)
    request = GenerateRequest([3, 4], SamplingParams(max_new_tokens=3))
    engine.update_weights({"step": 1})
    for fake in (a, b):  # straight to each worker: the router answers them with 404
        assert _control_calls(fake) == ["pause_generation", "update_weights_from_disk",
                                        "continue_generation"]
    done = asyncio.run(engine.generate([request] * 4))
    assert {r[0].meta["weight_version"] for r in done} == {1}
    assert {r[0].meta["server"] for r in done} == {router.url}

    b.fail_updates = True
    engine.update_weights({"step": 2})
    assert router.workers() == {a.url} and engine.servers[1].out_reason
    sent = len(b.generate_bodies())
    done = asyncio.run(engine.generate([request] * 4))
    assert {r[0].meta["weight_version"] for r in done} == {2}
    assert len(b.generate_bodies()) == sent  # it serves nothing with the old weights
    b.fail_updates = False
    assert engine.health() and engine.servers[1].out_reason is None
    assert router.workers() == {a.url, b.url} and b.version == "2"  # reloaded, re-added


def test_a_worker_serving_other_weights_leaves_the_router_until_it_has_reloaded(
        routed, workers, tmp_path):
    (_, router), (a, b) = routed, workers
    logs = []
    engine = _engine(workers, router, logs, tmp_path)
    engine.update_weights({"step": 1})
    a.version = "default"  # restarted with its launch weights; the router routes to it
    # Distinct routing keys, spread over both workers (min_group).
    requests = [GenerateRequest([i + 1], SamplingParams(max_new_tokens=2),
                                session_id=f"s{i}") for i in range(6)]
    done = asyncio.run(engine.generate(requests))
    assert {r[0].meta["weight_version"] for r in done} == {1}
    assert engine.stats["reissued"] >= 1 and engine.stats["taken_out"] == 1
    assert any(f"{a.url} out of rotation: serves weights version 'default', not 1" in line
               for line in logs)
    assert engine.health() and a.version == "1" and router.workers() == {a.url, b.url}
