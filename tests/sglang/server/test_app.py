"""rollout.server: a tiny HF model served in-process (httpx.ASGITransport) answers SGLang's
native API as SGLang's source does (python/sglang/srt/entrypoints/http_server.py,
managers/tokenizer_manager.py): generation equal to the in-process engine's for the same
seed, stops, n > 1, rid uniqueness, 4xx for bad requests, weight updates from disk,
pause / continue in each mode, aborts, health and info, LoRA adapters."""
import asyncio
import json

import httpx
import jax.numpy as jnp
import openai
import pytest
from flax import nnx

from agentjax.models import chat
from agentjax.models.hf import load_hf, make_tiny_hf
from agentjax.models.lora import LoraConfig, add_adapters, fold_adapters
from agentjax.models.peft import save_peft
from agentjax.models.tokenizer import stop_token_ids
from agentjax.engine.protocol import GenerateRequest, SamplingParams
from agentjax.engine.jax.lanes import LanedEngine
from agentjax.sglang.server.app import build_app, hf_params_loader
from agentjax.sglang.server.main import adapter_loader
from agentjax.sglang.server.requests import GenerateBody

CONTEXT = 128
# The served engine: two lanes, batch-invariant, so a seeded request's tokens do not
# depend on what else is in flight (rollout.jax_engine, deterministic mode).
ENGINE = dict(lanes=2, max_slots=4, max_len=CONTEXT, prefill_chunks=(16,), decode_steps=4,
              deterministic=True, deterministic_prefill_rows=2, batch_wait_s=0.01)
PROMPT = [5, 6, 7, 8, 9]


def build_engine(folder, tokenizer):
    model, _ = load_hf(folder)
    return LanedEngine.build(*nnx.split(model), tokenizer=tokenizer, **ENGINE)


@pytest.fixture(scope="module")
def folders(tmp_path_factory, tokenizer):
    """Two checkpoints of the same shapes (seeds 0 and 1) and one of other shapes."""
    root = tmp_path_factory.mktemp("checkpoints")
    make_tiny_hf(root / "a", tokenizer=tokenizer, seed=0)
    make_tiny_hf(root / "b", tokenizer=tokenizer, seed=1)
    make_tiny_hf(root / "narrow", tokenizer=tokenizer, hidden_size=32)
    return root


@pytest.fixture(scope="module")
def engine(folders, tokenizer):
    engine = build_engine(folders / "a", tokenizer)
    engine.warmup()
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def loop():
    """One event loop for the module (the engine and the apps outlive a test)."""
    with asyncio.Runner() as runner:
        yield runner


class HeldEngine:
    """The real engine, whose generate calls wait until `release` is set: requests are
    surely in flight while a test pauses, aborts or updates."""

    def __init__(self, engine):
        self.engine, self.release, self.waiting = engine, asyncio.Event(), 0

    async def generate(self, requests):
        self.waiting += 1
        try:
            await self.release.wait()
        finally:
            self.waiting -= 1
        return await self.engine.generate(requests)

    def __getattr__(self, name):
        return getattr(self.engine, name)


def make_app(engine, folders, tokenizer):
    return build_app(engine, tokenizer=tokenizer, model_path=str(folders / "a"),
                     context_length=CONTEXT, vocab_size=len(tokenizer),
                     load_params=hf_params_loader(jnp.float32))


def serve(loop, app, scenario):
    """Runs `scenario(client)` against `app` on the module's event loop."""
    async def run():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://server",
                                     timeout=120) as client:
            return await scenario(client)
    return loop.run(run())


async def until(condition, timeout_s=30.0):
    for _ in range(int(timeout_s / 0.005)):
        if condition():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("condition not reached")


def generate_body(seed, max_new_tokens=12, **fields):
    return dict(input_ids=PROMPT, return_logprob=True, sampling_params={
        "max_new_tokens": max_new_tokens, "sampling_seed": seed}, **fields)


