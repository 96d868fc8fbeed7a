"""Local rollout servers: N `agentjax.sglang.server.main` processes on free ports, and
an sglang-router in front of running servers.

    with LocalServers.start(model_path, count=2, flags=["--random-seed", "0"]) as servers:
        engine = SGLangEngine(servers.urls, ...)
    with LocalRouter.start(servers.urls, policy="manual") as router:
        engine = SGLangEngine(servers.urls, router_url=router.url, ...)

For CPU runs, tests and benchmarks of the SGLang path (`rollout.sglang.launch`): each
server is started directly (no shell, so it is the server's parent) with
`--port 0 --parent-pid <this pid>`, so it takes a free port, says which on its ready
line, and stops by itself if this process dies, even by SIGKILL. `stop()` (also on
leaving the `with` block) sends SIGTERM, waits, then SIGKILL: no server outlives its
launcher.

`LocalRouter` (tests, benchmarks) runs `python -m sglang_router.launch_router` (the pip
package sglang-router) on a free port, its metrics on another, and returns once GET
/workers lists every worker; `stop()` ends it the same way.
"""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from typing import Sequence

READY = re.compile(r"\[agentjax\] serving .* at (http://\S+)")
# The last lines a server printed, shown when it fails to start.
_TAIL_LINES = 20


class ServerStartError(RuntimeError):
    """A local server exited or stayed silent before its ready line."""


class _Process:
    """One server process; a thread reads its output (so the pipe never fills)."""

    def __init__(self, command: list[str], env: dict[str, str]):
        self.popen = subprocess.Popen(command, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True, env=env)
        self.url: str | None = None
        self.ready = threading.Event()
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.popen.stdout:
            self.lines = (self.lines + [line.rstrip()])[-_TAIL_LINES:]
            match = READY.search(line)
            if match and self.url is None:
                self.url = match.group(1)
                self.ready.set()
        self.ready.set()  # exited: whoever waits sees url is None


class LocalServers:
    """Started servers (`urls` in start order); stop() ends them all."""

    def __init__(self, processes: list[_Process], command: list[str], env: dict[str, str],
                 timeout_s: float):
        self._processes = processes
        self._command, self._env, self._timeout_s = command, env, timeout_s

    @classmethod
    def start(cls, model_path: str, *, count: int, flags: Sequence[str] = (),
              timeout_s: float = 600.0) -> "LocalServers":
        """Starts `count` servers of `model_path` with extra serve_main `flags`, and waits
        until each prints its URL; ServerStartError (all stopped) if one does not within
        timeout_s."""
        command = [sys.executable, "-m", "agentjax.sglang.server.main",
                   "--model-path", os.path.abspath(model_path), "--port", "0",
                   "--parent-pid", str(os.getpid()), *flags]
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        servers = cls([_Process(command, env) for _ in range(count)], command, env, timeout_s)
        servers._wait(range(count))
        return servers

    def revive(self) -> None:
        """Starts a server again in place of each that has exited (a new URL)."""
        dead = [i for i, p in enumerate(self._processes) if p.popen.poll() is not None]
        for index in dead:
            self._processes[index] = _Process(self._command, self._env)
        self._wait(dead)

    def _wait(self, indices) -> None:
        command, timeout_s = self._command, self._timeout_s
        deadline = time.monotonic() + timeout_s
        try:
            for index in indices:
                process = self._processes[index]
                process.ready.wait(max(deadline - time.monotonic(), 0))
                if process.url is None:
                    state = (f"exited with status {process.popen.poll()}"
                             if process.popen.poll() is not None
                             else f"printed no URL within {timeout_s:.0f}s")
                    raise ServerStartError(
                        f"local rollout server {index} ({' '.join(command)}) {state}; "
                        "its last output:\n" + "\n".join(process.lines))
        except BaseException:
            self.stop()
            raise

    @property
    def urls(self) -> list[str]:
        return [p.url for p in self._processes]

    @property
    def pids(self) -> list[int]:
        return [p.popen.pid for p in self._processes]

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM to every server still running, then SIGKILL after timeout_s."""
        running = [p.popen for p in self._processes if p.popen.poll() is None]
        for popen in running:
            popen.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for popen in running:
            try:
                popen.wait(max(deadline - time.monotonic(), 0))
            except subprocess.TimeoutExpired:
                popen.kill()
                popen.wait()

    def __enter__(self) -> "LocalServers":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


# The router flags docs/sglang.md recommends for rollouts (sglang-router 0.3.x): new
# routing keys to the worker holding the fewest; a dead or failing worker leaves its
# rotation after 2 failed answers or 1 failed health check a second, and is tried again
# after 5 s; 3 retries, each picking a worker again.
ROUTER_FLAGS = ("--assignment-mode", "min_group", "--cb-failure-threshold", "2",
                "--cb-timeout-duration-secs", "5", "--health-check-interval-secs", "1",
                "--health-failure-threshold", "1", "--retry-max-retries", "3")


def free_port() -> int:
    """A port free now (a process started next binds it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop(popen: subprocess.Popen, timeout_s: float) -> None:
    if popen.poll() is None:
        popen.send_signal(signal.SIGTERM)
        try:
            popen.wait(timeout_s)
        except subprocess.TimeoutExpired:
            popen.kill()
            popen.wait()


class LocalRouter:
    """An sglang-router process in front of `worker_urls` (module docstring)."""

    def __init__(self, process: _Process, url: str):
        self._process, self.url = process, url

    @classmethod
    def start(cls, worker_urls: Sequence[str], *, policy: str = "cache_aware",
              flags: Sequence[str] = (), timeout_s: float = 60.0) -> "LocalRouter":
        """Starts a router over `worker_urls` with `policy` and extra launch_router
        `flags`; ServerStartError (stopped) when it exits or does not list every worker
        within timeout_s."""
        port = free_port()
        command = [sys.executable, "-m", "sglang_router.launch_router", "--worker-urls",
                   *worker_urls, "--policy", policy, "--host", "127.0.0.1", "--port",
                   str(port), "--prometheus-port", str(free_port()), "--log-level", "warn",
                   *flags]
        router = cls(_Process(command, dict(os.environ)), f"http://127.0.0.1:{port}")
        wanted = {u.rstrip("/") for u in worker_urls}
        deadline = time.monotonic() + timeout_s
        try:
            while router.workers() != wanted:
                if router._process.popen.poll() is not None or time.monotonic() > deadline:
                    state = (f"exited with status {router._process.popen.poll()}"
                             if router._process.popen.poll() is not None
                             else f"did not list its workers within {timeout_s:.0f}s")
                    raise ServerStartError(f"sglang-router ({' '.join(command)}) {state}; "
                                           "its last output:\n"
                                           + "\n".join(router._process.lines))
                time.sleep(0.05)
        except BaseException:
            router.stop()
            raise
        return router

    def workers(self) -> set[str] | None:
        """The worker URLs the router lists now (None: it does not answer)."""
        try:
            with urllib.request.urlopen(self.url + "/workers", timeout=2) as answer:
                return {w["url"].rstrip("/") for w in json.load(answer)["workers"]}
        except (urllib.error.URLError, OSError, ValueError, KeyError):
            return None

    @property
    def pid(self) -> int:
        return self._process.popen.pid

    def stop(self, timeout_s: float = 10.0) -> None:
        _stop(self._process.popen, timeout_s)

    def __enter__(self) -> "LocalRouter":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
