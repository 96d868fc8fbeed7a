"""Overlap bench: the JaxEngine with `overlap` on against off, one engine, one process.

    python scripts/bench/overlap.py                                  # agent, host; steps 1, 8
    python scripts/bench/overlap.py --only agent --decode-steps 1 --repeats 6

With overlap each decode call is dispatched before the previous one is read, so the
scheduler's host work between calls runs while the device computes (engine/jax/rounds.py).
This bench flips `engine.overlap` between runs of one engine: the same programs, the
same prompts on both sides (run i of each side draws prompts from seed i), the runs
interleaved (scripts/bench/timing.py), no compilation while timed. Workloads, model
shapes and engine settings are scripts/bench/engine.py's, with `--decode-steps` tokens
per decode call (fewer steps: more calls, so more host work per token).

Per (workload, decode steps, mode) it prints wall seconds both ways (best, spread), their
ratio (or why it is unresolved), the host time per call the device sat idle, the decode
calls, how many were overlapped and how many of those found the previous call already
finished (host bound), and whether every completion is token-exact on against off.
On a CPU the host thread and XLA share the cores, so what overlap hides is bounded by
the host gap it removes; on an accelerator the device does not wait for the host at all
(scripts/bench/device.py measures that A/B there).
"""
from __future__ import annotations

import argparse

from flax import nnx

from engine import MODELS, VOCAB, engine_settings, run_workload, table
from rollout import compilations
from timing import Ratio, Runs, measure

from agentjax.engine.jax.engine import JaxEngine
from agentjax.models.config import ModelConfig
from agentjax.models.decoder import Decoder


def side(engine: JaxEngine, workload: str, overlap: bool, runs: list):
    """A `measure` candidate: one run of `workload` with overlap on or off, the k-th
    drawing prompts from seed k; appends what the run returned to `runs`."""
    def run() -> float:
        engine.overlap = overlap  # read between decode calls; the engine is idle here
        result = run_workload(engine, workload, rng_seed=len(runs))
        runs.append(result)
        return result["wall"]
    return run


def bench(workload: str, steps: int, deterministic: bool, model: str, repeats: int):
    config = ModelConfig(arch="qwen2", vocab_size=VOCAB, qkv_bias=True, **MODELS[model])
    slots, max_len, kv_tokens = engine_settings(workload, None)
    engine = JaxEngine.from_model(Decoder(config, rngs=nnx.Rngs(0)), max_slots=slots,
                                  max_len=max_len, decode_steps=steps, eos_token_ids=(),
                                  deterministic=deterministic, kv_pages=-(-kv_tokens // 64))
    runs = {True: [], False: []}
    try:
        measure({on: side(engine, workload, on, runs[on]) for on in (True, False)},
                repeats, compilations=compilations)
    finally:
        engine.close()
    walls = {on: Runs(tuple(r["wall"] for r in runs[on][1:])) for on in runs}

    def per_call(on: bool, key: str) -> float:
        timed = runs[on][1:]
        calls = sum(r.get("decode_calls", 0) + r.get("prefill_calls", 0) for r in timed)
        return sum(r.get(key, 0) for r in timed) / max(calls, 1)

    last = {on: runs[on][-1] for on in runs}
    exact = sum(a["outputs"] == b["outputs"] for a, b in zip(runs[True], runs[False]))
    return [workload, steps, "det" if deterministic else "default",
            f"{walls[True].best:.3f} ({walls[True].spread_text()})",
            f"{walls[False].best:.3f} ({walls[False].spread_text()})",
            Ratio.of(walls[True], walls[False]).text(),
            " / ".join(f"{per_call(on, 'host_gap_s') * 1e3:.2f}" for on in (True, False)),
            last[True].get("decode_calls", 0), last[True].get("overlapped_decode_calls", 0),
            last[True].get("host_bound_decode_calls", 0),
            f"{exact} / {len(runs[True])} runs"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="agent,host", help="engine.py workloads")
    parser.add_argument("--decode-steps", default="1,8", help="decode_steps values")
    parser.add_argument("--deterministic", action="store_true")
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--model", default="tiny", choices=sorted(MODELS))
    args = parser.parse_args()
    rows = [bench(workload, int(steps), args.deterministic, args.model, args.repeats)
            for workload in args.only.split(",") for steps in args.decode_steps.split(",")]
    print(f"\n## Overlap on / off (model {args.model}, best of {args.repeats} interleaved "
          f"runs after a warm-up run each)\n")
    table(["workload", "decode steps", "mode", "wall s, on", "wall s, off", "on / off",
           "host ms / call on / off", "decode calls", "overlapped", "host bound",
           "token-exact"], rows)


if __name__ == "__main__":
    main()
