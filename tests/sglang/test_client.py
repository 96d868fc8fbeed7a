"""SGLangEngine against fake SGLang servers (tests/sglang/fake_server.py): exact
completions, balancing and session pins, retries, timeouts, dropped connections, a
server killed mid-rollout, weight sync."""
import asyncio
import collections
import json
import os
import time

import pytest

from agentjax.core.task import Task
from agentjax.models.tokenizer import stop_token_ids
from agentjax.agents.loop import EpisodeLimits
from agentjax.engine.protocol import EnginesUnavailable, GenerateRequest, SamplingParams
from agentjax.agents.pool import RolloutPool
from agentjax.sglang.client import SGLangEngine
from agentjax.sglang.protocol import MalformedResponse, RequestRejected, sample_seed
from tests.agents.fakes import ToyEnv
from tests.sglang.fake_server import (DroppingServer, FakeSGLang, fake_completion, free_port,
                                       read_log, start_processes)

FAST = dict(health_interval_s=0.05, backoff_s=0.01, health_timeout_s=1.0,
            connect_timeout_s=1.0, grace_s=5.0)


def _engine(urls, logs=None, **kwargs):
    return SGLangEngine(urls, log=(logs if logs is not None else []).append,
                        **{**FAST, **kwargs})


def _run(engine, *requests):
    return asyncio.run(engine.generate(list(requests)))


def _expected(completion, body, version="default"):
    ids, logprobs, reason = fake_completion(body["input_ids"], body["sampling_params"], version)
    return (completion.output_ids, completion.logprobs, completion.finish_reason) == (
        ids, logprobs, reason["type"])


def test_completions_are_exactly_what_the_server_sampled(tokenizer):
    requests = [
        GenerateRequest([5, 6, 7], SamplingParams(max_new_tokens=6, seed=11)),
        GenerateRequest([8, 9], SamplingParams(temperature=0.5, top_p=0.8, max_new_tokens=4,
                                               n=2, seed=12, stop_token_ids=(64,))),
        GenerateRequest([1], SamplingParams(temperature=0.0, max_new_tokens=3)),
    ]
    with FakeSGLang() as fake:
        engine = _engine([fake.url], tokenizer=tokenizer, seed=3)
        results = _run(engine, *requests)
        again = _run(_engine([fake.url], tokenizer=tokenizer, seed=3), requests[2])
    bodies = {body["rid"]: body for body in fake.generate_bodies()}
    assert [len(r) for r in results] == [1, 2, 1] and len(bodies) == 5  # a rid per sample
    for request, completions in zip(requests, results):
        for completion in completions:
            body = bodies[completion.meta["rid"]]
            assert body["input_ids"] == list(request.input_ids) and _expected(completion, body)
            assert body["sampling_params"]["stop_token_ids"] == sorted(
                set(request.sampling.stop_token_ids) | set(stop_token_ids(tokenizer)))
            assert completion.meta["server"] == fake.url and completion.meta["attempts"] == 1
            assert completion.meta["weight_version"] == "default"
            assert completion.meta["prompt_tokens"] == len(request.input_ids)
    # [8, 9] samples 57, then 64: a stop id, kept as the last output id.
    assert results[1][0].output_ids == [57, 64] and results[1][0].matched_stop == 64
    seeds = [bodies[c.meta["rid"]]["sampling_params"]["sampling_seed"] for c in results[1]]
    assert seeds == [12, sample_seed(12, 1)]
    # Unseeded requests draw their seed from the engine's own seeded stream.
    unseeded = [bodies[r[0].meta["rid"]]["sampling_params"]["sampling_seed"]
                for r in (results[2], again[0])]
    assert unseeded[0] == unseeded[1]
    # SGLang's default log-probs: tempered, untruncated (engine module docstring).
    assert [c.meta["logprob_distribution"] for r in results for c in r] == [
        "sampling", "temperature", "temperature", "raw"]


