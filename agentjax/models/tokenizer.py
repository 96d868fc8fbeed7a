"""Tokenizers and chat-template helpers for token-in/token-out agent loops.

    tok = load_tokenizer("ckpt/", template_kwargs={"enable_thinking": False})
    tok = build_tokenizer(texts, vocab_size=512)         # tiny ChatML BPE, deterministic
    ids = prompt_ids(tok, [{"role": "user", "content": q}])        # ends with the
                                                                   # assistant header
    ids += generated                        # ends with end_of_turn_id(tok)
    ids += observation_ids(tok, "Doc 1 ...", role="tool")   # tool turn + next header

Everything about turns is read from the chat template itself, never from the eos token
(Qwen2.5/Qwen3 base models have eos `<|endoftext|>` while their template ends every turn
with `<|im_end|>`): `end_of_turn_id` renders a dummy assistant turn and takes the first
control token after its content; `observation_ids` renders the dummy conversation plus
the new turn with the generation prompt and takes everything after that end-of-turn
token: exactly the ids the template produces, without re-tokenizing any past turn (past
turns are the ids already in the trajectory; see its docstring for templates that
re-render earlier turns).

`build_tokenizer` trains a byte-level BPE (the `tokenizers` library) on given texts.
Control tokens of the chosen chat style are special tokens; `special_tokens` (agent tags
such as `<search>`) are added as single, non-special tokens so that decoding keeps them
and the engine can stop on their ids.
"""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

AGENT_TAGS = ("<think>", "</think>", "<search>", "</search>", "<answer>", "</answer>",
              "<information>", "</information>", "<tool_call>", "</tool_call>")

Message = Mapping[str, str]


@dataclasses.dataclass(frozen=True)
class ChatStyle:
    """Control tokens and Jinja chat template of one chat format.

    Attributes:
      control_tokens: special tokens of the format (ids 0..n-1 in a built tokenizer).
      eos_token: end-of-turn token, also the tokenizer's eos.
      pad_token: padding token.
      bos_token: beginning-of-text token or None.
      template: Jinja chat template (HF `chat_template`).
    """

    control_tokens: tuple[str, ...]
    eos_token: str
    pad_token: str
    bos_token: str | None
    template: str


CHAT_STYLES = {
    # Qwen-style ChatML.
    "chatml": ChatStyle(
        control_tokens=("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
        eos_token="<|im_end|>", pad_token="<|endoftext|>", bos_token=None,
        template=(
            "{%- for message in messages %}"
            "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
            "{%- endfor %}"
            "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"),
    ),
    # Llama 3 instruct layout (headers, <|eot_id|> ends a turn, content trimmed).
    "llama3": ChatStyle(
        control_tokens=("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                        "<|end_header_id|>", "<|eot_id|>"),
        eos_token="<|eot_id|>", pad_token="<|end_of_text|>", bos_token="<|begin_of_text|>",
        template=(
            "{{- bos_token }}"
            "{%- for message in messages %}"
            "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"
            " + message['content'] | trim + '<|eot_id|>' }}"
            "{%- endfor %}"
            "{%- if add_generation_prompt %}"
            "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"),
    ),
}


def build_tokenizer(texts: Iterable[str], *, vocab_size: int,
                    special_tokens: Sequence[str] = AGENT_TAGS,
                    style: str = "chatml") -> PreTrainedTokenizerFast:
    """Trains a byte-level BPE tokenizer deterministically on `texts`.

    Args:
      texts: training corpus (e.g. the synthetic world's documents and questions).
      vocab_size: total vocabulary size including control and extra tokens (the BPE
        stops earlier if the corpus has fewer merges).
      special_tokens: extra tokens kept whole (e.g. agent tags), appended after the
        BPE vocabulary as non-special tokens.
      style: chat format, a key of CHAT_STYLES ("chatml" or "llama3").

    Returns:
      A transformers PreTrainedTokenizerFast with eos/pad(/bos) and chat_template set.
    """
    if style not in CHAT_STYLES:
        raise ValueError(f"unknown chat style {style!r}; choose from {sorted(CHAT_STYLES)}")
    chat = CHAT_STYLES[style]
    extra = [t for t in dict.fromkeys(special_tokens) if t not in chat.control_tokens]
    bpe_size = vocab_size - len(extra)
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    if bpe_size < len(chat.control_tokens) + len(alphabet):
        raise ValueError(
            f"vocab_size={vocab_size} is too small: byte alphabet ({len(alphabet)}), "
            f"control tokens ({len(chat.control_tokens)}) and extra tokens ({len(extra)}) "
            "need more")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=bpe_size, special_tokens=list(chat.control_tokens),
                                  initial_alphabet=alphabet, show_progress=False)
    # Sorted input keeps the merges independent of the caller's order.
    tokenizer.train_from_iterator(sorted(texts), trainer=trainer)
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in extra])
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, eos_token=chat.eos_token, pad_token=chat.pad_token,
        bos_token=chat.bos_token, chat_template=chat.template)


