"""Tokenizer building/loading and chat-template diffing for multi-turn appends."""
import pytest

from agentjax.models.tokenizer import (
    AGENT_TAGS, build_tokenizer, end_of_turn_id, load_tokenizer, observation_ids, prompt_ids,
    set_template_kwargs, stop_token_ids, template_kwargs)
from tests.models.qwen_tokenizers import (FAMILIES, LAYOUTS, QWEN3_TEMPLATE, QWEN25_TEMPLATE,
                                          VARIANTS, qwen_tokenizer_folder)

TEXTS = [f"question {i}: who wrote the book about river {i % 7}? answer: author {i % 5}"
         for i in range(200)]


@pytest.fixture(scope="module", params=["chatml", "llama3"])
def tokenizer(request):
    return build_tokenizer(TEXTS, vocab_size=400, style=request.param)


def test_build_is_deterministic_and_keeps_tags_whole(tokenizer):
    again = build_tokenizer(list(reversed(TEXTS)), vocab_size=400,
                            style="llama3" if "<|eot_id|>" in tokenizer.get_vocab() else "chatml")
    assert again.backend_tokenizer.to_str() == tokenizer.backend_tokenizer.to_str()
    assert len(tokenizer) <= 400
    for tag in AGENT_TAGS:
        ids = tokenizer.encode(f"x{tag}y", add_special_tokens=False)
        assert tokenizer.convert_tokens_to_ids(tag) in ids
        assert tokenizer.decode(ids, skip_special_tokens=True) == f"x{tag}y"  # tags survive
    assert tokenizer.eos_token is not None and tokenizer.pad_token is not None


def test_agent_loop_ids_equal_full_render(tokenizer):
    """prompt + generated turn + observation ids == rendering the whole conversation."""
    question = [{"role": "user", "content": "who wrote the book about river 3?"}]
    assistant = "<search>river 3 book</search>"
    observation = "<information>Doc 1(Title: River) author 2 wrote it</information>"
    ids = prompt_ids(tokenizer, question)
    # The model's own turn: its text then the end-of-turn token it sampled.
    ids += tokenizer.encode(assistant, add_special_tokens=False) + [tokenizer.eos_token_id]
    ids += observation_ids(tokenizer, observation, role="tool")
    full = question + [{"role": "assistant", "content": assistant},
                       {"role": "tool", "content": observation}]
    assert ids == prompt_ids(tokenizer, full)


def test_observation_ids_for_user_role(tokenizer):
    ids = observation_ids(tokenizer, "try again", role="user")
    assert end_of_turn_id(tokenizer) == tokenizer.eos_token_id  # the built styles' eos
    text = tokenizer.decode(ids)
    assert "user" in text and "try again" in text and text.rstrip().endswith(
        ("<|im_start|>assistant", "assistant<|end_header_id|>"))


def test_observation_ids_reject_special_token_injection(tokenizer):
    with pytest.raises(ValueError, match="special token text"):
        observation_ids(tokenizer, f"evil {tokenizer.eos_token} text")


def test_save_and_load_round_trip(tokenizer, tmp_path):
    tokenizer.save_pretrained(tmp_path)
    loaded = load_tokenizer(tmp_path)
    messages = [{"role": "user", "content": "answer: author 3"}]
    assert prompt_ids(loaded, messages) == prompt_ids(tokenizer, messages)
    assert loaded.eos_token_id == tokenizer.eos_token_id


def test_errors():
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        load_tokenizer("/nonexistent/tokenizer/dir")
    with pytest.raises(ValueError, match="too small"):
        build_tokenizer(TEXTS, vocab_size=100)
    with pytest.raises(ValueError, match="unknown chat style"):
        build_tokenizer(TEXTS, vocab_size=400, style="alpaca")


# ---------------------------------------------------------------- real Qwen templates

REAL = [(f, v, layout) for f in FAMILIES for v in VARIANTS for layout in LAYOUTS]


@pytest.fixture(scope="module")
def qwen_root(tmp_path_factory):
    return tmp_path_factory.mktemp("qwen")


def _qwen(root, family, variant, layout="hub", **template_kwargs):
    return load_tokenizer(qwen_tokenizer_folder(root, family, variant, layout),
                          template_kwargs=template_kwargs)


@pytest.mark.parametrize("family,variant,layout", REAL)
def test_end_of_turn_comes_from_the_template_not_the_eos(qwen_root, family, variant, layout):
    tokenizer = _qwen(qwen_root, family, variant, layout)
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert tokenizer.eos_token == ("<|endoftext|>" if variant == "base" else "<|im_end|>")
    assert end_of_turn_id(tokenizer) == im_end
    assert stop_token_ids(tokenizer) == tuple(sorted({im_end, tokenizer.eos_token_id}))
    # Both layouts load the same template and vocabulary.
    assert tokenizer.chat_template == (QWEN3_TEMPLATE if family == "qwen3" else QWEN25_TEMPLATE)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("role", ["tool", "user"])
