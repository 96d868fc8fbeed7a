"""Realistic Qwen tokenizer folders, built offline for tests.

Each folder holds a byte-level BPE trained on a small corpus with Qwen's pre-tokenizer,
normalizer and added tokens (ids after the BPE vocabulary, as in the real files where
they start at 151643), the real chat template of the family, and a generation config:

  family   "qwen2.5": QWEN25_TEMPLATE, added tokens <|endoftext|> ... <|file_sep|>
           "qwen3":   QWEN3_TEMPLATE, plus <tool_response>, </tool_response>, <think>,
                      </think>
  variant  "base":     eos <|endoftext|> (Qwen2.5-3B, Qwen3-4B-Base); generation config
                       eos_token_id 151643 alone
           "instruct": eos <|im_end|>; generation config eos [<|im_end|>, <|endoftext|>]
                       and sampling defaults
  layout   "hub":  the transformers-4 files the Hub serves: tokenizer.json, vocab.json,
                   merges.txt, tokenizer_config.json with `tokenizer_class`
                   "Qwen2Tokenizer", `added_tokens_decoder` and the `chat_template`
           "tf5":  whatever the installed transformers' `save_pretrained` writes for it
                   (transformers 5: tokenizer.json, tokenizer_config.json with
                   "TokenizersBackend", chat_template.jinja)

    path = qwen_tokenizer_folder(tmp_path, "qwen3", "base", "hub")
"""
from __future__ import annotations

import json
from pathlib import Path

from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models, normalizers,
                        pre_tokenizers, trainers)
from transformers import PreTrainedTokenizerFast

FAMILIES = ("qwen2.5", "qwen3")
VARIANTS = ("base", "instruct")
LAYOUTS = ("hub", "tf5")

# The chat_template of Qwen/Qwen2.5-3B-Instruct's tokenizer_config.json on the Hugging
# Face Hub (Qwen2.5-3B, the base model, ships the same template), quoted verbatim.
QWEN25_TEMPLATE = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""

# The chat_template of Qwen/Qwen3-1.7B's tokenizer_config.json on the Hugging Face Hub
# (the Qwen3 dense models up to 32B, base and instruct, share it), quoted verbatim. The
# last assistant turn after the last user query gets `<think>\n...\n</think>\n\n` (empty
# reasoning included), earlier ones only when they carry reasoning; `enable_thinking`
# false closes an empty think block in the generation prompt.
QWEN3_TEMPLATE = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- set content = message.content %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is defined and message.reasoning_content is not none %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in message.content %}
                {%- set content = message.content.split('</think>')[-1].lstrip('\n') %}
                {%- set reasoning_content = message.content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}"""

# Qwen's added tokens in id order: (content, special).
_QWEN25_ADDED = (
    [(t, True) for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>",
                         "<|object_ref_end|>", "<|box_start|>", "<|box_end|>",
                         "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
                         "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>",
                         "<|video_pad|>")]
    + [(t, False) for t in ("<tool_call>", "</tool_call>", "<|fim_prefix|>",
                            "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
                            "<|repo_name|>", "<|file_sep|>")])
_QWEN3_ADDED = _QWEN25_ADDED + [(t, False) for t in ("<tool_response>", "</tool_response>",
                                                     "<think>", "</think>")]

# Qwen2's pre-tokenizer split pattern (tokenizer.json of Qwen2.5 and Qwen3).
_QWEN_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+"
               r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

CORPUS = [
    "Answer the given question. Call the search tool when you lack knowledge.",
    "Which city is the capital of France? Paris is the capital of France.",
    "Doc 1(Title: Paris) Paris is the capital and largest city of France.",
    'The search tool returns documents: {"name": "search", "arguments": {"query": "x"}}',
    "print(2 + 3 * 4) gives 14; python runs code in a sandbox and prints the result.",
    "<answer> Paris </answer> <search> capital of France </search> <information> </information>",
    "I should search first. Let me think about the question before answering it.",
    "You are a helpful assistant. Use tools when needed; the result comes back next.",
]


def _bpe(added: list[tuple[str, bool]], vocab_size: int) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(_QWEN_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(CORPUS * 4, trainer=trainer)
    for content, special in added:
        token = AddedToken(content, special=special, normalized=False)
        if special:
            tokenizer.add_special_tokens([token])
        else:
            tokenizer.add_tokens([token])
    return tokenizer


def _generation_config(ids: dict[str, int], variant: str) -> dict:
    if variant == "base":
        return {"bos_token_id": ids["<|endoftext|>"], "do_sample": False,
                "eos_token_id": ids["<|endoftext|>"], "max_new_tokens": 2048}
    return {"bos_token_id": ids["<|endoftext|>"], "do_sample": True,
            "eos_token_id": [ids["<|im_end|>"], ids["<|endoftext|>"]],
            "pad_token_id": ids["<|endoftext|>"], "repetition_penalty": 1.05,
            "temperature": 0.7, "top_p": 0.8, "top_k": 20}


def qwen_tokenizer_folder(root: str | Path, family: str, variant: str, layout: str,
                          *, vocab_size: int = 600) -> Path:
    """Writes one realistic tokenizer folder (module docstring) under `root`; returns it."""
    if family not in FAMILIES or variant not in VARIANTS or layout not in LAYOUTS:
        raise ValueError(f"unknown folder {(family, variant, layout)}")
    added = _QWEN3_ADDED if family == "qwen3" else _QWEN25_ADDED
    tokenizer = _bpe(added, vocab_size)
    hub = Path(root) / f"{family}-{variant}-hub"
    hub.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(hub / "tokenizer.json"))
    tokenizer.model.save(str(hub))  # vocab.json + merges.txt
    ids = {content: tokenizer.token_to_id(content) for content, _ in added}
    eos = "<|endoftext|>" if variant == "base" else "<|im_end|>"
    config = {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": {
            str(ids[content]): {"content": content, "lstrip": False, "normalized": False,
                                "rstrip": False, "single_word": False, "special": special}
            for content, special in added},
        "additional_special_tokens": [c for c, special in added[1:] if special],
        "bos_token": None,
        "chat_template": QWEN3_TEMPLATE if family == "qwen3" else QWEN25_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": eos,
        "errors": "replace",
        "model_max_length": 131072,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }
    (hub / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False))
    (hub / "generation_config.json").write_text(
        json.dumps(_generation_config(ids, variant), indent=2))
    if layout == "hub":
        return hub
    saved = Path(root) / f"{family}-{variant}-tf5"
    PreTrainedTokenizerFast.from_pretrained(str(hub)).save_pretrained(str(saved))
    (saved / "generation_config.json").write_text(
        (hub / "generation_config.json").read_text())
    return saved
