"""Does the code agent learn, and does running its programs help?

    python scripts/bench/code_learning.py [--config configs/grpo_code.py] [--seeds 0,1,2]
        [--out runs/code_learning] [--parallel 1] [-- --config.total_steps=20 ...]

Per seed, two full `scripts/train.py` runs of the code world (demonstrator, SFT, GRPO)
on the same budget of steps and episodes, the recipe's `turns` sweep: `multi_turn` (the
recipe: up to four actions, `run` against the visible tests, read, fix, submit) and
`single_shot` (env.max_turns=1: one program, no run). The baselines are measured in the
multi-turn runs: the scripted demonstrator that wrote the SFT data and the SFT agent.
Targets: the multi-turn GRPO agent's held-out sampled success at least 20 points above
both baselines on every seed, and above the single-shot agent's. Writes
<out>/code_learning.md and prints it.
"""
import argparse
import os
import sys

from agentjax.sweep import launch, plan
from agentjax.sweep import report as sweep_report

TARGET_MARGIN = 0.20


def _get(final, key):
    value = final.get(key) if final else None
    return None if value is None else float(value)


def _fmt(value):
    return "-" if value is None else f"{value:.3f}"


def report(runs, *, config_arg: str) -> str:
    by_seed = {}
    for run in runs:
        by_seed.setdefault(run.seed, {})[run.arm] = launch.read_final(run.workdir)
    learning, turns = [], []
    for seed, finals in sorted(by_seed.items()):
        multi, single = finals.get("multi_turn"), finals.get("single_shot")
        demo, sft = _get(multi, "demonstrator/demonstrator"), _get(multi, "sft/success_sampled")
        rl = _get(multi, "eval/success_sampled")
        margin = None if None in (demo, sft, rl) else rl - max(demo, sft)
        minutes = _get(multi, "time/total_s")
        learning.append([str(seed), _fmt(demo), _fmt(sft), _fmt(_get(multi, "sft/success_greedy")),
                         _fmt(rl), _fmt(_get(multi, "eval/success_greedy")), _fmt(margin),
                         "-" if margin is None else ("met" if margin >= TARGET_MARGIN else "missed"),
                         "-" if minutes is None else f"{minutes / 60:.1f}"])
        one = _get(single, "eval/success_sampled")
        gain = None if None in (rl, one) else rl - one
        turns.append([str(seed), _fmt(one), _fmt(_get(single, "eval/success_greedy")), _fmt(rl),
                      _fmt(_get(multi, "eval/success_greedy")), _fmt(gain),
                      "-" if gain is None else ("met" if gain > 0 else "missed")])
    return "\n\n".join([
        f"# Code learning benchmark: {config_arg}",
        "Held-out success (every hidden test passed), sampled at the rollout temperature "
        "and greedy.",
        sweep_report.markdown_table(
            ["seed", "demonstrator", "SFT sampled", "SFT greedy", "GRPO sampled",
             "GRPO greedy", "margin", f"target (+{TARGET_MARGIN:.2f})", "minutes"], learning),
        "Run-read-fix (multi-turn) against single-shot GRPO, same steps and episodes:",
        sweep_report.markdown_table(
            ["seed", "single-shot sampled", "single-shot greedy", "multi-turn sampled",
             "multi-turn greedy", "gain", "target (> 0)"], turns)])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/grpo_code.py")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--out", default="runs/code_learning")
    parser.add_argument("--parallel", type=int, default=1)
    parser.add_argument("extra", nargs="*", help="flags passed to every train.py run")
    args = parser.parse_args(argv)
    module = plan.load_config_module(args.config.split(":")[0])
    runs = plan.expand(module.sweep("turns"), plan.parse_seeds(args.seeds), args.out)
    launch.run_all(runs, lambda run: plan.train_command(run, args.config,
                                                        extra_args=args.extra),
                   parallel=args.parallel)
    text = report(runs, config_arg=args.config)
    with open(os.path.join(args.out, "code_learning.md"), "w") as f:
        f.write(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
