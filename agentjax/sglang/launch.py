"""Local rollout servers: N `agentjax.sglang.server.main` processes on free ports.

    with LocalServers.start(model_path, count=2, flags=["--random-seed", "0"]) as servers:
        engine = SGLangEngine(servers.urls, ...)

For CPU runs, tests and benchmarks of the SGLang path (`rollout.sglang.launch`): each
server is started directly (no shell, so it is the server's parent) with
`--port 0 --parent-pid <this pid>`, so it takes a free port, says which on its ready
line, and stops by itself if this process dies, even by SIGKILL. `stop()` (also on
leaving the `with` block) sends SIGTERM, waits, then SIGKILL: no server outlives its
launcher.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
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

    def __init__(self, processes: list[_Process]):
        self._processes = processes

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
        servers = cls([_Process(command, env) for _ in range(count)])
        deadline = time.monotonic() + timeout_s
        try:
            for index, process in enumerate(servers._processes):
                process.ready.wait(max(deadline - time.monotonic(), 0))
                if process.url is None:
                    state = (f"exited with status {process.popen.poll()}"
                             if process.popen.poll() is not None
                             else f"printed no URL within {timeout_s:.0f}s")
                    raise ServerStartError(
                        f"local rollout server {index} ({' '.join(command)}) {state}; "
                        "its last output:\n" + "\n".join(process.lines))
        except BaseException:
            servers.stop()
            raise
        return servers

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