# Arguments `apply_chat_template` takes itself; template kwargs must not shadow them.
_RENDER_ARGUMENTS = frozenset({"conversation", "messages", "add_generation_prompt", "tokenize",
                               "continue_final_message", "chat_template", "return_dict"})
# Where `set_template_kwargs` keeps the kwargs on the tokenizer object, so that every
# rendering (prompts, observations, demonstrations, evaluation) uses the same ones.
_TEMPLATE_KWARGS_ATTRIBUTE = "agentjax_template_kwargs"
_END_OF_TURN_ATTRIBUTE = "agentjax_end_of_turn"  # (template and variables, token id)
# Content of the dummy assistant turn whose rendering locates the end-of-turn token.
_ASSISTANT_MARKER = "agentjax-assistant-turn"


def load_tokenizer(path: str | os.PathLike, *,
                   template_kwargs: Mapping[str, Any] | None = None) -> PreTrainedTokenizerFast:
    """Loads a local HF tokenizer folder: the Hub's transformers-4 layout (chat template
    inside tokenizer_config.json) or transformers 5's (chat_template.jinja).

    Args:
      path: the folder; `tokenizer.name_or_path` keeps it, and `models.hf.save_hf`
        copies its files into exports.
      template_kwargs: extra variables of every chat-template rendering, e.g.
        {"enable_thinking": False} for Qwen3 (`set_template_kwargs`).

    Raises:
      FileNotFoundError: the folder has no tokenizer.json.
    """
    path = Path(path)
    if not (path / "tokenizer.json").exists():
        raise FileNotFoundError(f"{path / 'tokenizer.json'} not found")
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(path))
    return set_template_kwargs(tokenizer, template_kwargs or {})


def set_template_kwargs(tokenizer: PreTrainedTokenizerFast,
                        kwargs: Mapping[str, Any]) -> PreTrainedTokenizerFast:
    """Makes `kwargs` extra variables of every chat-template rendering of `tokenizer`
    (`prompt_ids`, `observation_ids`, `end_of_turn_id`); returns the tokenizer.

    Raises:
      ValueError: kwargs is not a mapping with string keys, or a key is an argument of
        `apply_chat_template` itself (add_generation_prompt, tokenize, ...).
    """
    if not isinstance(kwargs, Mapping) or not all(isinstance(k, str) for k in kwargs):
        raise ValueError(f"template kwargs must map names to values, got {kwargs!r}")
    clashes = sorted(_RENDER_ARGUMENTS & set(kwargs))
    if clashes:
        raise ValueError(f"template kwargs {clashes} are set by the renderer itself")
    setattr(tokenizer, _TEMPLATE_KWARGS_ATTRIBUTE, dict(kwargs))
    return tokenizer


def template_kwargs(tokenizer: PreTrainedTokenizerFast) -> dict[str, Any]:
    """The extra chat-template variables set on `tokenizer` ({} when none)."""
    return dict(getattr(tokenizer, _TEMPLATE_KWARGS_ATTRIBUTE, {}))


def _render(tokenizer: PreTrainedTokenizerFast, messages: Sequence[Message],
            add_generation_prompt: bool) -> str:
    if not tokenizer.chat_template:
        raise ValueError("tokenizer has no chat_template")
    return tokenizer.apply_chat_template(list(messages), tokenize=False,
                                         add_generation_prompt=add_generation_prompt,
                                         **template_kwargs(tokenizer))


def _encode(tokenizer: PreTrainedTokenizerFast, text: str) -> list[int]:
    # Templates write bos/eos themselves.
    return tokenizer.encode(text, add_special_tokens=False)


def prompt_ids(tokenizer: PreTrainedTokenizerFast, messages: Sequence[Message]) -> list[int]:
    """Token ids of `messages` rendered with the generation prompt (the assistant header
    the model continues from, `<think>\\n\\n</think>\\n\\n` included where the template
    adds it).

    Args:
      tokenizer: HF tokenizer with a chat template (template kwargs: `set_template_kwargs`).
      messages: [{"role": ..., "content": ...}, ...].
    """
    return _encode(tokenizer, _render(tokenizer, messages, add_generation_prompt=True))


def _special_texts(tokenizer: PreTrainedTokenizerFast) -> list[str]:
    return [t.content for t in tokenizer.added_tokens_decoder.values() if t.special]


def _dummy_history() -> list[dict[str, str]]:
    return [{"role": "user", "content": "q"}, {"role": "assistant", "content": _ASSISTANT_MARKER}]


