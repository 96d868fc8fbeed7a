"""Does the main job learn? Runs it on several seeds and records held-out success.

    python scripts/bench/learning.py [--config configs/grpo_search.py] [--seeds 0,1,2]
        [--out runs/learning] [--parallel 1] [-- --config.total_steps=60 ...]

Each seed is a full `scripts/train.py` run (world, demonstrator, SFT, RL; ~30 minutes
on 2 CPU cores). The baselines are measured in the same runs: the scripted demonstrator
that wrote the SFT data and the SFT agent. The target: the RL agent's held-out
sampled success beats both by at least 25 points on every seed. Writes
<out>/learning.md and prints it.
"""
import argparse
import os
import sys

from agentjax.sweep import launch, plan
from agentjax.sweep import report as sweep_report
from agentjax.agents.evaluation import group_of

TARGET_MARGIN = 0.25


def _get(final, key):
    value = final.get(key) if final else None
    return None if value is None else float(value)


def _fmt(value):
    return "-" if value is None else f"{value:.3f}"


def report(runs, *, config_arg: str) -> str:
    header = ["seed", "demonstrator", "SFT sampled", "SFT greedy", "RL sampled", "RL greedy",
              "margin", f"target (+{TARGET_MARGIN:.2f})", "minutes"]
    rows, group_rows, groups = [], [], set()
    for run in runs:
        final = launch.read_final(run.workdir)
        demo = _get(final, "demonstrator/demonstrator")
        sft = _get(final, "sft/success_sampled")
        rl = _get(final, "eval/success_sampled")
        margin = None if None in (demo, sft, rl) else rl - max(demo, sft)
        verdict = "-" if margin is None else ("met" if margin >= TARGET_MARGIN else "missed")
        minutes = _get(final, "time/total_s")
        rows.append([str(run.seed), _fmt(demo), _fmt(sft), _fmt(_get(final, "sft/success_greedy")),
                     _fmt(rl), _fmt(_get(final, "eval/success_greedy")), _fmt(margin), verdict,
                     "-" if minutes is None else f"{minutes / 60:.1f}"])
        groups.update(group_of(k) for k in (final or {})
                      if k.startswith("eval/success_sampled/") and group_of(k))
        group_rows.append((run.seed, final))
    groups = sorted(groups)
    group_table = sweep_report.markdown_table(
        ["seed", "policy"] + groups,
        [[str(seed), name] + [_fmt(_get(final, f"{prefix}/{g}")) for g in groups]
         for seed, final in group_rows
         for name, prefix in (("demonstrator", "demonstrator/demonstrator"),
                              ("SFT sampled", "sft/success_sampled"),
                              ("RL sampled", "eval/success_sampled"))])
    return "\n\n".join([
        f"# Learning benchmark: {config_arg}",
        "Held-out success (exact match), sampled at the rollout temperature and greedy.",
        sweep_report.markdown_table(header, rows),
        "Sampled success per task group (hops; taught: SFT trained the agent to state every "
        "fact the question needs, so recall can solve it):", group_table])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/grpo_search.py")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--out", default="runs/learning")
    parser.add_argument("--parallel", type=int, default=1)
    parser.add_argument("extra", nargs="*", help="flags passed to every train.py run")
    args = parser.parse_args(argv)
    runs = plan.expand([{"name": "main", "overrides": {}}], plan.parse_seeds(args.seeds),
                        args.out)
    launch.run_all(runs, lambda run: plan.train_command(run, args.config,
                                                        extra_args=args.extra),
                  parallel=args.parallel)
    text = report(runs, config_arg=args.config)
    with open(os.path.join(args.out, "learning.md"), "w") as f:
        f.write(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
