"""The endpoint through the real openai client (in-process, httpx.ASGITransport): a
multi-turn tool-using conversation with a template that renders tools (Qwen2.5's) and
one that does not (the Hermes fallback of the tiny ChatML), tool calls in OpenAI's
fields, streaming assembled by the SDK into the same message, the exact prompt ids of
`models.chat` recorded per session, forced session sampling, the context bound, the
refused fields; and one call end to end on the real tiny JaxEngine."""
import asyncio
import json

import openai
import pytest

from agentjax.endpoint.app import build_app
from agentjax.endpoint.sessions import Sessions
from agentjax.engine.protocol import GenerateRequest, SamplingParams
from agentjax.models import chat
from agentjax.models.tokenizer import stop_token_ids
from tests.endpoint.fakes import WEIGHT_VERSION, ScriptedEngine, in_process
from tests.engine_fixtures import ENGINE_KWARGS
from tests.models.chat_templates import chat_tokenizer

TOOLS = [{"type": "function", "function": {
    "name": "lookup", "description": "Look a word up.",
    "parameters": {"type": "object", "properties": {"q": {"type": "string"}},
                   "required": ["q"]}}}]
CALL = '<tool_call>\n{"name": "lookup", "arguments": {"q": "fox"}}\n</tool_call>'
# The same call in Mistral's format (the template numbers no ids: models.chat does).
MISTRAL_CALL = '[TOOL_CALLS][{"name": "lookup", "arguments": {"q": "fox"}}]'
ANSWER = "The answer is 42."


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    return chat_tokenizer("qwen2.5", tmp_path_factory.mktemp("qwen"))


def agent_script(tokenizer, call=CALL):
    """Turn 1: a tool call; turn 2 (after the tool's result): the answer."""
    eot = tokenizer.decode([chat.end_of_turn_id(tokenizer)])

    def script(request):
        seen = tokenizer.decode(request.input_ids)
        return (ANSWER if "result: 42" in seen else call) + eot
    return script


def run(coroutine):
    return asyncio.run(coroutine)


@pytest.mark.parametrize("family", ["qwen2.5", "mistral", "tiny"])
def test_a_multi_turn_tool_conversation_is_answered_and_recorded_token_exactly(
        family, qwen, tokenizer, tmp_path):
    tok = {"qwen2.5": qwen, "tiny": tokenizer}.get(family) or chat_tokenizer(family, tmp_path)
    written = MISTRAL_CALL if family == "mistral" else CALL
    engine = ScriptedEngine(tok, agent_script(tok, written))
    sessions = Sessions()
    app = build_app(engine, tok, sessions=sessions, max_context=4096, model_name="policy",
                    sampling_defaults=SamplingParams(max_new_tokens=64))
    sessions.open("r1")
    client = in_process(app, "http://endpoint/sessions/r1/v1")
    messages = [{"role": "system", "content": "Use tools."},
                {"role": "user", "content": [{"type": "text", "text": "What is"},
                                             {"type": "text", "text": "the fox?"}]}]

    async def agent():
        first = await client.chat.completions.create(
            model="gpt-4o", messages=messages, tools=TOOLS, logprobs=True, temperature=0.7)
        call = first.choices[0].message.tool_calls[0]
        history = [*messages, first.choices[0].message.model_dump(exclude_none=True),
                   {"role": "tool", "tool_call_id": call.id, "content": "result: 42"}]
        second = await client.chat.completions.create(model="gpt-4o", messages=history,
                                                      tools=TOOLS)
        return first, second, history
    first, second, history = run(agent())

    [choice] = first.choices
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    [call] = choice.message.tool_calls
    assert (call.type, call.function.name, json.loads(call.function.arguments)) == (
        "function", "lookup", {"q": "fox"})
    assert call.id == chat.call_id(0, 0) and first.model == "policy"
    assert second.choices[0].message.content == ANSWER
    assert second.choices[0].finish_reason == "stop"
    assert second.choices[0].message.tool_calls is None

    calls = sessions.close("r1")
    assert len(calls) == 2 and engine.ended_sessions == ["r1"]
    # The prompts are models.chat's rendering of the same conversation, written by hand
    # in its own format (arguments as objects, the tool message named after its call).
    user = {"role": "user", "content": "What is\nthe fox?"}
    assistant = {"role": "assistant", "content": "", "tool_calls": [
        {"id": call.id, "type": "function",
         "function": {"name": "lookup", "arguments": {"q": "fox"}}}]}
    result = {"role": "tool", "tool_call_id": call.id, "name": "lookup",
              "content": "result: 42"}
    want = [chat.prompt_ids(tok, [messages[0], user], TOOLS),
            chat.prompt_ids(tok, [messages[0], user, assistant, result], TOOLS)]
    for recorded, request, completion, prompt, sent in zip(
            calls, engine.requests, engine.completions, want, [messages, history]):
        assert list(recorded.prompt_ids) == prompt == list(request.input_ids)
        assert request.session_id == "r1"
        assert list(recorded.completion_ids) == completion.output_ids
        assert list(recorded.logprobs) == completion.logprobs
        assert recorded.versions == (WEIGHT_VERSION,) * len(completion.output_ids)
        assert recorded.finish_reason == "stop" and recorded.weight_version == WEIGHT_VERSION
        assert recorded.logprob_distribution == "sampling"
        assert list(recorded.messages) == sent and list(recorded.tools) == TOOLS
    # The agent kept its history, so the second prompt extends the first call's prompt
    # and completion token-exactly (what lets a runner merge the calls into one
    # trajectory). Mistral's template moves the tools to the last user message: no.
    head = calls[0].prompt_ids + calls[0].completion_ids
    assert (calls[1].prompt_ids[:len(head)] == head) == (family != "mistral")
    # The reply's log-probs are the engine's, but for the end-of-turn token it ended on.
    content = choice.logprobs.content
    assert [t.logprob for t in content] == engine.completions[0].logprobs[:-1]
    assert "".join(t.token for t in content) == written
    assert all(bytes(t.bytes).decode() == t.token and t.top_logprobs == [] for t in content)
    assert engine.requests[0].sampling.temperature == 0.7
    assert first.usage.prompt_tokens == len(want[0])
    assert first.usage.completion_tokens == len(engine.completions[0].output_ids)


