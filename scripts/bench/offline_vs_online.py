"""Offline vs online from the same SFT agent: RFT, offline DPO, online DPO and GRPO.

    python scripts/bench/offline_vs_online.py [--variant cpu] [--seeds 0,1,2]
        [--sft_from WORKDIR] [--out runs/offline_vs_online]
        [--methods grpo,rft,dpo_offline,dpo_online] [-- --config.key=value ...]

Per seed, one SFT run (configs/sft_search.py: the pretraining and SFT of the main job,
configs/grpo_search.py, on that seed) and then every method from its exported policy
(`init_from`), each a `scripts/train.py` run of its config's variant. With --sft_from
(a finished main-job or SFT run's workdir) every seed starts from that one SFT agent
instead, in its world (its data.world_seed; the seeds then vary the methods' own
randomness only), and its final.json gives the SFT row. Runs go seed by seed, so an
interrupted comparison has whole seeds:
  grpo         configs/grpo_search.py
  rft          configs/rft_search.py
  dpo_offline  configs/dpo_search.py, the "offline" arm of its "online" sweep (pairs
               collected once, from the SFT policy)
  dpo_online   configs/dpo_search.py, the "online" arm (pairs re-collected from the
               current policy every 10 steps: the same episodes in four collections)
Flags after `--` go to every run (after the arms' overrides). Finished runs are skipped, so a rerun continues. The
table (written to <out>/offline_vs_online.md and printed): held-out sampled and greedy
success of the SFT agent and of each method, the episodes each method sampled for
training (evaluation episodes are the same for all and not counted) and its minutes
(the run's whole wall-clock, evaluations included), per seed and as means; and for the
offline methods whether they beat their SFT start (sampled success) on every seed.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from agentjax.sweep import launch, plan
from agentjax.sweep import report as sweep_report

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = {arm: str(ROOT / "configs" / f"{name}.py") for arm, name in (
    ("sft", "sft_search"), ("grpo", "grpo_search"), ("rft", "rft_search"),
    ("dpo_offline", "dpo_search"), ("dpo_online", "dpo_search"))}
# The two arms of the DPO config's "online" sweep: one budget of episodes collected at
# once or in four collections.
OVERRIDES = {f"dpo_{arm['name']}": arm["overrides"]
             for arm in plan.load_config_module(CONFIGS["dpo_online"]).sweep("online")}
OFFLINE = ("rft", "dpo_offline", "dpo_online")


def sft_policy(out: str, seed: int) -> str:
    """Where the SFT run of `seed` exports its policy (`init_from` of the methods)."""
    return os.path.join(out, "sft", f"seed{seed}", "sft")


def planned_runs(methods: list[str], seeds: list[int], out: str,
                 sft_from: str | None = None) -> tuple[list, list]:
    """(SFT runs, method runs, seed-major): plan.Run's with the seed keys and init_from
    set. With `sft_from`, each seed's SFT "run" is that finished workdir and the methods
    start from its export, in its world."""
    if sft_from:
        with open(os.path.join(sft_from, "config.json")) as f:
            world = {"data.world_seed": json.load(f)["data"]["world_seed"]}
        sft = [plan.Run("sft", seed, {}, sft_from) for seed in seeds]
    else:
        world, sft = {}, plan.expand([{"name": "sft", "overrides": {}}], seeds, out)
    runs = []
    for method in methods:
        for run in plan.expand([{"name": method, "overrides": OVERRIDES.get(method, {})}],
                               seeds, out):
            start = (os.path.join(sft_from, "sft") if sft_from
                     else sft_policy(out, run.seed))
            runs.append(plan.Run(run.arm, run.seed, {
                **run.overrides, **world, "init_from": start}, run.workdir))
    return sft, sorted(runs, key=lambda run: run.seed)


def episodes(workdir: str, final: dict) -> int | None:
    """Training episodes a run sampled: the offline stages count theirs; an RL run
    samples prompts_per_step x group_size every step (None with dynamic sampling, whose
    extra draws are not counted)."""
    for stage in ("rft", "dpo"):
        if f"{stage}/episodes" in final:
            return int(final[f"{stage}/episodes"])
    with open(os.path.join(workdir, "config.json")) as f:
        config = json.load(f)
    if config["algo"]["dynamic_sampling"]:
        return None
    rollout = config["rollout"]
    return config["total_steps"] * rollout["prompts_per_step"] * rollout["group_size"]


def _fmt(value, digits=3):
    return "-" if value is None else f"{value:.{digits}f}"


def report(sft_runs, runs, *, variant: str) -> str:
    """The markdown report of finished runs (unfinished ones show '-')."""
    sft_of = {}
    for run in sft_runs:
        final = launch.read_final(run.workdir) or {}
        sft_of[run.seed] = (final.get("sft/success_sampled"), final.get("sft/success_greedy"))
    rows, by_method = [], {}
    for seed in sorted(sft_of):
        sampled, greedy = sft_of[seed]
        rows.append([str(seed), "SFT (start)", _fmt(sampled), _fmt(greedy), "-", "-"])
        for run in (r for r in runs if r.seed == seed):
            final = launch.read_final(run.workdir)
            if final is None:
                rows.append([str(seed), run.arm, "-", "-", "-", "-"])
                continue
            result = (final.get("eval/success_sampled"), final.get("eval/success_greedy"),
                      episodes(run.workdir, final), final.get("time/total_s", 0) / 60)
            by_method.setdefault(run.arm, []).append((seed, result))
            rows.append([str(seed), run.arm, _fmt(result[0]), _fmt(result[1]),
                         _fmt(result[2], 0), _fmt(result[3], 1)])
    means, verdicts = [], []
    for method, results in by_method.items():
        columns = list(zip(*[r for _, r in results]))
        means.append([method, str(len(results))] + [
            _fmt(None if None in c else sum(c) / len(c), d)
            for c, d in zip(columns, (3, 3, 0, 1))])
        if method in OFFLINE:
            beats = [r[0] > sft_of[seed][0] for seed, r in results
                     if None not in (r[0], sft_of[seed][0])]
            verdicts.append([method, f"{sum(beats)} of {len(beats)} seeds",
                             "yes" if beats and all(beats) else "no"])
    return "\n\n".join([
        f"# Offline vs online from the same SFT agent (variant {variant})",
        "Held-out success (exact match): sampled at the rollout temperature, and greedy. "
        "Episodes: sampled for training. Minutes: the run's wall-clock.",
        sweep_report.markdown_table(
            ["seed", "policy", "sampled", "greedy", "episodes", "minutes"], rows),
        "Means over seeds:",
        sweep_report.markdown_table(
            ["method", "seeds", "sampled", "greedy", "episodes", "minutes"], means),
        "Offline methods above their SFT start (sampled):",
        sweep_report.markdown_table(["method", "above SFT", "on every seed"], verdicts)])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", default="cpu")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--out", default="runs/offline_vs_online")
    parser.add_argument("--methods", default="grpo,rft,dpo_offline,dpo_online")
    parser.add_argument("--sft_from", default="",
                        help="a finished main-job or SFT run's workdir: every seed starts "
                             "from its SFT agent (default: one SFT run per seed)")
    parser.add_argument("extra", nargs="*", help="flags passed to every train.py run")
    args = parser.parse_args(argv)
    methods = [m for m in args.methods.split(",") if m]
    unknown = sorted(set(methods) - set(CONFIGS) | ({"sft"} & set(methods)))
    if unknown:
        parser.error(f"unknown --methods {unknown}; choose from {sorted(set(CONFIGS) - {'sft'})}")
    if args.sft_from and launch.read_final(args.sft_from) is None:
        parser.error(f"--sft_from {args.sft_from}: not a finished run (no final.json)")
    sft_runs, runs = planned_runs(methods, plan.parse_seeds(args.seeds), args.out,
                                  args.sft_from or None)

    def command(run):
        config = f"{CONFIGS[run.arm]}:{args.variant}"
        return plan.train_command(run, config, extra_args=args.extra)

    status = {} if args.sft_from else launch.run_all(sft_runs, command)
    failed = [name for name, s in status.items() if s.startswith("failed")]
    launch.run_all([r for r in runs if f"sft/seed{r.seed}" not in failed], command)
    text = report(sft_runs, runs, variant=args.variant)
    with open(os.path.join(args.out, "offline_vs_online.md"), "w") as f:
        f.write(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
