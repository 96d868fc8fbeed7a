"""Reliability under hostile input: how many adversarial cases agentjax holds.

    python scripts/bench/reliability.py                 # all four suites (~5 minutes)
    python scripts/bench/reliability.py --only fuzz,configs --fuzz_cases 2000

Suites (cases tried, cases held, seconds each):
  fuzz       seeded hostile action strings (random bytes, unicode, nested / unbalanced /
             repeated tags, ~1 MB strings, null bytes, malformed JSON, hostile Python)
             through both parsers, SearchEnv, PythonEnv (bubblewrap) and the composite
             reward (tests/envs/fuzz_corpus.py). Held: no exception, a valid UTF-8
             observation within the env's cap, each step under 3 s.
  configs    every key of the config with every value its rule must reject (out of
             range, NaN/inf, wrong type, bad format), set as a json file would set it.
             Held: `validate` raises a one-line ConfigError naming the key.
  requests   the malformed requests of tests/envs/retrieval_server.py sent to
             scripts/serve_retrieval.py over one kept-alive connection. Held: the
             expected 4xx with a message, and the next valid request answered on the
             same connection.
  kills      configs/grpo_search.py:test SIGKILLed at seeded points in every stage
             (tests/train/runs.py). Held: once finished, every stage's metrics, the
             evaluations and every exported model equal the uninterrupted run's, and no
             temporary file is left.

There is no baseline to divide by here: the figure is the count of cases held.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

# The corpora and runners live with the tests (tests/ is not part of the installed
# package), so the repository root goes on the path; each stage imports the helpers it
# needs inside its function, so a stage run alone loads only its own.
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def fuzz(cases: int, seed: int) -> tuple[int, int, list[str]]:
    from tests.envs.fuzz_corpus import fuzz_actions, run_fuzz

    result = run_fuzz(fuzz_actions(seed=seed, count=cases))
    for category, (tried, held, seconds) in sorted(result.counts.items()):
        print(f"  fuzz/{category}: {held}/{tried} held, {seconds:.1f}s")
    tried = sum(c[0] for c in result.counts.values())
    held = sum(c[1] for c in result.counts.values())
    return tried, held, [str(f) for f in result.failures]


def configs() -> tuple[int, int, list[str]]:
    from agentjax import config as config_lib
    from tests.config.test_schema import KEYS, _with, outside

    tried = held = 0
    problems = []
    for key in KEYS:
        for value in outside(config_lib.RULES[key]):
            tried += 1
            try:
                config_lib.validate(_with(key, value))
                problems.append(f"{key}={value!r} accepted")
            except config_lib.ConfigError as error:
                if str(error).startswith(f"config key {key!r}") and "\n" not in str(error):
                    held += 1
                else:
                    problems.append(f"{key}={value!r}: the error does not name the key in "
                                    f"one line: {error}")
            except Exception as error:  # noqa: BLE001 - any other exception is a miss
                problems.append(f"{key}={value!r}: {type(error).__name__}: {error}")
    return tried, held, problems


def requests(workdir: str) -> tuple[int, int, list[str]]:
    from tests.envs.conftest import world_records
    from tests.envs.retrieval_server import send_malformed, serve

    corpus = Path(workdir, "corpus.jsonl")
    corpus.write_text("".join(json.dumps(r) + "\n" for r in world_records()))
    with serve(corpus, Path(workdir, "index")) as base_url:
        outcomes = send_malformed(base_url)
    problems = [f"{what}: {problem}" for what, problem in outcomes if problem]
    return len(outcomes), len(outcomes) - len(problems), problems


def kills(workdir: str, count: int, seed: int) -> tuple[int, int, list[str]]:
    from tests.train.runs import ONE_DEVICE, differences, kill_campaign, temporaries, train

    # Restarts reuse compiled programs, as a user's reruns do (scripts/train.py's cache).
    env = {**ONE_DEVICE, "JAX_COMPILATION_CACHE_DIR": os.path.join(workdir, "xla"),
           "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}
    # Stages of a few steps each (the test variant's are one to three), so that kills
    # land inside pretraining, SFT and RL, not only between them.
    overrides = ("--config.pretrain.steps=8", "--config.sft.steps=8",
                 "--config.total_steps=6", "--config.eval.every=3")
    reference, killed = os.path.join(workdir, "straight"), os.path.join(workdir, "killed")
    train("grpo_search.py:test", reference, *overrides, env=env)
    counts = kill_campaign("grpo_search.py:test", killed, *overrides, kills=count, seed=seed,
                           env=env)
    for where, n in sorted(counts.items()):
        print(f"  kills/{where}: {n}")
    problems = differences(reference, killed) + [f"left over: {t}" for t in temporaries(killed)]
    landed = count - counts.get("finished first", 0)
    return landed, landed if not problems else 0, problems


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="fuzz,configs,requests,kills")
    parser.add_argument("--fuzz_cases", type=int, default=1000)
    parser.add_argument("--kills", type=int, default=12)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    chosen = args.only.split(",")
    rows = []
    with tempfile.TemporaryDirectory() as workdir:
        suites = {"fuzz": lambda: fuzz(args.fuzz_cases, args.seed),
                  "configs": configs,
                  "requests": lambda: requests(workdir),
                  "kills": lambda: kills(workdir, args.kills, args.seed)}
        for name in chosen:
            if name not in suites:
                parser.error(f"unknown suite {name!r}; choose from {sorted(suites)}")
            print(f"[{name}]", flush=True)
            start = time.perf_counter()
            tried, held, problems = suites[name]()
            rows.append((name, tried, held, time.perf_counter() - start))
            for problem in problems[:10]:
                print(f"  NOT HELD: {problem}")
    print("\n| suite | cases tried | cases held | seconds |\n|---|---|---|---|")
    for name, tried, held, seconds in rows:
        print(f"| {name} | {tried} | {held} | {seconds:.0f} |")
    sys.exit(0 if all(tried == held for _, tried, held, _ in rows) else 1)


if __name__ == "__main__":
    main()
