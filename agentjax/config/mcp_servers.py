"""`env.mcp_servers`: the MCP servers whose tools an env takes, as a JSON list, checked
when the config is validated (before anything starts) with an error that says which
server and which field is wrong.

Each server is a JSON object:

    {"name": "time", "command": "mcp-server-time", "args": ["--local-timezone=UTC"]}
    {"name": "search", "url": "http://127.0.0.1:8000/mcp", "tools": ["web_search"]}

Fields: `name` (required; names the server in errors and logs), either `command` with
optional `args`, `env` and `cwd` (a stdio server started as a subprocess; it inherits only
HOME, PATH, SHELL, TERM, USER and LOGNAME besides `env`, whose values may name variables
of the run's environment as ${VAR}, so a secret stays out of the saved config) or `url`
(a streamable-HTTP server already running), and optionally `tools` (an allow-list: only
these of the server's tools are offered; each must exist), `prefix` (put before every
tool name, so two servers' tools cannot clash), `isolation` ("shared": one session for
the whole run; "episode": a fresh session, for a stdio server a fresh process, per
episode), `timeout_s` (per call), `connect_timeout_s` (start and tool listing) and
`max_restarts` (restarts in a row, without a successful call between them, before the
server is given up). envs/mcp.py runs them.
"""
from __future__ import annotations

import dataclasses
import json
import math
import re
from typing import Any, Mapping

ISOLATIONS = ("shared", "episode")
# What a function name may be in the OpenAI tool schema chat templates are given.
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_PREFIX = re.compile(r"[A-Za-z0-9_-]{0,32}")


@dataclasses.dataclass(frozen=True)
class McpServer:
    """One MCP server of `env.mcp_servers` (see the module docstring for each field)."""

    name: str
    command: str = ""
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    cwd: str = ""
    url: str = ""
    tools: tuple[str, ...] | None = None
    prefix: str = ""
    isolation: str = "shared"
    timeout_s: float = 30.0
    connect_timeout_s: float = 60.0
    max_restarts: int = 3

    @property
    def transport(self) -> str:
        return "stdio" if self.command else "http"


_FIELDS = tuple(f.name for f in dataclasses.fields(McpServer))


def parse_mcp_servers(text: str) -> tuple[McpServer, ...]:
    """The servers of an `env.mcp_servers` value ('' = none).

    Raises:
      ValueError: the text is not a JSON list of server objects, or a server has an
        unknown or missing field, a wrong type, or a name used twice; the message names
        the server (by index and name) and the field.
    """
    if text.strip() == "":
        return ()
    try:
        entries = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"not JSON: {error}") from None
    if not isinstance(entries, list):
        raise ValueError(f"a JSON list of server objects is needed, not a JSON "
                         f"{type(entries).__name__}")
    servers, seen = [], set()
    for index, entry in enumerate(entries):
        server = _server(index, entry)
        if server.name in seen:
            raise ValueError(f"server {index}: the name {server.name!r} is used twice")
        seen.add(server.name)
        servers.append(server)
    return tuple(servers)


def _server(index: int, entry: Any) -> McpServer:
    where = f"server {index}"
    if not isinstance(entry, dict):
        raise ValueError(f"{where}: a JSON object is needed, not {json.dumps(entry)[:80]}")
    name = entry.get("name")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(f"{where}: 'name' must be 1 to 64 letters, digits, '_' or '-', "
                         f"got {name!r}")
    where = f"server {index} ({name!r})"
    unknown = sorted(set(entry) - set(_FIELDS))
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {unknown}; known: {list(_FIELDS)}")
    command, url = entry.get("command", ""), entry.get("url", "")
    if bool(command) == bool(url):
        raise ValueError(f"{where}: give either 'command' (a stdio server) or 'url' (a "
                         "streamable-HTTP server), not both or neither")
    _check(where, "command", command, isinstance(command, str), "a string")
    _check(where, "url", url, isinstance(url, str) and (
        url == "" or re.fullmatch(r"https?://\S+", url) is not None), "an http(s):// URL")
    args = entry.get("args", [])
    _check(where, "args", args, _strings(args), "a list of strings")
    env = entry.get("env", {})
    _check(where, "env", env, isinstance(env, dict) and _strings(list(env.values())),
           "an object of string values")
    if url and ("args" in entry or "env" in entry or "cwd" in entry):
        raise ValueError(f"{where}: 'args', 'env' and 'cwd' are for stdio servers "
                         "('command'), not for a 'url'")
    cwd = entry.get("cwd", "")
    _check(where, "cwd", cwd, isinstance(cwd, str), "a string")
    tools = entry.get("tools")
    _check(where, "tools", tools, tools is None or (_strings(tools) and len(tools) > 0
                                                    and len(set(tools)) == len(tools)),
           "a non-empty list of distinct tool names")
    prefix = entry.get("prefix", "")
    _check(where, "prefix", prefix, isinstance(prefix, str) and _PREFIX.fullmatch(prefix),
           "up to 32 letters, digits, '_' or '-'")
    isolation = entry.get("isolation", "shared")
    _check(where, "isolation", isolation, isolation in ISOLATIONS,
           f"one of {list(ISOLATIONS)}")
    for key in ("timeout_s", "connect_timeout_s"):
        value = entry.get(key, 1.0)
        _check(where, key, value, _number(value) and value > 0, "a number of seconds > 0")
    restarts = entry.get("max_restarts", 0)
    _check(where, "max_restarts", restarts, isinstance(restarts, int) and not isinstance(
        restarts, bool) and restarts >= 0, "an integer >= 0")
    fields = {key: entry[key] for key in _FIELDS if key in entry}
    fields["args"] = tuple(args)
    fields["env"] = dict(env)
    fields["tools"] = None if tools is None else tuple(tools)
    return McpServer(**fields)


def _check(where: str, key: str, value, ok: bool, what: str) -> None:
    if not ok:
        raise ValueError(f"{where}: {key!r} must be {what}, got {json.dumps(value)[:80]}")


def _strings(values) -> bool:
    return isinstance(values, list) and all(isinstance(v, str) for v in values)


def _number(value) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))


@dataclasses.dataclass(frozen=True)
class McpServerList:
    """The config rule of `env.mcp_servers`; `why_not` says what is wrong with a value."""

    allowed = ("'' or a JSON list of MCP servers, each {\"name\", \"command\", \"args\", "
               "\"env\", \"cwd\"} (stdio) or {\"name\", \"url\"} (streamable HTTP), with "
               "optional \"tools\", \"prefix\", \"isolation\" ('shared' or 'episode'), "
               "\"timeout_s\", \"connect_timeout_s\", \"max_restarts\"")

    def allows(self, value) -> bool:
        return isinstance(value, str) and self.why_not(value) is None

    def why_not(self, value) -> str | None:
        try:
            parse_mcp_servers(value)
        except ValueError as error:
            return str(error)
        return None


MCP_SERVERS = McpServerList()
