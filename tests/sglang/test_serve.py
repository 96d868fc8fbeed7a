"""SGLangEngine against two real scripts/serve.py servers (agentjax's engine behind
SGLang's native API): the same completions as the in-process engine, stop strings and
ids, n > 1, a session's turns on one server reusing its cache there, and weight updates
that change the outputs and the reported version. Then the same servers behind a real
sglang-router: the same completions and session caches through it, a weight sync to the
workers while requests go through it, a worker SIGKILLed mid-rollout."""
import asyncio
import os
import signal
import threading

import jax
import pytest
from flax import nnx

from agentjax.models.hf import load_hf, make_tiny_hf, save_hf
from agentjax.models.tokenizer import build_tokenizer, load_tokenizer
from agentjax.engine.protocol import GenerateRequest, SamplingParams
from agentjax.engine.jax.lanes import LanedEngine
from agentjax.core.task import Task
from agentjax.agents.loop import EpisodeLimits
from agentjax.agents.pool import RolloutPool
from agentjax.sglang.launch import ROUTER_FLAGS, LocalRouter, LocalServers
from agentjax.sglang.client import SGLangEngine
from tests.agents.fakes import CORPUS, ToyEnv

CONTEXT = 128
FLAGS = ["--context-length", str(CONTEXT), "--max-running-requests", "4",
         "--prefill-chunks", "16", "--decode-steps", "4", "--enable-deterministic-inference",
         "--random-seed", "3"]
