"""Rollout benchmarks: every figure comes with its baseline measured in the same run.

    python scripts/bench/rollout.py                  # all three
    python scripts/bench/rollout.py --only generate  # generate | multiturn | pool
    python scripts/bench/rollout.py --repeats 5      # timed runs per candidate (3)

A tiny Qwen2-shaped model (4 layers, d=256, vocab ~2k, random weights) is written as an
HF checkpoint with `make_tiny_hf` and loaded both by agentjax and by transformers (torch),
so both sides run the same weights.

How it measures (scripts/bench/timing.py), for a machine shared with other jobs: every
engine first compiles every program it can call (`warmup()`, time printed) and every
measured configuration then runs once untimed, so it has met each shape it will meet;
the compile counters (the engine's `COMPILE_COUNTS` and every JAX compilation in the
process, `core/compiles.py`) must not move during a timed run, or the bench stops naming
the run. All sections run in one process, so their engines' programs add up (each
keeps its code mapped): `planned_programs` states them, within a budget
(tests/scripts/test_bench_rollout.py), and the end of a run prints what it compiled. The
repeats of a table's configurations take turns (A B C, B C A, C A B, ...), so load from
other processes hits them alike; each row shows its best run and its spread
((max - min) / min); a ratio is printed only when it differs from 1 by more
than the larger spread of its two rows, otherwise the cell says "unresolved".

1. generate: JaxEngine and LanedEngine (one lane per core, up to 4), each also with
   `deterministic=True` (the price of batch invariance: every decode step over all rows
   at full span), vs HF transformers `generate` — batch 32, 128 new tokens, the same
   sampling (temperature 1, no top-k/top-p), eos disabled on both so every row makes 128
   tokens. Compile / warm-up time (one full-size call each) is printed separately. torch
   runs in worker processes that never import JAX (in one process, XLA's and torch's CPU
   thread pools slow each other down; torch measured >10x slower after JAX had run) and
   serve one run per request, so their runs take turns with the engines'; one worker has
   1 thread and one a thread per CPU: on a machine shared with other jobs, torch's OpenMP
   barriers make the multi-threaded run erratic (10-25x slower measured), so the faster
   of the two is the baseline.
2. multiturn: 16 concurrent sessions x 8 turns (32 new tokens + a 32-token observation per
   turn). Wall time per turn (best over the episodes) with session KV reuse vs
   re-prefilling the whole context every turn (session ids dropped); the two kinds of
   episode alternate.
3. pool: RolloutPool, 64 episodes x 4 turns (48 tokens per turn) against a tool that
   sleeps 100 ms per call vs the same run with zero tool latency (same seeds, so the
   same tokens), plus the same latency with one episode at a time, and the zero-latency
   run on a `deterministic=True` engine (its cost with rows joining and leaving). The
   engine has one slot per concurrent episode, so every session keeps its KV cache
   across turns. Each row also shows its best run's engine program calls and the
   seconds spent inside them: episodes whose turns line up share calls.
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import functools
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def hf_generate_worker(folder: str, new_tokens: int, threads: int) -> None:
    """Serves HF `generate` runs (torch only, no JAX in this process) with `threads` torch
    threads, one per stdin line, so the parent can interleave them with its own runs.

    The first line holds the prompts as JSON; each further line, "sampled" or "greedy",
    runs them once and prints {"seconds", "tokens", "first": the first 8 new tokens of
    the first two prompts} as JSON."""
    # Only this worker process imports torch (see the module docstring).
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(threads)
    ids = torch.tensor(json.loads(sys.stdin.readline()))
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    pad = model.config.pad_token_id or 0
    kwargs = dict(attention_mask=torch.ones_like(ids), pad_token_id=pad,
                  max_new_tokens=new_tokens, min_new_tokens=new_tokens)
    modes = {"sampled": dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0),
             "greedy": dict(do_sample=False)}
    for line in sys.stdin:
        start = time.perf_counter()
        with torch.no_grad():
            out = model.generate(ids, **kwargs, **modes[line.strip()])
        seconds, generated = time.perf_counter() - start, out[:, ids.shape[1]:]
        print(json.dumps({"seconds": seconds, "tokens": int(generated.numel()),
                          "first": generated[:2, :8].tolist()}), flush=True)


if __name__ == "__main__" and sys.argv[1:2] == ["--hf-worker"]:
    hf_generate_worker(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    sys.exit(0)


# The torch worker above must never import JAX (their CPU thread pools slow each other
# down), so JAX and agentjax are imported only below it.
import jax  # noqa: E402
from flax import nnx  # noqa: E402
from timing import Ratio, Runs, measure  # noqa: E402  (scripts/bench/timing.py)

from agentjax.core.task import EpisodeLog, Task, TurnLog  # noqa: E402
from agentjax.envs.base import StepResult
from agentjax.models.hf import load_hf, make_tiny_hf  # noqa: E402
from agentjax.models.tokenizer import build_tokenizer  # noqa: E402
from agentjax.agents.loop import EpisodeLimits  # noqa: E402
from agentjax.engine.jax.programs import COMPILE_COUNTS  # noqa: E402
from agentjax.engine.jax.shapes import engine_shapes  # noqa: E402
from agentjax.core import compiles  # noqa: E402
from agentjax.engine.protocol import GenerateRequest, SamplingParams  # noqa: E402
from agentjax.engine.jax.engine import JaxEngine  # noqa: E402
from agentjax.engine.jax.lanes import LanedEngine  # noqa: E402
from agentjax.agents.pool import RolloutPool  # noqa: E402

MODEL = dict(hidden_size=256, intermediate_size=1024, num_layers=4, num_heads=4,
             num_kv_heads=2, head_dim=64)
# The workloads' sizes (module docstring), and the engines they are run on.
GENERATE = dict(batch=32, prompt_len=32, new_tokens=128)
MULTITURN = dict(sessions=16, turns=8, new_tokens=32, obs_tokens=32, prompt_len=64)
POOL = dict(episodes=64, turns=4, new_tokens=48, latency=0.1, slots=64)
DECODE_STEPS = 16


def generate_engines(batch, prompt_len, new_tokens, lanes) -> dict[str, tuple[int, dict]]:
    """The generate section's engines: name -> (lanes, 0 for a plain JaxEngine; engine
    settings)."""
    settings = dict(max_slots=batch, max_len=prompt_len + new_tokens,
                    decode_steps=DECODE_STEPS, eos_token_ids=())
    return {name: (n, dict(settings, deterministic=deterministic))
            for name, n, deterministic in [
                ("agentjax JaxEngine", 0, False),
                ("agentjax JaxEngine (deterministic)", 0, True),
                (f"agentjax LanedEngine ({lanes} lanes)", lanes, False),
                (f"agentjax LanedEngine ({lanes} lanes, deterministic)", lanes, True)]}


def multiturn_engine(sessions, turns, new_tokens, obs_tokens, prompt_len) -> dict:
    return dict(max_slots=sessions, max_len=prompt_len + turns * (new_tokens + obs_tokens),
                decode_steps=DECODE_STEPS, eos_token_ids=())


def pool_engine(slots) -> dict:
    return dict(max_slots=slots, max_len=512, decode_steps=DECODE_STEPS, eos_token_ids=())


def planned_programs(lanes: int) -> dict[str, int]:
    """The programs each engine of a default run with `lanes` lanes adds to those of the
    engines built before it (`shapes.engine_shapes`; engines of the same model share a
    program when their pools, rows and decode steps agree): what the run compiles for
    its engines, its compile budget (tests/scripts/test_bench_rollout.py)."""
    engines = dict(generate_engines(**GENERATE, lanes=lanes))
    multiturn = multiturn_engine(**{k: MULTITURN[k] for k in (
        "sessions", "turns", "new_tokens", "obs_tokens", "prompt_len")})
    engines["multiturn JaxEngine"] = (0, multiturn)
    engines[f"multiturn LanedEngine ({lanes} lanes)"] = (lanes, multiturn)
    for deterministic in (False, True):
        engines[f"pool{' (deterministic)' * deterministic}"] = (
            0, dict(pool_engine(POOL["slots"]), deterministic=deterministic))
    seen, added = set(), {}
    for name, (lanes_, settings) in engines.items():
        shapes = engine_shapes(**dict(settings, max_slots=settings["max_slots"]
                                      // max(lanes_, 1)))
        programs = {(shapes.max_slots, shapes.view_pages, settings["decode_steps"], program)
                    for program in shapes.programs()}
        added[name] = len(programs - seen)
        seen |= programs
    return added


def compilations() -> tuple[dict, dict]:
    """(engine programs, every jitted function): compilations so far, process-wide."""
    return dict(COMPILE_COUNTS), compiles.by_function(compiles.counts())


def compile_line(before: tuple[dict, dict], timed_runs: int) -> str:
    """What compiled since `before` (warm-ups), and that the timed runs compiled nothing
    (`measure` raises otherwise)."""
    engine, every = ({name: count - start.get(name, 0) for name, count in now.items()
                      if count > start.get(name, 0)}
                     for now, start in zip(compilations(), before))
    return (f"compilations during warm-up: engine programs {engine or 'none'}, "
            f"{sum(every.values())} in all; during the {timed_runs} timed runs: none "
            f"(checked after each)")


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


def timed_work(results: list[tuple[float, int]]) -> tuple[Runs, Runs, int]:
    """(seconds, seconds per unit of work, units of the first run) of runs that each
    returned (seconds, units of work done)."""
    seconds = Runs(tuple(s for s, _ in results))
    units = [u for _, u in results]
    return seconds, seconds.per(units), units[0]


# --------------------------------------------------------------------------- generate

def _lanes() -> int:
    """LanedEngine lanes: one per core, at most 4 (dividing the benches' batches)."""
    return max(n for n in (1, 2, 4) if n <= os.cpu_count())


class HFWorker:
    """A `hf_generate_worker` process kept running, so its runs can take turns with the
    JAX engines' runs."""

    def __init__(self, folder: Path, new_tokens: int, threads: int, prompts: list):
        self._stderr = tempfile.TemporaryFile("w+")
        self._process = subprocess.Popen(
            [sys.executable, __file__, "--hf-worker", str(folder), str(new_tokens),
             str(threads)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=self._stderr, text=True)
        self._process.stdin.write(json.dumps(prompts) + "\n")

    def run(self, mode: str) -> dict:
        """One run, "sampled" or "greedy": {"seconds", "tokens", "first"}."""
        self._process.stdin.write(mode + "\n")
        self._process.stdin.flush()
        line = self._process.stdout.readline()
        if not line:
            self._stderr.seek(0)
            raise RuntimeError(f"HF worker exited with status {self._process.wait()}:\n"
                               f"{self._stderr.read()[-3000:]}")
        return json.loads(line)

    def sampled(self) -> tuple[float, int]:
        result = self.run("sampled")
        return result["seconds"], result["tokens"]

    def close(self) -> None:
        self._process.stdin.close()
        self._process.wait()
        self._stderr.close()


def bench_generate(folder: Path, tokenizer, model, batch=GENERATE["batch"],
                   prompt_len=GENERATE["prompt_len"], new_tokens=GENERATE["new_tokens"],
                   repeats=3):
    rng = np.random.default_rng(1)
    prompts = rng.integers(10, len(tokenizer), size=(batch, prompt_len)).tolist()
    sampling = SamplingParams(temperature=1.0, top_p=1.0, top_k=-1, max_new_tokens=new_tokens)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=8)
    before = compilations()
    workers = {f"HF generate (torch, {threads} thread{'s' * (threads > 1)})":
               HFWorker(folder, new_tokens, threads, prompts)
               for threads in sorted({1, os.cpu_count()})}
    engines = {name: (functools.partial(LanedEngine.from_model, lanes=lanes) if lanes
                      else JaxEngine.from_model)(model, tokenizer=tokenizer, **settings)
               for name, (lanes, settings) in generate_engines(
                   batch, prompt_len, new_tokens, _lanes()).items()}

    def engine_run(engine) -> tuple[float, int]:
        requests = [GenerateRequest(p, dataclasses.replace(sampling, seed=i))
                    for i, p in enumerate(prompts)]
        start = time.perf_counter()
        out = engine.generate_sync(requests)
        return time.perf_counter() - start, sum(len(c[0].output_ids) for c in out)

    candidates = {name: worker.sampled for name, worker in workers.items()}
    candidates.update({name: functools.partial(engine_run, engine)
                       for name, engine in engines.items()})
    # Warm-up, timed on its own: an engine compiles every program and makes one full-size
    # call; torch makes one call (its process start and model load are not counted).
    warm_s = {}
    for name, call in candidates.items():
        start = time.perf_counter()
        if name in engines:
            engines[name].warmup()
        seconds, _ = call()
        warm_s[name] = seconds if name in workers else time.perf_counter() - start
    results = measure(candidates, repeats, warmup=False, compilations=compilations)
    compiled = compile_line(before, repeats * len(candidates))
    # Same weights: greedy continuations of two prompts must agree with torch's.
    first = {name: worker.run("greedy")["first"] for name, worker in workers.items()}
    first.update({name: [c[0].output_ids for c in engine.generate_sync(
        [GenerateRequest(p, greedy) for p in prompts[:2]])] for name, engine in engines.items()})
    for closeable in (*workers.values(), *engines.values()):
        closeable.close()

    measured = {name: timed_work(runs) for name, runs in results.items()}
    hf_name = min(workers, key=lambda name: measured[name][0].best)
    hf_per_token = measured[hf_name][1]
    agree = {name: sum(a == b for x, y in zip(first[name], first[hf_name])
                       for a, b in zip(x, y)) for name in engines}
    print(f"\n## Generation: batch {batch}, prompt {prompt_len}, {new_tokens} new tokens, "
          f"temperature 1.0 (sampled); best of {repeats} interleaved runs")
    print(f"greedy agreement with torch (same weights), of 16 tokens: {agree}")
    print(compiled)
    rows = []
    for name, (seconds, per_token, tokens) in measured.items():
        rows.append([name, f"{warm_s[name]:.2f}", tokens,
                     "/".join(f"{t:.2f}" for t in seconds.costs), f"{seconds.best:.2f}",
                     seconds.spread_text(), f"{1 / per_token.best:.0f}",
                     "baseline" if name == hf_name else Ratio.of(hf_per_token, per_token).text()])
    table(["engine", "warm-up/compile s", "tokens", "runs s", "best s", "spread", "tokens/s",
           "vs best HF"], rows)


# --------------------------------------------------------------------------- multi-turn

def bench_multiturn(tokenizer, model, sessions=MULTITURN["sessions"],
                    turns=MULTITURN["turns"], new_tokens=MULTITURN["new_tokens"],
                    obs_tokens=MULTITURN["obs_tokens"], prompt_len=MULTITURN["prompt_len"],
                    repeats=3, make=JaxEngine.from_model, name="JaxEngine"):
    engine = make(model, tokenizer=tokenizer, **multiturn_engine(
        sessions, turns, new_tokens, obs_tokens, prompt_len))
    rng = np.random.default_rng(2)
    vocab = len(tokenizer)
    prompts = rng.integers(10, vocab, size=(sessions, prompt_len)).tolist()
    observation = rng.integers(10, vocab, size=obs_tokens).tolist()
    episode_ids = itertools.count()

    async def episode(use_sessions: bool):
        """Per-turn seconds and mean cached tokens per session of one episode (same seeds,
        so the same tokens, every time)."""
        tag = f"episode{next(episode_ids)}"
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

    before = compilations()
    start = time.perf_counter()
    programs = engine.warmup()
    compile_s = time.perf_counter() - start
    results = measure({"reuse": lambda: asyncio.run(episode(True)),
                       "scratch": lambda: asyncio.run(episode(False))},
                      repeats, compilations=compilations)
    engine.close()
    reuse, scratch = ([Runs(tuple(times[t] for times, _ in results[kind]))
                       for t in range(turns)] for kind in ("reuse", "scratch"))
    cached = results["reuse"][0][1]
    print(f"\n## Multi-turn, {name}: {sessions} concurrent sessions, {new_tokens} new + "
          f"{obs_tokens} observation tokens per turn, prompt {prompt_len}; per turn the best "
          f"of {repeats} episodes, reuse and re-prefill episodes alternating (warm-up: "
          f"{programs} programs in {compile_s:.1f} s, then one episode of each)")
    print(compile_line(before, 2 * repeats))
    rows = []
    for t in range(turns):
        rows.append([t + 1, f"{cached[t]:.0f}", f"{reuse[t].best * 1e3:.0f}",
                     reuse[t].spread_text(),
                     "baseline" if t == 0 else Ratio.of(reuse[t], reuse[0]).text(),
                     f"{scratch[t].best * 1e3:.0f}", scratch[t].spread_text(),
                     "baseline" if t == 0 else Ratio.of(scratch[t], scratch[0]).text(),
                     Ratio.of(scratch[t], reuse[t]).text()])
    table(["turn", "cached tokens/session", "session reuse ms", "spread", "vs turn 1",
           "re-prefill ms", "spread", "vs turn 1", "re-prefill / reuse"], rows)


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


# Engine counters a pool run reports: program calls (how well its episodes share calls)
# and seconds inside them (the rest is host work and waiting).
PROGRAM_STATS = ("prefill_calls", "decode_calls", "prefill_s", "decode_s")


def bench_pool(tokenizer, model, episodes=POOL["episodes"], turns=POOL["turns"],
               new_tokens=POOL["new_tokens"], latency=POOL["latency"], slots=POOL["slots"],
               repeats=3):
    tasks = [Task(f"t{i}", f"question number {i} about the world") for i in range(episodes // 4)]
    sampling = SamplingParams(temperature=1.0, max_new_tokens=new_tokens, seed=0)
    limits = EpisodeLimits(max_turns=turns, max_context_tokens=512)
    before = compilations()

    def make_engine(**options):
        """A warmed-up engine, its program count and its warm-up seconds."""
        engine = JaxEngine.from_model(model, tokenizer=tokenizer, **pool_engine(slots),
                                      **options)
        start = time.perf_counter()
        programs = engine.warmup()
        return engine, programs, time.perf_counter() - start

    engine, programs, compile_s = make_engine()
    det_engine, det_programs, det_compile_s = make_engine(deterministic=True)
    pools = []

    def configuration(engine, latency_s, concurrency, task_list, group):
        """A run of the configuration: (seconds, tokens, episodes, engine PROGRAM_STATS
        during the run). Every run starts at group id 0: the same seeds, so the same
        tokens."""
        pool = RolloutPool(engine, lambda: LatencyEnv(latency_s, turns), tokenizer,
                           limits=limits, concurrency=concurrency)
        pools.append(pool)

        def run():
            stats = dict(engine.stats)
            start = time.perf_counter()
            groups = pool.collect_sync(task_list, group, sampling=sampling, first_group_id=0)
            elapsed = time.perf_counter() - start
            trajs = [t for g in groups for t in g]
            assert not any(t.metadata["failed"] for t in trajs)
            programs = {key: engine.stats[key] - stats.get(key, 0) for key in PROGRAM_STATS}
            return (elapsed, sum(len(turn.action_ids) for t in trajs for turn in t.turns),
                    len(trajs), programs)
        return run

    zero = "zero tool latency"
    results = measure({
        zero: configuration(engine, 0.0, episodes, tasks, 4),
        f"{latency * 1e3:.0f} ms tool latency": configuration(engine, latency, episodes,
                                                              tasks, 4),
        f"{latency * 1e3:.0f} ms, one episode at a time": configuration(engine, latency, 1,
                                                                        tasks[:2], 2),
        "zero tool latency, deterministic engine": configuration(det_engine, 0.0, episodes,
                                                                 tasks, 4),
    }, repeats, compilations=compilations)
    for closeable in (*pools, engine, det_engine):
        closeable.close()

    print(f"\n## Pool: {episodes} episodes x {turns} turns, {new_tokens} tokens per turn, "
          f"engine {slots} slots, concurrency {episodes}; best of {repeats} interleaved runs "
          f"(warm-up: {programs} programs in {compile_s:.1f} s; deterministic engine: "
          f"{det_programs} in {det_compile_s:.1f} s; then one run of each row)")
    print(compile_line(before, repeats * len(results)))
    measured = {name: timed_work([run[:2] for run in runs]) for name, runs in results.items()}
    base = measured[zero][1]
    rows = []
    for name, (seconds, per_token, tokens) in measured.items():
        _, _, count, programs = results[name][seconds.costs.index(seconds.best)]
        rows.append([name, count, tokens, "/".join(f"{t:.2f}" for t in seconds.costs),
                     f"{seconds.best:.2f}", seconds.spread_text(), f"{1 / per_token.best:.0f}",
                     "baseline" if name == zero else Ratio.of(base, per_token).text(),
                     f"{programs['prefill_calls']} / {programs['decode_calls']}",
                     f"{programs['prefill_s'] + programs['decode_s']:.2f}"])
    table(["run", "episodes", "tokens", "runs s", "best s", "spread", "tokens/s",
           "vs zero latency", "prefill / decode calls (best run)", "in programs s"], rows)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="generate,multiturn,pool")
    parser.add_argument("--repeats", type=int, default=3,
                        help="timed runs of each configuration (at least 2: one run has no "
                             "spread, so its ratios are not printed)")
    args = parser.parse_args()
    chosen = set(args.only.split(","))
    print(f"jax {jax.__version__} on {jax.devices()[0].platform}, {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "tiny-qwen2"
        tokenizer, model = build_checkpoint(folder)
        params = sum(x.size for x in jax.tree.leaves(nnx.state(model)))
        print(f"model: Qwen2-shaped {MODEL}, vocab {model.config.vocab_size}, "
              f"{params / 1e6:.1f}M params, float32")
        if "generate" in chosen:
            bench_generate(folder, tokenizer, model, repeats=args.repeats)
        if "multiturn" in chosen:
            bench_multiturn(tokenizer, model, repeats=args.repeats)
            bench_multiturn(tokenizer, model, repeats=args.repeats,
                            name=f"LanedEngine ({_lanes()} lanes)",
                            make=functools.partial(LanedEngine.from_model, lanes=_lanes()))
        if "pool" in chosen:
            bench_pool(tokenizer, model, repeats=args.repeats)
    planned = planned_programs(_lanes())
    print(f"\nthis process compiled {compiles.summary(compiles.counts())}; a default run's "
          f"engines plan {sum(planned.values())} programs ({planned})")


if __name__ == "__main__":
    main()
