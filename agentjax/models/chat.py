"""Chat rendering with tools: OpenAI-style messages and function schemas through the
model's own chat template, for the agent loop, SFT demonstrations and a chat server.

    ids = prompt_ids(tok, messages, tools=schemas)          # system/user + tools
    ids += sampled                                           # the assistant's reply
    more, kept = turn_ids(tok, messages, [assistant, *tool_results], tools=schemas)

Messages are plain dicts: `{"role": "assistant", "content": ..., "tool_calls": [{"id":
..., "type": "function", "function": {"name": ..., "arguments": {...}}}]}` and `{"role":
"tool", "tool_call_id": ..., "name": ..., "content": ...}`; schemas are OpenAI function
schemas (`{"type": "function", "function": {"name", "description", "parameters"}}`).

What a template can do is read from the template itself (`template_traits`, probe
renderings cached per template):
  * renders_tools: a rendering with `tools=` differs from one without. A template that
    ignores tools (SmolLM2's, agentjax's tiny ChatML, a base model's) gets the Hermes
    fallback: the schemas in the system message in Qwen2.5's words (`hermes_tools_text`,
    what the `hermes` parser reads back), assistant calls written as `<tool_call>` JSON
    in the content; said once in the log per template.
  * tool_role: "tool" when the template renders a `tool` message's content; else tool
    results go back as one `user` message of `<tool_response>` blocks, as Qwen2.5 renders
    its tool messages.
  * system_role: the template renders a system message. Gemma's refuses one: a system
    message (and the fallback's tools section) then opens the first user message.
  * call_ids: the template writes the call id (Mistral's `[TOOL_RESULTS]`, 9
    alphanumerics); results must then carry the id of the call they answer.
  * prefix_preserving: appending turns leaves the rendering of earlier turns unchanged.
    Qwen3 renders an empty `<think>` block on the last assistant turn only and drops
    reasoning before the last user query; Mistral moves the tools and the system
    message to the last user message. Where it does not hold, a re-rendered history is
    not what the policy saw: the trajectory keeps the sampled tokens, and `turn_ids`
    appends only what the template renders after the assistant's end-of-turn token.

Observation ids are the rendered delta: the conversation with the new messages and the
generation prompt, cut after the end-of-turn token of the turn the policy just wrote
(counted, not searched for, so a re-rendered earlier turn cannot move the cut), never a
re-tokenized history.
"""
from __future__ import annotations

import dataclasses
import json
import logging
from typing import Any, Mapping, Sequence

import jinja2

from agentjax.models.tokenizer import end_of_turn_id, template_kwargs
from agentjax.parsers.tool_calls import ToolCall, detect_tool_parser

log = logging.getLogger(__name__)

Message = Mapping[str, Any]
ToolSchema = Mapping[str, Any]

_PROBE_TOOL = {"type": "function", "function": {
    "name": "agentjax_probe_tool", "description": "Probe.",
    "parameters": {"type": "object", "properties": {"x": {"type": "string"}},
                   "required": ["x"]}}}
# Mistral's templates refuse call ids that are not 9 alphanumerics.
_PROBE_IDS = ("agentjax1", "agentjax2")
_RESULT_MARKER = "agentjax-tool-result"
_TRAITS_ATTRIBUTE = "agentjax_template_traits"
_FALLBACK_LOGGED: set[str] = set()


@dataclasses.dataclass(frozen=True)
class TemplateTraits:
    """What a chat template does with tools (module docstring)."""

    renders_tools: bool
    tool_role: str
    system_role: bool
    call_ids: bool
    prefix_preserving: bool


def render(tokenizer, messages: Sequence[Message], *, add_generation_prompt: bool,
           tools: Sequence[ToolSchema] | None = None) -> str:
    """`apply_chat_template` text with the tokenizer's template kwargs; no conversion."""
    if not tokenizer.chat_template:
        raise ValueError("tokenizer has no chat_template")
    return tokenizer.apply_chat_template(
        [dict(m) for m in messages], tools=list(tools) if tools else None, tokenize=False,
        add_generation_prompt=add_generation_prompt, **template_kwargs(tokenizer))


def _probe(tokenizer, messages, **kwargs) -> str | None:
    try:
        return render(tokenizer, messages, add_generation_prompt=False, **kwargs)
    except Exception:  # noqa: BLE001 - a template refusing a probe is the answer
        return None


