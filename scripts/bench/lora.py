"""LoRA against full fine-tuning: GRPO from the same SFT agent at ranks 1, 8 and 32.

    python scripts/bench/lora.py [--variant cpu] [--seeds 0,1,2] [--sft_from WORKDIR]
        [--arms full,r1,r8,r32,attn8] [--lr_scale 10] [--out runs/lora]
        [-- --config.key=value ...]
    python scripts/bench/lora.py --variant test --seeds 0 --out /tmp/lora   # a minute

Per seed, one SFT run (configs/sft_search.py: the main job's pretraining and SFT,
configs/grpo_search.py, on that seed; or, with --sft_from, that finished run's agent
for every seed), then GRPO (configs/grpo_search.py of the variant, `init_from` the SFT
agent) per arm:
  full    full fine-tuning at the variant's optim.lr: the baseline every ratio divides by
  r1, r8, r32   LoRA of that rank on all seven projections, alpha 32, at lr_scale x
          optim.lr ("LoRA Without Regret": the best LoRA lr is ~10x full fine-tuning's)
  attn8   rank 8 on q, k, v, o only (reported as the attention-only control)
  r8_lrN  rank 8 at N x optim.lr (a small sweep: --arms r8_lr5,r8_lr20)
Flags after `--` go to every run. Finished runs are skipped (a rerun continues). The
table (<out>/lora.md, printed): held-out sampled and greedy success (mean over seeds
and per seed), wall-clock minutes of the GRPO run, mean RL step time, and the run's
peak resident memory (ru_maxrss of the training process; on CPU the whole process:
params, engine, activations), each with its ratio to `full` measured in this run.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
TRAIN = str(ROOT / "scripts" / "train.py")
ALL = "q,k,v,o,gate,up,down"


def arm_overrides(arm: str, lr: float, lr_scale: float) -> dict[str, object]:
    """The config overrides of one arm (module docstring) at the variant's lr."""
    if arm == "full":
        return {}
    match = re.fullmatch(r"(r|attn)(\d+)(?:_lr(\d+(?:\.\d+)?))?", arm)
    if match is None:
        raise SystemExit(f"unknown arm {arm!r}: full, rR, attnR or rR_lrN")
    kind, rank, scale = match.group(1), int(match.group(2)), match.group(3)
    return {"model.lora.rank": rank, "model.lora.targets": "q,k,v,o" if kind == "attn" else ALL,
            "optim.lr": lr * (float(scale) if scale else lr_scale)}


def run(config: str, workdir: Path, overrides: dict, extra: list[str]) -> dict:
    """scripts/train.py to the end (skipped when finished): (final.json, peak RSS
    GiB, wall-clock seconds)."""
    done = workdir / "final.json"
    measured = workdir / "bench.json"
    if done.exists() and measured.exists():
        return json.loads(measured.read_text())
    argv = [sys.executable, TRAIN, f"--config={config}", f"--workdir={workdir}",
            *(f"--config.{k}={v}" for k, v in overrides.items()), *extra]
    workdir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with open(workdir / "bench.log", "w") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
        _, status, usage = os.wait4(process.pid, 0)
    if status:
        raise SystemExit(f"{' '.join(argv)} failed: see {workdir / 'bench.log'}")
    metrics = workdir / "metrics.jsonl"  # the RL stage's (an SFT-only run has none)
    rows = ([json.loads(line) for line in metrics.read_text().splitlines()]
            if metrics.exists() else [])
    steps = [row["time/step_s"] for row in rows if "time/step_s" in row]
    result = {"final": json.loads(done.read_text()), "peak_gib": usage.ru_maxrss / 2**20,
              "wall_s": time.perf_counter() - started,
              "step_s": float(np.mean(steps)) if steps else None}
    measured.write_text(json.dumps(result))
    return result


def _mean(values):
    values = [v for v in values if v is not None]
    return float(np.mean(values)) if values else None


def _cell(value, digits=3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def report(results: dict[str, dict[int, dict]], sft: dict[int, dict], *, variant: str) -> str:
    """The markdown table of the module docstring."""
    def measured(by_seed, key):
        return _mean([r[key] for r in by_seed.values()])

    base = {key: measured(results["full"], key) for key in ("wall_s", "step_s", "peak_gib")
            } if "full" in results else {}

    def with_ratio(by_seed, key, digits, unit=1.0):
        value = measured(by_seed, key)
        text = _cell(None if value is None else value / unit, digits)
        return text if value is None or not base.get(key) else \
            f"{text} ({value / base[key]:.2f}x)"

    seeds = len(next(iter(results.values())))
    lines = [f"GRPO from the SFT agent (configs/grpo_search.py:{variant}), {seeds} seed(s); "
             "ratios to `full` of this run", "",
             "| arm | sampled | greedy | per seed (sampled) | minutes | step s | peak GiB |",
             "|---|---|---|---|---|---|---|"]
    sft_sampled = [s.get("sft/success_sampled") for s in sft.values()]
    lines.append(f"| SFT agent | {_cell(_mean(sft_sampled))} | "
                 f"{_cell(_mean([s.get('sft/success_greedy') for s in sft.values()]))} | "
                 f"{' / '.join(_cell(v) for v in sft_sampled)} | - | - | - |")
    for arm, by_seed in results.items():
        sampled = [r["final"].get("eval/success_sampled") for r in by_seed.values()]
        greedy = [r["final"].get("eval/success_greedy") for r in by_seed.values()]
        lines.append(f"| {arm} | {_cell(_mean(sampled))} | {_cell(_mean(greedy))} | "
                     f"{' / '.join(_cell(v) for v in sampled)} | "
                     f"{with_ratio(by_seed, 'wall_s', 1, unit=60)} | "
                     f"{with_ratio(by_seed, 'step_s', 2)} | "
                     f"{with_ratio(by_seed, 'peak_gib', 2)} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variant", default="cpu")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--arms", default="full,r1,r8,r32,attn8")
    parser.add_argument("--lr_scale", type=float, default=10.0)
    parser.add_argument("--sft_from", default="")
    parser.add_argument("--out", default="runs/lora")
    args = parser.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    sys.path.insert(0, str(ROOT))
    from agentjax.config import presets
    lr = presets.search_config("grpo", args.variant).optim.lr
    out, seeds = Path(args.out), [int(s) for s in args.seeds.split(",")]
    grpo = f"{ROOT}/configs/grpo_search.py:{args.variant}"
    sft_config = f"{ROOT}/configs/sft_search.py:{args.variant}"
    results: dict[str, dict[int, dict]] = {arm: {} for arm in args.arms.split(",")}
    sft = {}
    for seed in seeds:
        if args.sft_from:
            start = Path(args.sft_from)
        else:
            start = out / "sft" / f"seed{seed}"
            run(sft_config, start, {"seed": seed}, extra)
        sft[seed] = json.loads((start / "final.json").read_text())
        for arm in results:
            # The SFT stage exports to <workdir>/sft/hf: init_from reads <folder>/hf.
            overrides = {"seed": seed, "init_from": start / "sft",
                         **arm_overrides(arm, lr, args.lr_scale)}
            results[arm][seed] = run(grpo, out / arm / f"seed{seed}", overrides, extra)
    table = report(results, sft, variant=args.variant)
    (out / "lora.md").write_text(table + "\n")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
