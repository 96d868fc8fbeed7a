"""Engine bench: does the JaxEngine pay for the tokens it holds, not for max_len?

    python scripts/bench/engine.py                        # vs the engine before paging
    python scripts/bench/engine.py --baseline HEAD~3      # vs another commit
    python scripts/bench/engine.py --baseline none        # this checkout alone
    python scripts/bench/engine.py --only batch,group     # some workloads

Every workload runs on this checkout's engine and, in the same run, on the baseline
commit's (a git worktree made for the bench; default: 6dd2164, the last engine with a
fixed [max_slots, max_len] cache), each in its own process. Model: a random Qwen2 shape
(`--model`, MODELS: by default 4 layers, hidden 256, 8 query / 2 kv heads of 32), vocab
1024, float32; eos off, so every row makes all its tokens.

Workloads (each warmed up once — it meets every program shape it will meet — then timed
`--repeats` times; the best run is shown, with its spread):
  batch       32 x 256-token prompts, 64 new tokens, at max_len 1,024 and 32,768, both
              modes: prefill and decode seconds (device calls) and their 32k / 1k ratio
              (goal <= 1.15); deterministic / default decode (goal <= 1.2).
  long_row    31 x 256 + one 4,096-token prompt at max_len 8,192: decode seconds over
              the all-short batch at the same max_len (goal <= 1.3).
  group       one 1,024-token prompt, n=8 samples: prompt tokens prefilled (goal
              <= 1.1k).
  multiturn   16 sessions x 8 turns (32 new + 32 observation tokens a turn, 64-token
              prompts): wall seconds of turn 8 over turn 1 (goal <= 1.1).
  agent       the main job's rollout shape (configs/grpo_search.py: 64 slots, 512-token
              cap, 24-token actions, deterministic): 64 sessions x 4 turns of 24 new +
              40 observation tokens over 160-token prompts, wall seconds.
  agreeing    agent as 8 GRPO groups of 8 whose samples agree: a group's 8 sessions share
              a prompt and a seed, so they take the same actions and see the same
              observations at every turn (the main job's trained policy, at ~0.1 nat a
              token, often does): tokens prefilled and wall seconds.
  host        the device bench's decode shape at a smaller length (64 x 1,024-token
              prompts, 512 new tokens each): the scheduler's host time per call.
Seeded sampling (temperature 1) in float32: the last table counts the completions whose
tokens equal the baseline's. Every row prints the KV bytes: the pool the engine holds (the baseline reserves
max_slots x max_len), the peak of pages in use, and the peak of those a sequence or a
parked session holds ("held": in use less the shared contexts only the engine's cache
references; this checkout); and the host time between device calls per decode call
(this checkout).

The ratio against HF `generate` is scripts/bench/rollout.py's (`--only generate`).
"""
from __future__ import annotations

import argparse
import inspect
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from timing import Ratio, Runs

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_BASELINE = "6dd2164"
VOCAB = 1024


# --------------------------------------------------------------------------- workloads
# Each returns (requests per round, rounds): a round is one `generate` call; a workload
# with sessions runs its rounds in order, each extending the contexts.

def _prompts(rng, count: int, length: int) -> list[list[int]]:
    return rng.integers(10, VOCAB, size=(count, length)).tolist()