def _call(call_id: str, name: str = "agentjax_probe_tool", arguments=None) -> dict:
    return {"id": call_id, "type": "function",
            "function": {"name": name, "arguments": dict(arguments or {"x": "y"})}}


def template_traits(tokenizer) -> TemplateTraits:
    """The tool traits of the tokenizer's template (module docstring), cached on it."""
    key = (tokenizer.chat_template, repr(sorted(template_kwargs(tokenizer).items())))
    cached = getattr(tokenizer, _TRAITS_ATTRIBUTE, None)
    if cached is not None and cached[0] == key:
        return cached[1]
    user = {"role": "user", "content": "q"}
    plain = _probe(tokenizer, [user])
    with_tools = _probe(tokenizer, [user], tools=[_PROBE_TOOL])
    renders_tools = bool(with_tools and with_tools != plain
                         and "agentjax_probe_tool" in with_tools)

    def answered(call_id):
        return _probe(tokenizer, [user, {"role": "assistant", "content": "",
                                         "tool_calls": [_call(call_id)]},
                                  {"role": "tool", "tool_call_id": call_id,
                                   "name": "agentjax_probe_tool", "content": _RESULT_MARKER}])

    first, second = answered(_PROBE_IDS[0]), answered(_PROBE_IDS[1])
    tool_role = "tool" if first is not None and _RESULT_MARKER in first else "user"
    call_ids = bool(first and _PROBE_IDS[0] in first and second != first)
    system = _probe(tokenizer, [{"role": "system", "content": _RESULT_MARKER}, user])
    system_role = bool(system and _RESULT_MARKER in system)
    traits = TemplateTraits(renders_tools, tool_role, system_role, call_ids, True)
    traits = dataclasses.replace(traits, prefix_preserving=_keeps_prefix(tokenizer, traits))
    setattr(tokenizer, _TRAITS_ATTRIBUTE, (key, traits))
    return traits


def _keeps_prefix(tokenizer, traits: TemplateTraits) -> bool:
    """Whether a probe conversation renders its earlier turns the same once a tool result
    and once a new user message follow the assistant turn (a think block and a call in
    it, where templates rewrite earlier turns)."""
    tools = [_PROBE_TOOL]
    history = [{"role": "user", "content": "q"},
               {"role": "assistant", "content": "<think>\nr\n</think>\n\na",
                "tool_calls": [_call(_PROBE_IDS[0])]}]
    result = {"role": "tool", "tool_call_id": _PROBE_IDS[0], "name": "agentjax_probe_tool",
              "content": "b"}
    follow_ups = ([result], [result, {"role": "assistant", "content": "c"},
                             {"role": "user", "content": "d"}])
    eot = tokenizer.convert_ids_to_tokens(end_of_turn_id(tokenizer))
    try:
        for more in follow_ups:
            before = _render_converted(tokenizer, history, False, tools, traits)
            after = _render_converted(tokenizer, history + more, True, tools, traits)
            if not _prefix_kept(before, after, eot):
                return False
    except Exception:  # noqa: BLE001 - a template that cannot render the probe
        return False
    return True


def _prefix_kept(before: str, after: str, eot: str) -> bool:
    end = before.rfind(eot) + len(eot)
    return after[:end] == before[:end]


def tool_parser_for(tokenizer) -> str:
    """The tool-call parser of replies to prompts this module renders: "hermes" where the
    template does not render tools (the Hermes fallback asks for hermes calls), else the
    parser named after the template's format (`parsers.tool_calls.detect_tool_parser`)."""
    if not template_traits(tokenizer).renders_tools:
        return "hermes"
    return detect_tool_parser(tokenizer)


def call_id(turn: int, index: int) -> str:
    """The id of a call whose format carries none: 9 alphanumerics, unique in a
    conversation of up to 100 turns (Mistral's templates refuse any other shape; the
    others ignore ids)."""
    return f"call{turn % 100:02d}{index % 1000:03d}"


