"""Small worlds, indexes and envs shared by the search world's tests (built once per process)."""
from __future__ import annotations

from agentjax.envs.search.world import World, WorldConfig, build_world
from agentjax.envs.retrieval import BM25Retriever
from agentjax.envs.search.env import SHORT_INSTRUCTION, SearchEnv

SMALL = WorldConfig(seed=3, num_people=40, num_companies=12, num_cities=12, num_countries=6,
                    train_questions={1: 40, 2: 40, 3: 30, 4: 30},
                    test_questions={1: 10, 2: 10, 3: 10, 4: 10})

_cache: dict[str, tuple[World, BM25Retriever]] = {}


def world_and_retriever(config: WorldConfig = SMALL) -> tuple[World, BM25Retriever]:
    key = repr(config)
    if key not in _cache:
        w = build_world(config)
        _cache[key] = (w, BM25Retriever.from_corpus(w.corpus_records()))
    return _cache[key]


def world(config: WorldConfig = SMALL) -> World:
    return world_and_retriever(config)[0]


def env(config: WorldConfig = SMALL, max_turns: int = 5) -> SearchEnv:
    """A fresh SearchEnv over the world's BM25 index (envs hold per-episode state)."""
    return SearchEnv(world_and_retriever(config)[1], max_turns=max_turns,
                     instruction=SHORT_INSTRUCTION)