def run_workload(engine, name: str, rng_seed: int = 0) -> dict:
    """Runs workload `name` once; returns its wall seconds (per round for multi-turn
    ones) and the engine's counters that moved."""
    from agentjax.engine.protocol import GenerateRequest, SamplingParams

    rng = np.random.default_rng(rng_seed)
    before = dict(engine.stats)
    sampling = lambda seed, n=1, new=64: SamplingParams(  # noqa: E731
        temperature=1.0, max_new_tokens=new, seed=seed, n=n)
    rounds: list[float] = []
    outputs: list[list[int]] = []

    def timed_generate(requests):
        start = time.perf_counter()
        out = engine.generate_sync(requests)
        rounds.append(time.perf_counter() - start)
        outputs.extend(c.output_ids for completions in out for c in completions)
        return out

    if name == "batch":
        timed_generate([GenerateRequest(p, sampling(i))
                        for i, p in enumerate(_prompts(rng, 32, 256))])
    elif name == "long_row":
        prompts = _prompts(rng, 31, 256) + _prompts(rng, 1, 4096)
        timed_generate([GenerateRequest(p, sampling(i)) for i, p in enumerate(prompts)])
    elif name == "host":
        timed_generate([GenerateRequest(p, sampling(i, new=512))
                        for i, p in enumerate(_prompts(rng, 64, 1024))])
    elif name == "group":
        timed_generate([GenerateRequest(_prompts(rng, 1, 1024)[0], sampling(0, n=8))])
    elif name in ("multiturn", "agent", "agreeing"):
        sessions, turns, new, observed, prompt = ((16, 8, 32, 32, 64) if name == "multiturn"
                                                  else (64, 4, 24, 40, 160))
        group = 8 if name == "agreeing" else 1  # sessions sharing a prompt and a seed
        contexts = [list(p) for p in _prompts(rng, sessions // group, prompt)
                    for _ in range(group)]
        observation = _prompts(rng, 1, observed)[0]
        tag = f"{name}-{time.perf_counter_ns()}"
        for _ in range(turns):
            out = timed_generate([GenerateRequest(ctx, sampling(i // group, new=new),
                                                  session_id=f"{tag}-{i}")
                                  for i, ctx in enumerate(contexts)])
            for ctx, [c] in zip(contexts, out):
                ctx.extend(c.output_ids + observation)
        for i in range(sessions):
            engine.end_session(f"{tag}-{i}")
    else:
        raise ValueError(f"unknown workload {name!r}")
    moved = {k: v - before.get(k, 0) for k, v in engine.stats.items()}
    return dict(rounds=rounds, wall=sum(rounds), outputs=outputs, **moved)


# The bench's model shapes (random weights, float32):
#   tiny       4 layers, hidden 256, 8 / 2 heads of 32, SwiGLU 1,024 (the default).
#   3b_layers  2 layers of Qwen2.5-3B's shape (hidden 2,048, 16 / 2 heads of 128, SwiGLU
#              11,008). A token's keys and values are 6.6e-6 of a layer's weights in
#              bytes, Qwen2.5-3B's own ratio; in the tiny shape they are 1.3e-4, 20x more.
#              Decode reads every weight once a step and every held key once a token, so
#              how much a longer context costs follows this ratio.
MODELS = {
    "tiny": dict(hidden_size=256, intermediate_size=1024, num_layers=4, num_heads=8,
                 num_kv_heads=2, head_dim=32),
    "3b_layers": dict(hidden_size=2048, intermediate_size=11008, num_layers=2,
                      num_heads=16, num_kv_heads=2, head_dim=128),
}


# Engine settings per workload: (max_slots, max_len, KV tokens of the pool).
def engine_settings(name: str, max_len: int | None) -> tuple[int, int, int]:
    return {"batch": (32, max_len, 32 * 1024), "long_row": (32, 8192, 32 * 1024),
            "group": (8, 2048, 8 * 2048), "multiturn": (16, 576, 16 * 576),
            "agent": (64, 512, 64 * 512), "agreeing": (64, 512, 64 * 512),
            "host": (64, 2048, 64 * 1536)}[name]


# The workloads at their own max_len (the batch ones run at several), in print order.
OWN_LENGTH = ("group", "multiturn", "agent", "agreeing", "host")


def worker(spec: dict) -> dict:
    """One (checkout, workload, mode) measurement, in this process (the parent put the
    checkout first on sys.path)."""
    import jax
    from flax import nnx

    from agentjax.engine.jax.engine import JaxEngine
    from agentjax.models.config import ModelConfig
    from agentjax.models.decoder import Decoder

    config = ModelConfig(arch="qwen2", vocab_size=VOCAB, qkv_bias=True,
                         **MODELS[spec["model"]])
    model = Decoder(config, rngs=nnx.Rngs(0))
    slots, max_len, kv_tokens = engine_settings(spec["workload"], spec.get("max_len"))
    kwargs = dict(max_slots=slots, max_len=max_len, decode_steps=8, eos_token_ids=(),
                  deterministic=spec["deterministic"])
    paged = "kv_pages" in inspect.signature(JaxEngine).parameters
    if paged:
        kwargs["kv_pages"] = -(-kv_tokens // 64)
    engine = JaxEngine.from_model(model, **kwargs)
    # The warm-up meets every shape the runs meet; each run draws fresh prompts of the
    # same lengths, so no run reuses pages another left behind.
    run_workload(engine, spec["workload"], rng_seed=0)
    compiles = dict(engine.compile_counts)
    runs = [run_workload(engine, spec["workload"], rng_seed=i + 1)
            for i in range(spec["repeats"])]
    engine.close()
    token_bytes = 2 * config.num_layers * config.num_kv_heads * config.head_dim * 4
    if paged:
        pool = engine.kv_pages * engine.stats["kv_page_bytes"]
        peak = engine.stats["peak_kv_pages"] * engine.stats["kv_page_bytes"]
        held = engine.stats.get("peak_kv_pages_held")  # absent before 2026-12-05
        held = None if held is None else held * engine.stats["kv_page_bytes"]
    else:
        pool, peak, held = slots * max_len * token_bytes, None, None
    return dict(runs=runs, pool_bytes=pool, peak_bytes=peak, held_bytes=held,
                compiled_while_timed=dict(engine.compile_counts) != compiles,
                devices=str(jax.devices()[0].device_kind))


# --------------------------------------------------------------------------- parent

def baseline_checkout(commit: str) -> Path:
    """A worktree of `commit` (made once, kept under the system temp folder)."""
    sha = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", commit],
                         check=True, capture_output=True, text=True).stdout.strip()
    path = Path(tempfile.gettempdir()) / f"agentjax-engine-baseline-{sha}"
    if not (path / "agentjax").is_dir():
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(path),
                        sha], check=True, capture_output=True)
    return path


