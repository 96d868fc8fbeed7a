"""Prefix reuse: what a run's JaxEngine prefills, against what wider sharing would.

    python scripts/bench/prefix_reuse.py --config configs/grpo_search.py:test   # ~1 min
    python scripts/bench/prefix_reuse.py --config configs/grpo_search.py        # the main job

Runs the config (train/run.py, in a fresh workdir) with every JaxEngine request recorded
at the engine's boundary (ids, session, samples, outputs, the prefix the engine reused,
the weight version), then replays them in arrival order against three policies:
  engine         what the engine prefilled (`meta["cached_tokens"]`): a session's next
                 turn reuses its own pages, and a context (ids but the last) that
                 another sequence prefilled the same way is shared, among the 8 x
                 max_slots most recently used;
  whole context  a request whose whole context an earlier request prefilled or
                 generated shares it, whatever the way it was computed, unbounded;
  radix          a radix tree over everything prefilled or generated (SGLang's
                 RadixAttention), unbounded: the most any prefix cache can save.
A weight swap drops every page (no key of old weights is attended), so each policy
starts empty at every new weight version. Rows: first turns and later turns of a
session, greedy (evaluation) and sampled; tokens prefilled by each policy.
"""
from __future__ import annotations

import argparse
import collections
import tempfile
from typing import NamedTuple

from agentjax.engine.jax.engine import JaxEngine
from agentjax.sweep.plan import config_of, load_config_module
from agentjax.train.run import run

from engine import table  # scripts/bench/engine.py


class Request(NamedTuple):
    ids: tuple[int, ...]
    session: str | None
    outputs: list[tuple[int, ...]]
    cached: list[int]  # per completion: the prefix the engine reused
    greedy: bool
    version: int


def record(config, workdir: str) -> list[Request]:
    """Runs `config` with JaxEngine.generate wrapped to record every request."""
    log, generate = [], JaxEngine.generate

    async def recorded(self, requests):
        out = await generate(self, requests)
        for request, completions in zip(requests, out):
            log.append(Request(
                tuple(request.input_ids), request.session_id,
                [tuple(c.output_ids) for c in completions],
                [c.meta.get("cached_tokens", 0) for c in completions],
                request.sampling.temperature == 0,
                completions[0].meta.get("weight_version_start",
                                        completions[0].meta.get("weight_version"))))
        return out

    JaxEngine.generate = recorded
    try:
        run(config, workdir)
    finally:
        JaxEngine.generate = generate
    return log


class Trie:
    """Token ids inserted; `match` is the longest inserted prefix of ids."""

    def __init__(self):
        self.root: dict = {}

    def match(self, ids) -> int:
        node, n = self.root, 0
        for token in ids:
            if token not in node:
                break
            node, n = node[token], n + 1
        return n

    def insert(self, ids) -> None:
        node = self.root
        for token in ids:
            node = node.setdefault(token, {})


def replay(log: list[Request]) -> dict[str, collections.Counter]:
    """Tokens prefilled per row kind and policy (module docstring)."""
    rows = collections.defaultdict(collections.Counter)
    trie, contexts, version, sessions = Trie(), set(), None, set()
    for r in log:
        if r.version != version:
            trie, contexts, version = Trie(), set(), r.version
        context = len(r.ids) - 1  # the last id is fed by the first decode step
        key = r.ids[:-1]
        engine = sum(context - c for c in r.cached)
        kind = (("later turn" if r.session in sessions else "first turn")
                + (", greedy" if r.greedy else ", sampled"))
        sessions.add(r.session)
        row = rows[kind]
        row["requests"] += 1
        row["context ids"] += context * len(r.outputs)
        row["engine"] += engine
        row["whole context"] += 0 if key in contexts else engine
        row["radix"] += context - min(trie.match(key), context)
        contexts.add(key)
        for output in r.outputs:
            trie.insert(r.ids + output)
            contexts.add((r.ids + output)[:-1])
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="configs/grpo_search.py:test",
                        help="config file[:variant]")
    args = parser.parse_args()
    path, _, variant = args.config.partition(":")
    config = config_of(load_config_module(path), variant or None)
    with tempfile.TemporaryDirectory() as workdir:
        log = record(config, workdir)
    rows = replay(log)
    total = sum(rows.values(), collections.Counter())
    policies = ("engine", "whole context", "radix")
    print(f"\n## Prefix reuse ({args.config}): tokens prefilled, {len(log)} requests\n")
    table(["requests", "kind", "context ids", *policies],
          [[c["requests"], kind, c["context ids"], *(c[p] for p in policies)]
           for kind, c in sorted(rows.items())]
          + [[total["requests"], "all", total["context ids"],
              *(f"{total[p]} ({total[p] / max(total['engine'], 1):.2f}x)"
                for p in policies)]])


if __name__ == "__main__":
    main()