def test_sessions_stay_on_one_server_and_load_is_balanced():
    with FakeSGLang(delay_s=0.02) as a, FakeSGLang(delay_s=0.02) as b:
        engine = _engine([a.url, b.url])
        servers = collections.defaultdict(list)

        async def episode(name):
            ids = [1, 2]
            for _ in range(3):
                [[c]] = await engine.generate([GenerateRequest(
                    ids, SamplingParams(max_new_tokens=2), session_id=name)])
                servers[name].append(c.meta["server"])
                ids = ids + c.output_ids + [3]
            engine.end_session(name)

        async def main():
            await asyncio.gather(*(episode(f"s{i}") for i in range(4)))
            return await engine.generate([GenerateRequest([i], SamplingParams(max_new_tokens=1))
                                          for i in range(6)])

        loose = asyncio.run(main())
    assert all(len(set(turns)) == 1 for turns in servers.values())
    per_server = collections.Counter(turns[0] for turns in servers.values())
    assert per_server == {a.url: 2, b.url: 2}
    assert engine._pins == {} and [s.pinned for s in engine.servers] == [0, 0]
    assert collections.Counter(r[0].meta["server"] for r in loose) == {a.url: 3, b.url: 3}


def test_requests_in_flight_per_server_are_bounded():
    with FakeSGLang(delay_s=0.1) as fake:
        results = _run(_engine([fake.url], max_in_flight=2),
                       *[GenerateRequest([i + 1], SamplingParams(max_new_tokens=2))
                         for i in range(6)])
    assert fake.max_in_flight == 2 and all(r[0].finish_reason == "length" for r in results)


def test_5xx_and_aborts_are_retried_4xx_and_malformed_answers_raise():
    request = GenerateRequest([4, 2], SamplingParams(max_new_tokens=3))
    with FakeSGLang() as fake:
        # Its retries run out before its failures in a row would take the server out.
        engine = _engine([fake.url], retries=2, failure_threshold=4)
        fake.script.extend([{"status": 500, "message": "boom"},
                            {"abort": "Abort in waiting queue"}])
        [[ok]] = _run(engine, request)
        assert ok.meta["attempts"] == 3 and engine.stats["retried"] == 2
        assert _expected(ok, fake.generate_bodies()[-1])

        fake.script.extend([{"status": 503, "message": "overloaded"}] * 3)
        [[gave_up]] = _run(engine, request)
        assert gave_up.finish_reason == "abort" and gave_up.output_ids == []
        assert "HTTP 503: overloaded" in gave_up.meta["error"] and gave_up.meta["attempts"] == 3

        fake.script.append({"status": 400, "message": "Duplicate request ID detected"})
        with pytest.raises(RequestRejected, match="HTTP 400: Duplicate request ID"):
            _run(engine, request)
        fake.script.append({"edit": lambda answer: answer["output_ids"].append(7)})
        with pytest.raises(MalformedResponse, match="one \\[logprob, token_id, text\\]"):
            _run(engine, request)
    assert engine.stats["taken_out"] == 0


def test_slow_or_dropped_answer_is_retried_and_a_hung_server_is_replaced():
    request = GenerateRequest([9], SamplingParams(max_new_tokens=2))
    with FakeSGLang() as a, FakeSGLang() as b:
        logs = []
        engine = _engine([a.url, b.url], logs, request_timeout_s=0.3, health_timeout_s=1.0)
        a.script.append({"delay": 1.0})  # slow once; /health answers: same server again
        [[slow]] = _run(engine, request)
        assert slow.meta["attempts"] == 2 and slow.meta["server"] == a.url
        a.script.append({"drop": True})  # one connection dropped; /health answers
        [[dropped]] = _run(engine, request)
        assert dropped.meta["attempts"] == 2 and dropped.meta["server"] == a.url
        assert engine.stats["taken_out"] == 0 and engine.stats["retried"] == 2
        a.script.append({"delay": 1.0})
        a.health_delay_s = 3.0  # hung: neither /generate nor /health answers
        [[moved]] = _run(engine, request)
        assert moved.meta["server"] == b.url and engine.servers[0].out_reason is not None
        assert any(a.url in line and "out of rotation" in line for line in logs)
        a.health_delay_s = 0.0
        assert engine.health() and engine.servers[0].out_reason is None


