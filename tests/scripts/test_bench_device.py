"""scripts/bench/device.py: its --tiny mode runs every phase on CPU (so the accelerator
run cannot rot before a device is lent), and the formulas and verdicts it prints on a
device, checked by hand here where a CPU cannot reach them (a known peak, memory stats)."""
import itertools
import os
import re
import runpy
import subprocess
import sys

import pytest

from agentjax.models.paged_pallas import missing_backend

from tests.scripts.test_train import ROOT

BENCH = os.path.join(ROOT, "scripts", "bench")


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, BENCH)  # the bench imports its siblings (timing, rollout, ...)
    try:
        yield runpy.run_path(os.path.join(BENCH, "device.py"))
    finally:
        sys.path.remove(BENCH)


def test_tiny_mode_runs_every_phase_with_a_given_peak(tmp_path):
    # A made-up peak takes the utilization and goal paths a CPU has none for (the
    # tests' XLA flags skip the optimizations tiny programs do not need).
    env = dict(os.environ, PYTHONPATH=ROOT)
    done = subprocess.run(
        [sys.executable, os.path.join(BENCH, "device.py"), "--tiny", "--peak-tbps", "0.05",
         "--peak-tflops", "0.2", "--remat", "full", "none", "--profile", str(tmp_path)],
        capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    out = done.stdout
    assert done.returncode == 0, out[-3000:] + done.stderr[-3000:]
    assert "peak: 50 GB/s HBM, 200 GFLOP/s dense bf16 (--peak-tbps/--peak-tflops)" in out
    for section in ("## Train step at the tiny shape", "## TPU attention kernel at the tiny shape",
                    "## JaxEngine at the tiny shape", "## Goals (issue 27)"):
        assert section in out
    # One train step per remat policy, the goal at the best of them.
    assert "remat full, bfloat16" in out and "remat none, bfloat16" in out
    assert "train-step goal below: remat " in out and "the best of ['full', 'none']" in out
    # The profiled generate's ops (on CPU: the host's XLA threads).
    assert "profile of one generate of 8 new tokens per request" in out
    assert "| op | count | total ms | mean us | share |" in out
    # The timed runs were checked for compilations (timing.measure raises otherwise).
    assert out.count("timed runs: none (checked after each)") == 3
    # Each kernel against its baselines, interpreted: a decode step and a prefill chunk
    # (the GPU kernel where this jax can run it).
    for kernel, baselines in (("GPU", ["JAX's ops/gpu"]), ("TPU", ["pure JAX"])):
        section = out.split(f"## {kernel} attention kernel at the tiny shape")[-1]
        if kernel == "GPU" and missing_backend() is not None:
            assert section.startswith(f": skipped, {missing_backend()}")
            continue
        for call, name in itertools.product(("decode: 4 x 1", "prefill chunk: 4 x 16"),
                                            ["ours"] + baselines):
            assert re.search(rf"\| +{call} queries at 24 slots \| +{re.escape(name)} \|",
                             section)
    assert "measured peak: n/a (the device reports no memory stats, as on CPU)" in out
    assert "MBU n/a" not in out and "host gap:" in out and "WARNING" not in out
    assert out.count("not the goal's conditions") == 2


def test_costs_of_qwen25_0_5b_by_hand(bench):
    config = bench["model_config"](*bench["SHAPES"]["0.5B"], dtype="bfloat16")
    costs = bench["Costs"](config, 494_032_768)
    head = 151936 * 896
    assert costs.multiplied == 494_032_768  # tied: the embedding is the lm-head
    # 2 x (N - head) per token, 2 x head per logit token, 4 L H hd T per token.
    assert costs.forward_flops(10, 7, 2) == (2 * (494_032_768 - head) * 10 + 2 * head * 2
                                             + 4 * 24 * 14 * 64 * 7 * 10)
    assert costs.train_flops(10, 7) == 3 * costs.forward_flops(10, 7, 10)
    assert costs.weight_bytes == 2 * 494_032_768
    assert costs.kv_bytes_per_token == 2 * 24 * 2 * 64 * 2  # k and v, layers, kv heads
    # Two rows of 3 prompt tokens, 2 steps: contexts 4 and 5 keys per row.
    assert costs.decode_bytes(2, 3, 2) == 2 * costs.weight_bytes + 2 * 9 * 12288


def test_an_untied_input_embedding_is_a_lookup(bench):
    config = bench["model_config"](*bench["SHAPES"]["7B"])
    costs = bench["Costs"](config, 7_615_616_512)
    assert costs.multiplied == 7_615_616_512 - 152064 * 3584


def test_peaks_by_device_kind_or_flags(bench):
    args = bench["parse_args"](["--tiny"])
    h200 = bench["device_peak"]("NVIDIA H200", args)
    assert (h200.bandwidth, h200.flops) == (4.8e12, 989e12)
    assert bench["device_peak"]("TPU v6 lite", args).flops == 918e12
    assert bench["device_peak"]("cpu", args) is None
    given = bench["device_peak"]("cpu", bench["parse_args"](
        ["--tiny", "--peak-tbps", "1.5", "--peak-tflops", "300"]))
    assert (given.bandwidth, given.flops) == (1.5e12, 300e12)
    with pytest.raises(SystemExit):
        bench["parse_args"](["--peak-tbps", "1.5"])


def test_measured_peak_against_the_rows_the_train_phase_holds(bench):
    from agentjax.train.memory import MemoryPlan, MemoryRow

    plan = MemoryPlan(rows=(MemoryRow("policy params (float32)", 4 * 10 ** 9, ""),
                            MemoryRow("engine weights (bfloat16, 1 lane(s))", 10 ** 9, ""),
                            MemoryRow("KV cache (64 slots x 2048 tokens)", 10 ** 9, ""),
                            MemoryRow("activations (one micro-batch)", 6 * 10 ** 9, "")),
                      device_bytes=None, device="NVIDIA H200")
    lines = bench["peak_against_plan"](plan, {"peak_bytes_in_use": 15 * 10 ** 9,
                                              "bytes_limit": 140 * 10 ** 9})
    held = [line for line in lines if line.startswith("  * ")]
    assert [line.split()[1] for line in held] == ["policy", "activations", "total"]
    assert held[-1].endswith(" 10 GB")  # the engine rows are not built in that phase
    assert lines[-1].endswith("15 GB = 1.50x the held rows; device limit 140 GB")
    assert bench["peak_against_plan"](plan, None)[-1].startswith("measured peak: n/a")


def test_goal_verdicts(bench):
    goal, kind = bench["DECODE_GOAL"], "NVIDIA H200"

    def line(model, batch, value, kind, **missing):
        return bench["goal_line"](goal, bench["Measured"](model, batch, value, **missing), kind)

    assert line("3B", 64, 0.52, kind).endswith("measured at 3B, batch 64, NVIDIA H200: 52%: met")
    assert line("3B", 64, 0.41, kind).endswith("41%: NOT met")
    assert line("3B", 32, 0.6, kind).endswith("60%, not the goal's conditions")
    assert line("3B", 64, 0.6, "TPU v6 lite").endswith("not the goal's conditions")
    assert line("tiny", 4, None, "cpu").endswith("n/a: no peak known for this device")
    assert line("3B", 64, None, kind, missing="skipped: x").endswith("n/a: skipped: x")
    train = bench["Measured"]("0.5B", None, 0.45)
    assert bench["goal_line"](bench["TRAIN_GOAL"], train, kind).endswith("45%: met")


def test_a_phase_that_cannot_fit_is_skipped_with_the_sizes(bench):
    too_large = bench["too_large"]
    assert too_large("x", 10 ** 9, None) is None and too_large("x", 10 ** 9, 2 * 10 ** 9) is None
    assert too_large("the weights", 17 * 10 ** 9, 16 * 10 ** 9) == (
        "skipped: the weights: 17 GB, the device has 16 GB")