def test_a_streamed_reply_assembles_into_the_same_message(tokenizer):
    engine = ScriptedEngine(tokenizer, agent_script(tokenizer))
    app = build_app(engine, tokenizer, sessions=None, max_context=1024, model_name="policy",
                    sampling_defaults=SamplingParams(max_new_tokens=64))
    client = in_process(app)
    messages = [{"role": "user", "content": "What is the fox?"}]

    async def both():
        whole = await client.chat.completions.create(model="m", messages=messages,
                                                     tools=TOOLS, logprobs=True)
        stream = await client.chat.completions.create(
            model="m", messages=messages, tools=TOOLS, logprobs=True, stream=True,
            stream_options={"include_usage": True})
        chunks = [chunk async for chunk in stream]
        answer = await client.chat.completions.create(
            model="m", stream=True, logprobs=True, messages=[
                *messages, {"role": "assistant", "content": CALL},
                {"role": "user", "content": "result: 42"}])
        return whole, chunks, [chunk async for chunk in answer]
    whole, chunks, answer_chunks = run(both())

    calls = [c for chunk in chunks for choice in chunk.choices
             for c in choice.delta.tool_calls or ()]
    assert [(c.id, c.function.name, c.function.arguments) for c in calls] == [
        (c.id, c.function.name, c.function.arguments)
        for c in whole.choices[0].message.tool_calls]
    finishes = [choice.finish_reason for chunk in chunks for choice in chunk.choices]
    assert finishes[-1] == "tool_calls" and chunks[-1].usage.total_tokens == (
        whole.usage.total_tokens)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(choice.delta.content or "" for chunk in answer_chunks
                   for choice in chunk.choices)
    assert text == ANSWER
    logprobs = [t.logprob for chunk in answer_chunks for choice in chunk.choices
                if choice.logprobs for t in choice.logprobs.content]
    assert logprobs == engine.completions[-1].logprobs[:-1]


def test_forced_session_sampling_replaces_the_agents_and_the_reply_says_so(tokenizer):
    engine = ScriptedEngine(tokenizer, lambda request: "the quick brown fox jumps")
    forced = SamplingParams(temperature=1.0, top_p=1.0, seed=11, max_new_tokens=3)
    sessions = Sessions()
    app = build_app(engine, tokenizer, sessions=sessions, max_context=1024,
                    model_name="policy", sampling_defaults=SamplingParams(),
                    session_sampling=lambda session_id: forced if session_id == "s" else None)
    sessions.open("s")
    ask = dict(model="m", messages=[{"role": "user", "content": "hi"}], temperature=0.0,
               top_p=0.5, seed=1, max_tokens=50, stop=["zebra"])

    async def calls():
        session = await in_process(app, "http://e/sessions/s/v1").chat.completions.create(
            **ask)
        plain = await in_process(app).chat.completions.create(**ask)
        return session, plain
    session, plain = run(calls())

    used = engine.requests[0].sampling
    assert (used.temperature, used.top_p, used.seed, used.max_new_tokens, used.stop) == (
        1.0, 1.0, 11, 3, ("zebra",))
    assert session.model_extra["agentjax"]["sampling"] == {
        "temperature": 1.0, "top_p": 1.0, "top_k": -1, "seed": 11, "max_tokens": 3,
        "stop": ["zebra"]}
    assert session.choices[0].finish_reason == "length"
    assert session.usage.completion_tokens == 3
    asked = engine.requests[1].sampling  # plain serving takes what the agent asks
    assert (asked.temperature, asked.top_p, asked.seed, asked.max_new_tokens) == (
        0.0, 0.5, 1, 50)
    assert set(stop_token_ids(tokenizer)) <= set(asked.stop_token_ids)
    assert engine.requests[1].session_id is None and plain.choices[0].message.content