def _assistant_turn_end(tokenizer: PreTrainedTokenizerFast, text: str) -> tuple[int, str]:
    """(index just past the end-of-turn token, its text): the first control token after
    the dummy assistant content in a rendering of `_dummy_history()` (+ more turns)."""
    start = text.find(_ASSISTANT_MARKER)
    if start < 0:
        raise ValueError("the chat template does not render the assistant's content; "
                         "cannot locate the end of an assistant turn")
    after = start + len(_ASSISTANT_MARKER)
    found = [(text.find(token, after), -len(token), token)
             for token in _special_texts(tokenizer) if token in text[after:]]
    if not found:
        raise ValueError("no control (special) token follows the assistant's content in "
                         "the rendered chat template: it has no end-of-turn token")
    position, _, token = min(found)
    return position + len(token), token


def end_of_turn_id(tokenizer: PreTrainedTokenizerFast) -> int:
    """The token that ends an assistant turn, read from the chat template: the first
    control token the template writes after an assistant message's content
    (`<|im_end|>` for ChatML and every Qwen2.5 / Qwen3 model, base models included
    although their eos is `<|endoftext|>`; `<|eot_id|>` for Llama 3).

    Raises:
      ValueError: the tokenizer has no chat template, or the template writes no control
        token after an assistant turn.
    """
    # The agent loop asks every turn: render once per template and template variables.
    key = (tokenizer.chat_template, repr(sorted(template_kwargs(tokenizer).items())))
    cached = getattr(tokenizer, _END_OF_TURN_ATTRIBUTE, None)
    if cached is not None and cached[0] == key:
        return cached[1]
    text = _render(tokenizer, _dummy_history(), add_generation_prompt=False)
    _, token = _assistant_turn_end(tokenizer, text)
    end_of_turn = int(tokenizer.convert_tokens_to_ids(token))
    setattr(tokenizer, _END_OF_TURN_ATTRIBUTE, (key, end_of_turn))
    return end_of_turn


def stop_token_ids(tokenizer: PreTrainedTokenizerFast, model_eos: Iterable[int] = ()
                   ) -> tuple[int, ...]:
    """Every id that ends a policy turn, sorted: the template's end-of-turn token, the
    tokenizer's eos and `model_eos` (the eos ids of the model's config.json and
    generation_config.json, e.g. Qwen2.5-Instruct's [<|im_end|>, <|endoftext|>])."""
    ids = {int(i) for i in model_eos}
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    if tokenizer.chat_template:
        ids.add(end_of_turn_id(tokenizer))
    return tuple(sorted(ids))


def observation_ids(tokenizer: PreTrainedTokenizerFast, content: str,
                    role: str = "tool", *, then: Sequence[Message] = ()) -> list[int]:
    """Ids to append after an assistant turn that ended with its end-of-turn token: the
    new `role` turn holding `content` (and the messages `then`, e.g. the loop's own
    request after a tool's answer) plus the next assistant header.

    They are what the template renders after the end-of-turn token of an assistant turn
    followed by the new turn and the generation prompt (a dummy conversation). Past
    turns are never re-rendered: they are the ids already in the trajectory, as the
    policy saw them.
    Some templates render an assistant turn differently once another turn follows it,
    so the whole conversation re-rendered by `apply_chat_template` can differ from the
    trajectory there (the trajectory is what the policy saw and produced). Qwen3 is one:
    an assistant turn after the last user query gets `<think>\\n…\\n</think>\\n\\n` only
    while it is the last message or when it carries reasoning, and turns before the last
    user query lose their reasoning; re-rendering also normalises the newlines around
    the reasoning.

    Args:
      tokenizer: HF tokenizer with a chat template (template kwargs: `set_template_kwargs`).
      content: the observation text (tool output, user reply, corrective message).
      role: the turn's role ("tool", "user", "ipython", ...).
      then: further messages rendered after that turn, before the generation prompt.

    Raises:
      ValueError: `content` contains a special token's text (it would be parsed as a
        control token), or the template ends the assistant turn with a different token
        once a `role` turn follows it.
    """
    texts = [content, *(str(m.get("content", "")) for m in then)]
    injected = [t for t in _special_texts(tokenizer) if any(t in text for text in texts)]
    if injected:
        raise ValueError(f"observation content contains special token text {injected}; "
                         "escape or strip it before appending")
    text = _render(tokenizer, _dummy_history() + [{"role": role, "content": content},
                                                  *then], add_generation_prompt=True)
    cut, token = _assistant_turn_end(tokenizer, text)
    if tokenizer.convert_tokens_to_ids(token) != end_of_turn_id(tokenizer):
        raise ValueError(f"the chat template ends an assistant turn with {token!r} when a "
                         f"{role!r} turn follows but with another token when it is the "
                         "last turn; observation ids cannot be appended exactly")
    # A control token splits the text, so the ids after it do not depend on the ids
    # before it: encoding the rest alone gives the template's ids.
    return _encode(tokenizer, text[cut:])
