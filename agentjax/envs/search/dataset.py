"""Everything the search job needs, built from a seed and written to one folder.

    files = make_search_dataset("runs/data", WorldConfig(seed=0),
                                DemonstratorConfig("imperfect", p_guess=0.5))

writes
    corpus.jsonl        Search-R1 corpus (one document per entity)
    index/              the BM25 index over it (`BM25Retriever.load` / env retriever=path)
    train.parquet       Search-R1 parquet, training questions
    test.parquet        Search-R1 parquet, held-out questions
    demos.jsonl         the demonstrator's episodes on the training questions (SFT data)
    summary.json        sizes, settings and the measured success of the gold policy, the
                        demonstrator and a closed-book guesser

and returns the paths and the success reports. Demonstrations and measurements run
through the real SearchEnv over the real BM25 index.
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Mapping, NamedTuple, Sequence

from agentjax.data.demonstrations import write_demonstrations_jsonl
from agentjax.envs.search import demonstrators as demo_lib
from agentjax.envs.search.loaders import write_corpus_jsonl, write_search_r1_parquet
from agentjax.envs.search.world import World, WorldConfig, build_world
from agentjax.core.task import Task
from agentjax.envs.retrieval import BM25Retriever
from agentjax.envs.search.env import SHORT_INSTRUCTION, SearchEnv


class SearchDataset(NamedTuple):
    """What `make_search_dataset` built.

    Attributes:
      world: the world.
      paths: {"corpus", "index", "train", "test", "demos", "summary"} -> path.
      reports: {"gold", "demonstrator", "closed_book"} -> {"train": SuccessReport on the
        demonstrated training tasks, "test": SuccessReport on the test split}.
    """

    world: World
    paths: dict[str, str]
    reports: dict[str, dict[str, demo_lib.SuccessReport]]


def default_env_kwargs(world_config: WorldConfig) -> dict[str, Any]:
    """SearchEnv settings that fit the world: one spare turn beyond the longest chain
    (so negative examples fit), Search-R1's topk, the short instruction."""
    max_hops = max(list(world_config.train_questions) + list(world_config.test_questions))
    return {"topk": 3, "max_turns": max_hops + 2, "instruction": SHORT_INSTRUCTION}


def select_by_hops(tasks: Sequence[Task],
                   hops: Sequence[int] | Mapping[int, float] | None) -> list[Task]:
    """The tasks whose hop count is in `hops`; with {hops: fraction}, the first
    round(fraction * count) tasks of each hop count (task order is already random)."""
    if hops is None:
        return list(tasks)
    if not isinstance(hops, Mapping):
        hops = {h: 1.0 for h in hops}
    bad = {h: f for h, f in hops.items() if not 0.0 <= f <= 1.0}
    if bad:
        raise ValueError(f"hop fractions must be in [0, 1], got {bad}")
    by_hops: dict[int, list[Task]] = {}
    for t in tasks:
        by_hops.setdefault(t.metadata["hops"], []).append(t)
    keep = set()
    for h, fraction in hops.items():
        group = by_hops.get(h, [])
        keep.update(t.task_id for t in group[:int(round(fraction * len(group)))])
    return [t for t in tasks if t.task_id in keep]


def make_search_dataset(out_dir: str, world_config: WorldConfig = WorldConfig(),
                        demonstrator: demo_lib.DemonstratorConfig = demo_lib.DemonstratorConfig(),
                        *, demo_hops: Sequence[int] | Mapping[int, float] | None = None,
                        env_kwargs: Mapping[str, Any] | None = None,
                        seed: int = 0) -> SearchDataset:
    """Builds the world, index, splits, demonstrations and measurements into `out_dir`.

    Args:
      out_dir: output folder (created; existing files are overwritten).
      world_config: the world.
      demonstrator: the demonstrator that writes the SFT data.
      demo_hops: which training questions to demonstrate: None (all), hop counts such as
        (1, 2) (longer chains stay out of the SFT data, for RL to discover), or
        {hops: fraction}, e.g. {1: 1.0, 2: 1.0, 3: 0.1} (3-hop chains rare).
      env_kwargs: SearchEnv keyword arguments (default: `default_env_kwargs`).
      seed: seed of the demonstrators' random streams.
    """
    os.makedirs(out_dir, exist_ok=True)
    paths = {name: os.path.join(out_dir, file) for name, file in (
        ("corpus", "corpus.jsonl"), ("index", "index"), ("train", "train.parquet"),
        ("test", "test.parquet"), ("demos", "demos.jsonl"), ("summary", "summary.json"))}
    world = build_world(world_config)
    write_corpus_jsonl(paths["corpus"], world.corpus_records())
    retriever = BM25Retriever.from_corpus(paths["corpus"], index_dir=paths["index"])
    write_search_r1_parquet(paths["train"], world.train_tasks, split="train")
    write_search_r1_parquet(paths["test"], world.test_tasks, split="test")
    env_kwargs = dict(env_kwargs or default_env_kwargs(world_config))
    env = SearchEnv(retriever, **env_kwargs)
    demo_tasks = select_by_hops(world.train_tasks, demo_hops)
    if not demo_tasks:
        raise ValueError(f"demo_hops={demo_hops} selects no training question")
    guesses = demo_lib.guess_pool(world.train_tasks)
    policies = {
        "gold": demo_lib.ScriptedSearcher(),
        "demonstrator": demo_lib.ScriptedSearcher(demonstrator, guesses),
        "closed_book": demo_lib.ScriptedSearcher(
            demo_lib.DemonstratorConfig("closed_book", p_guess=1.0), guesses),
    }
    reports, demos = {}, None
    for name, policy in policies.items():
        train_demos = demo_lib.run_demonstrations(policy, env, demo_tasks, seed=seed)
        if name == "demonstrator":
            demos = train_demos
        reports[name] = {
            "train": demo_lib.success_report(train_demos),
            "test": demo_lib.measure_success(policy, env, world.test_tasks, seed=seed + 1)}
    write_demonstrations_jsonl(paths["demos"], demos)
    summary = {
        "world": {**dataclasses.asdict(world_config),
                  "entities": len(world.entities), "train_questions": len(world.train_tasks),
                  "test_questions": len(world.test_tasks)},
        "env": {k: v for k, v in env_kwargs.items()},
        "demonstrator": dataclasses.asdict(demonstrator),
        "demo_hops": (None if demo_hops is None else {str(h): f for h, f in demo_hops.items()}
                      if isinstance(demo_hops, Mapping) else list(demo_hops)),
        "demonstrations": len(demos),
        "success": {name: {split: r._asdict() for split, r in by_split.items()}
                    for name, by_split in reports.items()},
    }
    with open(paths["summary"], "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=1, default=str)
    return SearchDataset(world, paths, reports)
