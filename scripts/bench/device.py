"""What agentjax gets out of one accelerator: decode and prefill through JaxEngine, one
RL training step, each against the device's peak and a plain jitted baseline measured
in the same run.

    python scripts/bench/device.py            # Qwen2.5-0.5B and 3B shapes (< 10 min, H200)
    python scripts/bench/device.py --tiny     # a tiny shape on CPU in seconds (CI)
    python scripts/bench/device.py --models 3B --skip-train --deterministic
    python scripts/bench/device.py --skip-train --deterministic --prefill-rows 16 \
        --prefill-chunks 256,1024            # the rollout config's prefill knobs
    python scripts/bench/device.py --remat full dots_no_batch --profile /tmp/prof

On an H200 (2026-12-04) the default run took ~3 minutes with --repeats 1; the figures
and the profile are in docs/results/engine.md.

Weights are random (normal(0, 0.02), initialized on the device), never downloaded:
throughput does not depend on their values. Everything runs on `jax.devices()[0]`, in
this order (the training step first, so the process's peak memory is its own):

1. peak: the device's HBM bandwidth and dense bf16 FLOP/s from PEAKS, by `device_kind`
   (none on CPU or an unlisted device: utilizations print "n/a" unless --peak-tbps and
   --peak-tflops are given).
2. train, at the first model's shape: one RL update (`train/stages/rl.py:
   build_rl_update`, the trainer's own jitted update: GRPO loss, one optimizer step
   over --micro-rows micro-batches summed, AdamW on float32 masters, bf16 compute, the
   `hf` preset's remat and KL reference) on rows of 1k prompt + 1k action tokens, and
   the `prepare` pass before it (policy and reference log-probs); baseline: a plain
   jitted forward + backward of the masked token NLL (scripts/bench/model.py's
   jax_side). MFU = model FLOPs (FLOPS_FORMULA) / seconds / peak FLOP/s. Peak device
   memory (`memory_stats()`, none on CPU) against `train/memory.py`'s plan of the same
   config, the rows this phase holds (all but the engine's).
3. probes, same-run baselines of what a plain jitted kernel reaches: a streaming read
   (a sum over a large bf16 buffer) and a square bf16 matmul.
4. engine, per model: JaxEngine(max_slots=batch, max_len=prompt + new tokens) serving
   `batch` requests of `prompt` random tokens at once, temperature 1, no eos (every row
   makes every token); the same requests with one new token are the prefill alone.
   Decode tokens/s and MBU = the bytes decode must read (each step: the weights once,
   plus the KV cache every row holds at that step) / the engine's decode seconds / peak
   bandwidth; baseline: the roofline (those bytes at peak, and at the read probe's
   rate). Prefill utilization = the prefill's model FLOPs / the engine's prefill
   seconds / peak FLOP/s; baseline: a plain jitted forward of the same [batch, prompt]
   tokens. The host gap between the engine's device calls (HOST_GAP), and the same
   generate with the engine's overlap off (its baseline: each decode call read before
   the next is dispatched) in the same interleaved runs.
   Before each engine, its attention kernel alone against JAX's own (scripts/bench/
   kernel.py: a decode step and a prefill chunk of one layer at the engine's shape;
   interpreted on CPU).
5. goals (issue 27, for an H200): decode MBU >= 50% at 3B, batch 64; train-step MFU
   >= 40% at 0.5B; each beside the measured value: met, not met, or why not comparable.

Timing: scripts/bench/timing.py (every candidate once untimed first, repeats
interleaved, best run and spread); the process's compile counters must not move during
a timed run (scripts/bench/rollout.py: compilations).
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from kernel import bench_model as bench_kernel  # scripts/bench/kernel.py
from model import jax_side  # scripts/bench/model.py: plain jitted fwd + bwd
from qwen25 import SHAPES, model_config, parameter_count  # scripts/bench/qwen25.py
from rollout import compilations, compile_line, table  # scripts/bench/rollout.py
from timing import Ratio, Runs, measure, percent, timed  # scripts/bench/timing.py
from trace_summary import summary  # scripts/bench/trace_summary.py

from agentjax.config.choices import ENGINE_ATTENTION, REMAT_POLICIES
from agentjax.config.rules import chunk_widths
from agentjax.config.presets import search_config
from agentjax.core import parallel
from agentjax.core.trajectory import Trajectory, Turn, collate
from agentjax.engine.jax.engine import JaxEngine
from agentjax.engine.protocol import GenerateRequest, SamplingParams
from agentjax.models.config import ModelConfig
from agentjax.models.decoder import Decoder
from agentjax.train.memory import MemoryPlan, device_memory, memory_plan
from agentjax.train.precision import model_precision
from agentjax.train.runtime import Runtime
from agentjax.train.stages.rl import build_rl_update


@dataclasses.dataclass(frozen=True)
class Peak:
    """A device's peak HBM bandwidth (bytes/s) and dense bf16 FLOP/s."""

    bandwidth: float
    flops: float
    source: str


