"""Shared fixtures for the env tests: a small Search-R1-format corpus and its index."""
import json

import pytest

from agentjax.envs.retrieval import BM25Retriever

PEOPLE = ["Alvarez", "Brontë", "Castellan", "Dumont", "Eskildsen", "Fairweather",
          "Galloway", "Hargreave", "Ingleby", "Jessop"]
CITIES = ["Quellport", "Rivenhall", "Saltmarsh", "Thornbury", "Umberfield"]
COMPANIES = ["Acme Dynamics", "Borealis Mills", "Cobalt Freight"]


def world_records() -> list[dict]:
    """One document per person (born in a city, works for a company) and per city."""
    records = []
    for i, name in enumerate(PEOPLE):
        city, company = CITIES[i % len(CITIES)], COMPANIES[i % len(COMPANIES)]
        records.append({"id": f"person-{i}", "contents":
                        f'"{name}"\n{name} was born in {city}. {name} works for {company}.'})
    for j, city in enumerate(CITIES):
        records.append({"id": f"city-{j}", "contents":
                        f'"{city}"\n{city} is a harbour town with {j + 2} bridges.'})
    return records


@pytest.fixture(scope="session")
def corpus_records():
    return world_records()


@pytest.fixture(scope="session")
def corpus_path(tmp_path_factory, corpus_records):
    path = tmp_path_factory.mktemp("corpus") / "corpus.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in corpus_records))
    return path


@pytest.fixture(scope="session")
def bm25(corpus_records):
    return BM25Retriever.from_corpus(corpus_records)
