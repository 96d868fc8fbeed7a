"""Benchmarks of the env machinery, each against a baseline measured in the same run.

    python scripts/bench/envs.py                     # full size (about two minutes)
    python scripts/bench/envs.py --docs 20000 --sandbox_runs 40   # quicker

1. Sandbox: runs/s of a trivial program with `--parallel` runs in flight, bubblewrap +
   rlimits vs plain `subprocess` of the same interpreter without isolation.
2. Retrieval: queries/s and latency of BM25Retriever in-process (one thread, and
   `--clients` threads) and through scripts/serve_retrieval.py over HTTP with `--clients`
   concurrent HttpRetriever callers, on a synthetic corpus of `--docs` documents.
3. Code tests: hidden tests/s of `--episodes` code-world programs (half right, half
   wrong) checked at once: `rewards.code.run_tests` (one sandbox run per program, a
   forked child per test) and `Sandbox.run` once per test, against bare bwrap (no
   rlimits, no uid slots, no supervision) running each program + test on its own, as
   many in flight. Goal: the sandboxed path within 3x of bare bwrap.

Each section warms its candidates up, then runs them `--repeats` times in turn
(scripts/bench/timing.py: load from other processes hits them alike); a row shows the
rate of its best run, the spread of its runs' wall times ((max - min) / min)
and latency percentiles over all its runs; a ratio is printed only when it exceeds the
larger spread of its two rows.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import pathlib
import socket
import subprocess
import sys
import tempfile
import time

import httpx
import numpy as np
from timing import Ratio, Runs, measure  # scripts/bench/timing.py

from agentjax.envs.code import world as code_world
from agentjax.envs.retrieval import BM25Retriever, HttpRetriever
from agentjax.envs.sandbox import Sandbox
from agentjax.rewards import code as code_lib

REPO = pathlib.Path(__file__).resolve().parents[2]
TRIVIAL_PROGRAM = "print(sum(range(100)))"


def timed_parallel(fn, n: int, workers: int) -> tuple[float, np.ndarray]:
    """Runs fn(i) for i < n on `workers` threads; returns wall seconds and per-call
    latencies in seconds."""
    def one(i):
        start = time.perf_counter()
        fn(i)
        return time.perf_counter() - start

    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        latencies = np.array(list(pool.map(one, range(n))))
    return time.perf_counter() - start, latencies


def row(name, runs: list[tuple[float, np.ndarray]], baseline: Runs | None = None) -> Runs:
    """Prints one candidate's row from its runs' (wall seconds, latencies); returns its
    wall times (every run in a section makes the same number of calls)."""
    walls = Runs(tuple(wall for wall, _ in runs))
    rate = len(runs[0][1]) / walls.best
    ratio = "" if baseline is None else Ratio.of(baseline, walls).text(3)
    p50, p99 = np.percentile(np.concatenate([lat for _, lat in runs]), [50, 99]) * 1e3
    print(f"  {name:<44} {rate:10.1f} {walls.spread_text():>7} {p50:9.2f} {p99:9.2f} "
          f"{ratio:>8}")
    return walls


def header(unit):
    print(f"  {'':<44} {unit + '/s':>10} {'spread':>7} {'p50 ms':>9} {'p99 ms':>9} "
          f"{'ratio':>8}")


def bench_sandbox(runs: int, parallel: int, repeats: int) -> None:
    sandbox = Sandbox(max_parallel=parallel)
    plain = [sandbox.python, "-B", "-E", "-s", "-c", TRIVIAL_PROGRAM]

    def baseline(_):
        out = subprocess.run(plain, capture_output=True, check=True).stdout
        assert out == b"4950\n"

    def sandboxed(_):
        result = sandbox.run(TRIVIAL_PROGRAM)
        assert result.ok and result.stdout == "4950\n", result

    for fn in (baseline, sandboxed):  # warm the page cache and the slot locks
        timed_parallel(fn, parallel, parallel)
    results = measure({name: lambda fn=fn: timed_parallel(fn, runs, parallel)
                       for name, fn in (("base", baseline), ("sandbox", sandboxed))},
                      repeats, warmup=False)
    print(f"\nSandbox: {runs} runs of a trivial program, {parallel} in parallel "
          f"({sandbox.python}); best of {repeats} interleaved rounds")
    header("runs")
    base = row("plain subprocess (baseline)", results["base"])
    ratio = Ratio.of(row("Sandbox.run (bwrap + prlimit)", results["sandbox"], base), base)
    print(f"  sandbox overhead: {ratio.text()}"
          + (" the time of a plain subprocess" if ratio.resolved else ""))


def bench_code_tests(episodes: int, parallel: int, repeats: int) -> None:
    _, tasks = code_world.make_code_splits(code_world.CodeWorldConfig(
        train_tasks=0, test_tasks=episodes))
    wrong = code_world.program("sorted(x)")
    programs = [(t.metadata["solution"] if i % 2 else wrong, t.metadata["tests"])
                for i, t in enumerate(tasks)]
    pairs = [(program, test) for program, tests in programs for test in tests]
    sandbox = Sandbox(max_parallel=parallel)
    bare = [sandbox._bwrap, "--unshare-all", "--die-with-parent", "--new-session",
            *sandbox._system_binds(), "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp",
            "--", sandbox.python, "-B", "-E", "-s", "-c"]
    expected = [code_world.solves(p, [t]) for p, t in pairs]

    def bare_bwrap(i):
        program, test = pairs[i]
        return subprocess.run(bare + [f"{program}\n\n{test}\n"], capture_output=True,
                              timeout=30).returncode == 0

    def per_test(i):
        program, test = pairs[i]
        return sandbox.run(f"{program}\n\n{test}\n", timeout_s=5).ok

    def harness(i):
        program, tests = programs[i]
        return [r.passed for r in code_lib.run_tests(program, tests, sandbox, timeout_s=5)]

    def checked(fn, n):
        # Each call is one of `episodes` episodes in flight; all of them at once.
        def run():
            results = []
            wall, latencies = timed_parallel(lambda i: results.append((i, fn(i))), n, episodes)
            flat = [v for _, r in sorted(results) for v in (r if isinstance(r, list) else [r])]
            assert flat == expected, "a candidate scored the tests differently"
            return wall, latencies
        return run

    for fn, n in ((bare_bwrap, len(pairs)), (per_test, len(pairs)), (harness, len(programs))):
        checked(fn, n)()  # warm up (and check every candidate's verdicts)
    results = measure({"base": checked(bare_bwrap, len(pairs)),
                       "per_test": checked(per_test, len(pairs)),
                       "harness": checked(harness, len(programs))}, repeats, warmup=False)
    print(f"\nCode tests: {len(pairs)} hidden tests of {episodes} programs, {episodes} "
          f"episodes in flight, Sandbox(max_parallel={parallel}); best of {repeats} "
          "interleaved rounds (latency: per call)")
    header("tests")
    scale = len(pairs) // len(programs)  # each harness call checks this many tests
    base = row("bare bwrap, one process per test (baseline)", results["base"])
    row("Sandbox.run, one run per test", results["per_test"], base)
    harness_runs = [(wall, np.repeat(latencies, scale)) for wall, latencies in
                    results["harness"]]
    row("run_tests: one sandbox run per program", harness_runs, base)


def synthetic_corpus(num_docs: int, seed: int = 0) -> tuple[list[dict], list[str]]:
    """Documents of 40-120 Zipf-distributed pseudo-words (30k vocabulary), and queries of
    2-5 words drawn from random documents (so every query has hits)."""
    rng = np.random.default_rng(seed)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    vocab = ["".join(rng.choice(letters, size=rng.integers(4, 10))) for _ in range(30_000)]
    weights = 1.0 / np.arange(1, len(vocab) + 1) ** 1.1
    lengths = rng.integers(40, 121, size=num_docs)
    words = rng.choice(len(vocab), size=int(lengths.sum()), p=weights / weights.sum())
    records, texts, at = [], [], 0
    for i, n in enumerate(lengths):
        text = " ".join(vocab[w] for w in words[at:at + n])
        at += n
        texts.append(text)
        records.append({"id": str(i), "contents": f'"Doc {i}"\n{text}'})
    queries = []
    for _ in range(2000):
        doc = texts[rng.integers(num_docs)].split()
        queries.append(" ".join(rng.choice(doc, size=rng.integers(2, 6), replace=False)))
    return records, queries


def bench_retrieval(num_docs: int, num_queries: int, clients: int, repeats: int) -> None:
    records, queries = synthetic_corpus(num_docs)
    queries = (queries * (num_queries // len(queries) + 1))[:num_queries]
    start = time.perf_counter()
    retriever = BM25Retriever.from_corpus(records)
    print(f"\nRetrieval: {num_docs} documents (indexed in {time.perf_counter() - start:.1f} s), "
          f"{num_queries} queries, topk 3")

    with tempfile.TemporaryDirectory() as index_dir:
        retriever.save(index_dir)
        port = _free_port()
        server = subprocess.Popen(
            [sys.executable, str(REPO / "scripts" / "serve_retrieval.py"), "--index_dir",
             index_dir, "--port", str(port)], cwd=REPO)
        try:
            url = f"http://127.0.0.1:{port}"
            _wait_healthy(url, server)
            client = HttpRetriever(url, timeout_s=30)
            search = lambda i: retriever.search([queries[i]], 3)  # noqa: E731
            remote = lambda i: client.search([queries[i]], 3)  # noqa: E731
            for i in range(50):  # warm up both paths
                search(i), remote(i)
            results = measure({
                "base": lambda: timed_parallel(search, num_queries, 1),
                "threads": lambda: timed_parallel(search, num_queries, clients),
                "http": lambda: timed_parallel(remote, num_queries, clients),
            }, repeats, warmup=False)
            print(f"best of {repeats} interleaved rounds")
            header("queries")
            base = row("BM25Retriever in-process, 1 thread (base)", results["base"])
            row(f"BM25Retriever in-process, {clients} threads", results["threads"], base)
            row(f"HTTP server, {clients} concurrent clients", results["http"], base)
            got = client.search(queries[:20], 3)
            want = retriever.search(queries[:20], 3)
            assert [[d.id for d in h] for h in got] == [[d.id for d in h] for h in want]
        finally:
            server.terminate()
            server.wait(10)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_healthy(url: str, server: subprocess.Popen) -> None:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError("the retrieval server exited")
        try:
            httpx.get(url + "/health", timeout=1)
            return
        except httpx.HTTPError:
            time.sleep(0.2)
    raise RuntimeError("the retrieval server did not come up")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sandbox_runs", type=int, default=160)
    parser.add_argument("--parallel", type=int, default=8)
    parser.add_argument("--docs", type=int, default=100_000)
    parser.add_argument("--queries", type=int, default=2000)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--episodes", type=int, default=64,
                        help="code programs checked at once (section 3)")
    parser.add_argument("--only", choices=("sandbox", "retrieval", "code"), default=None,
                        help="run one section")
    parser.add_argument("--repeats", type=int, default=3,
                        help="timed runs of each candidate (at least 2 for a ratio)")
    args = parser.parse_args()
    if args.only in (None, "sandbox"):
        bench_sandbox(args.sandbox_runs, args.parallel, args.repeats)
    if args.only in (None, "retrieval"):
        bench_retrieval(args.docs, args.queries, args.clients, args.repeats)
    if args.only in (None, "code"):
        bench_code_tests(args.episodes, args.parallel, args.repeats)


if __name__ == "__main__":
    main()