# By `jax.devices()[0].device_kind`. NVIDIA quotes bf16 Tensor Core FLOP/s with 2:4
# sparsity; dense is half. Google's TPU pages quote dense bf16 per chip.
PEAKS = {
    "NVIDIA H200": Peak(4.8e12, 989e12, "H200 SXM datasheet: 4.8 TB/s HBM3e, "
                        "1,979 TFLOP/s bf16 sparse"),
    "NVIDIA H100 80GB HBM3": Peak(3.35e12, 989e12, "H100 SXM datasheet: 3.35 TB/s, "
                                  "1,979 TFLOP/s bf16 sparse"),
    "NVIDIA A100-SXM4-80GB": Peak(2.039e12, 312e12, "A100 80GB SXM datasheet: "
                                  "2,039 GB/s, 312 TFLOP/s bf16"),
    "TPU v5 lite": Peak(819e9, 197e12, "cloud.google.com/tpu/docs/v5e: 819 GBps, "
                        "197 TFLOPs bf16"),
    "TPU v6 lite": Peak(1638e9, 918e12, "cloud.google.com/tpu/docs/v6e: 1638 GBps, "
                        "918 TFLOPs bf16"),
    "TPU v5p": Peak(2765e9, 459e12, "cloud.google.com/tpu/docs/v5p: 2765 GBps, "
                    "459 TFLOPs bf16"),
}
PEAKS["TPU v5"] = PEAKS["TPU v5p"]  # what older runtimes call a v5p

FLOPS_FORMULA = (
    "model FLOPs, as PaLM (appendix B) counts them: a forward pass is 2 N per token for "
    "the weight matrices plus 4 L H hd T per token for attention (QK^T and AV over the "
    "full T x T, not halved for the causal mask); training is 3x the forward (6 N + "
    "12 L H hd T per token). N = the parameters a forward multiplies by: every layer and "
    "the lm-head (with tied embeddings the shared matrix counts once, as the lm-head; "
    "an untied input embedding is a lookup, not counted). Prefill computes logits of "
    "each row's last token only, so its lm-head term counts one token per row. "
    "Recomputation (remat) is not model FLOPs: it lowers MFU, as it costs time.")

HOST_GAP = (
    "host gap per call = (wall seconds of generate_sync - seconds inside the engine's "
    "prefill and decode program calls, stats prefill_s + decode_s) / program calls: the "
    "scheduler's work between calls (building inputs, appending tokens, stop checks, "
    "admission) plus request intake and delivery, while the device idles. With overlap "
    "a decode call is dispatched before the previous one is read (its seconds count "
    "from that read), so the work between two decode calls runs while the device "
    "computes and leaves this figure")


# The goals, for an H200: (what, model, batch, least fraction).
DECODE_GOAL = ("decode MBU", "3B", 64, 0.50)
TRAIN_GOAL = ("train-step MFU", "0.5B", None, 0.40)
GOAL_DEVICE = "NVIDIA H200"

# Rows of the RL batch that share a prompt (a GRPO group).
GROUP_SIZE = 4

FULL = dict(models=("0.5B", "3B"), batch=64, prompt=1024, new_tokens=1024, train_rows=16,
            micro_rows=8, decode_steps=16, read_probe_bytes=2 ** 31, matmul_probe=8192, repeats=2)
