"""configs/real_python.py's `test` variant end to end: one SFT step and one GRPO step on a
2-layer model cut from SmolLM2-135M-Instruct's config (its widths, heads, rope, tied
embeddings) with SmolLM2's tokenizer and chat template; and the CPU memory plan that run
logs against the peak resident set the kernel measured for it.

The tokenizer is tests/fixtures/smollm2_tokenizer: SmolLM2's tokenizer.json (3.5 MB) cut
to its first 2,048 ids and the merges among them (50 KB), with its special tokens,
byte-level pre-tokenizer and chat template unchanged; the model's vocabulary is those
2,048 ids. Neither the 135M weights nor the full tokenizer are needed (CI has neither).
"""
import json
import os
import re
import subprocess
import sys

import pytest
from flax import nnx

from agentjax.models import Decoder, ModelConfig
from agentjax.models.hf import save_hf
from agentjax.models.tokenizer import load_tokenizer
from agentjax.train.metrics import read_metrics
from tests.train.runs import ONE_DEVICE, ROOT, TRAIN

FIXTURE = os.path.join(ROOT, "tests", "fixtures", "smollm2_tokenizer")
# SmolLM2-135M-Instruct's config.json (the fields a model reads), 2 of its 30 layers.
SMOLLM2 = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 576,
    "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
    "num_key_value_heads": 3, "head_dim": 64, "hidden_act": "silu",
    "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "rope_theta": 100000.0,
    "tie_word_embeddings": True, "vocab_size": 49152, "bos_token_id": 1,
    "eos_token_id": 2, "pad_token_id": 2, "attention_bias": False, "mlp_bias": False,
}
LAYERS = 2
# The plan must hold within this of the peak resident set (above or below).
PLAN_TOLERANCE = 0.2


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """(workdir, output, peak resident bytes) of real_python.py:test on the cut model."""
    root = tmp_path_factory.mktemp("real_recipe")
    tokenizer = load_tokenizer(FIXTURE)
    cut = dict(SMOLLM2, num_hidden_layers=LAYERS, vocab_size=len(tokenizer))
    config = ModelConfig.from_hf(cut)
    save_hf(Decoder(config, rngs=nnx.Rngs(0)), config, root / "model", tokenizer=tokenizer)
    workdir = root / "run"
    # A fresh compilation cache: the run compiles every program, as a first run does
    # (the plan's XLA:CPU runtime row counts the compiler's memory; a warm cache
    # saves about 0.4 GiB of it).
    env = dict(ONE_DEVICE, JAX_COMPILATION_CACHE_DIR=str(root / "xla_cache"))
    peak_file = root / "peak_kib"
    process = subprocess.run(
        [sys.executable, "-c", OWN_PEAK, str(peak_file), TRAIN,
         f"--config={ROOT}/configs/real_python.py:test",
         f"--workdir={workdir}", f"--config.model.path={root / 'model'}"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT, env=env)
    assert process.returncode == 0, process.stdout[-4000:]
    return workdir, process.stdout, int(peak_file.read_text()) * 1024


# Runs the script argv[2:] as __main__ and, at its exit, writes the peak resident set of
# this process's own memory (VmHWM, kB) to argv[1]. Not the child's ru_maxrss (wait4):
# Linux carries the parent's peak into it when the child is started (subprocess's
# vfork/exec keeps the larger of the parent's high-water mark and the child's), so
# inside a pytest-xdist worker that had run other tests it read the worker's 2.73 GiB.
OWN_PEAK = """
import atexit, runpy, sys
def peak(path=sys.argv[1]):
    status = open('/proc/self/status').read()
    open(path, 'w').write(status.split('VmHWM:')[1].split()[0])
atexit.register(peak)
sys.argv = sys.argv[2:]
runpy.run_path(sys.argv[0], run_name='__main__')
"""


# The run (mostly compiling the engine's and the update's programs at the real widths)
# took 57 s on the 2 cores at load 4.5, 300 s at load 12.
@pytest.mark.slow
def test_one_sft_step_and_one_grpo_step_in_the_real_template(run):
    workdir, out, _ = run
    [sft] = read_metrics(str(workdir / "sft"))
    assert sft["step"] == 1 and sft["nll"] > 0
    [rl] = read_metrics(str(workdir))
    assert rl["step"] == 1 and "time/update_s" in rl
    # The episodes were rendered by SmolLM2's ChatML template, the tool schema in the
    # system turn.
    sample = next((workdir / "samples").iterdir()).read_text()
    assert "<|im_start|>system\nYou can call tools." in sample
    assert "<|im_start|>assistant\n" in sample
    final = json.loads((workdir / "final.json").read_text())
    assert "sft/success_greedy" in final and "eval/success_greedy" in final


@pytest.mark.slow
def test_the_cpu_memory_plan_holds_within_20_percent_of_the_peak(run):
    """The plan logged before the model loads (train/memory.py: host_plan) against the
    peak resident set of the whole run (SFT, rollouts, the update, evaluations)."""
    _, out, peak = run
    total = float(re.search(r"^\s+total\s+([\d.]+) GiB$", out, re.M).group(1)) * 2 ** 30
    assert "host (CPU) memory" in out
    assert abs(total - peak) <= PLAN_TOLERANCE * peak, (total / 2 ** 30, peak / 2 ** 30)