def test_the_context_bounds_the_prompt_and_clamps_max_tokens(tokenizer):
    engine = ScriptedEngine(tokenizer, lambda request: "the fox")
    sessions = Sessions()
    app = build_app(engine, tokenizer, sessions=sessions, max_context=64, model_name="m",
                    sampling_defaults=SamplingParams(max_new_tokens=16))
    sessions.open("s")
    client = in_process(app, "http://e/sessions/s/v1")
    short = [{"role": "user", "content": "hi"}]
    prompt = chat.prompt_ids(tokenizer, short)

    async def calls():
        reply = await client.chat.completions.create(model="m", messages=short,
                                                     max_completion_tokens=1000)
        with pytest.raises(openai.BadRequestError) as too_long:
            await client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "fox " * 200}])
        return reply, too_long.value
    reply, error = run(calls())

    assert engine.requests[0].sampling.max_new_tokens == 64 - len(prompt)
    assert reply.model_extra["agentjax"]["sampling"]["max_tokens"] == 64 - len(prompt)
    assert error.code == "context_length_exceeded" and "64 tokens" in error.message
    assert len(engine.requests) == 1 and len(sessions.close("s")) == 1


def test_continue_final_message_continues_the_assistants_open_turn(tokenizer):
    """vLLM's and SGLang's extension: the prompt is the earlier messages' with the
    generation prompt, then the open turn's ids; the reply is the continuation only."""
    engine = ScriptedEngine(tokenizer, lambda request: " Paris </answer>")
    sessions = Sessions()
    app = build_app(engine, tokenizer, sessions=sessions, max_context=512, model_name="m",
                    sampling_defaults=SamplingParams(max_new_tokens=16))
    sessions.open("s")
    question = [{"role": "user", "content": "Where is the fox?"}]
    turn = "<search> fox </search>\n\n<information>The fox is in Paris.</information>\n\n<answer>"

    async def call():
        return await in_process(app, "http://e/sessions/s/v1").chat.completions.create(
            model="m", messages=question + [{"role": "assistant", "content": turn}],
            extra_body={"continue_final_message": True})
    reply = run(call())
    assert reply.choices[0].message.content == " Paris </answer>"
    expected = (chat.prompt_ids(tokenizer, question)
                + tokenizer.encode(turn, add_special_tokens=False))
    assert engine.requests[0].input_ids == expected
    [recorded] = sessions.close("s")
    assert list(recorded.prompt_ids) == expected


