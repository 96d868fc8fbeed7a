"""MCP servers as tools: every tool an MCP server lists becomes an agentjax Tool.

`McpManager(servers)` (servers from `env.mcp_servers`, config/mcp_servers.py) connects to
each server through the official `mcp` SDK, lists its tools (`tools/list`) and keeps the
allowed ones; `manager.tools()` gives one env its Tools (name, description, the server's
input schema as `parameters`, `__call__(arguments) -> str` or ToolError), which go to the
chat template like the env's own. A server that cannot start or list its tools raises
McpSetupError naming it, while the suite is built: before any training.

Threads: envs step in worker threads (agents/loop.py runs `env.step` in an executor)
while the SDK is async, so the manager owns one background thread running one asyncio
loop; every session lives on it (a task holds each `async with Client(...)` open, so
the SDK's cancel scopes are entered and left in one task) and a tool call is
`asyncio.run_coroutine_threadsafe(...).result(bound)` from the worker thread.

State isolation, per server (`isolation`):
  * "shared": one session for the whole run (for a stdio server, one process), which
    every episode's calls go to, concurrently. Right for stateless tools (a clock, a
    calculator, a search API), and the cheap choice: one start per run.
  * "episode": a fresh session per episode (for a stdio server a fresh process, started
    at the episode's first call to it and stopped when the episode's env is released),
    so nothing one episode does to the server's state is seen by another: a memory, a
    file system, a database. For a URL server this is a new MCP session; whether state
    is kept per session is the server's own design.
  Both are listed once at setup (the tools an episode server offers are the ones that
  listing found).

A call and what the policy sees (`ToolError` becomes an error observation; the run goes
on):
  * text content: the observation, cut to `max_result_chars` (head and tail kept);
  * image, audio, resource links, embedded resources and (when no text came with it)
    structuredContent: one line each saying the type, MIME type and size, never the
    bytes;
  * `isError`: ToolError with the server's text;
  * no answer within the server's `timeout_s` (the SDK's read timeout raises): ToolError;
    then the server is asked for its tools list, and one that does not answer within
    5 s is treated as dead;
  * the server process exits mid-call or the connection drops: ToolError; the session is
    restarted (a stdio server's process respawned) at the next call, at most
    `max_restarts` times in a row without a successful call in between; after that the
    server is gone and its tools answer every call with a ToolError saying so;
  * a result the SDK cannot parse (not a CallToolResult) or refuses (structuredContent
    against the tool's output schema) from a server that still answers, or an MCP
    protocol error: ToolError, no restart.
The SDK parses a result whole (a 10 MB result is 10 MB for a moment, and over stdio its
line reassembly takes seconds: give such a server a `timeout_s` to match); the manager
keeps only what the observation shows. `close()` stops every session and server process (the
SDK closes stdin, then terminates the process tree); it runs at interpreter exit too.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import importlib.metadata
import json
import logging
import os
import tempfile
import threading
import weakref
from typing import Any, Mapping, Sequence

from agentjax.config.mcp_servers import McpServer, parse_mcp_servers
from agentjax.envs.tools import ToolError
from agentjax.envs.turns import DEFAULT_MAX_OBSERVATION_CHARS, clip

log = logging.getLogger(__name__)

# The SDK versions this module is written against: mcp 2.x names (MCPError,
# snake_case result fields such as `is_error` and `input_schema`, timeouts that raise
# MCPError(REQUEST_TIMEOUT)); 1.x spells them differently. pyproject's `mcp` extra
# pins the same range.
SDK_RANGE = (2, 3), (3, 0)
INSTALL = "pip install 'mcp>=2.3,<3'  (or pip install -e '.[mcp]' from the checkout)"
# A server that answered no call within its timeout gets this long to answer a
# tools/list; one that does not is treated as dead (restarted).
PROBE_TIMEOUT_S = 5.0
# A session's close: the SDK closes a stdio server's stdin, waits 2 s, sends SIGTERM,
# waits 2 s, kills; this is the most it is waited for.
CLOSE_TIMEOUT_S = 15.0
# Beyond a call's own timeout and a restart's connect_timeout_s: the probe and the close
# of the old session.
CALL_MARGIN_S = PROBE_TIMEOUT_S + CLOSE_TIMEOUT_S
# How much of a server's stderr a setup error quotes.
STDERR_TAIL_CHARS = 2000
# tools/list pages read at most (a server whose cursor never ends cannot hang setup).
MAX_LIST_PAGES = 100


class McpSetupError(RuntimeError):
    """An MCP server could not start, list its tools, or offer the tools asked for."""


def check_sdk() -> None:
    """Raises McpSetupError naming the install when the `mcp` SDK is missing or outside
    the supported range."""
    try:
        version = importlib.metadata.version("mcp")
    except importlib.metadata.PackageNotFoundError:
        raise McpSetupError(f"env.mcp_servers needs the mcp SDK; install it with: "
                            f"{INSTALL}") from None
    major_minor = tuple(int(p) for p in version.split(".")[:2] if p.isdigit())
    (low, high) = SDK_RANGE
    if not low <= major_minor < high:
        raise McpSetupError(f"env.mcp_servers supports mcp >=2.3,<3, found mcp {version}; "
                            f"install with: {INSTALL}")


def describe_server(server: McpServer) -> str:
    """`'time' (stdio: mcp-server-time --x)` or `'search' (http://host/mcp)`."""
    where = (" ".join([server.command, *server.args]) if server.transport == "stdio"
             else server.url)
    return f"{server.name!r} ({server.transport}: {clip(where, 200)})"


# -- results -------------------------------------------------------------------------


def render_result(result, max_chars: int) -> str:
    """The observation text of a CallToolResult: its text blocks (each cut to
    `max_chars` before they are joined, so a huge block is never copied whole), one
    line describing each other block, and structuredContent described when no text
    came with it; cut to `max_chars` (head and tail kept)."""
    parts, texts = [], 0
    for block in result.content:
        if block.type == "text":
            parts.append(clip(block.text, max_chars))
            texts += 1
        else:
            parts.append(describe_block(block))
    if texts == 0 and result.structured_content is not None:
        parts.append(describe_structured(result.structured_content))
    return clip("\n".join(parts), max_chars) if parts else "(no output)"


def describe_block(block) -> str:
    """One line for a non-text content block: its type, MIME type and size."""
    if block.type in ("image", "audio"):
        return f"[{block.type}: {block.mime_type}, {base64_size(block.data)} bytes]"
    if block.type == "resource_link":
        size = "" if block.size is None else f", {block.size} bytes"
        return (f"[resource link: {clip(block.uri, 200)} ({clip(block.name, 100)}, "
                f"{block.mime_type or 'unknown type'}{size})]")
    resource = block.resource  # an embedded resource: text or a base64 blob
    size = (f"{len(resource.text)} characters" if hasattr(resource, "text")
            else f"{base64_size(resource.blob)} bytes")
    return (f"[embedded resource: {clip(resource.uri, 200)} "
            f"({resource.mime_type or 'unknown type'}, {size})]")


def describe_structured(value: Any) -> str:
    """structuredContent in one line: its JSON type, its keys (an object's), its size."""
    text = json.dumps(value, default=str)
    kind = {dict: "object", list: "array", str: "string"}.get(type(value), "value")
    keys = (f" with keys {clip(', '.join(map(str, value)), 200)}"
            if isinstance(value, dict) else "")
    return f"[structured content: JSON {kind}{keys}, {len(text)} characters]"


def base64_size(data: str) -> int:
    """Bytes a base64 string decodes to."""
    return len(data) * 3 // 4 - data[-2:].count("=") if data else 0


# -- sessions and the loop that runs them ----------------------------------------------


class _Hub:
    """The background event loop and every open session. Holds no reference to the
    manager, so a manager nobody uses is collected (and its finalizer closes this)."""

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self.sessions: set[_Session] = set()
        self.closed = False
        self.thread = threading.Thread(target=self._run, name="mcp-client-loop", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(self, coroutine, timeout: float):
        """Runs `coroutine` on the loop from another thread; waits at most `timeout`."""
        future = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise

    def close_later(self, session: _Session | None) -> None:
        """Schedules `session`'s close without waiting (from any thread, a finalizer's
        included)."""
        if session is not None and not self.closed:
            self.loop.call_soon_threadsafe(lambda: self.loop.create_task(session.close()))

    def shutdown(self) -> None:
        """Closes every session (server processes stopped), then the loop."""
        if self.closed:
            return
        self.closed = True

        async def close_all():
            await asyncio.gather(*(s.close() for s in list(self.sessions)),
                                 return_exceptions=True)

        if threading.current_thread() is self.thread:
            # A finalizer the garbage collector ran on the loop's own thread: waiting
            # here would block the loop, so the close runs and then stops it.
            def stop(_):
                self.loop.stop()
            self.loop.create_task(close_all()).add_done_callback(stop)
            return
        try:
            self.run(close_all(), timeout=30)
        except Exception as error:  # noqa: BLE001 - the loop stops all the same
            log.warning("MCP: closing the sessions failed: %s", error)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        if not self.thread.is_alive():
            self.loop.close()


class _Session:
    """One open client session to a server (for a stdio server, one process). A task on
    the hub's loop holds `async with Client(...)` open until `close()`."""

    def __init__(self, server: McpServer, hub: _Hub):
        self.server = server
        self.hub = hub
        self.client = None
        self._stop = asyncio.Event()
        self._task: asyncio.Task | None = None
        # The server's stderr: quoted by setup errors, kept off the run's own stderr.
        self.stderr = tempfile.TemporaryFile() if server.transport == "stdio" else None
        self._last_stderr = ""

    async def open(self) -> None:
        """Starts the server (stdio) or connects (http) and does the handshake, within
        `connect_timeout_s`."""
        ready = asyncio.get_running_loop().create_future()
        # Read even when open() gave up on it first (no "exception never retrieved").
        ready.add_done_callback(lambda done: done.cancelled() or done.exception())
        self.hub.sessions.add(self)
        self._task = asyncio.create_task(self._hold(ready))
        try:
            await asyncio.wait_for(asyncio.shield(ready), self.server.connect_timeout_s)
        except BaseException:
            await self.close()
            raise

    def _transport(self):
        from mcp import StdioServerParameters, stdio_client

        server = self.server
        if server.transport == "http":
            return server.url
        # ${VAR} in an env value is read from this process's environment when the
        # server starts, so a secret stays out of the saved config.
        env = {key: os.path.expandvars(value) for key, value in server.env.items()}
        return stdio_client(StdioServerParameters(
            command=server.command, args=list(server.args), env=env or None,
            cwd=server.cwd or None), errlog=self.stderr)

    async def _hold(self, ready: asyncio.Future) -> None:
        from mcp import Client

        try:
            # cache=None: every tools/list reaches the server (setup checks it is alive).
            async with Client(self._transport(), cache=None) as client:
                self.client = client
                ready.set_result(None)
                await self._stop.wait()
        except BaseException as error:  # noqa: BLE001 - reported to open() or dropped
            if not ready.done():
                ready.set_exception(error if isinstance(error, Exception)
                                    else RuntimeError(f"cancelled: {error!r}"))
            elif not isinstance(error, asyncio.CancelledError):
                log.debug("MCP server %s: session ended: %r", self.server.name, error)
        finally:
            self.client = None

    async def close(self) -> None:
        """Ends the session; a stdio server's process is stopped (the SDK closes its
        stdin, then terminates it). Idempotent."""
        self._stop.set()
        task = self._task
        if task is not None and not task.done():
            if self.client is None:  # still connecting: nothing to wind down politely
                task.cancel()
            try:
                await asyncio.wait_for(asyncio.shield(task), CLOSE_TIMEOUT_S)
            except (asyncio.TimeoutError, asyncio.CancelledError, Exception):  # noqa: BLE001
                task.cancel()
        self.hub.sessions.discard(self)
        if self.stderr is not None and task is not None and task.done():
            self._last_stderr = self.stderr_tail()
            self.stderr.close()  # the process is gone

    def stderr_tail(self) -> str:
        """The end of what the server wrote to stderr ('' for a URL server)."""
        if self.stderr is None or self.stderr.closed:
            return self._last_stderr
        self.stderr.seek(0, 2)
        self.stderr.seek(max(0, self.stderr.tell() - STDERR_TAIL_CHARS))
        return self.stderr.read().decode("utf-8", "replace").strip()


async def _list_tools(session: _Session) -> list:
    tools, cursor = [], None
    for _ in range(MAX_LIST_PAGES):
        page = await session.client.list_tools(cursor=cursor)
        tools.extend(page.tools)
        cursor = page.next_cursor
        if cursor is None:
            return tools
    raise McpSetupError(f"tools/list gave more than {MAX_LIST_PAGES} pages")


class _Connection:
    """A server as its tools see it: a session that is (re)started when needed, at most
    `max_restarts` times in a row without a successful call between; then gone."""

    def __init__(self, server: McpServer, hub: _Hub, session: _Session | None = None):
        self.server = server
        self.hub = hub
        self.session = session
        self.broken = False
        self.failures_in_a_row = 0
        self.gone: str | None = None
        self._lock: asyncio.Lock | None = None

    async def _live_session(self) -> _Session:
        self._lock = self._lock or asyncio.Lock()
        async with self._lock:
            session = self.session
            if session is not None and not self.broken and session.client is None:
                self._failed(session)  # it ended between calls (the process died idle)
            if self.gone:
                raise ToolError(self.gone, summary="server gone", extra=self._extra("gone"))
            if self.session is not None and not self.broken:
                return self.session
            if self.session is not None:
                await self.session.close()
                self.session = None
            session = _Session(self.server, self.hub)
            try:
                await session.open()
            except Exception as error:  # noqa: BLE001 - told to the policy, counted
                self._failed(None)
                raise ToolError(f"MCP server {self.server.name!r} could not be (re)started: "
                                f"{_short(error)}; {self._next()}",
                                extra=self._extra("start_failed")) from None
            self.session, self.broken = session, False
            return session

    def _failed(self, session: _Session | None) -> None:
        """Counts a failure of `session` (a crash, a dead hang; None: a start that
        failed); past `max_restarts` in a row the server is gone for the rest of the
        run. A session's failure counts once, however many concurrent calls saw it."""
        if session is not None and (session is not self.session or self.broken):
            return
        self.broken = True
        self.failures_in_a_row += 1
        if self.failures_in_a_row > self.server.max_restarts:
            self.gone = (f"MCP server {self.server.name!r} is gone: it failed "
                         f"{self.failures_in_a_row} times in a row (max_restarts="
                         f"{self.server.max_restarts}); its tools cannot be called for the "
                         "rest of the run.")
            log.warning("%s", self.gone)
            self.hub.close_later(self.session)
            self.session = None

    def _extra(self, status: str) -> dict[str, Any]:
        return {"mcp_server": self.server.name, "status": status}

    async def call(self, tool: str, arguments: dict, max_chars: int) -> tuple[str, bool]:
        """Calls `tool`; returns (observation text, isError) or raises ToolError."""
        from mcp.shared.exceptions import MCPError
        from mcp_types import CONNECTION_CLOSED, REQUEST_TIMEOUT
        from pydantic import ValidationError

        session = await self._live_session()
        name = f"MCP server {self.server.name!r}"
        try:
            result = await session.client.call_tool(
                tool, arguments, read_timeout_seconds=self.server.timeout_s)
        except MCPError as error:
            if error.code == REQUEST_TIMEOUT:
                alive = await self._answers(session)
                if not alive:
                    self._failed(session)
                raise ToolError(
                    f"{name}: {tool!r} did not answer within {self.server.timeout_s:g} s"
                    + ("" if alive else "; the server stopped answering and is restarted "
                       "for the next call"),
                    summary="timeout", extra=self._extra("timeout")) from None
            if error.code == CONNECTION_CLOSED:
                self._failed(session)
                raise ToolError(f"{name} stopped during the call to {tool!r} (connection "
                                f"closed); {self._next()}", summary="server crashed",
                                extra=self._extra("crashed")) from None
            raise ToolError(f"{name}: {tool!r} failed: MCP error {error.code}: "
                            f"{clip(str(error), 500)}",
                            extra=self._extra("mcp_error")) from None
        except ValidationError as error:
            raise ToolError(f"{name}: {tool!r} returned a malformed result: "
                            f"{_short(error)}", summary="malformed result",
                            extra=self._extra("malformed")) from None
        except Exception as error:  # noqa: BLE001 - told to the policy
            # The SDK refused the result (structuredContent against the tool's output
            # schema) from a server that still answers; or the transport failed
            # (connection refused or reset, broken pipe): the session starts afresh.
            if session.client is not None and await self._answers(session):
                raise ToolError(f"{name}: {tool!r} returned a malformed result: "
                                f"{_short(error)}", summary="malformed result",
                                extra=self._extra("malformed")) from None
            self._failed(session)
            raise ToolError(f"{name}: the call to {tool!r} failed: {_short(error)}; "
                            f"{self._next()}", extra=self._extra("transport")) from None
        self.failures_in_a_row = 0
        return render_result(result, max_chars), bool(result.is_error)

    def _next(self) -> str:
        return self.gone or "it is restarted for the next call"

    async def _answers(self, session: _Session) -> bool:
        """Whether the server still answers a request (tools/list: ping is gone from the
        2026-07-28 protocol the SDK negotiates first)."""
        try:
            await asyncio.wait_for(session.client.list_tools(),
                                   min(PROBE_TIMEOUT_S, self.server.timeout_s))
            return True
        except Exception:  # noqa: BLE001 - any failure to answer is no answer
            return False


def _short(error: BaseException) -> str:
    """`Type: first line` of an error; of an exception group (the SDK's task groups
    raise them), its first leaf's."""
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    text = str(error).strip().splitlines()
    return clip(f"{type(error).__name__}: {text[0] if text else ''}", 500)


# -- tools and the manager --------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _ToolSpec:
    server: McpServer
    remote_name: str  # the server's name of the tool
    name: str         # the policy's: prefix + remote_name
    description: str
    parameters: Mapping[str, Any]


class McpTool:
    """One tool of an MCP server, as an agentjax Tool (envs/tools.py).

    Attributes:
      name: the server's tool name with the server's `prefix`.
      description, parameters: the server's description and input schema.
      server: the McpServer entry it comes from.
    """

    def __init__(self, spec: _ToolSpec, connection: _Connection, hub: _Hub, max_chars: int):
        self.name, self.description = spec.name, spec.description
        self.parameters = spec.parameters
        self.server = spec.server
        self._remote_name = spec.remote_name
        self._connection, self._hub, self._max_chars = connection, hub, max_chars

    def __call__(self, arguments: Mapping[str, Any]) -> str:
        server = self.server
        if self._hub.closed:
            raise ToolError(f"MCP server {server.name!r}: the run's MCP sessions are closed",
                            extra={"mcp_server": server.name, "status": "closed"})
        bound = server.timeout_s + server.connect_timeout_s + CALL_MARGIN_S
        try:
            text, is_error = self._hub.run(
                self._connection.call(self._remote_name, dict(arguments), self._max_chars),
                timeout=bound)
        except concurrent.futures.TimeoutError:
            raise ToolError(f"MCP server {server.name!r}: {self._remote_name!r} gave no "
                            f"answer within {bound:g} s", summary="timeout",
                            extra={"mcp_server": server.name, "status": "timeout"}) from None
        if is_error:
            first = text.strip().splitlines()
            raise ToolError(text, summary=f"isError: {first[0] if first else ''}",
                            extra={"mcp_server": server.name, "status": "is_error"})
        return text


class McpManager:
    """The MCP servers of a run, connected and listed; `tools()` gives one env its tools.

    Args:
      servers: the servers (config/mcp_servers.py: `parse_mcp_servers`).
      max_result_chars: an observation is cut to this many characters (the env's
        `max_observation_chars` cuts it again).
      reserved: tool names the env already has (a server tool of that name is an error).

    Raises:
      McpSetupError: the SDK is missing, or a server cannot start or list its tools
        within its `connect_timeout_s`, lacks a tool its allow-list names, or offers a
        tool whose name another server (or the env) already uses; the message names the
        server. Every session opened so far is closed first.
    """

    def __init__(self, servers: Sequence[McpServer], *,
                 max_result_chars: int = DEFAULT_MAX_OBSERVATION_CHARS,
                 reserved: Sequence[str] = ()):
        check_sdk()
        self.servers = tuple(servers)
        self.max_result_chars = int(max_result_chars)
        self._hub = _Hub()
        self._finalizer = weakref.finalize(self, self._hub.shutdown)
        # Each server's setup is bounded by its connect_timeout_s plus a session's close;
        # this bound only catches an SDK that ignores cancellation.
        bound = max([s.connect_timeout_s for s in self.servers] or [0.0]) + 2 * CLOSE_TIMEOUT_S
        try:
            listed = self._hub.run(self._setup_all(), timeout=bound)
        except BaseException as error:
            self.close()
            if isinstance(error, McpSetupError):
                raise
            names = ", ".join(describe_server(s) for s in self.servers)
            raise McpSetupError(f"MCP servers {names} did not finish their setup within "
                                f"{bound:g} s: {_short(error)}") from None
        self._specs: list[_ToolSpec] = []
        self._shared: dict[str, _Connection] = {}
        owner = {name: "the env" for name in reserved}
        for server, (session, tools) in zip(self.servers, listed):
            for spec in self._tool_specs(server, tools):
                if spec.name in owner:
                    self.close()
                    raise McpSetupError(
                        f"MCP server {describe_server(server)} offers tool {spec.name!r}, "
                        f"which {owner[spec.name]} already has: give the server a 'prefix' "
                        "or a 'tools' allow-list in env.mcp_servers")
                owner[spec.name] = f"MCP server {server.name!r}"
                self._specs.append(spec)
            if server.isolation == "shared":
                self._shared[server.name] = _Connection(server, self._hub, session)
        log.info("MCP: %d tools from %d servers: %s", len(self._specs), len(self.servers),
                 ", ".join(s.name for s in self._specs))

    @property
    def tool_names(self) -> list[str]:
        return [spec.name for spec in self._specs]

    def tools(self) -> list[McpTool]:
        """The tools for one env (one episode): shared servers' tools call the run's one
        session; each episode server gets a connection of its own, started at its first
        call and closed when these tools are released."""
        connections = dict(self._shared)
        for server in self.servers:
            if server.isolation == "episode":
                connection = _Connection(server, self._hub)
                weakref.finalize(connection, _close_connection, self._hub, connection.__dict__)
                connections[server.name] = connection
        return [McpTool(spec, connections[spec.server.name], self._hub, self.max_result_chars)
                for spec in self._specs]

    def close(self) -> None:
        """Stops every session and server process; idempotent (also run at exit)."""
        self._finalizer()

    async def _setup_all(self):
        # All finish (none left opening a session after close()), then the first error.
        listed = await asyncio.gather(*(self._setup(server) for server in self.servers),
                                      return_exceptions=True)
        for outcome in listed:
            if isinstance(outcome, BaseException):
                raise outcome
        return listed

    async def _setup(self, server: McpServer):
        """Connects to `server` and lists its tools; an episode server's probe session is
        closed again. Returns (session or None, tools)."""
        session = _Session(server, self._hub)

        async def start_and_list():
            await session.open()
            return await _list_tools(session)

        try:
            tools = await asyncio.wait_for(start_and_list(), server.connect_timeout_s)
        except BaseException as error:  # noqa: BLE001 - named and re-raised
            tail = session.stderr_tail()
            await session.close()
            what = ("did not start and answer within "
                    f"{server.connect_timeout_s:g} s (connect_timeout_s)"
                    if isinstance(error, asyncio.TimeoutError) else f"failed: {_short(error)}")
            raise McpSetupError(
                f"MCP server {describe_server(server)} could not start or list its tools: "
                f"{what}" + (f"\nits stderr ends with:\n{tail}" if tail else "")) from None
        if server.isolation == "episode":
            await session.close()
            session = None
        return session, tools

    def _tool_specs(self, server: McpServer, tools) -> list[_ToolSpec]:
        by_name = {tool.name: tool for tool in tools}
        if server.tools is not None:
            missing = [name for name in server.tools if name not in by_name]
            if missing:
                self.close()
                raise McpSetupError(
                    f"MCP server {describe_server(server)} has no tool(s) {missing} of its "
                    f"allow-list; it offers {sorted(by_name)}")
        chosen = server.tools if server.tools is not None else list(by_name)
        specs = []
        for name in chosen:
            tool = by_name[name]
            schema = dict(tool.input_schema or {"type": "object"})
            description = tool.description or getattr(tool, "title", None) or name
            specs.append(_ToolSpec(server, name, server.prefix + name, description, schema))
        return specs


def _close_connection(hub: _Hub, state: dict) -> None:
    """An episode connection's finalizer: its session (if it started one) is closed."""
    hub.close_later(state.get("session"))


def mcp_manager(servers: str, *, reserved: Sequence[str] = (),
                max_result_chars: int = DEFAULT_MAX_OBSERVATION_CHARS) -> McpManager | None:
    """The manager of an `env.mcp_servers` value, or None when it names no server: what
    a suite builds once and hands each env `manager.tools()` from (`reserved`: the
    env's own tool names)."""
    parsed = parse_mcp_servers(servers)
    if not parsed:
        return None
    return McpManager(parsed, reserved=reserved, max_result_chars=max_result_chars)