# One micro-batch: summing two costs --tiny's CPU compile a third more time.
TINY = dict(models=("tiny",), batch=4, prompt=16, new_tokens=16, train_rows=4, micro_rows=4,
            decode_steps=4, read_probe_bytes=2 ** 22, matmul_probe=128, repeats=2)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tiny", action="store_true",
                        help="a tiny shape, batch 4, 16 + 16 tokens: every code path in "
                             "seconds on CPU")
    parser.add_argument("--models", nargs="+", choices=sorted(SHAPES),
                        help="engine models (default 0.5B 3B; tiny with --tiny); the train "
                             "step runs at the first")
    parser.add_argument("--batch", type=int, help="engine rows and requests (64)")
    parser.add_argument("--prompt", type=int, help="prompt tokens per request (1024)")
    parser.add_argument("--new-tokens", type=int, help="new tokens per request (1024)")
    parser.add_argument("--train-rows", type=int,
                        help=f"rows of the RL batch, a multiple of {GROUP_SIZE} (16)")
    parser.add_argument("--micro-rows", type=int,
                        help="rows of a micro-batch, dividing --train-rows (8: two micro-"
                             "batches summed, as the trainer's hf preset)")
    parser.add_argument("--decode-steps", type=int, help="JaxEngine decode_steps (16)")
    parser.add_argument("--repeats", type=int, help="timed runs per candidate (2)")
    parser.add_argument("--deterministic", action="store_true",
                        help="the engine in batch-invariant mode (the trainer's default)")
    parser.add_argument("--prefill-rows", type=int, default=4,
                        help="rows of every prefill call with --deterministic "
                             "(rollout.deterministic_prefill_rows)")
    parser.add_argument("--prefill-chunks", default="16,64,256", type=chunk_widths,
                        help="the engine's prefill chunk widths (rollout.prefill_chunks)")
    parser.add_argument("--attention", default="auto", choices=ENGINE_ATTENTION,
                        help="JaxEngine attention (auto: the Pallas kernel on a GPU)")
    parser.add_argument("--skip-train", action="store_true", help="engines only")
    parser.add_argument("--remat", nargs="+", choices=REMAT_POLICIES,
                        help="the train step once per policy, in this order (default: the "
                             "hf preset's); measured peaks are the process's so far, so "
                             "list the policies from least memory to most")
    parser.add_argument("--profile", metavar="DIR",
                        help="after each engine's timed runs, trace one short generate "
                             "(2 x decode_steps new tokens) into DIR/<model> and print "
                             "where its device time went")
    parser.add_argument("--peak-tbps", type=float,
                        help="peak HBM TB/s of a device PEAKS does not list")
    parser.add_argument("--peak-tflops", type=float,
                        help="peak dense bf16 TFLOP/s of a device PEAKS does not list")
    args = parser.parse_args(argv)
    for key, value in (TINY if args.tiny else FULL).items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    if args.train_rows % GROUP_SIZE or args.train_rows < GROUP_SIZE:
        parser.error(f"--train-rows must be a positive multiple of {GROUP_SIZE}")
    if args.micro_rows < 1 or args.train_rows % args.micro_rows:
        parser.error("--micro-rows must divide --train-rows")
    if args.prefill_rows < 1:
        parser.error("--prefill-rows must be >= 1")
    if (args.peak_tbps is None) != (args.peak_tflops is None):
        parser.error("give both --peak-tbps and --peak-tflops, or neither")
    return args


def device_peak(kind: str, args) -> Peak | None:
    if args.peak_tbps is not None:
        return Peak(args.peak_tbps * 1e12, args.peak_tflops * 1e12, "--peak-tbps/--peak-tflops")
    return PEAKS.get(kind)


def scaled(value: float, unit: str) -> str:
    """1.234e12, "FLOP/s" -> "1.23 TFLOP/s"."""
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


def utilization(rate: float, peak_rate: float | None) -> str:
    return "n/a" if peak_rate is None else percent(rate / peak_rate)


@dataclasses.dataclass(frozen=True)
class Costs:
    """What one model's forward computes and reads (FLOPS_FORMULA)."""

    config: ModelConfig
    params: int

    @classmethod
    def of(cls, name: str, config: ModelConfig) -> "Costs":
        """The costs of SHAPES[name] computed as `config` says, known before a weight
        exists."""
        return cls(config, parameter_count(*SHAPES[name]))

    @property
    def head(self) -> int:
        return self.config.vocab_size * self.config.hidden_size

    @property
    def multiplied(self) -> int:
        """N: parameters a forward multiplies by (the input embedding is a lookup unless
        it is also the lm-head)."""
        return self.params - (0 if self.config.tie_embeddings else self.head)

    def forward_flops(self, tokens: int, context: int, logit_tokens: int) -> float:
        """`tokens` tokens in rows of `context`, logits for `logit_tokens` of them."""
        c = self.config
        attention = 4 * c.num_layers * c.num_heads * c.head_dim * context * tokens
        return 2 * (self.multiplied - self.head) * tokens + 2 * self.head * logit_tokens + attention

    def train_flops(self, tokens: int, context: int) -> float:
        return 3 * self.forward_flops(tokens, context, tokens)

    @property
    def weight_bytes(self) -> int:
        """What one decode step reads of the weights: N in the compute dtype."""
        return self.multiplied * jnp.dtype(self.config.dtype).itemsize

    @property
    def kv_bytes_per_token(self) -> int:
        c = self.config
        return 2 * c.num_layers * c.num_kv_heads * c.head_dim * jnp.dtype(c.dtype).itemsize

    def decode_bytes(self, rows: int, prompt: int, steps: int) -> int:
        """Bytes `steps` decode steps must read: the weights each step, and each row's KV
        cache in use (step j of a `prompt`-token row attends to prompt + j keys)."""
        contexts = steps * prompt + steps * (steps + 1) // 2
        return steps * self.weight_bytes + rows * contexts * self.kv_bytes_per_token


