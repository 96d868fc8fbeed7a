"""A minimal stand-in of the endpoint's app (agentjax/endpoint `build_app`), for these
tests only until the endpoint lands: POST /sessions/{id}/v1/chat/completions rendered with
the chat template, sampled by the engine under the session's sampling, the reply's tool
calls read by the template's parser, each call recorded in the session."""
from __future__ import annotations

import dataclasses
import json
import time

import fastapi

from agentjax.endpoint.sessions import RecordedCall
from agentjax.engine.protocol import GenerateRequest
from agentjax.models import chat
from agentjax.models.tokenizer import end_of_turn_id
from agentjax.parsers.tool_calls import parse_tool_calls


def _template_message(message: dict) -> dict:
    """An OpenAI message as chat templates take it (call arguments as objects)."""
    message = {k: v for k, v in message.items() if v is not None}
    if message.get("tool_calls"):
        message["tool_calls"] = [
            {**call, "function": {**call["function"],
                                  "arguments": json.loads(call["function"]["arguments"])}}
            for call in message["tool_calls"]]
    if isinstance(message.get("content"), list):  # content parts: their text
        message["content"] = "".join(part.get("text", "") for part in message["content"])
    return message


def build_standin_app(engine, tokenizer, *, sessions, sampling_defaults, max_context,
                      model_name, session_sampling=None, tool_parser="auto"):
    app = fastapi.FastAPI()
    parser = chat.tool_parser_for(tokenizer) if tool_parser == "auto" else tool_parser
    eot = end_of_turn_id(tokenizer)

    @app.get("/sessions/{session_id}/v1/models")
    async def models(session_id: str):
        return {"object": "list", "data": [{"id": model_name, "object": "model",
                                            "created": 0, "owned_by": "agentjax"}]}

    @app.post("/sessions/{session_id}/v1/chat/completions")
    async def completions(session_id: str, body: dict):
        messages = [_template_message(m) for m in body["messages"]]
        tools = body.get("tools") or None
        schemas = [t["function"] for t in tools] if tools else None
        prompt = chat.prompt_ids(tokenizer, messages, tools)
        sampling = (session_sampling and session_sampling(session_id)) or sampling_defaults
        room = max_context - len(prompt)
        if room <= 0:
            raise fastapi.HTTPException(400, "the prompt fills the context")
        sampling = dataclasses.replace(sampling, max_new_tokens=min(sampling.max_new_tokens,
                                                                    room))
        [[completion]] = await engine.generate(
            [GenerateRequest(tuple(prompt), sampling=sampling, session_id=session_id)])
        ids = list(completion.output_ids)
        text = tokenizer.decode([t for t in ids if t != eot], skip_special_tokens=False)
        parsed = parse_tool_calls(parser, text, tools=schemas) if tools else None
        try:
            sessions.record(session_id, RecordedCall(
                tuple(prompt), tuple(ids), tuple(completion.logprobs),
                tuple(completion.meta.get("token_versions", ())), completion.finish_reason,
                completion.meta.get("weight_version", 0), tuple(body["messages"]),
                tuple(tools or ()), completion.meta.get("logprob_distribution", "sampling")))
        except KeyError:
            raise fastapi.HTTPException(404, f"session {session_id!r} is not open") from None
        message = {"role": "assistant", "content": parsed.content if parsed else text}
        finish = {"stop": "stop", "length": "length"}.get(completion.finish_reason, "stop")
        if parsed and parsed.calls:
            message["tool_calls"] = [
                {"id": f"call_{i}_{len(prompt)}", "type": "function",
                 "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
                for i, c in enumerate(parsed.calls)]
            finish = "tool_calls"
        return {"id": f"chatcmpl-{len(prompt)}", "object": "chat.completion",
                "created": int(time.time()), "model": model_name,
                "choices": [{"index": 0, "message": message, "finish_reason": finish,
                             "logprobs": None}],
                "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(ids),
                          "total_tokens": len(prompt) + len(ids)}}

    return app
