"""Writes the synthetic multi-hop search world and its SFT demonstrations to a folder.

    python scripts/make_search_data.py --out /tmp/search_data --seed 0 \
        --p-guess 0.5 --p-stop-early 0.1 --p-repeat 0.1 --p-poor-query 0.1 --p-negative 0.1

Outputs corpus.jsonl, index/ (BM25), train.parquet, test.parquet (Search-R1 format),
demos.jsonl and summary.json (see agentjax.envs.search.dataset), and prints the measured
success of the gold policy, the demonstrator and a closed-book guesser.
"""
from __future__ import annotations

import argparse
import sys
import time

from agentjax.envs.search.demonstrators import DemonstratorConfig
from agentjax.envs.search.dataset import default_env_kwargs, make_search_dataset
from agentjax.envs.search.world import WorldConfig


def hop_counts(text: str) -> dict[int, int]:
    """Parses "1:300,2:300" into {1: 300, 2: 300}."""
    try:
        pairs = [item.split(":") for item in text.split(",") if item.strip()]
        return {int(h): int(n) for h, n in pairs}
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected 'hops:count,...', got {text!r}") from None


def demo_hops(text: str) -> dict[int, float]:
    """Parses "1,2,3:0.1" into {1: 1.0, 2: 1.0, 3: 0.1}."""
    try:
        items = [item.split(":") for item in text.split(",") if item.strip()]
        return {int(i[0]): float(i[1]) if len(i) == 2 else 1.0 for i in items}
    except (ValueError, IndexError):
        raise argparse.ArgumentTypeError(f"expected 'hops[:fraction],...', got {text!r}") from None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--seed", type=int, default=0, help="world seed (and demonstrator seed)")
    p.add_argument("--people", type=int, default=120)
    p.add_argument("--companies", type=int, default=40)
    p.add_argument("--cities", type=int, default=40)
    p.add_argument("--countries", type=int, default=16)
    p.add_argument("--twin-fraction", type=float, default=0.25)
    p.add_argument("--train", type=hop_counts, default={1: 300, 2: 300, 3: 200, 4: 200},
                   help="training questions per hop count, e.g. 1:300,2:300")
    p.add_argument("--test", type=hop_counts, default={1: 50, 2: 50, 3: 50, 4: 50})
    p.add_argument("--demo-hops", type=demo_hops, default=None,
                   help="training questions to demonstrate: hop counts, each optionally "
                        "with the fraction of its questions, e.g. 1,2,3:0.1 (default: all)")
    p.add_argument("--max-turns", type=int, default=None,
                   help="env turn budget (default: longest chain + 2)")
    p.add_argument("--topk", type=int, default=3)
    for knob in ("guess", "stop-early", "repeat", "poor-query", "negative"):
        p.add_argument(f"--p-{knob}", type=float, default=0.0,
                       help=f"demonstrator's probability to {knob.replace('-', ' ')}")
    args = p.parse_args(argv)

    world = WorldConfig(seed=args.seed, num_people=args.people, num_companies=args.companies,
                        num_cities=args.cities, num_countries=args.countries,
                        twin_fraction=args.twin_fraction, train_questions=args.train,
                        test_questions=args.test)
    demonstrator = DemonstratorConfig(
        "demonstrator", p_guess=args.p_guess, p_stop_early=args.p_stop_early,
        p_repeat=args.p_repeat, p_poor_query=args.p_poor_query, p_negative=args.p_negative)
    env_kwargs = default_env_kwargs(world)
    env_kwargs["topk"] = args.topk
    if args.max_turns is not None:
        env_kwargs["max_turns"] = args.max_turns
    start = time.perf_counter()
    data = make_search_dataset(args.out, world, demonstrator, demo_hops=args.demo_hops,
                               env_kwargs=env_kwargs, seed=args.seed)
    elapsed = time.perf_counter() - start

    print(f"world seed {args.seed}: {len(data.world.entities)} entities, "
          f"{len(data.world.train_tasks)} train / {len(data.world.test_tasks)} test questions "
          f"({elapsed:.1f}s)")
    hops = sorted(data.reports["gold"]["test"].by_hops)
    print("| policy | split | success | mean turns | "
          + " | ".join(f"{h} hops" for h in hops) + " |")
    print("|---|---|---|---|" + "---|" * len(hops))
    for name, by_split in data.reports.items():
        for split, r in by_split.items():
            cells = " | ".join(f"{r.by_hops[h]:.3f}" if h in r.by_hops else "-" for h in hops)
            print(f"| {name} | {split} | {r.success:.3f} | {r.mean_turns:.2f} | {cells} |")
    for name, path in data.paths.items():
        print(f"{name}: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
