"""Tokenizers and chat-template helpers for token-in/token-out agent loops.

    tok = load_tokenizer("ckpt/")                        # any local HF tokenizer.json
    tok = build_tokenizer(texts, vocab_size=512)         # tiny ChatML BPE, deterministic
    ids = prompt_ids(tok, [{"role": "user", "content": q}])        # ends with the
                                                                   # assistant header
    ids += generated                                     # ends with the end-of-turn token
    ids += observation_ids(tok, "Doc 1 ...", role="tool")   # tool turn + next header

`observation_ids` diffs two renderings of the chat template (REFERENCES.md "Multi-turn
agent loops"): a dummy conversation ending with an assistant turn, and the same plus the
new turn with the generation prompt. Everything after the assistant's end-of-turn token
is the observation: exactly the ids the template would produce, without re-tokenizing
any past turn (past turns are the ids already in the trajectory).

`build_tokenizer` trains a byte-level BPE (the `tokenizers` library) on given texts.
Control tokens of the chosen chat style are special tokens; `special_tokens` (agent tags
such as `<search>`) are added as single, non-special tokens so that decoding keeps them
and the engine can stop on their ids.
"""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Iterable, Mapping, Sequence

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


def load_tokenizer(path: str | os.PathLike) -> PreTrainedTokenizerFast:
    """Loads a local HF tokenizer folder (tokenizer.json + tokenizer_config.json).

    Raises:
      FileNotFoundError: the folder has no tokenizer.json.
    """
    path = Path(path)
    if not (path / "tokenizer.json").exists():
        raise FileNotFoundError(f"{path / 'tokenizer.json'} not found")
    return PreTrainedTokenizerFast.from_pretrained(str(path))


def _render(tokenizer: PreTrainedTokenizerFast, messages: Sequence[Message],
            add_generation_prompt: bool) -> list[int]:
    if not tokenizer.chat_template:
        raise ValueError("tokenizer has no chat_template")
    text = tokenizer.apply_chat_template(list(messages), tokenize=False,
                                         add_generation_prompt=add_generation_prompt)
    return tokenizer.encode(text, add_special_tokens=False)


def prompt_ids(tokenizer: PreTrainedTokenizerFast, messages: Sequence[Message]) -> list[int]:
    """Token ids of `messages` rendered with the generation prompt (the assistant header
    the model continues from).

    Args:
      tokenizer: HF tokenizer with a chat template.
      messages: [{"role": ..., "content": ...}, ...].
    """
    return _render(tokenizer, messages, add_generation_prompt=True)


def _special_ids(tokenizer: PreTrainedTokenizerFast) -> set[int]:
    return {i for i, tok in tokenizer.added_tokens_decoder.items() if tok.special}


def observation_ids(tokenizer: PreTrainedTokenizerFast, content: str, role: str = "tool", *,
                    end_of_turn_id: int | None = None) -> list[int]:
    """Ids to append after an assistant turn that ended with its end-of-turn token: the
    new `role` turn holding `content` plus the next assistant header.

    Args:
      tokenizer: HF tokenizer with a chat template.
      content: the observation text (tool output, user reply, corrective message).
      role: the turn's role ("tool", "user", "ipython", ...).
      end_of_turn_id: the token that ends an assistant turn; by default the last
        special token of a rendered assistant turn (<|im_end|>, <|eot_id|>, ...).

    Raises:
      ValueError: `content` contains a special token's text (it would be parsed as a
        control token), or the template renders the earlier turns differently once the
        new turn is added (then no exact append exists).
    """
    special_texts = [t.content for t in tokenizer.added_tokens_decoder.values() if t.special]
    injected = [t for t in special_texts if t in content]
    if injected:
        raise ValueError(f"observation content contains special token text {injected}; "
                         "escape or strip it before appending")
    history = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    base = _render(tokenizer, history, add_generation_prompt=False)
    full = _render(tokenizer, history + [{"role": role, "content": content}],
                   add_generation_prompt=True)
    if end_of_turn_id is None:
        specials = _special_ids(tokenizer)
        ends = [i for i, t in enumerate(base) if t in specials]
        if not ends:
            raise ValueError("cannot find the assistant end-of-turn token in the rendered "
                             "template; pass end_of_turn_id")
        cut = ends[-1] + 1
    else:
        if end_of_turn_id not in base:
            raise ValueError(f"end_of_turn_id {end_of_turn_id} does not occur in a "
                             "rendered assistant turn")
        cut = len(base) - base[::-1].index(end_of_turn_id)
    if full[:cut] != base[:cut]:
        raise ValueError("the chat template renders earlier turns differently once a "
                         f"{role!r} turn follows; observation ids cannot be appended exactly")
    return full[cut:]
