"""Rollout benchmarks: every figure comes with its baseline measured in the same run.

    python scripts/bench/rollout.py                  # all three
    python scripts/bench/rollout.py --only generate  # generate | multiturn | pool

A tiny Qwen2-shaped model (4 layers, d=256, vocab ~2k, random weights) is written as an
HF checkpoint with `make_tiny_hf` and loaded both by agentjax and by transformers (torch),
so both sides run the same weights.

1. generate: JaxEngine vs HF transformers `generate` — batch 32, 128 new tokens, the same
   sampling (temperature 1, no top-k/top-p), eos disabled on both so every row makes 128
   tokens. A second JaxEngine row runs the same workload with `deterministic=True` (the
   price of batch invariance: every decode step over all rows at full span). Compile /
   warm-up time (one full-size call each) is printed separately; the figure is the best
   of 3 steady-state runs. torch runs in a subprocess that never
   imports JAX (in one process, XLA's and torch's CPU thread pools slow each other down;
   torch measured >10x slower after JAX had run), once with 1 thread and once with one
   thread per CPU: on a machine shared with other jobs, torch's OpenMP barriers make the
   multi-threaded run erratic (10-25x slower measured), so the faster of the two is the
   baseline.
2. multiturn: 16 concurrent sessions x 8 turns (32 new tokens + a 32-token observation per
   turn). Wall time per turn (best of 3 episodes) with session KV reuse vs re-prefilling
   the whole context every turn (session ids dropped).
3. pool: RolloutPool, 64 episodes x 4 turns (48 tokens per turn) against a tool that
   sleeps 100 ms per call vs the same run with zero tool latency (same seeds, so the
   same tokens), plus the same latency with one episode at a time, and the zero-latency
   run on a `deterministic=True` engine (its cost with rows joining and leaving). The
   engine has one slot per concurrent episode, so every session keeps its KV cache
   across turns.
Before measuring, `JaxEngine.warmup()` compiles every program (time printed), so no
measured run waits on XLA.
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import functools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def hf_generate_worker(folder: str, new_tokens: int, repeats: int, threads: int) -> None:
    """Times HF `generate` (torch only, no JAX in this process) with `threads` torch
    threads: reads the prompts as JSON from stdin, prints {"warmup_s", "runs_s", "tokens",
    "greedy"} as JSON."""
    # Only this worker process imports torch (see the module docstring).
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(threads)
    prompts = json.load(sys.stdin)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ids = torch.tensor(prompts)
    pad = model.config.pad_token_id or 0
    kwargs = dict(attention_mask=torch.ones_like(ids), pad_token_id=pad,
                  max_new_tokens=new_tokens, min_new_tokens=new_tokens)

    def run(**sampling):
        start = time.perf_counter()
        with torch.no_grad():
            out = model.generate(ids, **kwargs, **sampling)
        return time.perf_counter() - start, out[:, ids.shape[1]:]

    sampled = dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0)
    warmup, _ = run(**sampled)
    runs = [run(**sampled) for _ in range(repeats)]
    _, greedy = run(do_sample=False)
    print(json.dumps({"warmup_s": warmup, "runs_s": [t for t, _ in runs],
                      "tokens": int(runs[0][1].numel()), "greedy": greedy[:2, :8].tolist()}))


if __name__ == "__main__" and sys.argv[1:2] == ["--hf-worker"]:
    hf_generate_worker(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
    sys.exit(0)


# The torch worker above must never import JAX (their CPU thread pools slow each other
# down), so JAX and agentjax are imported only below it.
import jax  # noqa: E402
from flax import nnx  # noqa: E402

from agentjax.envs.base import EpisodeLog, StepResult, Task, TurnLog  # noqa: E402
from agentjax.models.hf import load_hf, make_tiny_hf  # noqa: E402
from agentjax.models.tokenizer import build_tokenizer  # noqa: E402
from agentjax.rollout.agent_loop import EpisodeLimits  # noqa: E402
from agentjax.rollout.device_programs import COMPILE_COUNTS  # noqa: E402
from agentjax.rollout.engine import GenerateRequest, SamplingParams  # noqa: E402
from agentjax.rollout.jax_engine import JaxEngine  # noqa: E402
from agentjax.rollout.lanes import LanedEngine  # noqa: E402
from agentjax.rollout.pool import RolloutPool  # noqa: E402

MODEL = dict(hidden_size=256, intermediate_size=1024, num_layers=4, num_heads=4,
             num_kv_heads=2, head_dim=64)


def build_checkpoint(folder: Path):
    """Tokenizer (byte-level BPE, ~2k vocab) + random Qwen2-shaped HF checkpoint."""
    rng = np.random.default_rng(0)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    words = ["".join(rng.choice(letters, size=rng.integers(2, 9))) for _ in range(3000)]
    corpus = [" ".join(rng.choice(words, size=20)) for _ in range(4000)]
    tokenizer = build_tokenizer(corpus, vocab_size=2048)
    make_tiny_hf(folder, arch="qwen2", tokenizer=tokenizer, **MODEL)
    model, _ = load_hf(folder)
    return tokenizer, model


def table(headers, rows):
    widths = [max(len(str(h)), *(len(str(r[i])) for r in rows)) for i, h in enumerate(headers)]
    line = lambda cells: "| " + " | ".join(str(c).rjust(w) for c, w in zip(cells, widths)) + " |"
    print(line(headers))
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in rows:
        print(line(row))


# --------------------------------------------------------------------------- generate

def _lanes() -> int:
    """LanedEngine lanes: one per core, at most 4 (dividing the benches' batches)."""
    return max(n for n in (1, 2, 4) if n <= os.cpu_count())


def bench_generate(folder: Path, tokenizer, model, batch=32, prompt_len=32, new_tokens=128,
                   repeats=3):
    rng = np.random.default_rng(1)
    prompts = rng.integers(10, len(tokenizer), size=(batch, prompt_len)).tolist()
    sampling = SamplingParams(temperature=1.0, top_p=1.0, top_k=-1, max_new_tokens=new_tokens)

    hf_by_threads = {}
    for threads in sorted({1, os.cpu_count()}):
        hf_by_threads[threads] = json.loads(subprocess.run(
            [sys.executable, __file__, "--hf-worker", str(folder), str(new_tokens),
             str(repeats), str(threads)],
            input=json.dumps(prompts), capture_output=True, text=True, check=True
        ).stdout.strip().splitlines()[-1])

    def time_engine(make=JaxEngine.from_model, **options):
        """(warm-up s, [(run s, tokens)], compilations, greedy continuations of 2 prompts)
        of an engine `make(model, ...)` with `options` on the workload."""
        engine = make(model, tokenizer=tokenizer, max_slots=batch,
                      max_len=prompt_len + new_tokens, decode_steps=16, eos_token_ids=(),
                      **options)

        def run(seed):
            requests = [GenerateRequest(p, dataclasses.replace(sampling, seed=seed + i))
                        for i, p in enumerate(prompts)]
            start = time.perf_counter()
            out = engine.generate_sync(requests)
            return time.perf_counter() - start, sum(len(c[0].output_ids) for c in out)

        start = time.perf_counter()
        engine.warmup()
        run(0)
        warm = time.perf_counter() - start
        compiles = dict(engine.compile_counts)
        runs = [run(100 * (r + 1)) for r in range(repeats)]
        assert engine.compile_counts == compiles, "a measured run compiled"
        greedy = SamplingParams(temperature=0.0, max_new_tokens=8)
        continuations = [c[0].output_ids for c in engine.generate_sync(
            [GenerateRequest(p, greedy) for p in prompts[:2]])]
        engine.close()
        return warm, runs, compiles, continuations

    lanes = _lanes()
    engines = {"agentjax JaxEngine": time_engine(),
               "agentjax JaxEngine (deterministic)": time_engine(deterministic=True),
               f"agentjax LanedEngine ({lanes} lanes)": time_engine(
                   functools.partial(LanedEngine.from_model, lanes=lanes)),
               f"agentjax LanedEngine ({lanes} lanes, deterministic)": time_engine(
                   functools.partial(LanedEngine.from_model, lanes=lanes), deterministic=True)}
    best_threads = min(hf_by_threads, key=lambda t: min(hf_by_threads[t]["runs_s"]))
    hf = hf_by_threads[best_threads]
    hf_time, hf_tokens = min(hf["runs_s"]), hf["tokens"]
    # Same weights: greedy continuations of two prompts must agree with torch.
    agree = {name: sum(a == b for x, y in zip(result[3], hf["greedy"]) for a, b in zip(x, y))
             for name, result in engines.items()}

    print(f"\n## Generation: batch {batch}, prompt {prompt_len}, {new_tokens} new tokens, "
          f"temperature 1.0 (sampled); best of {repeats} runs")
    print(f"greedy agreement with torch (same weights), of 16 tokens: {agree}; "
          f"JaxEngine compilations (all engines): {dict(COMPILE_COUNTS)}")
    rows = []
    for threads, result in hf_by_threads.items():
        best = min(result["runs_s"])
        rows.append([f"HF generate (torch, {threads} thread{'s' * (threads > 1)})",
                     f"{result['warmup_s']:.2f}", result["tokens"],
                     "/".join(f"{t:.2f}" for t in result["runs_s"]), f"{best:.2f}",
                     f"{result['tokens'] / best:.0f}", f"{hf_time / best:.2f}x"])
    for name, (warm, runs, _, _) in engines.items():
        best, tokens = min(runs)
        rows.append([name, f"{warm:.2f}", tokens, "/".join(f"{t:.2f}" for t, _ in runs),
                     f"{best:.2f}", f"{tokens / best:.0f}",
                     f"{(tokens / best) / (hf_tokens / hf_time):.2f}x"])
    table(["engine", "warm-up/compile s", "tokens", "runs s", "best s", "tokens/s",
           "vs best HF"], rows)


# --------------------------------------------------------------------------- multi-turn

def bench_multiturn(tokenizer, model, sessions=16, turns=8, new_tokens=32, obs_tokens=32,
                    prompt_len=64, repeats=3, make=JaxEngine.from_model, name="JaxEngine"):
    max_len = prompt_len + turns * (new_tokens + obs_tokens)
    engine = make(model, tokenizer=tokenizer, max_slots=sessions, max_len=max_len,
                  decode_steps=16, eos_token_ids=())
    rng = np.random.default_rng(2)
    vocab = len(tokenizer)
    prompts = rng.integers(10, vocab, size=(sessions, prompt_len)).tolist()
    observation = rng.integers(10, vocab, size=obs_tokens).tolist()

    async def episode_turns(use_sessions: bool, tag: str):
        contexts = [list(p) for p in prompts]
        times, cached = [], []
        for turn in range(turns):
            requests = [GenerateRequest(
                ctx, SamplingParams(temperature=1.0, max_new_tokens=new_tokens, seed=i),
                session_id=f"{tag}-{i}" if use_sessions else None)
                for i, ctx in enumerate(contexts)]
            start = time.perf_counter()
            out = await engine.generate(requests)
            times.append(time.perf_counter() - start)
            cached.append(sum(c[0].meta["cached_tokens"] for c in out) / sessions)
            for ctx, c in zip(contexts, out):
                ctx.extend(c[0].output_ids + observation)
        for i in range(sessions):
            engine.end_session(f"{tag}-{i}")
        return times, cached

    start = time.perf_counter()
    programs = engine.warmup()
    compile_s = time.perf_counter() - start
    # Each turn's figure is its best over `repeats` episodes (same seeds, same tokens).
    reuse_runs = [asyncio.run(episode_turns(True, f"reuse{r}")) for r in range(repeats)]
    scratch_runs = [asyncio.run(episode_turns(False, f"scratch{r}")) for r in range(repeats)]
    engine.close()
    reuse = np.min([times for times, _ in reuse_runs], axis=0)
    scratch = np.min([times for times, _ in scratch_runs], axis=0)
    cached = reuse_runs[0][1]
    print(f"\n## Multi-turn, {name}: {sessions} concurrent sessions, {new_tokens} new + {obs_tokens} "
          f"observation tokens per turn, prompt {prompt_len}; best of {repeats} episodes per "
          f"turn (warm-up: {programs} programs in {compile_s:.1f} s)")
    rows = []
    for t in range(turns):
        rows.append([t + 1, f"{cached[t]:.0f}", f"{reuse[t] * 1e3:.0f}",
                     f"{reuse[t] / reuse[0]:.2f}x", f"{scratch[t] * 1e3:.0f}",
                     f"{scratch[t] / scratch[0]:.2f}x", f"{scratch[t] / reuse[t]:.2f}x"])
    table(["turn", "cached tokens/session", "session reuse ms", "vs turn 1",
           "re-prefill ms", "vs turn 1", "re-prefill / reuse"], rows)


# --------------------------------------------------------------------------- pool

class LatencyEnv:
    """Every step sleeps `latency_s` (the tool) and returns a fixed observation; the
    episode ends after `turns` steps."""

    stop = ()
    observation_role = None

    def __init__(self, latency_s: float, turns: int):
        self.latency_s, self.turns = latency_s, turns
        self.log = EpisodeLog(task=Task("none", ""))

    def reset(self, task):
        self.log = EpisodeLog(task=task)
        return [{"role": "user", "content": task.question}]

    def step(self, action_text):
        time.sleep(self.latency_s)
        done = len(self.log.turns) + 1 >= self.turns
        self.log.turns.append(TurnLog(action_text, "tool_call", tool_name="tool"))
        if done:
            self.log.done, self.log.stop_reason = True, "answer"
        return StepResult("<information> tool result number seven </information>", done, 0.0,
                          {})


def bench_pool(tokenizer, model, episodes=64, turns=4, new_tokens=48, latency=0.1, slots=64):
    tasks = [Task(f"t{i}", f"question number {i} about the world") for i in range(episodes // 4)]
    sampling = SamplingParams(temperature=1.0, max_new_tokens=new_tokens, seed=0)
    limits = EpisodeLimits(max_turns=turns, max_context_tokens=512)

    def make_engine(**options):
        """A warmed-up engine and its (programs, warm-up s)."""
        engine = JaxEngine.from_model(model, tokenizer=tokenizer, max_slots=slots,
                                      max_len=512, decode_steps=16, eos_token_ids=(),
                                      **options)
        start = time.perf_counter()
        programs = engine.warmup()
        return engine, programs, time.perf_counter() - start

    def run(engine, latency_s, concurrency, task_list, group):
        pool = RolloutPool(engine, lambda: LatencyEnv(latency_s, turns), tokenizer,
                           limits=limits, concurrency=concurrency)
        with pool:
            start = time.perf_counter()
            groups = pool.collect_sync(task_list, group, sampling=sampling)
            elapsed = time.perf_counter() - start
        trajs = [t for g in groups for t in g]
        assert not any(t.metadata["failed"] for t in trajs)
        tokens = sum(len(turn.action_ids) for t in trajs for turn in t.turns)
        return elapsed, tokens, len(trajs)

    engine, programs, compile_s = make_engine()
    zero = run(engine, 0.0, episodes, tasks, 4)
    slow = run(engine, latency, episodes, tasks, 4)
    sequential = run(engine, latency, 1, tasks[:2], 2)
    engine.close()
    engine, det_programs, det_compile_s = make_engine(deterministic=True)
    deterministic = run(engine, 0.0, episodes, tasks, 4)
    engine.close()
    print(f"\n## Pool: {episodes} episodes x {turns} turns, {new_tokens} tokens per turn, "
          f"engine {slots} slots, concurrency {episodes} (warm-up: {programs} programs in "
          f"{compile_s:.1f} s; deterministic engine: {det_programs} in {det_compile_s:.1f} s)")
    base = zero[1] / zero[0]
    rows = []
    for name, (elapsed, tokens, count) in [
            ("zero tool latency", zero), (f"{latency * 1e3:.0f} ms tool latency", slow),
            (f"{latency * 1e3:.0f} ms, one episode at a time", sequential),
            ("zero tool latency, deterministic engine", deterministic)]:
        rows.append([name, count, tokens, f"{elapsed:.2f}", f"{tokens / elapsed:.0f}",
                     f"{tokens / elapsed / base:.2f}x"])
    table(["run", "episodes", "tokens", "s", "tokens/s", "vs zero latency"], rows)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="generate,multiturn,pool")
    args = parser.parse_args()
    chosen = set(args.only.split(","))
    print(f"jax {jax.__version__} on {jax.devices()[0].platform}, {os.cpu_count()} CPUs")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "tiny-qwen2"
        tokenizer, model = build_checkpoint(folder)
        params = sum(x.size for x in jax.tree.leaves(nnx.state(model)))
        print(f"model: Qwen2-shaped {MODEL}, vocab {model.config.vocab_size}, "
              f"{params / 1e6:.1f}M params, float32")
        if "generate" in chosen:
            bench_generate(folder, tokenizer, model)
        if "multiturn" in chosen:
            bench_multiturn(tokenizer, model)
            bench_multiturn(tokenizer, model, name=f"LanedEngine ({_lanes()} lanes)",
                            make=functools.partial(LanedEngine.from_model, lanes=_lanes()))
        if "pool" in chosen:
            bench_pool(tokenizer, model)


if __name__ == "__main__":
    main()