def tool_calls(calls: Sequence[ToolCall], *, turn: int) -> list[dict[str, Any]]:
    """A parsed turn's calls as an assistant message's `tool_calls` (arguments as
    objects, as chat templates take them), each with the parser's id or `call_id`."""
    return [{"id": call.id or call_id(turn, index), "type": "function",
             "function": {"name": call.name, "arguments": dict(call.arguments)}}
            for index, call in enumerate(calls)]


# --------------------------------------------------------------- conversion for a template

def hermes_tools_text(tools: Sequence[ToolSchema]) -> str:
    """The tools section of the Hermes fallback, in Qwen2.5's template's own words (the
    format the `hermes` parser reads)."""
    schemas = "".join("\n" + json.dumps(t, ensure_ascii=False) for t in tools)
    return ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
            "You are provided with function signatures within <tools></tools> XML tags:\n"
            f"<tools>{schemas}\n</tools>\n\nFor each function call, return a json object "
            "with function name and arguments within <tool_call></tool_call> XML tags:\n"
            '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n'
            "</tool_call>")


def hermes_call_text(call: Mapping[str, Any]) -> str:
    """One assistant tool call as Hermes text (Qwen2.5's template's rendering)."""
    function = call.get("function", call)
    arguments = function.get("arguments", {})
    if isinstance(arguments, str):
        arguments = json.loads(arguments)
    return ('<tool_call>\n{"name": "' + function["name"] + '", "arguments": '
            + json.dumps(arguments, ensure_ascii=False) + "}\n</tool_call>")


def for_template(tokenizer, messages: Sequence[Message],
                 tools: Sequence[ToolSchema] | None = None
                 ) -> tuple[list[dict], list[ToolSchema] | None]:
    """(messages, tools) as this template takes them: unchanged where it renders tools
    and tool messages; else the Hermes fallback (module docstring)."""
    return _convert(messages, tools, template_traits(tokenizer), tokenizer)


def _convert(messages, tools, traits: TemplateTraits, tokenizer=None):
    out: list[dict] = []
    previous_role = None
    for message in messages:
        message, role = dict(message), message.get("role")
        if role == "assistant" and message.get("tool_calls") and not traits.renders_tools:
            text = "\n".join(hermes_call_text(c) for c in message.pop("tool_calls"))
            content = message.get("content") or ""
            message["content"] = f"{content}\n{text}" if content else text
        if role == "tool" and traits.tool_role == "user":
            # Results of one turn: one user message of blocks, as Qwen2.5 renders them.
            block = f"<tool_response>\n{message.get('content', '')}\n</tool_response>"
            if previous_role == "tool":
                out[-1]["content"] += "\n" + block
                continue
            message = {"role": "user", "content": block}
        out.append(message)
        previous_role = role
    if tools and not traits.renders_tools:
        if tokenizer is not None and tokenizer.chat_template not in _FALLBACK_LOGGED:
            _FALLBACK_LOGGED.add(tokenizer.chat_template)
            log.warning("the chat template does not render tools: the tool schemas go into "
                        "the system message, Hermes style (tool results as %r messages)",
                        traits.tool_role)
        section = hermes_tools_text(tools)
        if out and out[0].get("role") == "system":
            out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{section}"}
        else:
            out.insert(0, {"role": "system", "content": section})
    if not traits.system_role and len(out) > 1 and out[0].get("role") == "system":
        # Gemma's convention: the system text opens the first user message.
        system = out.pop(0)
        out[0] = {**out[0], "content": f"{system['content']}\n\n{out[0].get('content') or ''}"}
    return out, (list(tools) if tools and traits.renders_tools else None)


def _render_converted(tokenizer, messages, add_generation_prompt, tools, traits) -> str:
    converted, template_tools = _convert(messages, tools, traits, tokenizer)
    return render(tokenizer, converted, add_generation_prompt=add_generation_prompt,
                  tools=template_tools)


