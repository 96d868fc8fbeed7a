"""An engine completion as an OpenAI ChatCompletion, whole or as server-sent chunks.

The reply's text is the completion decoded without its final stop token (OpenAI's
content never holds the end-of-turn token) and without a stop string that ended it
(OpenAI excludes the stop sequence); control tokens elsewhere stay, since tool-call
formats are written with them (Mistral's `[TOOL_CALLS]`, Llama's `<|python_tag|>`).
Where the request has tools, the text is read by the model's tool-call parser
(`parsers.tool_calls`): its calls become `message.tool_calls` (ids as `models.chat`
numbers them, arguments a JSON string), the text around them `message.content` (null
when empty), and finish_reason "tool_calls". A turn with no well-formed call keeps its
whole text as content, so the agent sees what the model wrote.

Log-probs (`logprobs: true`) cover the tokens of the reply, the final stop token
excluded, each `{token, logprob, bytes, top_logprobs: []}` with the token's decoded
text. A streamed reply is generated whole, then sent as chunks: the role, the content,
the tool calls, the finish reason (and the usage when asked); the openai client
assembles them into the same message.
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any, Iterator, Sequence

from agentjax.engine.protocol import Completion
from agentjax.models import chat
from agentjax.parsers.tool_calls import parse_tool_calls


@dataclasses.dataclass(frozen=True)
class Reply:
    """One assistant reply in OpenAI's fields."""

    content: str | None
    tool_calls: tuple[dict, ...]
    finish_reason: str
    logprobs: tuple[dict, ...] | None
    prompt_tokens: int
    completion_tokens: int


def visible_ids(completion: Completion, stop_ids: Sequence[int]) -> list[int]:
    """The output ids less the stop token that ended it."""
    ids = list(completion.output_ids)
    if ids and completion.finish_reason == "stop" and (
            ids[-1] in stop_ids or ids[-1] == completion.matched_stop):
        ids.pop()
    return ids


def read_completion(tokenizer, completion: Completion, *, prompt_tokens: int,
                    stop_ids: Sequence[int], parser: str | None, tools: Sequence[dict],
                    turn: int, logprobs: bool) -> Reply:
    """The reply to a completion (module docstring).

    Args:
      parser: the tool-call format to read the text with; None: no reading.
      turn: the number of assistant messages before this one (call ids are unique in a
        conversation).
    """
    ids = visible_ids(completion, stop_ids)
    text = tokenizer.decode(ids, skip_special_tokens=False)
    if isinstance(completion.matched_stop, str) and text.endswith(completion.matched_stop):
        text = text[:-len(completion.matched_stop)]
    content, calls = text, ()
    if parser is not None:
        parsed = parse_tool_calls(parser, text, tools=tools)
        if parsed.calls:
            calls = tuple({"id": call["id"], "type": "function",
                           "function": {"name": call["function"]["name"],
                                        "arguments": json.dumps(call["function"]["arguments"],
                                                                ensure_ascii=False)}}
                          for call in chat.tool_calls(parsed.calls, turn=turn))
            content = parsed.content or None
    finish = completion.finish_reason
    if calls and finish == "stop":
        finish = "tool_calls"
    tokens = None
    if logprobs:
        tokens = tuple(_token_logprob(tokenizer, token, logprob)
                       for token, logprob in zip(ids, completion.logprobs))
    return Reply(content, calls, finish, tokens, prompt_tokens, len(completion.output_ids))


def _token_logprob(tokenizer, token: int, logprob: float) -> dict[str, Any]:
    text = tokenizer.decode([token], skip_special_tokens=False)
    return {"token": text, "logprob": float(logprob), "bytes": list(text.encode("utf-8")),
            "top_logprobs": []}


def _usage(reply: Reply) -> dict[str, int]:
    return {"prompt_tokens": reply.prompt_tokens,
            "completion_tokens": reply.completion_tokens,
            "total_tokens": reply.prompt_tokens + reply.completion_tokens}


def completion_json(reply: Reply, *, completion_id: str, created: int, model: str,
                    extra: dict[str, Any]) -> dict[str, Any]:
    """The `chat.completion` object; `extra` goes under the key "agentjax"."""
    message: dict[str, Any] = {"role": "assistant", "content": reply.content}
    if reply.tool_calls:
        message["tool_calls"] = list(reply.tool_calls)
    return {"id": completion_id, "object": "chat.completion", "created": created,
            "model": model, "system_fingerprint": None,
            "choices": [{"index": 0, "message": message,
                         "logprobs": None if reply.logprobs is None
                         else {"content": list(reply.logprobs), "refusal": None},
                         "finish_reason": reply.finish_reason}],
            "usage": _usage(reply), "agentjax": extra}


def completion_chunks(reply: Reply, *, completion_id: str, created: int, model: str,
                      include_usage: bool, extra: dict[str, Any]) -> Iterator[str]:
    """The `chat.completion.chunk` events of a reply, as server-sent event lines, ending
    with `data: [DONE]`."""
    def event(delta: dict | None, *, finish: str | None = None, logprobs=None,
              usage: dict | None = None, **more) -> str:
        chunk = {"id": completion_id, "object": "chat.completion.chunk", "created": created,
                 "model": model, "system_fingerprint": None,
                 "choices": [] if delta is None else [
                     {"index": 0, "delta": delta, "logprobs": logprobs,
                      "finish_reason": finish}], **more}
        if include_usage:  # null on every chunk but the last, as OpenAI sends them
            chunk["usage"] = usage
        return f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n"

    yield event({"role": "assistant", "content": ""})
    if reply.content:
        logprobs = None if reply.logprobs is None else {"content": list(reply.logprobs),
                                                        "refusal": None}
        yield event({"content": reply.content}, logprobs=logprobs)
    if reply.tool_calls:
        yield event({"tool_calls": [{"index": i, **call}
                                    for i, call in enumerate(reply.tool_calls)]})
    yield event({}, finish=reply.finish_reason, agentjax=extra)
    if include_usage:
        yield event(None, usage=_usage(reply))
    yield "data: [DONE]\n\n"