def measure(checkout: Path, spec: dict) -> dict:
    env = dict(os.environ, PYTHONPATH=str(checkout), JAX_PLATFORMS="cpu")
    out = subprocess.run([sys.executable, __file__, "--worker", json.dumps(spec)],
                         env=env, cwd=str(checkout), capture_output=True, text=True)
    if out.returncode:
        why = ("killed by signal 9 (out of memory?)" if out.returncode == -9
               else f"exit {out.returncode}: {out.stderr.strip().splitlines()[-1:]}")
        return dict(error=why)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _runs(result: dict, key: str) -> Runs:
    return Runs(tuple(float(r.get(key, 0.0)) for r in result["runs"]))


def _best(result: dict, key: str) -> str:
    return f"{min(float(r.get(key, 0.0)) for r in result['runs']):.3f}"


def _mb(n) -> str:
    return "-" if n is None else f"{n / 2 ** 20:.0f}"


def table(headers, rows):
    print("| " + " | ".join(headers) + " |")
    print("|" + "---|" * len(headers))
    for row in rows:
        print("| " + " | ".join(str(c) for c in row) + " |")


def _ratio(numerator: Runs, denominator: Runs) -> str:
    """The ratio of the best runs, saying when it lies within the runs' noise (a goal
    "<= x" is then judged on the value alone)."""
    ratio = Ratio.of(numerator, denominator)
    return f"{ratio.value:.2f}x" + ("" if ratio.resolved else f" ({ratio.text()})")


