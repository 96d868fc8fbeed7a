"""Rollouts over SGLang's HTTP API: what the server pool costs, measured against the
in-process engine in the same run.

    python scripts/bench/serve.py                        # all three (~6 min, 2 shared cores)
    python scripts/bench/serve.py --only overhead        # overhead | failover | sync | router
    python scripts/bench/serve.py --prompts 16 --repeats 5   # the trainer's full step

Workload: one rollout step of the search suite as the trainer builds it for
configs/grpo_search.py's `cpu` variant (synthetic world, BM25 SearchEnv, composite reward,
its `rollout.*` settings: temperature 1, 24 new tokens per turn, up to 4 turns, a
batch-invariant engine of 64 rows, seeded episodes), `--prompts` tasks x `--group-size`
episodes (default 8 x 8; the trainer's step is 16 x 8). The policy is a random-init
decoder of the variant's size (0.5M params) with a tokenizer trained on the suite's texts,
saved as an HF folder. Engines are built by the trainer's own code
(`train/engines.py: build_engine`): the in-process LanedEngine for rollout.engine="jax",
SGLangEngine over local servers for "sglang"; the servers are serve_main processes
(scripts/serve.py) started by `sglang/launch.py: LocalServers` with the trainer's flags
(`server_flags`: same rows, lanes, decode rounds, dtype, seed, batch invariance).

1. overhead: episodes/s through SGLangEngine + one local server vs the in-process engine
   (goal >= 0.8x). A third row runs the in-process engine without session ids:
   SGLangEngine sends none (SGLang reuses prefixes through its radix cache, which
   agentjax's server does not have), so on serve_main every turn re-prefills its whole
   context; that row separates re-prefilling from HTTP.
2. failover: the same rollout over two servers, one SIGKILLed with requests in flight
   once a quarter of the episodes have finished (at three quarters regardless), vs none
   killed. Every episode is counted (one per task and member, none
   failed) and compared token for token with an uninterrupted run: requests are seeded
   and the engines batch-invariant, so a request re-issued on the other server samples
   what it would have sampled on the first; "0 lost, 0 differ" is checked, not assumed.
   The killed server is replaced by a fresh one (untimed, warmed by one untimed group)
   before the next run.
3. router: the same rollout over two servers through a real sglang-router (the pip
   package; `sglang/launch.py: LocalRouter`, the flags of `ROUTER_FLAGS`) vs SGLangEngine
   over the same servers directly (goal >= 0.95x), with the manual policy (each episode's
   routing key) and with cache_aware (prefix matching on the input ids): episodes/s and
   the share of prompt tokens the servers found cached. Then failover through the
   router: a worker SIGKILLed midway, and a wedged worker (a fake that answers every
   /generate with HTTP 500 while /health answers) beside one real server, through the
   router and directly: episodes lost and seconds.
4. sync: `update_weights` of the in-process engine vs SGLangEngine's on two servers
   (export with save_hf into weights_dir, then every server pauses, loads, continues),
   and SGLangEngine's loads alone (an already exported folder); then a table on paper
   for Qwen2.5-0.5B / 3B / 7B (parameter counts from their config.json shapes,
   bandwidths and step time are flags) against an NCCL broadcast.

Timing: scripts/bench/timing.py (every candidate once untimed, repeats interleaved, best
run and spread, a ratio only when the effect exceeds the spread); this process's JAX
compile counters must not move during a timed run.
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import functools
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

import httpx
import jax
import jax.numpy as jnp
from flax import nnx
from qwen25 import QWEN25, parameter_count  # scripts/bench/qwen25.py
from rollout import PROGRAM_STATS, compilations, compile_line, table  # bench/rollout.py
from timing import Ratio, Runs, measure, timed  # scripts/bench/timing.py

from agentjax.models.config import ModelConfig
from agentjax.models.hf import load_hf, make_tiny_hf
from agentjax.models.tokenizer import AGENT_TAGS, build_tokenizer, load_tokenizer
from agentjax.agents.loop import EpisodeLimits
from agentjax.engine.protocol import SamplingParams
from agentjax.sglang.launch import ROUTER_FLAGS, LocalRouter, LocalServers, free_port
from agentjax.agents.pool import RolloutPool
from agentjax.train.engines import WEIGHTS_DIR, build_engine, server_flags
from agentjax.config.presets import search_config
from agentjax.envs.registry import build_suite

GB = 1e9


@dataclasses.dataclass
class Workload:
    """One rollout step (module docstring) and what builds its engines."""

    config: object
    suite: object
    tokenizer: object
    model_path: str
    graphdef: nnx.GraphDef
    params: object
    model_config: ModelConfig
    tasks: list
    group_size: int
    sampling: SamplingParams
    limits: EpisodeLimits
    folder: Path

    def engine(self, **rollout):
        """(engine, close) as the trainer builds them, with `rollout.*` overrides."""
        config = self.config.copy_and_resolve_references()
        config.rollout.update({k: v for k, v in rollout.items() if k != "sglang"})
        config.rollout.sglang.update(rollout.get("sglang", {}))
        return build_engine(config, graphdef=self.graphdef, params=self.params,
                            model_config=self.model_config, tokenizer=self.tokenizer,
                            model_path=self.model_path, workdir=str(self.folder), log=print)

    def client(self, urls, router_url=""):
        """(SGLangEngine, close) over running serve_main servers (their log-probs, their
        session caches), through the router at `router_url` if given."""
        return self.engine(engine="sglang", sglang=dict(
            urls=",".join(urls), logprob_distribution="sampling", server_sessions=True,
            router_url=router_url))

    def start_servers(self, count: int) -> LocalServers:
        return LocalServers.start(self.model_path, count=count,
                                  flags=server_flags(self.config))


def build_workload(folder: Path, prompts: int, group_size: int) -> Workload:
    config = search_config("grpo", "cpu")
    r, m = config.rollout, config.model
    suite = build_suite(config, str(folder / "data"))
    if len(suite.train_tasks) < prompts:
        raise SystemExit(f"--prompts {prompts}: the suite has {len(suite.train_tasks)} tasks")
    model_path = str(folder / "policy")
    make_tiny_hf(model_path, arch=m.arch, seed=config.seed,
                 tokenizer=build_tokenizer(suite.texts, vocab_size=config.tokenizer.vocab_size,
                                           special_tokens=AGENT_TAGS),
                 hidden_size=m.hidden_size, intermediate_size=m.intermediate_size,
                 num_layers=m.num_layers, num_heads=m.num_heads, num_kv_heads=m.num_kv_heads,
                 head_dim=m.hidden_size // m.num_heads,
                 max_position_embeddings=max(r.max_tokens, 2048))
    model, model_config = load_hf(model_path)
    graphdef, params = nnx.split(model)
    return Workload(
        config, suite, load_tokenizer(model_path), model_path, graphdef, params, model_config,
        list(suite.train_tasks[:prompts]), group_size,
        SamplingParams(temperature=r.temperature, top_p=r.top_p, top_k=r.top_k,
                       max_new_tokens=r.max_new_tokens, seed=config.seed),
        EpisodeLimits(max_turns=config.env.max_turns, max_context_tokens=r.max_tokens),
        folder)


@dataclasses.dataclass
class Rollout:
    seconds: float
    episodes: int
    failed: int
    tokens: int
    tokens_by_episode: dict  # (task id, group id, member) -> its action and observation ids
    reissued: int = 0  # requests SGLangEngine re-issued on another server
    calls: dict = dataclasses.field(default_factory=dict)  # engine program calls and seconds
    cpu_s: tuple = (0.0, 0.0)  # CPU seconds of this process, of the servers

    def differing(self, reference: "Rollout") -> int:
        """Episodes whose tokens differ from `reference`'s, or that it lacks."""
        return sum(reference.tokens_by_episode.get(key) != tokens
                   for key, tokens in self.tokens_by_episode.items())


