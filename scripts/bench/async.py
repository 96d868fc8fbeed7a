"""Asynchronous vs synchronous RL against a slow tool: GRPO steps per hour and held-out
success after the same number of steps, and both over rollout.max_staleness.

    python scripts/bench/async.py [--config configs/grpo_search.py:cpu] [--steps 10]
        [--latency 0.5] [--staleness 0,1,2,4] [--partial] [--seeds 0]
        [--warm_start WORKDIR] [--in_flight N] [--out runs/bench_async]
        [-- --config.key=value ...]

Every arm is one `scripts/train.py` RL run from the same warm start, in one invocation:
`sync`, then `async` at each max_staleness (interruption off; `--partial` adds each with
interruption on; --in_flight N adds each with N episodes in flight, below). Every
search answers after --latency seconds (retrieval.latency_s: a
remote retrieval server). The warm start is a short SFT run (--warm_pretrain_steps,
--warm_sft_steps) made first, or --warm_start: an HF folder or a folder holding one as
hf/ (`init_from`), e.g. a main-job run's <workdir>/sft: held-out success is only worth comparing from a policy that
already solves some tasks (the default's short SFT does not; it measures throughput).
Steps per hour leave out the first step (compilation): 3600 x
(steps - 1) / the seconds of steps 2.., each step from asking for its groups to the
engine holding its update. Held-out success: the final evaluation (eval.num_tasks
questions, eval.samples sampled attempts each, and greedy). Writes <out>/async.md and
prints it.
"""
from __future__ import annotations

import argparse
import os
import sys

from agentjax.sweep import launch, plan
from agentjax.sweep.report import as_number, markdown_table, read_metric_rows

# The rollout shape of every arm: 4 groups of 4 per step, all 16 episodes at once.
SCALE = {"rollout.prompts_per_step": 4, "rollout.group_size": 4,
         "rollout.concurrency": 16, "rollout.engine_slots": 16,
         "eval.num_tasks": 64, "eval.samples": 2}


def arms(staleness: list[int], partial: bool, latency: float, steps: int,
         warm_start: str, in_flight: int | None = None) -> list[dict]:
    """The arms' runs. `in_flight` adds async arms keeping that many episodes in flight
    (rollout.concurrency and engine_slots): a synchronous step has one step's episodes
    (16) to run, so more rows would only make its batch-invariant decode dearer, while
    an asynchronous producer can run the next step's episodes beside this step's."""
    common = {"init_from": warm_start, "retrieval.latency_s": latency,
              "total_steps": steps, "eval.every": 0, "checkpoint.every": 0,
              "log.progress": False, **SCALE}
    out = [{"name": "sync", "overrides": {**common, "rollout.mode": "sync"}}]
    widths = [None] + ([in_flight] if in_flight else [])
    for width in widths:
        wide = {} if width is None else {"rollout.concurrency": width,
                                         "rollout.engine_slots": width}
        for interrupt in (False, True) if partial else (False,):
            for s in staleness:
                name = (f"async_s{s}" + ("_partial" if interrupt else "")
                        + ("" if width is None else f"_f{width}"))
                out.append({"name": name, "overrides": {
                    **common, **wide, "rollout.mode": "async", "rollout.max_staleness": s,
                    "rollout.partial_rollouts": interrupt}})
    return out


def summarize(workdir: str) -> dict[str, float] | None:
    """Throughput and quality of one finished arm run (None if it did not finish)."""
    final, rows = launch.read_final(workdir), read_metric_rows(workdir)
    if final is None or len(rows) < 2:
        return None

    def total(key, first=1):
        return sum(as_number(r.get(key)) or 0.0 for r in rows[first:])

    seconds = total("time/step_s")
    # A row's engine idle time runs from the previous step's groups to its own, so it
    # holds the previous step's update: from the third row on, none is a compilation.
    return {
        "steps_per_hour": 3600 * (len(rows) - 1) / seconds,
        "learner_idle": total("time/rollout_s") / seconds,
        "engine_idle": total("time/engine_idle_s", 2) / total("time/step_s", 2)
        if "time/engine_idle_s" in rows[-1] and len(rows) > 2 else None,
        "staleness": total("rollout/staleness_mean", False) / len(rows)
        if "rollout/staleness_mean" in rows[-1] else 0.0,
        "dropped": total("rollout/dropped_groups", False),
        "train_success": total("success/train", False) / len(rows),
        "sampled": as_number(final.get("eval/success_sampled")),
        "greedy": as_number(final.get("eval/success_greedy")),
        "minutes": (as_number(final.get("time/total_s")) or 0.0) / 60,
    }