def test_dropped_connections_take_the_server_out_and_requests_run_elsewhere():
    with DroppingServer() as dropping, FakeSGLang() as fake:
        engine = _engine([dropping.url, fake.url])
        results = _run(engine, *[GenerateRequest([i + 1], SamplingParams(max_new_tokens=2))
                                 for i in range(4)])
    assert all(r[0].meta["server"] == fake.url for r in results)
    assert len(fake.generate_bodies()) == 4 and engine.stats["taken_out"] == 1
    assert engine.servers[0].out_reason.startswith(("ServerDisconnectedError", "ClientOSError"))
    assert engine.servers[0].out_reason.endswith("no /health answer")


def test_server_killed_mid_rollout_loses_nothing_rejoins_and_all_down_is_an_error(
        tokenizer, tmp_path):
    ports = [free_port(), free_port()]
    logs = [str(tmp_path / "a.log"), str(tmp_path / "b.log")]
    processes = start_processes([(port, log, 0.3) for port, log in zip(ports, logs)])
    started = list(processes)
    urls = [f"http://127.0.0.1:{port}" for port in ports]
    try:
        engine = _engine(urls, tokenizer=tokenizer, max_in_flight=4, grace_s=1.0)
        pool = RolloutPool(engine, ToyEnv, tokenizer, concurrency=8,
                           limits=EpisodeLimits(max_turns=2, max_context_tokens=400))
        sampling = SamplingParams(max_new_tokens=4)

        async def kill_when_busy():
            while len(read_log(logs[0])["start"]) < 2:
                await asyncio.sleep(0.01)
            processes[0].kill()  # SIGKILL with requests in flight

        async def rollout():
            killer = asyncio.ensure_future(kill_when_busy())
            groups = await pool.collect([Task(f"t{i}", f"question {i}") for i in range(4)],
                                        group_size=2, sampling=sampling)
            await killer
            return groups

        trajectories = [t for group in asyncio.run(rollout()) for t in group]
        params = {"max_new_tokens": 4, "stop_token_ids": list(stop_token_ids(tokenizer))}
        for traj in trajectories:
            assert not traj.metadata["failed"] and len(traj.turns) == 2
            context = list(traj.prompt_ids)
            for turn in traj.turns:  # every turn is the fake model's answer to its context
                assert turn.action_ids == fake_completion(context, params, "default")[0]
                context += turn.action_ids + turn.observation_ids
        a, b = read_log(logs[0]), read_log(logs[1])
        base = lambda rid: rid.rsplit("-", 1)[0]  # noqa: E731 - the request, any attempt
        lost = {base(rid) for rid in set(a["start"]) - set(a["done"])}
        assert lost and lost <= {base(rid) for rid in b["done"]}  # re-run on the survivor
        assert len({base(rid) for rid in a["done"] + b["done"]}) == 16  # 8 episodes x 2 turns
        assert len(b["done"]) == len({base(rid) for rid in b["done"]})
        assert engine.stats["taken_out"] == 1 and engine.stats["reissued"] >= len(lost)

        processes[0], = start_processes([(ports[0], logs[0] + ".restarted", 0.3)])
        started.append(processes[0])
        # The survivor takes the first max_in_flight requests; the probe brings the
        # restarted server back while they run (0.3 s each), in time for others.
        back = _run(engine, *[GenerateRequest([i + 1], sampling) for i in range(8)])
        served = collections.Counter(r[0].meta["server"] for r in back)
        assert served[urls[1]] >= 4 and served[urls[0]] >= 1
        assert engine.stats["rejoined"] == 1 and engine.servers[0].out_reason is None

        for process in processes:
            process.kill()
        start = time.monotonic()
        with pytest.raises(EnginesUnavailable, match="no SGLang server in rotation") as error:
            pool.collect_sync([Task("t", "q")], group_size=2, sampling=sampling)
        assert all(url in str(error.value) for url in urls)
        assert 1.0 <= time.monotonic() - start < 10.0
        pool.close()
    finally:
        for process in started:
            process.kill()
            process.wait(10)


def _export(params, folder):
    os.makedirs(folder, exist_ok=True)  # as save_hf: a re-export overwrites
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump({"params": params}, f)