def test_served_generation_equals_the_in_process_engines_for_the_same_seed(
        loop, engine, folders, tokenizer):
    app = make_app(engine, folders, tokenizer)
    texts = ["Which city is the capital of France?", "The quick brown fox"]

    async def scenario(client):
        single = await client.post("/generate", json=generate_body(7, rid="one"))
        batch = await client.post("/generate", json=dict(
            text=texts, rid="b", return_logprob=True,
            sampling_params={"max_new_tokens": 10, "sampling_seed": 3, "n": 2}))
        return single, batch
    single, batch = serve(loop, app, scenario)
    assert single.status_code == 200 and batch.status_code == 200, single.text + batch.text

    requests = [GenerateRequest(PROMPT, SamplingParams(max_new_tokens=12, seed=7))] + [
        GenerateRequest(tokenizer(text)["input_ids"], SamplingParams(
            max_new_tokens=10, seed=3, n=2)) for text in texts]
    with build_engine(folders / "a", tokenizer) as in_process:
        [[want], *batch_want] = in_process.generate_sync(requests)
    out = single.json()
    assert out["output_ids"] == want.output_ids
    assert [lp for lp, _, _ in out["meta_info"]["output_token_logprobs"]] == want.logprobs
    assert [t for _, t, _ in out["meta_info"]["output_token_logprobs"]] == want.output_ids
    meta = out["meta_info"]
    assert meta["id"] == "one" and meta["weight_version"] == "default"
    assert meta["prompt_tokens"] == len(PROMPT) and meta["completion_tokens"] == len(
        want.output_ids)
    assert meta["finish_reason"] == ({"type": "length", "length": 12}
                                     if want.finish_reason == "length" else
                                     {"type": "stop", "matched": want.matched_stop})
    kept = want.output_ids[:-1] if want.finish_reason == "stop" else want.output_ids
    assert out["text"] == tokenizer.decode(kept, skip_special_tokens=True)

    # Request by request, the n samples of each together, each with its own id.
    outputs = batch.json()
    assert len(outputs) == 4 and len({o["meta_info"]["id"] for o in outputs}) == 4
    for got, want in zip(outputs, [c for completions in batch_want for c in completions]):
        assert got["output_ids"] == want.output_ids
        assert [lp for lp, _, _ in got["meta_info"]["output_token_logprobs"]] == want.logprobs
    assert outputs[0]["output_ids"] != outputs[1]["output_ids"]  # fold_in(seed, sample)