# The servers' engine, built in-process.
ENGINE = dict(lanes=1, max_slots=4, max_len=CONTEXT, prefill_chunks=(16,), decode_steps=4,
              deterministic=True, seed=3)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(model folder, tokenizer, started servers)."""
    path = str(tmp_path_factory.mktemp("sglang_serve") / "model")
    make_tiny_hf(path, tokenizer=build_tokenizer(CORPUS * 4, vocab_size=384))
    with LocalServers.start(path, count=2, flags=FLAGS) as servers:
        yield path, load_tokenizer(path), servers


@pytest.fixture
def router(served):
    """A router (manual policy, the flags docs/sglang.md recommends) over the servers,
    any a test killed started again first."""
    pytest.importorskip("sglang_router.launch_router",
                        reason="sglang-router is not installed (pip install -e '.[dev]')")
    served[2].revive()
    with LocalRouter.start(served[2].urls, policy="manual", flags=ROUTER_FLAGS) as router:
        yield router


def _generate(engine, requests):
    return asyncio.run(engine.generate(requests))


def _requests(tokenizer):
    text = tokenizer.encode("the capital of")
    return [GenerateRequest(text, SamplingParams(max_new_tokens=8, seed=11)),
            GenerateRequest([5, 6, 7], SamplingParams(max_new_tokens=6, seed=12,
                                                      temperature=0.7, top_k=20)),
            GenerateRequest(text, SamplingParams(max_new_tokens=8, temperature=0.0))]


@pytest.mark.slow
def test_served_completions_equal_the_in_process_engine(served, tmp_path):
    path, tokenizer, servers = served
    model, _ = load_hf(path)
    requests = _requests(tokenizer)
    with LanedEngine.build(*nnx.split(model), tokenizer=tokenizer, **ENGINE) as local:
        expected = _generate(local, requests)
        # The stop id and stop string each engine finds in the first completion's text.
        first = expected[0][0].output_ids
        stop_id = first[2]
        stop_text = tokenizer.decode(first[:4])[-2:]
        stopping = [GenerateRequest(requests[0].input_ids, SamplingParams(
            max_new_tokens=8, seed=11, stop_token_ids=(stop_id,))),
            GenerateRequest(requests[0].input_ids, SamplingParams(
                max_new_tokens=8, seed=11, stop=(stop_text,)))]
        expected_stops = _generate(local, stopping)
    with SGLangEngine(servers.urls, tokenizer=tokenizer, weights_dir=str(tmp_path),
                      logprob_distribution="sampling") as remote:
        got = _generate(remote, requests)
        got_stops = _generate(remote, stopping)
        [[one, two]] = _generate(remote, [GenerateRequest(
            requests[0].input_ids, SamplingParams(max_new_tokens=8, seed=11, n=2))])
    for [want], [have] in zip(expected + expected_stops, got + got_stops):
        assert have.output_ids == want.output_ids
        assert have.logprobs == pytest.approx(want.logprobs, abs=1e-6)
        assert (have.finish_reason, have.matched_stop) == (want.finish_reason,
                                                          want.matched_stop)
    assert got_stops[0][0].output_ids[-1] == stop_id
    assert tokenizer.decode(got_stops[1][0].output_ids).endswith(stop_text)
    assert one.output_ids != two.output_ids  # two samples, not one copied


@pytest.mark.slow
def test_sessions_stay_on_one_server_and_weight_updates_reach_every_server(served, tmp_path):
    path, tokenizer, servers = served
    model, config = load_hf(path)
    graphdef, params = nnx.split(model)

    def export(weights, folder):
        save_hf(nnx.merge(graphdef, weights), config, folder, tokenizer=tokenizer)

    greedy = SamplingParams(max_new_tokens=6, temperature=0.0)
    with SGLangEngine(servers.urls, tokenizer=tokenizer, weights_dir=str(tmp_path),
                      export_fn=export, logprob_distribution="sampling",
                      server_sessions=True) as engine:
        used, contexts, shared = {}, {session: [5, 6, 7] for session in "abcd"}, 0
        for turn in range(3):
            for session in contexts:
                [[done]] = _generate(engine, [GenerateRequest(
                    contexts[session], greedy, session_id=session)])
                used.setdefault(session, set()).add(done.meta["server"])
                # Later turns extend the context: the server's session cache holds all
                # but the last output (never fed) and the appended id 8. Greedy sessions
                # agree, so one that reaches a context another session on its server
                # prefilled first shares all of it but the last id (a first turn, the
                # prompt).
                cached, context = done.meta["cached_tokens"], len(contexts[session])
                assert cached in ((context - 2, context - 1) if turn else (0, context - 1))
                shared += cached == context - 1
                contexts[session] += done.output_ids + [8]
        assert shared >= 2 * 3  # every turn, the second session on each server
        assert all(len(servers_used) == 1 for servers_used in used.values())
        assert set().union(*used.values()) == set(servers.urls)  # both servers used
        for session in contexts:
            engine.end_session(session)

        probe = [GenerateRequest([5, 6, 7], greedy)] * 4
        before = _generate(engine, probe)
        shifted = jax.tree.map(lambda x: x + 0.5, params)
        engine.update_weights(shifted)
        after = _generate(engine, probe)
        assert {c.meta["server"] for [c] in after} == set(servers.urls)
        assert all(c.meta["weight_version"] == 1 for [c] in after)
        assert [c.output_ids for [c] in after] != [c.output_ids for [c] in before]
        engine.update_weights(params)
        again = _generate(engine, probe)
    assert [c.output_ids for [c] in again] == [c.output_ids for [c] in before]
    assert all(c.meta["weight_version"] == 2 for [c] in again)


def _export_fn(path, tokenizer):
    model, config = load_hf(path)
    graphdef, params = nnx.split(model)

    def export(weights, folder):
        save_hf(nnx.merge(graphdef, weights), config, folder, tokenizer=tokenizer)
    return export, params


@pytest.mark.slow
def test_through_the_router_completions_caches_and_a_sync_under_load_match_direct(
        served, router, tmp_path):
    path, tokenizer, servers = served
    export, params = _export_fn(path, tokenizer)
    greedy = SamplingParams(max_new_tokens=6, temperature=0.0)

    def engine(**kwargs):
        return SGLangEngine(servers.urls, tokenizer=tokenizer, weights_dir=str(tmp_path),
                            export_fn=export, logprob_distribution="sampling",
                            server_sessions=True, **kwargs)

    def two_turns(engine, name):
        """Four sessions of distinct prompts (so none shares another's context); each
        one's second turn: (output ids, cached tokens, context length)."""
        async def episode(i):
            context = [5, 6, 40 + i]
            [[first]] = await engine.generate([GenerateRequest(context, greedy,
                                                               session_id=f"{name}{i}")])
            context = context + first.output_ids + [8]
            [[second]] = await engine.generate([GenerateRequest(context, greedy,
                                                                session_id=f"{name}{i}")])
            engine.end_session(f"{name}{i}")
            return second.output_ids, second.meta["cached_tokens"], len(context)

        async def main():
            return await asyncio.gather(*(episode(i) for i in range(4)))
        return asyncio.run(main())

    requests = _requests(tokenizer)
    with engine() as direct, engine(router_url=router.url) as routed:
        assert _outputs(_generate(routed, requests)) == _outputs(_generate(direct, requests))
        # The router pins each session to a worker, which keeps its cache between turns:
        # all but the first turn's last output (never fed) and the appended id 8. (Routed
        # first: its prompts are new to the servers, so no other request's context can
        # stand in for a session's own cache.)
        routed_turns = two_turns(routed, "r")
        assert all(cached == length - 2 for _, cached, length in routed_turns)
        assert ([ids for ids, _, _ in routed_turns]
                == [ids for ids, _, _ in two_turns(direct, "d")])

        probe = [GenerateRequest([5, 6, 7 + i], greedy) for i in range(8)]
        before_run = _generate(routed, probe)
        before = _outputs(before_run)
        # The servers are the module's: earlier tests may have left other weights loaded.
        [old] = {c.meta["weight_version"] for [c] in before_run}
        shifted = jax.tree.map(lambda x: x + 0.5, params)
        syncing = threading.Thread(target=routed.update_weights, args=(shifted,))

        async def sync_under_load():
            tasks = [asyncio.ensure_future(routed.generate(probe)) for _ in range(3)]
            await asyncio.sleep(0.05)
            syncing.start()
            return [o for task in tasks for o in await task]
        during = asyncio.run(sync_under_load())
        syncing.join()
        after = _outputs(_generate(routed, probe))
        assert after != before and {c.meta["weight_version"] for [c] in
                                    _generate(routed, probe)} == {1}
        # Each completion is wholly one version's: the old outputs or the new ones.
        for k, [completion] in enumerate(during):
            one_version = [(old, before[k % len(probe)][0]), (1, after[k % len(probe)][0])]
            assert (completion.meta["weight_version"], completion.output_ids) in one_version


def _outputs(results):
    return [(c.output_ids, c.finish_reason) for [c] in results]


@pytest.mark.slow
def test_a_worker_sigkilled_mid_rollout_behind_the_router_loses_no_episode(served, router):
    path, tokenizer, servers = served
    victim = servers.pids[1]

    def rollout(engine, kill_after=None):
        pool = RolloutPool(engine, ToyEnv, tokenizer, concurrency=8,
                           limits=EpisodeLimits(max_turns=2, max_context_tokens=CONTEXT),
                           progress=kill_after)
        groups = pool.collect_sync([Task(f"t{i}", f"question {i}") for i in range(4)],
                                   group_size=2,
                                   sampling=SamplingParams(max_new_tokens=6, seed=5),
                                   first_group_id=0)
        pool.close()
        return [[(t.action_ids, t.observation_ids) for t in traj.turns]
                for group in groups for traj in group], groups

    def kill_after_two(progress):
        if progress.episodes_done >= 2 and not killed:
            os.kill(victim, signal.SIGKILL)
            killed.append(progress.episodes_done)

    killed = []
    with SGLangEngine(servers.urls, router_url=router.url, tokenizer=tokenizer,
                      logprob_distribution="sampling") as engine:
        uninterrupted, _ = rollout(engine)
        got, groups = rollout(engine, kill_after_two)
    assert killed and all(not t.metadata["failed"] for g in groups for t in g)
    # Seeded requests on batch-invariant servers: a request re-run on the survivor
    # samples what it would have on the victim.
    assert got == uninterrupted