def _encode(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def _special_texts(tokenizer) -> list[str]:
    return [t.content for t in tokenizer.added_tokens_decoder.values() if t.special]


def _clean(tokenizer, messages: Sequence[Message]) -> list[dict]:
    """Tool and user content with control-token text removed: env output is untrusted,
    a result holding `<|im_end|>` must not close the turn."""
    specials = _special_texts(tokenizer)
    out = []
    for message in messages:
        message = dict(message)
        if message.get("role") in ("tool", "user") and isinstance(message.get("content"), str):
            for token in specials:
                message["content"] = message["content"].replace(token, "")
        out.append(message)
    return out


# ------------------------------------------------------------------------------ rendering

def prompt_ids(tokenizer, messages: Sequence[Message],
               tools: Sequence[ToolSchema] | None = None) -> list[int]:
    """Token ids of `messages` (and `tools`) with the generation prompt."""
    traits = template_traits(tokenizer)
    return _encode(tokenizer, _render_converted(tokenizer, messages, True, tools, traits))


def turn_ids(tokenizer, history: Sequence[Message], turn: Sequence[Message],
             tools: Sequence[ToolSchema] | None = None) -> tuple[list[int], bool]:
    """The ids that follow the assistant turn `turn[0]` after `history`: the template's
    rendering of `turn[1:]` (tool results, a user message) and the generation prompt.

    Returns:
      (ids, prefix_kept): prefix_kept is False when the template renders the history
      differently from the prompt the policy was given (`history` with the generation
      prompt), or the assistant turn differently once `turn[1:]` follows it;
      the ids are the same either way: what follows the assistant's end-of-turn token.

    Raises:
      ValueError: `turn` does not start with an assistant message, or the template
        renders fewer end-of-turn tokens once the new messages follow.
    """
    if not turn or turn[0].get("role") != "assistant":
        raise ValueError("a turn starts with the assistant message it follows")
    traits = template_traits(tokenizer)
    eot = tokenizer.convert_ids_to_tokens(end_of_turn_id(tokenizer))
    assistant, answers = dict(turn[0]), _clean(tokenizer, turn[1:])
    try:
        before = _render_converted(tokenizer, [*history, assistant], False, tools, traits)
    except jinja2.TemplateError:
        if len(assistant.get("tool_calls") or ()) < 2:
            raise
        # Llama 3.1's template renders one call per assistant message and raises on more;
        # what follows the turn does not depend on its calls, so the turn is rendered
        # with its first call only to find where it ends.
        assistant["tool_calls"] = assistant["tool_calls"][:1]
        before = _render_converted(tokenizer, [*history, assistant], False, tools, traits)
    after = _render_converted(tokenizer, [*history, assistant, *answers], True, tools, traits)
    count = before.count(eot)
    cut = -1
    for _ in range(count):
        cut = after.find(eot, cut + 1)
        if cut < 0:
            raise ValueError(f"the chat template renders fewer {eot!r} tokens once "
                             "messages follow the assistant turn; cannot locate its end")
    cut += len(eot)
    seen = _render_converted(tokenizer, history, True, tools, traits)  # the policy's prompt
    kept = _prefix_kept(before, after, eot) and after.startswith(seen)
    return _encode(tokenizer, after[cut:]), kept


def assistant_text(tokenizer, history: Sequence[Message], assistant: Message,
                   tools: Sequence[ToolSchema] | None = None) -> str:
    """The assistant turn as the template writes it after `history`'s generation prompt,
    through its end-of-turn token: what a demonstration trains the model to write (its
    calls in the model's own format).

    The turn is cut out of the rendering of `history + [assistant]` after the last
    occurrence of the generation prompt's tail (its text from its last control token on,
    e.g. `<|im_start|>assistant\n`, `[/INST]`) before the turn's end-of-turn token, so a
    template that renders the history differently once the turn follows (Mistral drops
    the system message unless a user message is last) still gives the turn.

    Raises:
      ValueError: the rendering has no such tail or end-of-turn token.
    """
    traits = template_traits(tokenizer)
    head = _render_converted(tokenizer, history, True, tools, traits)
    full = _render_converted(tokenizer, list(history) + [assistant], False, tools, traits)
    eot = tokenizer.convert_ids_to_tokens(end_of_turn_id(tokenizer))
    end = -1
    for _ in range(head.count(eot) + 1):
        end = full.find(eot, end + 1)
        if end < 0:
            raise ValueError(f"the chat template writes no {eot!r} after the assistant turn")
    specials = [(head.rfind(t), t) for t in _special_texts(tokenizer) if t in head]
    tail = head[max(specials)[0]:] if specials else head
    start = full.rfind(tail, 0, end)
    if start < 0:
        raise ValueError("the rendered assistant turn does not follow the generation prompt")
    return full[start + len(tail):end + len(eot)]