def random_model(config: ModelConfig, mesh=None) -> Decoder:
    """A random-init decoder built on the device, never on the host: on `mesh` as the
    trainer places its policy, else on the default device (the engines': JaxEngine puts
    its cache on a device, so weights on a one-device mesh would hand its programs a
    cache of another sharding after the first call and compile each of them twice). The
    key is XLA's RngBitGenerator ("unsafe_rbg"): the init compiles in a third of the
    time of the default threefry (seconds of --tiny's budget on CPU); the weights are
    as random."""
    key = jax.random.key(0, impl="unsafe_rbg")

    def make():
        return Decoder(config, rngs=nnx.Rngs(key))

    return nnx.jit(make)() if mesh is None else parallel.create_sharded(make, mesh)


def best(values) -> Runs:
    return Runs(tuple(float(v) for v in values))


# --------------------------------------------------------------------------- device


@dataclasses.dataclass(frozen=True)
class Probes:
    """What plain jitted kernels reach on this device, this run."""

    read_bandwidth: float
    matmul_flops: float


def probe_device(args, peak: Peak | None) -> Probes:
    elements = args.read_probe_bytes // 2
    buffer = jnp.ones((elements,), jnp.bfloat16)
    total = jax.jit(lambda x: jnp.sum(x, dtype=jnp.float32))
    n = args.matmul_probe
    square = jnp.ones((n, n), jnp.bfloat16)
    matmul = jax.jit(lambda a: a @ a)
    results = measure({"read": timed(lambda: total(buffer).block_until_ready()),
                       "matmul": timed(lambda: matmul(square).block_until_ready())},
                      max(args.repeats, 5), compilations=compilations)
    read, product = best(results["read"]), best(results["matmul"])
    probes = Probes(elements * 2 / read.best, 2 * n ** 3 / product.best)
    print(f"probes (best of {len(read.costs)} interleaved): read of {scaled(elements * 2, 'B')} "
          f"bf16 {scaled(probes.read_bandwidth, 'B/s')} (spread {read.spread_text()}, "
          f"{utilization(probes.read_bandwidth, peak and peak.bandwidth)} of peak); "
          f"bf16 matmul {n}^3 {scaled(probes.matmul_flops, 'FLOP/s')} (spread "
          f"{product.spread_text()}, {utilization(probes.matmul_flops, peak and peak.flops)} "
          f"of peak)")
    return probes


# --------------------------------------------------------------------------- train


def train_config(args, remat: str | None):
    """The trainer's config for the bench's step: configs/grpo_search.py's `hf` variant
    (bf16 compute, remat, log-prob chunks, KL reference) at the bench's shapes, one
    optimizer step over --micro-rows micro-batches; `remat` replaces the preset's."""
    config = search_config("grpo", "hf")
    if remat is not None:
        config.model.remat = remat
    r, algo = config.rollout, config.algo
    r.max_tokens, r.max_new_tokens = args.prompt + args.new_tokens, args.new_tokens
    r.group_size, r.prompts_per_step = GROUP_SIZE, args.train_rows // GROUP_SIZE
    r.engine_slots = r.concurrency = args.batch
    algo.ppo_epochs = algo.minibatches = 1
    algo.microbatch_size = args.micro_rows
    return config