def _fmt(value, digits=3):
    return "-" if value is None else f"{value:.{digits}f}"


def report(runs, *, config_arg: str, latency: float, steps: int, warm_start: str) -> str:
    results = {run.name: summarize(run.workdir) for run in runs}
    sync = {run.seed: results[run.name] for run in runs if run.arm == "sync"}
    header = ["arm", "seed", "steps/hour", "vs sync", "held-out sampled", "greedy",
              "train success", "staleness (mean)", "dropped groups", "learner idle",
              "engine idle", "minutes"]
    rows = []
    for run in runs:
        r, base = results[run.name], sync.get(run.seed)
        if r is None:
            rows.append([run.arm, str(run.seed), "failed"] + ["-"] * (len(header) - 3))
            continue
        speedup = r["steps_per_hour"] / base["steps_per_hour"] if base else None
        rows.append([run.arm, str(run.seed), f"{r['steps_per_hour']:.0f}",
                     _fmt(speedup, 2) + ("x" if speedup else ""), _fmt(r["sampled"]),
                     _fmt(r["greedy"]), _fmt(r["train_success"]), _fmt(r["staleness"], 2),
                     f"{r['dropped']:.0f}", _fmt(r["learner_idle"], 2),
                     _fmt(r["engine_idle"], 2), _fmt(r["minutes"], 1)])
    return "\n\n".join([
        f"# Asynchronous RL benchmark: {config_arg}",
        f"{steps} GRPO steps per arm from the warm start {warm_start}; every search waits "
        f"{latency} s. Steps per hour leave out the first step (compilation); learner "
        "idle: the fraction of that time the learner waited for groups; engine idle: "
        "the fraction with no generate call out (async only).",
        markdown_table(header, rows)])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/grpo_search.py:cpu")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--latency", type=float, default=0.5)
    parser.add_argument("--staleness", default="0,1,2,4")
    parser.add_argument("--partial", action="store_true",
                        help="also every max_staleness with rollout.partial_rollouts")
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--warm_start", default="",
                        help="init_from of every arm, e.g. a finished run's <workdir>/sft")
    parser.add_argument("--warm_pretrain_steps", type=int, default=0)
    parser.add_argument("--warm_sft_steps", type=int, default=40)
    parser.add_argument("--in_flight", type=int, default=None,
                        help="also every async arm with this many episodes in flight")
    parser.add_argument("--out", default="runs/bench_async")
    parser.add_argument("extra", nargs="*", help="flags passed to every train.py run")
    args = parser.parse_args(argv)
    if args.steps < 2:
        parser.error("--steps must be >= 2 (the first step is left out)")
    seeds = plan.parse_seeds(args.seeds)
    # Every arm compiles the same programs: the first run's compilations serve the rest.
    os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(args.out, "xla_cache"))
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    staleness = [int(s) for s in args.staleness.split(",")]
    status = {}
    if not args.warm_start:
        warm = plan.expand([{"name": "warm_start", "overrides": {
            "stage": "sft", "pretrain.steps": args.warm_pretrain_steps,
            "sft.steps": args.warm_sft_steps, "log.progress": False, **SCALE}}],
            seeds, args.out)
        status.update(launch.run_all(warm, lambda run: plan.train_command(
            run, args.config, extra_args=args.extra)))
    runs = []
    for seed in seeds:
        warm_start = args.warm_start or os.path.join(args.out, "warm_start", f"seed{seed}",
                                                     "sft")
        runs += plan.expand(arms(staleness, args.partial, args.latency, args.steps,
                                 warm_start, args.in_flight), [seed], args.out)
    status.update(launch.run_all(runs, lambda run: plan.train_command(
        run, args.config, extra_args=args.extra)))
    text = report(runs, config_arg=args.config, latency=args.latency, steps=args.steps,
                  warm_start=args.warm_start or "<out>/warm_start/seed<seed>/sft (SFT "
                  f"{args.warm_sft_steps} steps after pretraining {args.warm_pretrain_steps})")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "async.md"), "w") as f:
        f.write(text + "\n")
    print(text)
    return 0 if all(s.startswith(("done", "skipped")) for s in status.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