def lane_stats(lanes) -> collections.Counter:
    """The JaxEngine program counters of `lanes`, summed."""
    return sum((collections.Counter({k: lane.stats[k] for k in PROGRAM_STATS})
                for lane in lanes), collections.Counter())


def server_stats(urls) -> collections.Counter:
    """The program counters of serve_main servers (/get_server_info), summed."""
    return sum((collections.Counter({k: lane["engine_stats"].get(k, 0) for k in PROGRAM_STATS})
                for url in urls
                for lane in httpx.get(url + "/get_server_info").json()["internal_states"]),
               collections.Counter())


def counter_delta(after: dict, before: dict) -> dict:
    """PROGRAM_STATS gained from `before` to `after`, every key kept: a Counter
    difference drops the keys that did not move (a run without a prefill call had no
    prefill_calls)."""
    return {key: after.get(key, 0) - before.get(key, 0) for key in PROGRAM_STATS}


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process `pid` so far (/proc/<pid>/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rollout(engine, work: Workload, *, tasks=None, on_progress=None, programs=None,
            server_pids=()) -> Rollout:
    """One rollout step through `engine`, seeded as the trainer seeds it (group ids from
    0, so every call samples the same episodes); `programs()` returns the engine's
    program counters, `server_pids` the processes whose CPU time counts as the servers'."""
    pool = RolloutPool(engine, work.suite.make_env, work.tokenizer, limits=work.limits,
                       concurrency=work.config.rollout.concurrency,
                       reward_fn=work.suite.reward_fn, progress=on_progress)
    reissued = getattr(engine, "stats", {}).get("reissued", 0)
    calls = programs() if programs else {}
    cpu = (time.process_time(), sum(map(cpu_seconds, server_pids)))
    with pool:
        start = time.perf_counter()
        groups = pool.collect_sync(tasks or work.tasks, work.group_size,
                                   sampling=work.sampling, first_group_id=0)
        seconds = time.perf_counter() - start
    cpu = (time.process_time() - cpu[0], sum(map(cpu_seconds, server_pids)) - cpu[1])
    calls = counter_delta(programs(), calls) if programs else calls
    episodes = {(traj.task_id, traj.group_id, member): tuple(
                    (tuple(t.action_ids), tuple(t.observation_ids or ())) for t in traj.turns)
                for group in groups for member, traj in enumerate(group)}
    trajs = [t for g in groups for t in g]
    return Rollout(seconds, len(trajs), sum(bool(t.metadata["failed"]) for t in trajs),
                   sum(len(t.action_ids) for x in trajs for t in x.turns), episodes,
                   getattr(engine, "stats", {}).get("reissued", 0) - reissued, calls, cpu)


class WithoutSessions:
    """The in-process engine with its requests' session ids dropped: every turn
    re-prefills its context, as on a server that is sent no session id."""

    def __init__(self, engine):
        self.engine = engine

    async def generate(self, requests):
        return await self.engine.generate(
            [dataclasses.replace(r, session_id=None) for r in requests])

    def update_weights(self, weights, *, version=None):
        self.engine.update_weights(weights, version=version)

    def health(self) -> bool:
        return self.engine.health()

    def end_session(self, session_id: str) -> None:
        pass


class CachedTokens:
    """An engine whose completions' cached and prompt tokens are counted."""

    def __init__(self, engine):
        self.engine, self.cached, self.prompt = engine, 0, 0

    async def generate(self, requests):
        results = await self.engine.generate(requests)
        for completion in (c for result in results for c in result):
            self.cached += completion.meta.get("cached_tokens") or 0
            self.prompt += completion.meta.get("prompt_tokens") or 0
        return results

    def __getattr__(self, name):
        return getattr(self.engine, name)


def rollout_rows(results: dict, baseline: str, total: int, reference: Rollout,
                 work_columns: bool = False) -> list:
    """Table rows of `measure` results (lists of Rollout): seconds, episodes/s, speed
    vs the baseline row, the episode checks of every run, and with `work_columns` the
    best run's program calls and CPU seconds."""
    rows = []
    base = Runs(tuple(r.seconds for r in results[baseline]))
    for name, runs in results.items():
        seconds = Runs(tuple(r.seconds for r in runs))
        best = runs[seconds.costs.index(seconds.best)]
        checks = sorted({f"{total - len(r.tokens_by_episode) + r.failed} lost, "
                         f"{r.differing(reference)} differ" for r in runs})
        rows.append([name, f"{best.episodes} ({best.failed} failed)", best.tokens,
                     "/".join(f"{s:.2f}" for s in seconds.costs), f"{seconds.best:.2f}",
                     seconds.spread_text(), f"{best.episodes / seconds.best:.1f}",
                     "baseline" if name == baseline else Ratio.of(base, seconds).text(),
                     "; ".join(checks)])
        if work_columns:
            calls = best.calls
            rows[-1] += [f"{calls['prefill_calls']} / {calls['decode_calls']}",
                         f"{calls['prefill_s']:.2f} / {calls['decode_s']:.2f}",
                         f"{best.cpu_s[0]:.2f} / {best.cpu_s[1]:.2f}"]
    return rows


ROLLOUT_HEADERS = ["run", "episodes", "tokens", "runs s", "best s", "spread", "episodes/s",
                   "speed vs baseline", "episodes lost / differing from the in-process run"]
WORK_HEADERS = ["prefill / decode calls", "prefill / decode s", "CPU s: this process / server"]


# --------------------------------------------------------------------------- benches

def bench_overhead(work: Workload, servers: LocalServers, repeats: int) -> Rollout:
    local, close_local = work.engine(engine="jax")
    start = time.perf_counter()
    programs = local.warmup()
    warmup_s = time.perf_counter() - start
    url, pid = servers.urls[0], servers.pids[0]
    http, close_http = work.client([url])
    in_process_calls = functools.partial(lane_stats, local.lanes)
    before = compilations()
    in_process = "in-process LanedEngine"
    results = measure({
        in_process: lambda: rollout(local, work, programs=in_process_calls),
        "in-process, no session ids": lambda: rollout(WithoutSessions(local), work,
                                                      programs=in_process_calls),
        "SGLangEngine + 1 local server (HTTP)": lambda: rollout(
            http, work, programs=functools.partial(server_stats, [url]), server_pids=[pid])},
        repeats, compilations=compilations)
    close_http()
    close_local()
    reference = results[in_process][0]
    print(f"\n## HTTP overhead: {len(work.tasks)} x {work.group_size} episodes, best of "
          f"{repeats} interleaved runs (in-process warm-up: {programs} programs in "
          f"{warmup_s:.1f} s; then one untimed run of each row)")
    print(compile_line(before, repeats * len(results)))
    table(ROLLOUT_HEADERS + WORK_HEADERS,
          rollout_rows(results, in_process, len(reference.tokens_by_episode), reference,
                       work_columns=True))
    return reference


def bench_failover(work: Workload, servers: LocalServers, repeats: int, reference: Rollout,
                   keep: contextlib.ExitStack) -> str:
    """Prints the failover table; returns the URL of the second server now running
    (a replacement, stopped by `keep`)."""
    total = len(work.tasks) * work.group_size
    survivor = servers.urls[0]
    second = {"servers": servers, "index": 1}  # the server to kill next
    restart_s = []

    def uninterrupted():
        engine, close = work.client([survivor, second["servers"].urls[second["index"]]])
        try:
            return rollout(engine, work)
        finally:
            close()

    def one_killed():
        victim, index = second["servers"], second["index"]
        engine, close = work.client([survivor, victim.urls[index]])
        killed = []

        def kill_midway(progress):
            # At the first episode end after a quarter of them at which the victim has
            # requests in flight (so some are re-issued: with every episode started at
            # once, its pinned sessions may all have ended by half-time), or at three
            # quarters regardless.
            due = progress.episodes_done >= total // 4 and engine.servers[1].outstanding
            if not killed and (due or progress.episodes_done >= 3 * total // 4):
                os.kill(victim.pids[index], signal.SIGKILL)
                killed.append(progress.episodes_done)
        try:
            result = rollout(engine, work, on_progress=kill_midway)
        finally:
            close()
        start = time.perf_counter()
        second.update(servers=keep.enter_context(work.start_servers(1)), index=0)
        warm(second["servers"].urls[0])
        restart_s.append(time.perf_counter() - start)
        return result

    def warm(url):
        """One untimed group on a server: its first requests."""
        engine, close = work.client([url])
        rollout(engine, work, tasks=work.tasks[:1])
        close()

    # Each server is warmed by one group instead of an untimed round of both rows, which
    # would cost one more kill and server start.
    for url in servers.urls[:2]:
        warm(url)
    killed = "one of two SIGKILLed midway"
    results = measure({"two servers, none killed": uninterrupted, killed: one_killed},
                      repeats, warmup=False)
    print(f"\n## Failover: {total} episodes over two servers, best of {repeats} "
          f"interleaved runs (both servers warmed by one untimed group each)")
    table(ROLLOUT_HEADERS, rollout_rows(results, "two servers, none killed", total,
                                        reference))
    print(f"- requests re-issued on the surviving server, per killed run: "
          f"{[r.reissued for r in results[killed]]}; replacing the killed server (start, "
          f"compile, one warm group; untimed): {'/'.join(f'{s:.0f}' for s in restart_s)} s")
    return second["servers"].urls[second["index"]]


def bench_router(work: Workload, servers: LocalServers, repeats: int,
                 reference: Rollout) -> None:
    # The wedged worker is the tests' fake server (tests/ is not part of the installed
    # package: the repository root goes on the path).
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from tests.sglang.fake_server import start_processes

    urls = servers.urls[:2]
    total = len(work.tasks) * work.group_size
    direct_name = "SGLangEngine over 2 servers, direct"
    shares = collections.defaultdict(list)
    with contextlib.ExitStack() as stack:
        routers = {policy: stack.enter_context(LocalRouter.start(urls, policy=policy,
                                                                 flags=ROUTER_FLAGS))
                   for policy in ("manual", "cache_aware")}
        clients = {direct_name: work.client(urls)}
        for policy, router in routers.items():
            clients[f"through sglang-router, {policy}"] = work.client(urls, router.url)
        for _, close in clients.values():
            stack.callback(close)

        def run(name):
            engine = CachedTokens(clients[name][0])
            result = rollout(engine, work)
            shares[name].append(engine.cached / max(engine.prompt, 1))
            return result
        results = measure({name: functools.partial(run, name) for name in clients}, repeats)
    print(f"\n## Through sglang-router: {total} episodes over two servers, best of {repeats} "
          f"interleaved runs (router flags: {' '.join(ROUTER_FLAGS)})")
    rows = rollout_rows(results, direct_name, total, reference)
    for row, name in zip(rows, results):
        row.append("/".join(f"{share:.0%}" for share in shares[name]))
    table(ROLLOUT_HEADERS + ["prompt tokens cached"], rows)

    # Failover through the router (manual policy): one worker SIGKILLed midway.
    failover = []
    with LocalRouter.start(urls, policy="manual", flags=ROUTER_FLAGS) as router:
        engine, close = work.client(urls, router.url)
        killed = []

        def kill_midway(progress):
            if not killed and progress.episodes_done >= total // 4:
                os.kill(servers.pids[1], signal.SIGKILL)
                killed.append(progress.episodes_done)
        start = time.perf_counter()
        result = rollout(engine, work, on_progress=kill_midway)
        failover.append(["through the router, manual: one of two SIGKILLed midway",
                         result, time.perf_counter() - start])
        close()
    servers.revive()
    # A wedged worker beside one real server: through the router, then directly.
    port = free_port()
    with tempfile.TemporaryDirectory() as logs:
        [wedged] = start_processes([(port, os.path.join(logs, "wedged"), 0.0)],
                                   flags=("--fail-generate", "500"))
        wedged_url = f"http://127.0.0.1:{port}"
        try:
            with LocalRouter.start([urls[0], wedged_url], policy="manual",
                                   flags=ROUTER_FLAGS) as router:
                for name, router_url in (("through the router, manual", router.url),
                                         ("direct (SGLangEngine takes it out)", "")):
                    engine, close = work.client([urls[0], wedged_url], router_url)
                    start = time.perf_counter()
                    result = rollout(engine, work)
                    failover.append([f"{name}: one of two answers 500 to every /generate",
                                     result, time.perf_counter() - start])
                    close()
        finally:
            wedged.kill()
            wedged.wait()
    print(f"\n## Failover through sglang-router: {total} episodes, one run each")
    table(["run", "episodes (failed)", "lost", "differ from the in-process run", "s"],
          [[name, f"{r.episodes} ({r.failed})",
            total - len(r.tokens_by_episode) + r.failed, r.differing(reference),
            f"{seconds:.1f}"] for name, r, seconds in failover])


def bench_sync(work: Workload, urls: list[str], repeats: int) -> None:
    local, close_local = work.engine(engine="jax")
    http, close_http = work.client(urls)
    http.update_weights(work.params)
    # A copy of that export for the load-only row (SGLangEngine prunes old versions).
    folder = str(work.folder / "exported")
    shutil.copytree(work.folder / WEIGHTS_DIR / f"v{http.weight_version:08d}", folder)
    loads = f"SGLangEngine: {len(urls)} servers load an exported folder"
    in_process = "in-process update_weights"
    results = measure({
        in_process: timed(lambda: local.update_weights(work.params)),
        f"SGLangEngine: export + {len(urls)} servers load": timed(
            lambda: http.update_weights(work.params)),
        loads: timed(lambda: http.update_weights(folder))}, repeats)
    close_http()
    close_local()
    base = Runs(tuple(results[in_process]))
    size = sum(f.stat().st_size for f in Path(folder).glob("*.safetensors"))
    rows = []
    for name, seconds in results.items():
        runs = Runs(tuple(seconds))
        rows.append([name, "/".join(f"{s:.3f}" for s in runs.costs), f"{runs.best:.3f}",
                     runs.spread_text(), "baseline" if name == in_process
                     else Ratio.of(runs, base).text()])
    print(f"\n## Weight sync of the CPU policy ({size / 1e6:.1f} MB of safetensors), best of "
          f"{repeats} interleaved runs")
    table(["sync", "runs s", "best s", "spread", "cost vs in-process"], rows)


def sync_seconds(params: int, args) -> tuple[int, float, float, float]:
    """(bytes, write s, read s, broadcast s) of one sync of `params` bf16 weights: one host
    writes them; every server reads them at its own rate unless the storage's total rate
    for all servers is the slower; an NCCL broadcast is pipelined, so its time does not
    grow with the servers."""
    size = params * jnp.dtype(jnp.bfloat16).itemsize
    read = max(size / (args.read_gbps * GB), args.servers * size / (args.storage_gbps * GB))
    return size, size / (args.write_gbps * GB), read, size / (args.nccl_gbps * GB)


def paper_sync(args) -> None:
    """Seconds per sync at scale, bf16 weights: the disk path (one host writes, every
    server reads from shared storage) vs an NCCL broadcast from the trainer."""
    rows = []
    for name, shape in QWEN25.items():
        params = parameter_count(*shape)
        size, write, read, broadcast = sync_seconds(params, args)
        rows.append([f"Qwen2.5-{name}", f"{params / 1e9:.2f}B", f"{size / GB:.1f}",
                     f"{write:.1f}", f"{read:.1f}", f"{write + read:.1f}",
                     f"{(write + read) / args.step_s:.0%}", f"{broadcast:.2f}",
                     f"{broadcast / args.step_s:.1%}"])
    print(f"\n## Weight sync on paper: bf16, {args.servers} servers; one host writes "
          f"{args.write_gbps:g} GB/s, a server reads {args.read_gbps:g} GB/s, the shared "
          f"storage serves {args.storage_gbps:g} GB/s in all; NCCL broadcast "
          f"{args.nccl_gbps:g} GB/s; a step takes {args.step_s:g} s")
    table(["model", "params", "GB", "write s", "read s", "disk sync s", "disk / step",
           "NCCL s", "NCCL / step"], rows)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="overhead,failover,router,sync")
    parser.add_argument("--prompts", type=int, default=8, help="tasks per rollout")
    parser.add_argument("--group-size", type=int, default=8, help="episodes per task")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of each row")
    parser.add_argument("--failover-repeats", type=int, default=2,
                        help="timed runs of each failover row (a kill costs a restart)")
    paper = parser.add_argument_group("the weight sync on paper")
    paper.add_argument("--servers", type=int, default=8, help="SGLang servers loading")
    paper.add_argument("--write-gbps", type=float, default=1.0,
                       help="GB/s the trainer host writes to shared storage (NFS-class)")
    paper.add_argument("--read-gbps", type=float, default=2.0,
                       help="GB/s one server reads and loads")
    paper.add_argument("--storage-gbps", type=float, default=5.0,
                       help="GB/s the shared storage serves to all servers together")
    paper.add_argument("--nccl-gbps", type=float, default=25.0,
                       help="GB/s of an NCCL broadcast to the servers (200 Gb/s InfiniBand)")
    paper.add_argument("--step-s", type=float, default=120.0,
                       help="seconds of one RL step at that scale")
    args = parser.parse_args()
    chosen = set(args.only.split(","))
    print(f"jax {jax.__version__} on {jax.devices()[0].platform}, {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        work = build_workload(Path(tmp), args.prompts, args.group_size)
        print(f"workload: search suite (grpo_search cpu), {len(work.tasks)} tasks x "
              f"{work.group_size} episodes; policy {work.model_config.num_layers} layers, "
              f"d={work.model_config.hidden_size}, vocab {work.model_config.vocab_size}; "
              f"server flags {' '.join(server_flags(work.config))} "
              f"({time.perf_counter() - start:.0f} s)")
        count = 2 if chosen & {"failover", "router", "sync"} else 1
        start = time.perf_counter()
        with contextlib.ExitStack() as keep:
            servers = keep.enter_context(work.start_servers(count))
            print(f"{count} local server(s) ready in {time.perf_counter() - start:.0f} s")
            urls = servers.urls
            reference = None
            if "overhead" in chosen:
                reference = bench_overhead(work, servers, args.repeats)
            if chosen & {"failover", "router"} and reference is None:
                local, close = work.engine(engine="jax")
                local.warmup()
                reference = rollout(local, work)
                close()
            if "router" in chosen:
                bench_router(work, servers, args.repeats, reference)
                urls = servers.urls
            if "failover" in chosen:
                urls = [urls[0], bench_failover(work, servers, args.failover_repeats,
                                                reference, keep)]
            if "sync" in chosen:
                bench_sync(work, urls, args.repeats)
    paper_sync(args)
    print(f"\nload average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