def _host_gap(result: dict) -> str:
    calls = sum(r.get("decode_calls", 0) + r.get("prefill_calls", 0) for r in result["runs"])
    gap = sum(r.get("host_gap_s", 0.0) for r in result["runs"])
    return f"{gap / calls * 1e3:.2f}" if calls and "host_gap_s" in result["runs"][0] else "-"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--baseline", default=DEFAULT_BASELINE,
                        help="commit of the engine to compare with ('none': skip)")
    parser.add_argument("--only", default=",".join(("batch", "long_row") + OWN_LENGTH))
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--model", default="tiny", choices=sorted(MODELS),
                        help="model shape (MODELS)")
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return
    sides = {"paged (this checkout)": ROOT}
    if args.baseline != "none":
        sides[f"baseline {args.baseline}"] = baseline_checkout(args.baseline)
    only = args.only.split(",")
    cases = []
    if "batch" in only:
        cases += [("batch", m, d) for d in (False, True) for m in (1024, 32768)]
    if "long_row" in only:
        cases += [("batch", 8192, False), ("long_row", None, False)]
    cases += [(w, None, d) for w in OWN_LENGTH if w in only
              for d in ((False,) if w in ("group", "host") else (False, True))]
    results = {}
    for side, checkout in sides.items():
        for workload, max_len, det in dict.fromkeys(cases):
            spec = dict(workload=workload, max_len=max_len, deterministic=det,
                        repeats=args.repeats, model=args.model)
            start = time.perf_counter()
            r = measure(checkout, spec)
            print(f"# {side}: {workload} max_len={max_len} deterministic={det}: "
                  f"{time.perf_counter() - start:.0f} s"
                  + (f"  FAILED: {r['error']}" if "error" in r else "")
                  + ("  (compiled while timed!)" if r.get("compiled_while_timed") else ""),
                  flush=True)
            if "error" not in r:
                results[side, workload, max_len, det] = r

    print(f"\n## Engine bench ({next(iter(results.values()))['devices']}, model "
          f"{args.model}), best of {args.repeats} runs after a warm-up run\n")
    rows = []
    for (side, workload, max_len, det), r in results.items():
        rows.append([side, workload, max_len or "", "det" if det else "default",
                     _best(r, "prefill_s"), _best(r, "decode_s"),
                     f"{_runs(r, 'wall').best:.3f}", _runs(r, "wall").spread_text(),
                     int(r["runs"][0].get("prefill_tokens", 0)), _mb(r["pool_bytes"]),
                     _mb(r["peak_bytes"]), _mb(r.get("held_bytes")), _host_gap(r)])
    table(["engine", "workload", "max_len", "mode", "prefill s", "decode s", "wall s",
           "spread", "prefilled tokens", "KV pool MiB", "KV peak MiB", "held MiB",
           "host ms / call"], rows)

    print("\n## Ratios (goal in brackets)\n")
    rows = []
    for side in sides:
        get = lambda w, m, d: results.get((side, w, m, d))  # noqa: E731
        for det in (False, True):
            short, long = get("batch", 1024, det), get("batch", 32768, det)
            if short and long:
                for key in ("prefill_s", "decode_s"):
                    rows.append([side, f"batch {key[:-2]} 32k / 1k, "
                                 f"{'det' if det else 'default'} (<= 1.15)",
                                 _ratio(_runs(long, key), _runs(short, key))])
        det, default = get("batch", 1024, True), get("batch", 1024, False)
        if det and default:
            rows.append([side, "batch decode det / default at 1k (<= 1.2)",
                         _ratio(_runs(det, "decode_s"), _runs(default, "decode_s"))])
        long, short = get("long_row", None, False), get("batch", 8192, False)
        if long and short:
            rows.append([side, "decode, one 4k row / all short, max_len 8k (<= 1.3)",
                         _ratio(_runs(long, "decode_s"), _runs(short, "decode_s"))])
        group = get("group", None, False)
        if group:
            rows.append([side, "group of 8, 1,024-token prompt: tokens prefilled (<= 1.1k)",
                         int(group["runs"][0].get("prefill_tokens", 0))])
        for det in (False, True):
            turns = get("multiturn", None, det)
            if turns:
                per_turn = [Runs(tuple(r["rounds"][t] for r in turns["runs"]))
                            for t in range(len(turns["runs"][0]["rounds"]))]
                rows.append([side, f"multiturn turn 8 / turn 1, "
                             f"{'det' if det else 'default'} (<= 1.1)",
                             _ratio(per_turn[-1], per_turn[0])])
    table(["engine", "ratio", "value"], rows)
    if len(sides) == 2:
        print("\n## This checkout against the baseline, wall seconds (lower is better)\n")
        paged, base = sides
        rows = []
        for (side, workload, max_len, det), r in results.items():
            if side == paged and (base, workload, max_len, det) in results:
                b = results[base, workload, max_len, det]
                pairs = [(x, y) for run_a, run_b in zip(r["runs"], b["runs"])
                         for x, y in zip(run_a["outputs"], run_b["outputs"])]
                same = sum(x == y for x, y in pairs)
                rows.append([workload, max_len or "", "det" if det else "default",
                             _ratio(_runs(r, "wall"), _runs(b, "wall")),
                             f"{same} / {len(pairs)}"])
        table(["workload", "max_len", "mode", "paged / baseline",
               "completions token-exact"], rows)


if __name__ == "__main__":
    main()