@pytest.mark.parametrize("fields, param", [
    (dict(n=2), "n"),
    (dict(tool_choice="required", tools=TOOLS), "tool_choice"),
    (dict(tool_choice={"type": "function", "function": {"name": "lookup"}}, tools=TOOLS),
     "tool_choice"),
    (dict(logprobs=True, top_logprobs=2), "top_logprobs"),
    (dict(presence_penalty=0.5), "presence_penalty"),
    (dict(response_format={"type": "json_object"}), "response_format"),
    (dict(temperature=3.0), "temperature"),
    (dict(messages=[{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]),
     "messages[0].content[0]"),
    (dict(messages=[{"role": "assistant", "content": "", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{bad"}}]}]),
     "messages[0].tool_calls[0].function.arguments"),
    (dict(messages=[{"role": "tool", "content": "x"}]), "messages[0].tool_call_id"),
    (dict(extra_body={"continue_final_message": True}), "continue_final_message"),
    (dict(messages=[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "",
                     "tool_calls": [{"id": "c", "type": "function", "function": {
                         "name": "f", "arguments": "{}"}}]}],
          extra_body={"continue_final_message": True}), "continue_final_message"),
])
def test_refused_fields_are_a_400_naming_the_field(tokenizer, fields, param):
    engine = ScriptedEngine(tokenizer, lambda request: "fox")
    app = build_app(engine, tokenizer, sessions=None, max_context=512, model_name="m",
                    sampling_defaults=SamplingParams())
    request = dict(model="m", messages=[{"role": "user", "content": "hi"}]) | fields

    async def call():
        with pytest.raises(openai.BadRequestError) as refused:
            await in_process(app).chat.completions.create(**request)
        return refused.value
    error = run(call())
    assert error.status_code == 400 and error.param == param, error.message
    assert error.body["type"] == "invalid_request_error" and not engine.requests


def test_tool_choice_none_keeps_the_tools_in_the_prompt_and_reads_no_calls(qwen):
    engine = ScriptedEngine(qwen, agent_script(qwen))
    app = build_app(engine, qwen, sessions=None, max_context=2048, model_name="m",
                    sampling_defaults=SamplingParams(max_new_tokens=64))
    messages = [{"role": "user", "content": "What is the fox?"}]

    async def call():
        return await in_process(app).chat.completions.create(
            model="m", messages=messages, tools=TOOLS, tool_choice="none")
    reply = run(call())
    assert reply.choices[0].message.content == CALL
    assert reply.choices[0].message.tool_calls is None
    assert reply.choices[0].finish_reason == "stop"
    assert list(engine.requests[0].input_ids) == chat.prompt_ids(qwen, messages, TOOLS)


def test_messages_the_template_refuses_are_a_400(tmp_path):
    gemma = chat_tokenizer("gemma", tmp_path)  # its template raises on roles out of turn
    engine = ScriptedEngine(gemma, lambda request: "fox")
    app = build_app(engine, gemma, sessions=None, max_context=512, model_name="m",
                    sampling_defaults=SamplingParams())

    async def call(messages):
        return await in_process(app).chat.completions.create(model="m", messages=messages)
    with pytest.raises(openai.BadRequestError) as refused:
        run(call([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]))
    assert refused.value.param == "messages" and "alternate" in refused.value.message
    reply = run(call([{"role": "system", "content": "Be brief."},
                      {"role": "user", "content": "hi"}]))
    assert reply.choices[0].message.content == "fox" and len(engine.requests) == 1


def test_unknown_fields_are_ignored_and_models_are_listed(tokenizer):
    engine = ScriptedEngine(tokenizer, lambda request: "fox")
    app = build_app(engine, tokenizer, sessions=None, max_context=512, model_name="policy",
                    sampling_defaults=SamplingParams())

    async def calls():
        client = in_process(app)
        reply = await client.chat.completions.create(
            model="m", messages=[{"role": "developer", "content": "Be brief."},
                                 {"role": "user", "content": "hi"}],
            user="u", metadata={"k": "v"}, parallel_tool_calls=False,
            extra_body={"made_up_field": {"x": 1}})
        return reply, await client.models.list()
    reply, models = run(calls())
    assert reply.choices[0].message.content == "fox"
    assert [m.id for m in models.data] == ["policy"]
    system = chat.prompt_ids(tokenizer, [{"role": "system", "content": "Be brief."},
                                         {"role": "user", "content": "hi"}])
    assert list(engine.requests[0].input_ids) == system


def test_a_call_on_the_real_jax_engine_is_its_greedy_completion(engine, tokenizer):
    """End to end on the tiny JaxEngine: the reply's ids and log-probs are what the
    engine gives the same prompt alone."""
    sessions = Sessions()
    app = build_app(engine, tokenizer, sessions=sessions,
                    max_context=ENGINE_KWARGS["max_len"], model_name="tiny",
                    sampling_defaults=SamplingParams())
    sessions.open("jax")
    messages = [{"role": "user", "content": "Which city is the capital of France?"}]

    async def call():
        return await in_process(app, "http://e/sessions/jax/v1").chat.completions.create(
            model="tiny", messages=messages, temperature=0, max_tokens=6, logprobs=True)
    reply = run(call())
    [recorded] = sessions.close("jax")

    prompt = chat.prompt_ids(tokenizer, messages)
    [[alone]] = engine.generate_sync([GenerateRequest(prompt, SamplingParams(
        temperature=0.0, max_new_tokens=6, stop_token_ids=stop_token_ids(tokenizer)))])
    assert list(recorded.prompt_ids) == prompt
    assert list(recorded.completion_ids) == alone.output_ids
    assert list(recorded.logprobs) == alone.logprobs
    assert recorded.finish_reason == alone.finish_reason
    assert recorded.logprob_distribution == "raw"
    assert len(recorded.versions) == len(alone.output_ids)
    kept = alone.output_ids[:-1] if alone.finish_reason == "stop" else alone.output_ids
    assert [t.logprob for t in reply.choices[0].logprobs.content] == alone.logprobs[:len(kept)]
    assert reply.choices[0].message.content == tokenizer.decode(kept)