def test_qwen25_tool_turns_equal_the_whole_conversation_rendered(qwen_root, variant, role):
    """Qwen2.5 renders earlier turns the same whatever follows: the ids appended turn by
    turn equal apply_chat_template of the whole conversation, but for the newline the
    template writes after the last <|im_end|> (it separates turns; the trajectory ends at
    the end-of-turn token)."""
    tokenizer = _qwen(qwen_root, "qwen2.5", variant)
    messages = [{"role": "user", "content": "Which city is the capital of France?"}]
    actions = ['<tool_call>\n{"name": "search", "arguments": {"query": "France"}}\n</tool_call>',
               "<answer> Paris </answer>"]
    ids = prompt_ids(tokenizer, messages)
    ids += _encode(tokenizer, actions[0]) + [end_of_turn_id(tokenizer)]
    ids += observation_ids(tokenizer, "Doc 1(Title: Paris) Paris is the capital.", role)
    ids += _encode(tokenizer, actions[1]) + [end_of_turn_id(tokenizer)]
    whole = messages + [{"role": "assistant", "content": actions[0]},
                        {"role": role, "content": "Doc 1(Title: Paris) Paris is the capital."},
                        {"role": "assistant", "content": actions[1]}]
    rendered = tokenizer.apply_chat_template(whole, tokenize=False)
    assert ids + _encode(tokenizer, "\n") == _encode(tokenizer, rendered)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("enable_thinking", [None, False])
def test_qwen3_observation_ids_and_the_documented_rerender_difference(
        qwen_root, variant, enable_thinking):
    """Qwen3 renders an assistant turn with `<think>\\n\\n</think>\\n\\n` only while it is
    the last message: the observation is the new turn as the template renders it after
    the history the policy saw, and re-rendering the whole conversation differs from the
    trajectory exactly there (module docstring of agentjax.models.tokenizer)."""
    kwargs = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
    tokenizer = _qwen(qwen_root, "qwen3", variant, **kwargs)
    think = "<think>\n\n</think>\n\n"
    messages = [{"role": "user", "content": "Which city is the capital of France?"}]
    action = '<tool_call>\n{"name": "search", "arguments": {"query": "France"}}\n</tool_call>'
    prompt = prompt_ids(tokenizer, messages)
    assert tokenizer.decode(prompt).endswith(
        "<|im_start|>assistant\n" + (think if enable_thinking is False else ""))
    observation = observation_ids(tokenizer, "Paris is the capital.", "tool")
    assert tokenizer.decode(observation) == (
        "\n<|im_start|>user\n<tool_response>\nParis is the capital.\n</tool_response>"
        "<|im_end|>\n<|im_start|>assistant\n" + (think if enable_thinking is False else ""))
    ids = prompt + _encode(tokenizer, action) + [end_of_turn_id(tokenizer)] + observation
    ids += _encode(tokenizer, "<answer> Paris </answer>") + [end_of_turn_id(tokenizer)]
    text = tokenizer.decode(ids)
    assert _encode(tokenizer, text) == ids  # the joins are the tokenizer's own ids
    rendered = tokenizer.apply_chat_template(
        messages + [{"role": "assistant", "content": action},
                    {"role": "tool", "content": "Paris is the capital."},
                    {"role": "assistant", "content": "<answer> Paris </answer>"}],
        tokenize=False, **kwargs)
    head, last_header, last_turn = text.rpartition("<|im_start|>assistant\n")
    if enable_thinking is False:
        # The trajectory's earlier assistant turn keeps the empty think block its
        # generation prompt had; the re-render drops it from every turn but the last.
        assert rendered == head.replace(think, "") + last_header + last_turn + "\n"
    else:
        # The model wrote no think block; the re-render adds one to the last turn only.
        assert rendered == head + last_header + think + last_turn + "\n"


def test_template_kwargs_are_validated(qwen_root):
    tokenizer = _qwen(qwen_root, "qwen3", "instruct")
    assert template_kwargs(tokenizer) == {}
    set_template_kwargs(tokenizer, {"enable_thinking": False})
    assert template_kwargs(tokenizer) == {"enable_thinking": False}
    with pytest.raises(ValueError, match="add_generation_prompt"):
        set_template_kwargs(tokenizer, {"add_generation_prompt": False})
    with pytest.raises(ValueError, match="map names to values"):
        set_template_kwargs(tokenizer, ["enable_thinking"])


def test_templates_without_an_end_of_turn_token_are_an_error(qwen_root):
    tokenizer = _qwen(qwen_root, "qwen2.5", "base")
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
    with pytest.raises(ValueError, match="no end-of-turn token"):
        end_of_turn_id(tokenizer)
    tokenizer.chat_template = "{% for m in messages %}<|im_start|>{% endfor %}"
    with pytest.raises(ValueError, match="does not render the assistant's content"):
        observation_ids(tokenizer, "x")


def _encode(tokenizer, text):
    return tokenizer.encode(text, add_special_tokens=False)