def rl_batch(config, vocab: int, rng: np.random.Generator) -> dict:
    """Collated episodes of one prompt and one action turn each, rewards 0/1 alternating
    within each group (so advantages are not all zero)."""
    r = config.rollout
    prompt = r.max_tokens - r.max_new_tokens
    episodes = [Trajectory(
        prompt_ids=rng.integers(0, vocab, prompt).tolist(),
        turns=[Turn(action_ids=rng.integers(0, vocab, r.max_new_tokens).tolist(),
                    logprobs=(-rng.random(r.max_new_tokens)).tolist(),
                    finish_reason="length")],
        final_reward=float(i % 2), group_id=i // r.group_size)
        for i in range(r.prompts_per_step * r.group_size)]
    batch = collate(episodes, buckets=(r.max_tokens,), pad_id=0)
    batch["temperature"] = np.ones(len(episodes), np.float32)
    del batch["truncated"]
    return batch


# Plan rows of the rollout engine, which the train phase does not build.
ENGINE_ROWS = ("engine weights", "engine weight swap", "staged weights", "KV cache")


def held_rows(plan: MemoryPlan) -> tuple:
    return tuple(row for row in plan.rows if not row.name.startswith(ENGINE_ROWS))


def peak_against_plan(plan: MemoryPlan, stats: dict | None) -> list[str]:
    """The plan (rows this phase holds marked *) and the device's measured peak."""
    held = held_rows(plan)
    lines = ["memory plan per device (train/memory.py; * = held by this phase, the engine "
             "rows are not built):"]
    width = max(len(row.name) for row in plan.rows)
    lines += [f"  {'*' if row in held else ' '} {row.name:<{width}}  {scaled(row.bytes, 'B'):>9}"
              for row in plan.rows]
    planned = sum(row.bytes for row in held)
    lines.append(f"  * {'total held':<{width}}  {scaled(planned, 'B'):>9}")
    if not stats or "peak_bytes_in_use" not in stats:
        lines.append("measured peak: n/a (the device reports no memory stats, as on CPU)")
    else:
        peak = stats["peak_bytes_in_use"]
        limit = stats.get("bytes_limit")
        lines.append(f"measured peak (memory_stats peak_bytes_in_use, this process so far): "
                     f"{scaled(peak, 'B')} = {peak / planned:.2f}x the held rows"
                     + (f"; device limit {scaled(limit, 'B')}" if limit else ""))
    return lines


@dataclasses.dataclass(frozen=True)
class Measured:
    """A goal's figure (a fraction of the device's peak) as one phase measured it, or
    why it has none."""

    model: str
    batch: int | None
    value: float | None
    missing: str = "no peak known for this device"


def too_large(what: str, needed: int, device_bytes: int | None) -> str | None:
    """Why `what` is skipped on a device of `device_bytes` (None: it fits, or the device
    does not say)."""
    if device_bytes is None or needed <= device_bytes:
        return None
    return (f"skipped: {what}: {scaled(needed, 'B')}, the device has "
            f"{scaled(device_bytes, 'B')}")


def bench_train(name: str, args, peak: Peak | None, mesh, device,
                remat: str | None) -> Measured:
    config = train_config(args, remat)
    model_cfg = model_config(*SHAPES[name], **model_precision(config))
    plan = memory_plan(config, model_cfg, mesh)
    skipped = too_large("the plan's rows the step holds",
                        sum(row.bytes for row in held_rows(plan)), plan.device_bytes)
    if skipped:  # a TPU v5e's 16 GB, say
        print(f"\n## Train step at the {name} shape: {skipped}")
        return Measured(name, None, None, skipped)
    # The trainer's jit and batch placement; nothing is written (no checkpoints, logs).
    runtime = Runtime(workdir=tempfile.gettempdir(), mesh=mesh,
                      rules=parallel.resolve_rules(None), is_main=True,
                      checkpoint=config.checkpoint, progress=False)
    model = random_model(model_cfg, mesh)
    graphdef, params = nnx.split(model)
    state, update, prepare = build_rl_update(config, runtime, graphdef, params)
    batch = rl_batch(config, model_cfg.vocab_size, np.random.default_rng(0))
    device_batch = runtime.device_batch(batch)

    def prepared():
        out, _ = prepare(state.params, state.ref_params, state.critic_params, device_batch)
        return jax.block_until_ready(out)

    update_batch = prepared()

    def rl_update():
        nonlocal state
        state, _ = update(state, update_batch)  # donates the old state
        jax.block_until_ready(state.params)

    before = compilations()
    results = measure({"update": timed(rl_update), "prepare": timed(prepared)},
                      args.repeats, compilations=compilations)
    memory = peak_against_plan(plan, device.memory_stats())
    # The baseline after the peak is read: its gradients are not the step's.
    plain_step, _, plain_compile_s = jax_side(
        model, (batch["inputs"], batch["segment_ids"], batch["positions"], batch["targets"],
                batch["action_mask"]), config.model.logprob_chunk, with_logprobs=False)
    results.update(measure({"plain": timed(plain_step)}, args.repeats,
                           compilations=compilations))

    costs = Costs.of(name, model_cfg)
    rows, length = batch["inputs"].shape
    tokens = int(batch["segment_ids"].sum())
    train_flops = costs.train_flops(tokens, length)
    forward_flops = costs.forward_flops(tokens, length, tokens)
    work = {"update": ("RL update: fwd + bwd + AdamW, one optimizer step", train_flops),
            "prepare": ("prepare: policy + reference log-probs (2 forwards)",
                        2 * forward_flops),
            "plain": ("baseline: plain jitted fwd + bwd of the token NLL", train_flops)}
    print(f"\n## Train step at the {name} shape: {rows} rows x {length} tokens ({tokens} "
          f"tokens), {config.algo.advantage} / {config.algo.loss}, "
          f"{config.algo.microbatch_size}-row micro-batches, remat {model_cfg.remat}, "
          f"{model_cfg.dtype} compute on float32 masters, KL coef {config.algo.kl_coef}; "
          f"N = {costs.multiplied:,}")
    print(f"FLOPs: {FLOPS_FORMULA}")
    print(compile_line(before, 2 * args.repeats))
    print(f"(plain baseline compiled ahead of time in {plain_compile_s:.1f} s)")
    table_rows, mfu = [], None
    for key, (what, flops) in work.items():
        runs = best(results[key])
        rate = flops / runs.best
        if key == "update" and peak is not None:
            mfu = rate / peak.flops
        table_rows.append([what, f"{runs.best:.3f}", runs.spread_text(),
                           f"{flops / 1e12:.3g}", scaled(rate, "FLOP/s"),
                           utilization(rate, peak and peak.flops)])
    table(["step", "best s", "spread", "model TFLOPs", "rate", "MFU"], table_rows)
    print("\n".join(memory))
    return Measured(name, None, mfu)


# --------------------------------------------------------------------------- engine


@dataclasses.dataclass(frozen=True)
class EngineRun:
    """One generate_sync call: its wall seconds, what it added to the engine's stats,
    and the tokens it returned."""

    wall: float
    stats: dict
    output_tokens: int

    @property
    def calls(self) -> int:
        return self.stats.get("prefill_calls", 0) + self.stats.get("decode_calls", 0)

    @property
    def host_gap(self) -> float:
        """Mean host seconds per program call (HOST_GAP)."""
        inside = self.stats.get("prefill_s", 0.0) + self.stats.get("decode_s", 0.0)
        return (self.wall - inside) / max(self.calls, 1)


def engine_run(engine: JaxEngine, prompts: np.ndarray, new_tokens: int,
               overlap: bool = True) -> EngineRun:
    requests = [GenerateRequest(p.tolist(), SamplingParams(
        temperature=1.0, max_new_tokens=new_tokens, seed=i)) for i, p in enumerate(prompts)]
    before = dict(engine.stats)
    engine.overlap = overlap  # read by the scheduler between decode calls; it is idle now
    start = time.perf_counter()
    completions = engine.generate_sync(requests)
    wall = time.perf_counter() - start
    engine.overlap = True
    added = {key: value - before.get(key, 0) for key, value in engine.stats.items()}
    return EngineRun(wall, added, sum(len(c[0].output_ids) for c in completions))


def plain_forward(model: Decoder, tokens: np.ndarray):
    """A jitted forward of [B, T] tokens without a cache, logits of each row's last
    token (what a prefill computes); returns a `timed` candidate."""
    graphdef, params = nnx.split(model)
    tokens = jnp.asarray(tokens, jnp.int32)
    positions = jnp.broadcast_to(jnp.arange(tokens.shape[1], dtype=jnp.int32), tokens.shape)
    segments = jnp.ones_like(tokens)

    @jax.jit
    def forward(params):
        decoder = nnx.merge(graphdef, params)
        hidden, _ = decoder(tokens, positions, segments)
        return decoder.logits(hidden[:, -1:])

    return timed(lambda: forward(params).block_until_ready())


def bench_engine(name: str, args, peak: Peak | None, probes: Probes) -> Measured:
    config = model_config(*SHAPES[name], param_dtype="bfloat16", dtype="bfloat16")
    costs = Costs.of(name, config)
    max_len = args.prompt + args.new_tokens
    # The model (the plain forward's weights), the engine's copy and its KV cache.
    skipped = too_large("the weights twice and the KV cache",
                        2 * costs.params * 2 + args.batch * max_len * costs.kv_bytes_per_token,
                        device_memory(jax.devices()[0]))
    if skipped:
        print(f"\n## JaxEngine at the {name} shape: {skipped}")
        return Measured(name, args.batch, None, skipped)
    model = random_model(config)
    rng = np.random.default_rng(1)
    prompts = rng.integers(0, config.vocab_size, (args.batch, args.prompt))
    engine = JaxEngine.from_model(model, max_slots=args.batch, max_len=max_len,
                                  decode_steps=args.decode_steps,
                                  prefill_chunks=args.prefill_chunks,
                                  deterministic=args.deterministic,
                                  deterministic_prefill_rows=args.prefill_rows,
                                  attention=args.attention)
    attention = engine.attention
    before = compilations()
    try:
        results = measure({
            "prefill": functools.partial(engine_run, engine, prompts, 1),
            "generate": functools.partial(engine_run, engine, prompts, args.new_tokens),
            "generate, no overlap": functools.partial(engine_run, engine, prompts,
                                                      args.new_tokens, overlap=False),
            "forward": plain_forward(model, prompts)}, args.repeats, compilations=compilations)
        if args.profile:
            trace_dir = os.path.join(args.profile, name)
            with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
                engine_run(engine, prompts, 2 * args.decode_steps)
    finally:
        engine.close()
    compiled = compile_line(before, 4 * args.repeats)

    # Prefill caches the prompt but its last token; every new token is sampled by a
    # decode step (the first one feeds the prompt's last token).
    steps = args.new_tokens
    generate = results["generate"]
    decoded = generate[0].stats.get("decode_tokens", 0)
    decode_s = best(run.stats["decode_s"] for run in generate)
    decode_bytes = costs.decode_bytes(args.batch, args.prompt, steps)
    decode_rate = decode_bytes / decode_s.best
    prefill_s = best(run.stats["prefill_s"] for run in results["prefill"])
    forward_s = best(results["forward"])
    prefill_flops = costs.forward_flops(args.batch * args.prompt, args.prompt, args.batch)
    wall = best(run.wall for run in generate)
    serial = results["generate, no overlap"]
    serial_wall = best(run.wall for run in serial)
    reported = {k: v for k, v in generate[0].stats.items() if "host" in k or "gap" in k
                or "overlap" in k}

    print(f"\n## JaxEngine at the {name} shape ({costs.params:,} params, bf16): "
          f"{args.batch} requests x {args.prompt} prompt tokens -> {args.new_tokens} new, "
          f"max_slots {args.batch}, decode_steps {args.decode_steps}, prefill chunks "
          f"{args.prefill_chunks}, deterministic {args.deterministic}"
          f"{f' ({args.prefill_rows} prefill rows)' if args.deterministic else ''}, attention "
          f"{attention}; best of {args.repeats} interleaved runs")
    print(compiled)
    print(f"weights read per decode step {scaled(costs.weight_bytes, 'B')}; KV cache "
          f"{scaled(costs.kv_bytes_per_token, 'B')} per token; {steps} decode steps read "
          f"{scaled(decode_bytes, 'B')} in all ({scaled(decode_bytes / steps, 'B')} a step)")
    if decoded != args.batch * steps:
        print(f"WARNING: the engine decoded {decoded} tokens, the formulas assume "
              f"{args.batch} x {steps}")
    roofline = decode_bytes / peak.bandwidth if peak else None
    table(["measurement", "best s", "spread", "rate", "utilization", "same-run baseline"], [
        ["decode (engine decode calls)", f"{decode_s.best:.3f}", decode_s.spread_text(),
         f"{args.batch * steps / decode_s.best:.0f} tok/s, {scaled(decode_rate, 'B/s')}",
         f"MBU {utilization(decode_rate, peak and peak.bandwidth)}",
         (f"roofline {args.batch * steps / roofline:.0f} tok/s at peak; " if roofline else "")
         + f"{args.batch * steps * probes.read_bandwidth / decode_bytes:.0f} tok/s at the "
           f"read probe's {scaled(probes.read_bandwidth, 'B/s')}"],
        ["prefill (engine prefill calls)", f"{prefill_s.best:.3f}", prefill_s.spread_text(),
         f"{args.batch * args.prompt / prefill_s.best:.0f} tok/s, "
         f"{scaled(prefill_flops / prefill_s.best, 'FLOP/s')}",
         f"{utilization(prefill_flops / prefill_s.best, peak and peak.flops)} of peak",
         f"plain forward {forward_s.best:.3f} s, "
         f"{scaled(prefill_flops / forward_s.best, 'FLOP/s')} "
         f"({utilization(prefill_flops / forward_s.best, peak and peak.flops)})"],
        ["generate_sync end to end", f"{wall.best:.3f}", wall.spread_text(),
         f"{generate[0].output_tokens / wall.best:.0f} new tok/s",
         f"overlap on / off: {Ratio.of(wall, serial_wall).text()}",
         f"overlap off: {serial_wall.best:.3f} s, spread {serial_wall.spread_text()}"]])
    for label, runs in (("host gap", generate), ("host gap, overlap off", serial)):
        slowest, fastest = (f(runs, key=lambda run: run.host_gap) for f in (max, min))
        print(f"{label}: {fastest.host_gap * 1e3:.2f}-{slowest.host_gap * 1e3:.2f} ms per "
              f"program call over the runs ({fastest.calls} calls, "
              f"{percent(fastest.host_gap * fastest.calls / fastest.wall)} of the "
              f"wall time)")
    print(f"engine-reported (one overlapped generate): {reported or 'none'}. {HOST_GAP}")
    if args.profile:
        print(f"\nprofile of one generate of {2 * args.decode_steps} new tokens per request "
              f"(prefill included; {trace_dir}):")
        print(summary(trace_dir))
    return Measured(name, args.batch, decode_rate / peak.bandwidth if peak else None)


# --------------------------------------------------------------------------- goals


def goal_line(goal, measured: Measured, kind: str) -> str:
    what, goal_model, goal_batch, least = goal
    conditions = f"Qwen2.5-{goal_model}" + (f", batch {goal_batch}" if goal_batch else "")
    here = (measured.model + (f", batch {measured.batch}" if measured.batch else "")
            + f", {kind}")
    value = measured.value
    if value is None:
        verdict = f"n/a: {measured.missing}"
    elif (measured.model, measured.batch, kind) != (goal_model, goal_batch, GOAL_DEVICE):
        verdict = f"{percent(value)}, not the goal's conditions"
    else:
        verdict = f"{percent(value)}: {'met' if value >= least else 'NOT met'}"
    return f"  {what} >= {percent(least)} ({conditions}, {GOAL_DEVICE}): measured at {here}: {verdict}"


def main(argv=None) -> None:
    args = parse_args(argv)
    start = time.perf_counter()
    device = jax.devices()[0]
    mesh = parallel.make_mesh({}, devices=[device])
    peak = device_peak(device.device_kind, args)
    print(f"agentjax device bench: {device.device_kind} ({device.platform}; device 0 of "
          f"{jax.device_count()}), jax {jax.__version__}; models {', '.join(args.models)}"
          f"{' (--tiny)' if args.tiny else ' (Qwen2.5 shapes)'}, random weights: bf16 for "
          f"the engines, float32 masters for the train step")
    if peak is None:
        print(f"peak: none known for {device.device_kind!r}: absolute numbers only, "
              f"utilization n/a (--peak-tbps / --peak-tflops give one)")
    else:
        print(f"peak: {scaled(peak.bandwidth, 'B/s')} HBM, {scaled(peak.flops, 'FLOP/s')} "
              f"dense bf16 ({peak.source})")

    # Train first: memory_stats' peak is process-wide, so nothing larger runs before it.
    train = None
    if not args.skip_train:
        by_remat = {}
        for remat in args.remat or [None]:
            by_remat[remat] = bench_train(args.models[0], args, peak, mesh, device, remat)
            print(f"[{time.perf_counter() - start:.0f} s]")
        best_remat = max(by_remat, key=lambda r: by_remat[r].value or 0)
        train = by_remat[best_remat]
        if len(by_remat) > 1:
            print(f"train-step goal below: remat {best_remat}, the best of {list(by_remat)}")
    print()
    probes = probe_device(args, peak)
    engines = []
    for name in args.models:
        bench_kernel(name, batch=args.batch, prompt=args.prompt, new_tokens=args.new_tokens,
                     repeats=max(args.repeats, 3), tiny=args.tiny)
        engines.append(bench_engine(name, args, peak, probes))
        print(f"[{time.perf_counter() - start:.0f} s]")

    kind = device.device_kind
    print("\n## Goals (issue 27)")
    print(goal_line(DECODE_GOAL, engines[-1], kind))
    if train is not None:
        print(goal_line(TRAIN_GOAL, train, kind))
    print(f"\ntotal {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
