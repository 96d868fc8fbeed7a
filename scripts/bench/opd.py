"""On-policy distillation vs GRPO alone, from the same SFT agent, the main job's agent as
teacher: how many RL steps each needs to reach the teacher's held-out success.

    python scripts/bench/opd.py [--teacher WORKDIR] [--variant cpu] [--seeds 0,1,2]
        [--out runs/opd] [--arms grpo,opd] [-- --config.eval.every=5 ...]

The teacher is a finished main-job run (configs/grpo_search.py: pretraining, SFT,
GRPO): --teacher, or one run here (<out>/teacher, the variant's main job, seed 0). Per
seed, each arm is a configs/grpo_search.py:<variant> run from the teacher's SFT agent
(`init_from` <teacher>/sft, in its world: its data.world_seed; the seeds vary the arms'
own randomness):
  grpo  GRPO alone: the main job's RL stage again
  opd   algo.name='opd' with algo.teacher=<teacher>: the teacher's per-token signal
        log pi_teacher - log pi_student alone (rl/distillation.py)
Flags after `--` go to every arm's run (e.g. --config.eval.every=5 for a denser curve).
Finished runs are skipped, so a rerun continues. The report (<out>/opd.md, printed):
the teacher's and the SFT agent's held-out sampled success; per arm and seed the curve
of held-out sampled success at each evaluation (metrics.jsonl), the first evaluated
step at or above the teacher's success ("-": never), and the steps OPD saves (GRPO's
step less OPD's, per seed). Each run's whole wall-clock is given too: an OPD step costs
one more forward pass (the teacher's) than a GRPO step.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from agentjax.config.algorithms import algorithm_overrides
from agentjax.sweep import launch, plan
from agentjax.sweep import report as sweep_report
from agentjax.train.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[2]
CONFIG = str(ROOT / "configs" / "grpo_search.py")
ARMS = ("grpo", "opd")
SUCCESS = "eval/success_sampled"


def arm_overrides(arm: str, teacher: str) -> dict:
    """The overrides of `arm` over the main job (its world and start aside)."""
    if arm == "grpo":
        return {}
    return {**algorithm_overrides("opd"), "algo.teacher": teacher}


def planned_runs(arms: list[str], seeds: list[int], out: str, teacher: str) -> list[plan.Run]:
    """Each arm on each seed from the teacher's SFT agent in the teacher's world
    (seed-major, so an interrupted comparison has whole seeds)."""
    with open(os.path.join(teacher, "config.json")) as f:
        world = {"data.world_seed": json.load(f)["data"]["world_seed"]}
    start = {**world, "init_from": os.path.join(teacher, "sft")}
    runs = [plan.Run(run.arm, run.seed, {**run.overrides, **start}, run.workdir)
            for arm in arms for run in plan.expand(
                [{"name": arm, "overrides": arm_overrides(arm, teacher)}], seeds, out)]
    return sorted(runs, key=lambda run: run.seed)


def curve(workdir: str) -> list[tuple[int, float]]:
    """(step, held-out sampled success) of each evaluation of a run."""
    if not os.path.exists(os.path.join(workdir, "metrics.jsonl")):
        return []
    return [(row["step"], row[SUCCESS]) for row in read_metrics(workdir) if SUCCESS in row]


def steps_to(points: list[tuple[int, float]], target: float) -> int | None:
    """The first evaluated step at or above `target`; None if none is."""
    return next((step for step, success in points if success >= target), None)


def _fmt(value, digits=3):
    return "-" if value is None else f"{value:.{digits}f}"


def report(teacher: str, runs: list[plan.Run], *, variant: str) -> str:
    final = launch.read_final(teacher) or {}
    target, sft = final.get(SUCCESS), final.get("sft/success_sampled")
    rows, reached = [], {}
    for run in runs:
        points = curve(run.workdir)
        step = None if target is None else steps_to(points, target)
        reached[run.arm, run.seed] = step
        minutes = (launch.read_final(run.workdir) or {}).get("time/total_s")
        rows.append([run.arm, str(run.seed), "-" if step is None else str(step),
                     _fmt(None if minutes is None else minutes / 60, 1),
                     " ".join(f"{s}:{v:.2f}" for s, v in points) or "-"])
    saved = [[str(seed), str(reached["grpo", seed] - reached["opd", seed])]
             for seed in sorted({run.seed for run in runs})
             if reached.get(("grpo", seed)) is not None
             and reached.get(("opd", seed)) is not None]
    return "\n\n".join([
        f"# On-policy distillation vs GRPO alone: configs/grpo_search.py:{variant}",
        f"Teacher: {teacher} (pretraining, SFT, GRPO), held-out sampled success "
        f"{_fmt(target)}; its SFT agent, where both arms start: {_fmt(sft)}.",
        sweep_report.markdown_table(
            ["arm", "seed", "steps to the teacher's success", "minutes",
             "held-out sampled success (step:success)"], rows),
        "Steps OPD saves (GRPO's less OPD's; seeds where both reached it):",
        sweep_report.markdown_table(["seed", "steps saved"], saved) if saved else "none yet"])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--teacher", default="", help="a finished main-job run's workdir "
                        "(default: run one in <out>/teacher)")
    parser.add_argument("--variant", default="cpu")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--out", default="runs/opd")
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument("extra", nargs="*", help="flags passed to every arm's train.py run")
    args = parser.parse_args(argv)
    arms = [a for a in args.arms.split(",") if a]
    if not arms or set(arms) - set(ARMS):
        parser.error(f"--arms {args.arms!r}: choose from {list(ARMS)}")
    config = f"{CONFIG}:{args.variant}"
    teacher = args.teacher or os.path.join(args.out, "teacher")
    if not args.teacher:
        status = launch.run_all([plan.Run("teacher", 0, {}, teacher)],
                                lambda run: plan.train_command(run, config))
        if any(s.startswith("failed") for s in status.values()):
            print(f"the teacher's run failed: {status}", file=sys.stderr)
            return 1
    if launch.read_final(teacher) is None:
        parser.error(f"--teacher {teacher}: not a finished run (no final.json)")
    runs = planned_runs(arms, plan.parse_seeds(args.seeds), args.out, os.path.abspath(teacher))
    launch.run_all(runs, lambda run: plan.train_command(run, config, extra_args=args.extra))
    text = report(teacher, runs, variant=args.variant)
    with open(os.path.join(args.out, "opd.md"), "w") as f:
        f.write(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