def test_weight_sync_order_versions_folders_and_failed_servers(tmp_path):
    request = GenerateRequest([3, 4], SamplingParams(max_new_tokens=3))
    with FakeSGLang() as a, FakeSGLang() as b:
        logs = []
        engine = _engine([a.url, b.url], logs, weights_dir=str(tmp_path / "w"), export_fn=_export)
        [[before]] = _run(engine, request)
        engine.update_weights({"step": 1})  # version 1
        folder1 = str(tmp_path / "w" / "v00000001")
        for fake in (a, b):
            assert [call for call in fake.calls if call[0] != "generate"] == [
                ("pause_generation", {"mode": "abort"}),
                ("update_weights_from_disk", {"model_path": folder1, "weight_version": "1",
                                              "flush_cache": True}),
                ("continue_generation", {})]
        [[after]] = _run(engine, request)
        assert after.meta["weight_version"] == 1 and before.meta["weight_version"] == "default"
        assert after.output_ids != before.output_ids
        assert _expected(after, a.generate_bodies()[-1] if after.meta["server"] == a.url
                         else b.generate_bodies()[-1], version="1")

        engine.update_weights({"step": 2}, version=5)
        engine.update_weights({"step": 2.5}, version=5)  # re-exported: still one folder
        engine.update_weights({"step": 3})  # version 6
        assert sorted(os.listdir(tmp_path / "w")) == ["v00000005", "v00000006"]  # keep 2
        assert not any("could not delete" in line for line in logs)
        given = str(tmp_path / "given")
        _export({"step": "given"}, given)
        engine.update_weights(given, version=9)
        assert a.calls[-2][1]["model_path"] == given and os.path.isdir(given)

        b.fail_updates = True
        engine.update_weights({"step": 4})  # version 10: b fails
        assert b.calls[-1][0] == "continue_generation"  # not left paused
        assert "update_weights_from_disk: HTTP 400: Failed to load weights" in \
            engine.servers[1].out_reason
        assert any(b.url in line for line in logs)
        results = _run(engine, *[request] * 3)
        assert {r[0].meta["server"] for r in results} == {a.url}
        assert {r[0].meta["weight_version"] for r in results} == {10}
        b.fail_updates = False
        assert engine.health() and engine.servers[1].out_reason is None
        assert b.calls[-2][1]["weight_version"] == "10"  # reloaded before rejoining

        a.fail_updates = b.fail_updates = True
        with pytest.raises(EnginesUnavailable, match=f"{a.url}.*{b.url}"):
            engine.update_weights({"step": 5})
    with pytest.raises(ValueError, match="export_fn"):
        SGLangEngine([a.url]).update_weights({"step": 1})
    with pytest.raises(FileNotFoundError, match="no config.json"):
        SGLangEngine([a.url]).update_weights(str(tmp_path))


def test_startup_check_and_constructor_errors():
    dead = f"http://127.0.0.1:{free_port()}"
    with FakeSGLang() as fake:
        _engine([fake.url]).wait_until_ready(5.0)
        with pytest.raises(EnginesUnavailable, match=f"no answer from {dead} on /health"):
            _engine([fake.url, dead]).wait_until_ready(0.2)
    with pytest.raises(ValueError, match="http"):
        SGLangEngine(["h1:30000"])
    with pytest.raises(ValueError, match="twice"):
        SGLangEngine(["http://h1:30000", "http://h1:30000/"])
    with pytest.raises(ValueError, match="logprob_distribution"):
        SGLangEngine(["http://h1:30000"], logprob_distribution="processed")


def _export_adapter(params, folder):
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "adapter_config.json"), "w") as f:
        json.dump({"params": params}, f)


