"""An OpenAI chat-completion request body in, what the endpoint renders and samples out.

What is honoured (the OpenAI API reference's names):
  messages      roles system, developer (rendered as system, as OpenAI maps it for
                older models), user, assistant (content and/or tool_calls, arguments a
                JSON string or an object) and tool (tool_call_id; its function name is
                filled in from the call it answers, for templates that render it);
                content a string or a list of {"type": "text"} parts (joined with
                newlines, as vLLM joins them); an assistant's null content is "".
  tools         {"type": "function", "function": {"name", "description", "parameters"}}
  tool_choice   "auto" (the default) and "none" (the tools stay in the prompt, so a
                conversation renders the same either way; the reply is not read for
                calls). "required" and a named function would need constrained
                decoding: refused with a 400 naming `tool_choice`.
  sampling      temperature, top_p, top_k (vLLM's and SGLang's extension), seed,
                max_completion_tokens (or max_tokens, its older name), stop (a string or
                a list), n (1 only), logprobs (the sampled token's; top_logprobs above 0
                is refused: the engine reports no alternatives), stream and
                stream_options.include_usage.
  continue_final_message
                vLLM's and SGLang's extension (sent in the OpenAI client's extra_body):
                the last message is the assistant's, left open, and the reply continues
                its text. Its prompt is the earlier messages' with the generation prompt,
                then that text's ids: what an agent that writes the observations into
                the assistant's own turn (Search-R1) extends call after call.
  refused       presence_penalty, frequency_penalty other than 0, a logit_bias, a
                response_format other than text, image or audio parts: silently ignoring
                them would change what the agent gets without telling it.
  ignored       every other field (model, user, metadata, store, parallel_tool_calls,
                service_tier, ...), as OpenAI-compatible servers (vLLM, SGLang) ignore
                what they do not implement; the reply names the served model.
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any

import pydantic

from agentjax.parsers.actions import exceeds_depth, load_json

ROLES = ("system", "developer", "user", "assistant", "tool")
# A chat request nests some ten levels, a tool's parameter schema a few more; deeper is
# an attack on whatever walks it recursively (pydantic, jinja's tojson, json.dumps).
MAX_REQUEST_DEPTH = 64
TOOL_CHOICES = ("auto", "none")


class ApiError(Exception):
    """An error answered in OpenAI's shape: `{"error": {"message", "type", "param",
    "code"}}` with HTTP `status`."""

    def __init__(self, message: str, *, status: int = 400, param: str | None = None,
                 code: str | None = None):
        super().__init__(message)
        self.message, self.status, self.param, self.code = message, status, param, code

    @property
    def type(self) -> str:
        return "invalid_request_error" if self.status < 500 else "server_error"

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}


class _Body(pydantic.BaseModel):
    """The fields read; extra ones are ignored (module docstring)."""

    model_config = pydantic.ConfigDict(extra="ignore")

    messages: list[dict[str, Any]] = pydantic.Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    temperature: float | None = pydantic.Field(None, ge=0, le=2)
    top_p: float | None = pydantic.Field(None, gt=0, le=1)
    top_k: int | None = pydantic.Field(None, ge=-1)
    max_tokens: int | None = pydantic.Field(None, ge=1)
    max_completion_tokens: int | None = pydantic.Field(None, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = pydantic.Field(None, ge=-2**63, lt=2**63)
    n: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = pydantic.Field(None, ge=0, le=20)
    stream: bool | None = None
    stream_options: dict[str, Any] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, Any] | None = None
    response_format: dict[str, Any] | None = None
    continue_final_message: bool | None = None


@dataclasses.dataclass(frozen=True)
class ChatRequest:
    """One parsed request.

    Attributes:
      messages: the messages as sent (what a session records).
      template_messages: the messages as chat.prompt_ids takes them (module docstring).
      tools: the tool schemas as sent (() when none).
      parse_calls: whether the reply is read for tool calls (tools given, tool_choice
        not "none").
      temperature, top_p, top_k, seed, max_tokens: None where the request is silent.
      stop: the stop strings.
      logprobs: whether the reply carries the sampled tokens' log-probs.
      stream: answer as server-sent chunks.
      include_usage: a streamed answer ends with a usage chunk.
      continue_final: the reply continues the last (assistant) message's text.
    """

    messages: tuple[dict, ...]
    template_messages: tuple[dict, ...]
    tools: tuple[dict, ...]
    parse_calls: bool
    temperature: float | None
    top_p: float | None
    top_k: int | None
    seed: int | None
    max_tokens: int | None
    stop: tuple[str, ...]
    logprobs: bool
    stream: bool
    include_usage: bool
    continue_final: bool = False

    def text_size(self) -> int:
        """Characters of message text and tool schemas: every one of them is rendered
        into the prompt, so it bounds the prompt's tokens from below."""
        return (sum(len(m.get("content") or "") for m in self.template_messages)
                + sum(len(json.dumps(t)) for t in self.tools))


def parse_chat_request(raw: bytes) -> ChatRequest:
    """The request in a body (module docstring).

    Raises:
      ApiError: the body is not JSON, not an object, or a field is invalid or refused;
        the message and `param` name the field.
    """
    try:
        data = json.loads(raw)
    except RecursionError:
        data = None  # nested past the interpreter's recursion limit: refused below
    except ValueError as error:  # not JSON, not UTF-8, an integer too long to convert
        raise ApiError(f"the request body is not valid JSON: {error}") from None
    if data is None or exceeds_depth(data, MAX_REQUEST_DEPTH):
        raise ApiError(f"the request body nests deeper than {MAX_REQUEST_DEPTH} levels")
    if not isinstance(data, dict):
        raise ApiError("the request body must be a JSON object")
    try:
        body = _Body.model_validate(data)
    except pydantic.ValidationError as error:
        first = error.errors()[0]
        where = ".".join(map(str, first["loc"]))
        raise ApiError(f"{where}: {first['msg']}", param=where) from None
    _refuse_unsupported(body)
    tools = tuple(_tool(tool, f"tools[{i}]") for i, tool in enumerate(body.tools or ()))
    choice = body.tool_choice if body.tool_choice is not None else "auto"
    stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or ())
    if any(not s for s in stop):
        raise ApiError("stop strings must not be empty", param="stop")
    options = body.stream_options or {}
    last = body.messages[-1]
    if body.continue_final_message and (last.get("role") != "assistant"
                                        or last.get("tool_calls")):
        raise ApiError("continue_final_message continues the last message, which must be "
                       "the assistant's, without tool calls", param="continue_final_message")
    return ChatRequest(
        messages=tuple(body.messages), template_messages=tuple(_messages(body.messages)),
        tools=tools, parse_calls=bool(tools) and choice == "auto",
        temperature=body.temperature, top_p=body.top_p,
        top_k=None if body.top_k in (None, 0) else body.top_k, seed=body.seed,
        max_tokens=body.max_completion_tokens or body.max_tokens, stop=tuple(stop),
        logprobs=bool(body.logprobs), stream=bool(body.stream),
        include_usage=bool(body.stream and options.get("include_usage")),
        continue_final=bool(body.continue_final_message))


def _refuse_unsupported(body: _Body) -> None:
    if body.n not in (None, 1):
        raise ApiError("n must be 1: one completion per call (make n calls for n samples)",
                       param="n", code="unsupported_parameter")
    if body.tool_choice is not None and body.tool_choice not in TOOL_CHOICES:
        raise ApiError(f"tool_choice {body.tool_choice!r} is not supported: only \"auto\" "
                       "and \"none\" (forcing a call needs constrained decoding, which "
                       "this server does not do)", param="tool_choice",
                       code="unsupported_parameter")
    if body.top_logprobs:
        raise ApiError("top_logprobs must be 0: the engine reports the sampled token's "
                       "log-prob only", param="top_logprobs", code="unsupported_parameter")
    for name in ("presence_penalty", "frequency_penalty"):
        if getattr(body, name):
            raise ApiError(f"{name} is not supported (0 only)", param=name,
                           code="unsupported_parameter")
    if body.logit_bias:
        raise ApiError("logit_bias is not supported", param="logit_bias",
                       code="unsupported_parameter")
    if body.response_format and body.response_format.get("type") != "text":
        raise ApiError("response_format other than text is not supported (no constrained "
                       "decoding)", param="response_format", code="unsupported_parameter")


def _tool(tool: dict, where: str) -> dict:
    function = tool.get("function")
    if tool.get("type") != "function" or not isinstance(function, dict):
        raise ApiError(f"{where} must be {{\"type\": \"function\", \"function\": {{...}}}}",
                       param=where)
    if not isinstance(function.get("name"), str) or not function["name"]:
        raise ApiError(f"{where}.function.name must be a non-empty string",
                       param=f"{where}.function.name")
    if not isinstance(function.get("parameters", {}), dict):
        raise ApiError(f"{where}.function.parameters must be a JSON schema object",
                       param=f"{where}.function.parameters")
    return tool


def _text(content: Any, where: str, *, optional: bool) -> str:
    """A message's content as text: a string, or text parts joined with newlines."""
    if content is None and optional:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or \
                    not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise ApiError(f"{where}.content[{j}]: only text parts are supported "
                               f"(got {kind!r})", param=f"{where}.content[{j}]")
            texts.append(part["text"])
        return "\n".join(texts)
    raise ApiError(f"{where}.content must be a string or a list of text parts",
                   param=f"{where}.content")


def _call(call: Any, where: str) -> dict:
    """An assistant's tool call with its arguments as an object (what templates take)."""
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise ApiError(f"{where} must be {{\"id\", \"type\": \"function\", \"function\": "
                       "{\"name\", \"arguments\"}}", param=where)
    if not isinstance(call.get("id"), str):
        raise ApiError(f"{where}.id must be a string", param=f"{where}.id")
    arguments = function.get("arguments") or {}
    if isinstance(arguments, str):
        arguments, why = load_json(arguments)
        if why is not None:
            raise ApiError(f"{where}.function.arguments is not valid JSON: {why}",
                           param=f"{where}.function.arguments")
    if not isinstance(arguments, dict):
        raise ApiError(f"{where}.function.arguments must be a JSON object",
                       param=f"{where}.function.arguments")
    return {"id": call["id"], "type": "function",
            "function": {"name": function["name"], "arguments": arguments}}


def _messages(messages: list[dict]) -> list[dict]:
    names: dict[str, str] = {}  # call id -> function name, for the tool messages
    out = []
    for i, message in enumerate(messages):
        where, role = f"messages[{i}]", message.get("role")
        if role not in ROLES:
            raise ApiError(f"{where}.role {role!r} is not one of {', '.join(ROLES)}",
                           param=f"{where}.role")
        converted = {"role": "system" if role == "developer" else role,
                     "content": _text(message.get("content"), where,
                                      optional=role == "assistant")}
        if role == "assistant":
            calls = message.get("tool_calls") or []
            if not isinstance(calls, list):
                raise ApiError(f"{where}.tool_calls must be a list",
                               param=f"{where}.tool_calls")
            if calls:
                converted["tool_calls"] = [_call(c, f"{where}.tool_calls[{j}]")
                                           for j, c in enumerate(calls)]
                names.update((c["id"], c["function"]["name"])
                             for c in converted["tool_calls"])
            if isinstance(message.get("reasoning_content"), str):
                converted["reasoning_content"] = message["reasoning_content"]
        if role == "tool":
            call_id = message.get("tool_call_id")
            if not isinstance(call_id, str):
                raise ApiError(f"{where}.tool_call_id must be a string",
                               param=f"{where}.tool_call_id")
            converted["tool_call_id"] = call_id
            name = message.get("name") or names.get(call_id)
            if isinstance(name, str):
                converted["name"] = name
        out.append(converted)
    return out
