"""scripts/bench/vs_trl.py: the report's arithmetic on hand-made measurements, and the
whole bench (agentjax's scripts/train.py, then TRL's GRPOTrainer) on a tiny random model."""
import argparse
import os
import re
import runpy
import subprocess
import sys

import pytest

from agentjax.models.hf import make_tiny_hf
from agentjax.models.tokenizer import load_tokenizer
from tests.models.qwen_tokenizers import qwen_tokenizer_folder
from tests.scripts.test_train import ROOT
from tests.train.runs import ONE_DEVICE

BENCH = os.path.join(ROOT, "scripts", "bench", "vs_trl.py")


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, os.path.dirname(BENCH))  # the bench imports its sibling timing.py
    try:
        yield runpy.run_path(BENCH)
    finally:
        sys.path.remove(os.path.dirname(BENCH))


def _side(step_s, rollout_s, tokens, rewards, peak_gib):
    return {"steps": [{"step_s": s, "rollout_s": r, "update_s": s - r, "tokens": n,
                       "reward": w} for s, r, n, w in zip(step_s, rollout_s, tokens, rewards)],
            "peak_gib": peak_gib, "wall_s": 100.0, "load": (2.0, 3.0)}


def test_report_divides_the_later_steps_and_judges_the_goal(bench):
    # agentjax: step 1 compiles (50 s), then 10 s steps; TRL: 30 s steps.
    agentjax = {**_side([50, 10, 10], [20, 4, 4], [80, 80, 80], [0.0, 0.25, 0.5], 3.0),
                "programs": 40, "tasks": [], "prompt": ("t", "p")}
    trl = {**_side([30, 30, 30], [10, 12, 12], [160, 160, 160], [0.0, 0.125, 0.25], 4.0),
           "tool_support": "its chat template does not render tool calls", "prompts": {}}
    a, t = bench["summary"](agentjax), bench["summary"](trl)
    assert a["step_s"] == 10 and a["first_s"] == 50 and a["per_hour"] == 360
    assert a["per_hour_all"] == pytest.approx(3600 / (70 / 3))
    assert a["tokens_per_s"] == pytest.approx(160 / 8) and t["tokens_per_s"] == 320 / 24
    assert a["reward"] == pytest.approx(0.25) and a["reward_se"] == pytest.approx(0.25 / 3 ** .5)
    args = argparse.Namespace(model="/m/smol", prompts=2, group=4, max_new_tokens=96,
                              max_tokens=512, lr=1e-6, steps=3, threads=1, nice=0)
    text = bench["report"](args, agentjax, trl, "the same text", "python vs_trl.py")
    assert re.search(r"\| steps / hour \(steps 2\.\.N\) \| 360\.0 \| 120\.0 \| \*\*3\.00x\*\* \|",
                     text)
    assert "| peak RSS GiB | 3.00 | 4.00 | **0.75x** |" in text
    assert "| agentjax | 0.000 | 0.250 | 0.500 |" in text
    assert "steps per hour 3.00x TRL's (steps 2..N; goal >= 2x): met" in text
    assert "peak memory 0.75x TRL's (goal <= 1x): met" in text
    assert "not worse within noise" in text
    assert "agentjax 2.0 -> 3.0, TRL 2.0 -> 3.0" in text
    # Half the speed and more memory miss the goal, and say so.
    slow = {**agentjax, **_side([50, 60, 60], [20, 30, 30], [80] * 3, [0.0] * 3, 5.0)}
    text = bench["report"](args, slow, trl, "the same text", "python vs_trl.py")
    assert "steps per hour 0.50x TRL's (steps 2..N; goal >= 2x): missed" in text
    assert "peak memory 1.25x TRL's (goal <= 1x): missed" in text


@pytest.mark.slow  # 40-85 s on a loaded 2-core machine: two training processes
def test_the_bench_runs_both_libraries_end_to_end(tmp_path):
    source = qwen_tokenizer_folder(tmp_path / "tokenizer", "qwen2.5", "instruct", "hub")
    model = tmp_path / "model"
    make_tiny_hf(model, tokenizer=load_tokenizer(source), hidden_size=32,
                 intermediate_size=64, num_layers=2, num_heads=2, num_kv_heads=1)
    out = tmp_path / "bench"
    result = subprocess.run(
        [sys.executable, BENCH, "--tiny", "--model", str(model), "--out", str(out),
         "--threads", "1"], capture_output=True, text=True, cwd=ROOT, timeout=600,
        env={**ONE_DEVICE, "PYTHONPATH": ROOT})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    text = result.stdout
    assert text == (out / "vs_trl.md").read_text() + "\n"
    assert "| | agentjax | TRL | agentjax / TRL |" in text
    for row in ("s / step", "rollout s", "update s", "steps / hour (steps 2..N)",
                "generated tokens / s of rollout", "peak RSS GiB"):
        line = next(line for line in text.splitlines() if row in line)
        agentjax, trl = (float(cell) for cell in line.split("|")[2:4])
        assert agentjax > 0 and trl > 0, line
    assert re.search(r"\| steps / hour \(steps 2\.\.N\) \| [\d.]+ \| [\d.]+ \| \*\*[\d.]+x\*\* \|",
                     text)
    assert re.search(r"\| peak RSS GiB \| [\d.]+ \| [\d.]+ \| \*\*[\d.]+x\*\* \|", text)
    # Both trained 2 steps of 2 episodes of 8 tokens (the tiny model never ends a turn).
    assert "| generated tokens / step | 16 | 16 |" in text
    assert re.search(r"\| agentjax \| [\d.]+ \| [\d.]+ \|\n\| TRL \| [\d.]+ \| [\d.]+ \|", text)
    assert "are the same text" in text
    assert "goal >= 2x" in text and "goal <= 1x" in text