def test_lora_sync_loads_an_adapter_per_version_names_it_and_unloads_the_old(tmp_path):
    request = GenerateRequest([3, 4], SamplingParams(max_new_tokens=3))
    with FakeSGLang() as a:
        engine = _engine([a.url], weights_dir=str(tmp_path / "w"), export_fn=_export_adapter,
                         lora=True)
        engine.update_weights({"step": 0}, version=0)  # the initial adapter (engines.py)
        engine.update_weights({"step": 1})
        folder = str(tmp_path / "w" / "v00000001")
        assert [call for call in a.calls if call[0] != "generate"][-3:] == [
            ("load_lora_adapter", {"lora_name": "v00000001", "lora_path": folder}),
            ("continue_generation", {}),
            ("unload_lora_adapter", {"lora_name": "v00000000"})]
        assert a.adapters == {"v00000001": folder}
        [[completion]] = _run(engine, request)
        # Every request names the current adapter: none samples the bare base.
        assert a.generate_bodies()[-1]["lora_path"] == "v00000001"
        assert completion.meta["weight_version"] == 1
        a.fail_updates = True
        with pytest.raises(EnginesUnavailable):
            engine.update_weights({"step": 2})
        assert a.calls[-1][0] == "continue_generation"
    with pytest.raises(FileNotFoundError, match="no adapter_config.json"):
        SGLangEngine([a.url], lora=True).update_weights(str(tmp_path))


def test_a_server_failing_every_request_leaves_the_rotation_and_costs_no_episode(
        tokenizer, tmp_path):
    with FakeSGLang() as bad, FakeSGLang() as good:
        bad.fail_generate = 500  # /health answers: only its answers tell
        logs = []
        engine = _engine([bad.url, good.url], logs, tokenizer=tokenizer,
                         weights_dir=str(tmp_path), export_fn=_export)
        pool = RolloutPool(engine, ToyEnv, tokenizer, concurrency=8,
                           limits=EpisodeLimits(max_turns=2, max_context_tokens=400))
        sampling = SamplingParams(max_new_tokens=4)
        groups = pool.collect_sync([Task(f"t{i}", f"question {i}") for i in range(4)],
                                   group_size=2, sampling=sampling)
        params = {"max_new_tokens": 4, "stop_token_ids": list(stop_token_ids(tokenizer))}
        for traj in (t for group in groups for t in group):
            assert not traj.metadata["failed"] and len(traj.turns) == 2
            context = list(traj.prompt_ids)
            for turn in traj.turns:
                assert turn.action_ids == fake_completion(context, params, "default")[0]
                context += turn.action_ids + turn.observation_ids
        assert len(good.generate_bodies()) == 16  # 8 episodes x 2 turns, each once
        # Out after 3 failed answers in a row; each rejoin (it answers /health) costs
        # one failed answer, re-issued, and doubles its wait before the next. Requests
        # already sent when the third failure lands fail too (up to the other 7 of the 8
        # concurrent episodes: seen 5 failures with 1 rejoin on a loaded machine).
        assert engine.stats["taken_out"] >= 1
        assert "3 failed answers in a row, the last: " in logs[0] and "wedged" in logs[0]
        failed = len(bad.generate_bodies())
        assert failed <= 3 + (8 - 1) + engine.stats["rejoined"]

        engine.update_weights({"step": 1})  # the bad server loads it as well
        bad.fail_generate = None  # it recovers: back after its wait, current weights
        deadline = time.monotonic() + 5
        while not (engine.health() and engine.servers[0].out_reason is None):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        back = _run(engine, *[GenerateRequest([i + 1], sampling) for i in range(4)])
        assert {r[0].meta["server"] for r in back} == {bad.url, good.url}
        assert {r[0].meta["weight_version"] for r in back} == {1}
        assert engine.servers[0].failures == engine.servers[0].strikes == 0
        pool.close()


def test_a_server_answering_with_other_weights_reloads_before_it_serves_again(tmp_path):
    request = GenerateRequest([3, 4], SamplingParams(max_new_tokens=3))
    with FakeSGLang() as a, FakeSGLang() as b:
        logs = []
        engine = _engine([a.url, b.url], logs, weights_dir=str(tmp_path), export_fn=_export)
        engine.update_weights({"step": 1})
        a.version = "default"  # restarted with its launch weights, unnoticed
        results = _run(engine, *[request] * 4)
        assert {r[0].meta["weight_version"] for r in results} == {1}
        assert engine.stats["reissued"] >= 1
        assert any("sampled with weights version 'default', not 1" in line for line in logs)
        assert engine.health() and a.version == "1"  # reloaded before it rejoined
        assert [c[0] for c in a.calls if c[0] != "generate"][-3:] == [
            "pause_generation", "update_weights_from_disk", "continue_generation"]