def test_stop_ids_and_stop_strings_end_generation_and_trim_only_the_text(
        loop, engine, folders, tokenizer):
    app = make_app(engine, folders, tokenizer)

    async def scenario(client):
        free = (await client.post("/generate", json=generate_body(5, 40))).json()["output_ids"]
        # A token first seen at position k >= 2 ends generation right after position k.
        k = next(k for k in range(2, len(free)) if free[k] not in free[:k])
        by_id = await client.post("/generate", json=dict(input_ids=PROMPT, sampling_params={
            "max_new_tokens": 40, "sampling_seed": 5, "stop_token_ids": [free[k]]}))
        untrimmed = await client.post("/generate", json=dict(input_ids=PROMPT, sampling_params={
            "max_new_tokens": 40, "sampling_seed": 5, "stop_token_ids": [free[k]],
            "no_stop_trim": True}))
        # A stop string: the text of a later token; generation ends at the first token
        # whose output text contains it.
        j = next(j for j in range(3, len(free))
                 if tokenizer.decode([free[j]]).strip().isalnum())
        stop = tokenizer.decode([free[j]]).strip()
        by_text = await client.post("/generate", json=dict(input_ids=PROMPT, sampling_params={
            "max_new_tokens": 40, "sampling_seed": 5, "stop": [stop]}))
        return free, k, by_id.json(), untrimmed.json(), stop, by_text.json()
    free, k, by_id, untrimmed, stop, by_text = serve(loop, app, scenario)

    assert by_id["output_ids"] == free[:k + 1]
    assert by_id["meta_info"]["finish_reason"] == {"type": "stop", "matched": free[k]}
    assert by_id["text"] == tokenizer.decode(free[:k], skip_special_tokens=True)
    assert untrimmed["text"] == tokenizer.decode(free[:k + 1], skip_special_tokens=True)

    end = next(i for i in range(len(free))
               if stop in tokenizer.decode(free[:i + 1], skip_special_tokens=False))
    assert by_text["output_ids"] == free[:end + 1]
    assert by_text["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    full = tokenizer.decode(free[:end + 1], skip_special_tokens=True)
    assert by_text["text"] == full[:full.find(stop)]


def test_a_rid_in_flight_is_refused_and_bad_requests_never_stop_the_server(
        loop, engine, folders, tokenizer):
    held = HeldEngine(engine)
    app = make_app(held, folders, tokenizer)
    valid = generate_body(1, 3)
    bad = [  # (body bytes or JSON, status, error shape)
        (b"{not json", 400, "object"), (b"", 400, "object"), (b"[" * 50_000, 400, "object"),
        (b'{"input_ids": ["\xe9"]}', 400, "object"), (b"null", 400, "object"),
        ({"input_ids": [1, "a"]}, 400, "object"), ({"input_ids": [1, True]}, 400, "object"),
        ({"input_ids": PROMPT, "stream": True}, 400, "error"),
        ({"input_ids": PROMPT, "sampling_params": {"bogus": 1}}, 400, "error"),
        ({"input_ids": PROMPT, "sampling_params": {"temperature": float("nan")}}, 400, "error"),
        ({"input_ids": PROMPT, "sampling_params": {"n": 10**12}}, 400, "error"),
        ({"input_ids": PROMPT, "sampling_params": {"top_k": 2**70, "max_new_tokens": 3}},
         200, None),
        ({"input_ids": PROMPT, "sampling_params": {"stop_token_ids": list(range(20))}},
         400, "error"),
        ({"input_ids": [10**30]}, 400, "error"),
        ({"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 3}, "priority": 1,
          "not_an_sglang_field": [1]}, 200, None),  # unknown fields are ignored
        ({"input_ids": [PROMPT, [len(tokenizer)]]}, 400, "error"),
    ]

    control = [("/pause_generation", {"mode": "bogus"}), ("/update_weights_from_disk", {}),
               ("/abort_request", {"rid": 5}), ("/close_session", {})]

    async def scenario(client):
        first = asyncio.create_task(client.post("/generate", json=dict(valid, rid="dup")))
        await until(lambda: held.waiting == 1)
        again = await client.post("/generate", json=dict(valid, rid="dup"))
        held.release.set()
        answers = [again, await first]
        for body, _, _ in bad:
            if isinstance(body, bytes):
                answer = await client.post("/generate", content=body,
                                           headers={"content-type": "application/json"})
            else:
                answer = await client.post("/generate", content=json.dumps(body),
                                           headers={"content-type": "application/json"})
            answers.append((answer, await client.post("/generate", json=valid)))
        answers.append((await client.get("/generate"), await client.post("/generate",
                                                                         json=valid)))
        for path, body in control:
            answers.append((await client.post(path, json=body),
                            await client.post("/generate", json=valid)))
        return answers
    again, first, *rest = serve(loop, app, scenario)
    assert again.status_code == 400
    assert again.json() == {"error": {"message": "Duplicate request ID detected: dup"}}
    assert first.status_code == 200 and first.json()["meta_info"]["id"] == "dup"
    for (body, status, shape), (answer, after) in zip(bad, rest):
        assert answer.status_code == status, (body, answer.text)
        if shape == "error":
            assert answer.json()["error"]["message"], body
        elif shape == "object":
            assert answer.json().get("object") == "error", (body, answer.text)
            assert answer.json()["code"] == 400 and answer.json()["message"], body
        assert after.status_code == 200, (body, after.text)
    rest = rest[len(bad):]
    assert rest[0][0].status_code == 405 and rest[0][1].status_code == 200
    for (path, body), (answer, after) in zip(control, rest[1:]):
        assert answer.status_code == 400 and answer.json()["object"] == "error", (path, body)
        assert after.status_code == 200


def test_weight_updates_from_disk_change_outputs_and_the_weight_version(
        loop, engine, folders, tokenizer):
    app = make_app(engine, folders, tokenizer)

    async def scenario(client):
        async def ids():
            answer = (await client.post("/generate", json=generate_body(2))).json()
            return answer["output_ids"], answer["meta_info"]["weight_version"]

        async def update(**body):
            answer = await client.post("/update_weights_from_disk", json=body)
            return answer.status_code, answer.json()
        before = await ids()
        failures = [await update(model_path=str(folders / "missing")),
                    await update(model_path=str(folders / "narrow"), weight_version="bad"),
                    await update(model_path=str(folders / "b"), load_format="pt")]
        after_failures = await ids()
        to_b = await update(model_path=str(folders / "b"), weight_version="step-1")
        on_b = await ids()
        versions = ((await client.get("/model_info")).json(),
                    (await client.get("/get_model_info")).json())
        back = await update(model_path=str(folders / "a"), weight_version="step-2")
        return before, failures, after_failures, to_b, on_b, versions, back, await ids()
    before, failures, after_failures, to_b, on_b, versions, back, on_a = serve(
        loop, app, scenario)

    assert before[1] == "default"
    for status, answer in failures:
        assert status == 400 and answer["success"] is False, answer
        assert answer["num_paused_requests"] == 0
    assert "Rolling back to original weights" in failures[0][1]["message"]
    assert "load_format 'pt' is not supported" in failures[2][1]["message"]
    assert after_failures == before
    assert to_b == (200, {"success": True, "num_paused_requests": 0, "message":
                          "Succeeded to update model weights. Weight version updated to "
                          "step-1."})
    assert on_b[1] == "step-1" and on_b[0] != before[0]
    assert versions[0] == versions[1] and versions[0]["weight_version"] == "step-1"
    assert versions[1]["model_path"] == str(folders / "b")
    assert versions[1]["weight_version"] == "step-1"
    assert back[0] == 200 and on_a == (before[0], "step-2")


@pytest.mark.parametrize("mode", ["retract", "in_place"])
def test_pause_update_continue_finishes_held_requests_under_the_new_weights(
        loop, engine, folders, tokenizer, mode):
    held = HeldEngine(engine)
    app = make_app(held, folders, tokenizer)

    async def scenario(client):
        request = asyncio.create_task(client.post("/generate", json=generate_body(4)))
        await until(lambda: held.waiting == 1)
        paused = await client.post("/pause_generation", json={"mode": mode})
        update = await client.post("/update_weights_from_disk", json={
            "model_path": str(folders / "b"), "weight_version": "b"})
        assert not request.done()
        await client.post("/continue_generation")
        held.release.set()
        answer = await request
        expected = await client.post("/generate", json=generate_body(4))
        await client.post("/update_weights_from_disk", json={"model_path": str(folders / "a")})
        return paused.json(), update.json(), answer.json(), expected.json()
    paused, update, answer, expected = serve(loop, app, scenario)
    assert paused == {"message": "Generation paused successfully.", "status": "ok"}
    # retract stopped the engine call (it reruns after continue); in_place left it running.
    assert update["success"] and update["num_paused_requests"] == (mode == "in_place")
    assert answer["meta_info"]["weight_version"] == "b"
    assert answer["output_ids"] == expected["output_ids"]  # entirely from the new weights


def test_pause_abort_ends_requests_in_flight_and_holds_new_ones_until_continue(
        loop, engine, folders, tokenizer):
    held = HeldEngine(engine)
    app = make_app(held, folders, tokenizer)

    async def scenario(client):
        running = asyncio.create_task(client.post("/generate", json=generate_body(4)))
        await until(lambda: held.waiting == 1)
        await client.post("/pause_generation")  # no body: mode "abort"
        aborted = await running
        waiting = asyncio.create_task(client.post("/generate", json=generate_body(4)))
        for _ in range(20):
            await asyncio.sleep(0.005)
        assert not waiting.done() and held.waiting == 0  # held before the engine
        health = await client.get("/health_generate")
        await client.post("/continue_generation")
        held.release.set()
        return aborted.json(), health.status_code, (await waiting).json()
    aborted, health, finished = serve(loop, app, scenario)
    assert aborted["output_ids"] == [] and aborted["meta_info"]["finish_reason"] == {
        "type": "abort", "message": "Aborted by /pause_generation", "status_code": None,
        "err_type": None}
    assert health == 503  # paused: SGLang's health check would time out
    assert finished["meta_info"]["finish_reason"]["type"] == "length"


def test_abort_request_by_rid_or_all_answers_the_requests_with_an_abort(
        loop, engine, folders, tokenizer):
    held = HeldEngine(engine)
    app = make_app(held, folders, tokenizer)

    async def scenario(client):
        one = asyncio.create_task(client.post("/generate", json=generate_body(1, rid="x")))
        two = asyncio.create_task(client.post("/generate", json=dict(
            input_ids=[PROMPT, PROMPT], rid=["y1", "y2"], sampling_params={
                "max_new_tokens": 3})))
        await until(lambda: held.waiting == 3)
        flush = await client.post("/flush_cache")
        statuses = [(await client.post("/abort_request", json=body)).status_code
                    for body in ({"rid": "unknown"}, {"rid": "x"})]
        first = await one
        statuses.append((await client.post("/abort_request", json={"abort_all": True}))
                        .status_code)
        return flush.status_code, statuses, first.json(), (await two).json()
    flush, statuses, first, second = serve(loop, app, scenario)
    assert flush == 400  # requests are running
    assert statuses == [200, 200, 200]
    assert first["meta_info"]["finish_reason"]["type"] == "abort"
    assert [o["meta_info"]["id"] for o in second] == ["y1", "y2"]
    assert all(o["meta_info"]["finish_reason"]["type"] == "abort" for o in second)


def test_health_info_sessions_and_shutdown(loop, engine, folders, tokenizer):
    app = make_app(engine, folders, tokenizer)
    service = app.state.service

    async def scenario(client):
        get = {path: await client.get(path) for path in (
            "/health", "/health_generate", "/get_model_info", "/get_server_info",
            "/model_info", "/server_info", "/flush_cache")}
        turn = dict(input_ids=PROMPT, session_id="episode",
                    sampling_params={"max_new_tokens": 4, "sampling_seed": 0})
        first = (await client.post("/generate", json=turn)).json()
        turn["input_ids"] = PROMPT + first["output_ids"] + PROMPT
        second = (await client.post("/generate", json=turn)).json()
        # The same turns through sglang-router: no session_id, its routing key header.
        routed = {"X-SMG-Routing-Key": "agentjax-session:routed"}
        del turn["session_id"]
        turn["input_ids"] = PROMPT
        await client.post("/generate", json=turn, headers=routed)
        turn["input_ids"] = PROMPT + first["output_ids"] + PROMPT
        routed_second = (await client.post("/generate", json=turn, headers=routed)).json()
        # A bare routing key only routes: no session kept.
        await client.post("/generate", json=turn, headers={"X-SMG-Routing-Key": "bare"})
        sessions = set(service.sessions)
        closed = await client.post("/close_session", json={"session_id": "episode"})
        service.shutting_down = True
        health = await client.get("/health")
        service.shutting_down = False
        return get, second, routed_second, sessions, closed.status_code, health.status_code
    get, second, routed_second, sessions, closed, health = serve(loop, app, scenario)
    assert [get[p].status_code for p in ("/health", "/health_generate", "/flush_cache")] == [
        200, 200, 200]
    assert get["/get_model_info"].json() == {
        "model_path": str(folders / "a"), "tokenizer_path": None, "is_generation": True,
        "preferred_sampling_params": None, "weight_version": "default"}
    assert get["/model_info"].json() == get["/get_model_info"].json()
    info = get["/get_server_info"].json()
    assert get["/server_info"].json().keys() == info.keys()
    assert info["context_length"] == CONTEXT and info["max_req_input_len"] == CONTEXT - 1
    assert len(info["internal_states"]) == 2 and info["version"].startswith("agentjax-")
    # The second turn of a session reuses the first turn's cache on its lane.
    assert second["meta_info"]["cached_tokens"] > 0
    assert routed_second["meta_info"]["cached_tokens"] == second["meta_info"]["cached_tokens"]
    assert routed_second["output_ids"] == second["output_ids"]
    assert sessions == {"episode", "routed"}
    assert closed == 200 and health == 503


def test_the_openai_endpoint_serves_the_engine_and_is_held_by_a_pause(
        loop, engine, folders, tokenizer):
    """/v1/chat/completions on the same engine: the tokens /generate gives the chat
    template's prompt ids for the same seed, the server's weight version, the served
    model name; a pause holds the call until continue_generation."""
    app = build_app(engine, tokenizer=tokenizer, model_path=str(folders / "a"),
                    context_length=CONTEXT, vocab_size=len(tokenizer),
                    load_params=hf_params_loader(jnp.float32), served_model_name="tiny")
    messages = [{"role": "user", "content": "Which city is the capital of France?"}]
    prompt = chat.prompt_ids(tokenizer, messages)

    async def scenario(client):
        openai_client = openai.AsyncOpenAI(base_url="http://server/v1", api_key="unused",
                                           max_retries=0, http_client=client)
        ask = dict(model="anything", messages=messages, seed=7, max_tokens=8, logprobs=True)
        reply = await openai_client.chat.completions.create(**ask)
        generated = (await client.post("/generate", json=dict(
            input_ids=prompt, return_logprob=True, sampling_params={
                "max_new_tokens": 8, "sampling_seed": 7,
                "stop_token_ids": list(stop_token_ids(tokenizer))}))).json()
        await client.post("/pause_generation", json={"mode": "abort"})
        held = asyncio.ensure_future(openai_client.chat.completions.create(**ask))
        await asyncio.sleep(0.3)
        waiting = not held.done()
        await client.post("/continue_generation")
        return reply, generated, waiting, await held, await openai_client.models.list()
    reply, generated, waiting, after_pause, models = serve(loop, app, scenario)
    ids = generated["output_ids"]
    kept = ids[:-1] if generated["meta_info"]["finish_reason"]["type"] == "stop" else ids
    assert reply.choices[0].message.content == tokenizer.decode(kept)
    assert [t.logprob for t in reply.choices[0].logprobs.content] == [
        lp for lp, _, _ in generated["meta_info"]["output_token_logprobs"]][:len(kept)]
    assert reply.usage.prompt_tokens == len(prompt) and reply.model == "tiny"
    assert reply.model_extra["agentjax"]["weight_version"] == "default"
    assert waiting and after_pause.choices[0].message.content == reply.choices[0].message.content
    assert [m.id for m in models.data] == ["tiny"]


def test_a_request_whose_client_disconnects_is_aborted(loop, engine, folders, tokenizer):
    held = HeldEngine(engine)  # never released: only the disconnect can end the request
    service = make_app(held, folders, tokenizer).state.service

    class Disconnected:
        headers: dict = {}

        async def is_disconnected(self):
            return True

    answer = loop.run(service.generate(GenerateBody.model_validate(generate_body(1)),
                                       Disconnected()))
    out = json.loads(answer.body)
    assert out["meta_info"]["finish_reason"]["type"] == "abort"
    assert out["meta_info"]["finish_reason"]["message"] == "the client disconnected"
    assert held.waiting == 0 and not service.flights


def test_lora_adapters_load_serve_and_unload_as_sglang_does(loop, engine, folders, tokenizer,
                                                            tmp_path):
    """A PEFT adapter over the served base: generation under it equals the engine's on
    the merged weights; requests must name it; unloading it brings the base back."""
    base, _ = load_hf(folders / "a")
    lora = LoraConfig(rank=2, targets=("q", "v", "down"))
    adapted = add_adapters(base, lora, seed=0)
    for pair in adapted.lora.values():  # a trained adapter: B is not zero
        pair["b"][...] = jnp.full(pair["b"].shape, 0.2, jnp.float32)
    save_peft(adapted, tmp_path / "v1", base_model=str(folders / "a"))
    merged = build_engine(folders / "a", tokenizer)
    merged.update_weights(nnx.split(fold_adapters(adapted))[1])
    app = build_app(engine, tokenizer=tokenizer, model_path=str(folders / "a"),
                    context_length=CONTEXT, vocab_size=len(tokenizer),
                    load_params=hf_params_loader(jnp.float32),
                    load_adapter=adapter_loader(jnp.float32, max_rank=4,
                                                target_modules=["all"]))

    async def scenario(client):
        async def generate(**fields):
            answer = await client.post("/generate", json=generate_body(2, **fields))
            return answer.status_code, answer.json()

        on_base = await generate()
        loaded = await client.post("/load_lora_adapter",
                                   json={"lora_name": "v1", "lora_path": str(tmp_path / "v1")})
        twice = await client.post("/load_lora_adapter",
                                  json={"lora_name": "v1", "lora_path": str(tmp_path / "v1")})
        on_adapter, unnamed = await generate(lora_path="v1"), await generate()
        unloaded = await client.post("/unload_lora_adapter", json={"lora_name": "v1"})
        return on_base, loaded, twice, on_adapter, unnamed, unloaded, await generate()
    on_base, loaded, twice, on_adapter, unnamed, unloaded, back = serve(loop, app, scenario)
    expected = loop.run(merged.generate([GenerateRequest(
        PROMPT, SamplingParams(max_new_tokens=12, seed=2))]))[0][0]
    merged.close()
    assert loaded.status_code == 200 and loaded.json() == {
        "success": True, "error_message": None,
        "loaded_adapters": {"v1": str(tmp_path / "v1")}}
    assert twice.status_code == 400 and "already loaded" in twice.json()["error_message"]
    assert on_adapter[0] == 200 and on_adapter[1]["output_ids"] == list(expected.output_ids)
    assert on_adapter[1]["output_ids"] != on_base[1]["output_ids"]
    assert unnamed[0] == 400 and "with the LoRA adapter 'v1' (name it)" in str(unnamed[1])
    assert unloaded.status_code == 200 and unloaded.json()["loaded_adapters"] == {}
    assert back[1]["output_ids"] == on_base[1]["output_ids"]
    assert back[1]["meta_info"]["output_token_logprobs"] == \
        on_base[1]["meta_info"]["output_token_logprobs"]
