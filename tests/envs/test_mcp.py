"""MCP servers as tools (agentjax/envs/mcp.py), against real servers: mcp-server-time from
the package registry over stdio, and tests/envs/mcp_server.py (built with the SDK's
MCPServer) over stdio and streamable HTTP, whose tools are slow, hang, crash, fail,
return 10 MB or non-text content. Every failure is an error observation or a clear
error; the run goes on; no server process outlives its manager."""
from __future__ import annotations

import concurrent.futures
import contextlib
import gc
import importlib.metadata
import importlib.util
import json
import os
import pathlib
import subprocess
import sys
import time

import httpx
import pytest

from agentjax.config import ConfigError, default_config, preflight, validate
from agentjax.config.mcp_servers import McpServer, parse_mcp_servers
from agentjax.core.task import Task
from agentjax.envs import mcp as mcp_lib
from agentjax.envs.mcp import McpManager, McpSetupError, McpTool
from agentjax.envs.python.env import PythonEnv
from agentjax.envs.tools import tool_schema
from tests.envs.retrieval_server import free_port

SERVER = str(pathlib.Path(__file__).with_name("mcp_server.py"))
TASK = Task("t", "What time is it?", ("now",))


def stdio(name: str, mode: str = "stdio", **fields) -> McpServer:
    """A server entry running tests/envs/mcp_server.py, parsed as the config would."""
    entry = {"name": name, "command": sys.executable, "args": [SERVER, mode], **fields}
    return parse_mcp_servers(json.dumps([entry]))[0]


def alive(pid: int) -> bool:
    """Whether process `pid` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def wait_gone(pids, timeout_s: float = 10.0) -> list[int]:
    """The pids still alive after waiting up to `timeout_s` for them to end."""
    deadline = time.monotonic() + timeout_s
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [p for p in pids if alive(p)]


def tools_of(manager: McpManager) -> dict[str, McpTool]:
    return {tool.name: tool for tool in manager.tools()}


def episode(tools, tool: str, **arguments):
    """One tool call through a PythonEnv episode: (observation, the turn's error)."""
    env = PythonEnv(tools=tools, max_turns=3)
    env.reset(TASK)
    call = json.dumps({"name": tool, "arguments": arguments})
    observation, done, _, _ = env.step(f"<tool_call>{call}</tool_call>")
    assert not done
    return observation, env.log.turns[-1].error


# -- config ---------------------------------------------------------------------------


@pytest.mark.parametrize("value, message", [
    ("{", "not JSON"),
    ('{"name": "a"}', "a JSON list of server objects is needed"),
    ('["x"]', "server 0: a JSON object is needed"),
    ('[{"command": "x"}]', "server 0: 'name' must be"),
    ('[{"name": "a b", "command": "x"}]', "server 0: 'name' must be"),
    ('[{"name": "a"}]', "server 0 ('a'): give either 'command'"),
    ('[{"name": "a", "command": "x", "url": "http://h/mcp"}]', "not both or neither"),
    ('[{"name": "a", "comand": "x"}]', "unknown field(s) ['comand']"),
    ('[{"name": "a", "command": "x", "args": "-v"}]', "'args' must be a list of strings"),
    ('[{"name": "a", "command": "x", "env": {"K": 1}}]', "'env' must be an object"),
    ('[{"name": "a", "url": "localhost:80"}]', "'url' must be an http(s):// URL"),
    ('[{"name": "a", "url": "http://h/mcp", "args": []}]', "are for stdio servers"),
    ('[{"name": "a", "command": "x", "tools": []}]', "'tools' must be a non-empty list"),
    ('[{"name": "a", "command": "x", "prefix": "a.b"}]', "'prefix' must be"),
    ('[{"name": "a", "command": "x", "isolation": "group"}]', "'isolation' must be one of"),
    ('[{"name": "a", "command": "x", "timeout_s": 0}]', "'timeout_s' must be a number"),
    ('[{"name": "a", "command": "x", "max_restarts": -1}]', "'max_restarts' must be"),
    ('[{"name": "a", "command": "x"}, {"name": "a", "url": "http://h"}]',
     "server 1: the name 'a' is used twice"),
])
def test_a_bad_server_list_is_a_config_error_naming_server_and_field(value, message):
    config = default_config()
    config.env.mcp_servers = value
    with pytest.raises(ConfigError) as error:
        validate(config)
    text = str(error.value)
    assert text.startswith("config key 'env.mcp_servers' is ") and message in text, text
    assert "\n" not in text


def test_a_server_list_parses_into_its_entries():
    config = default_config()
    config.env.mcp_servers = json.dumps([
        {"name": "time", "command": "mcp-server-time", "args": ["--local-timezone=UTC"],
         "env": {"TZ": "UTC"}, "isolation": "episode", "tools": ["get_current_time"]},
        {"name": "web", "url": "https://example.org/mcp", "prefix": "web_", "timeout_s": 5}])
    validate(config)
    time_server, web = parse_mcp_servers(config.env.mcp_servers)
    assert time_server == McpServer(
        "time", command="mcp-server-time", args=("--local-timezone=UTC",), env={"TZ": "UTC"},
        isolation="episode", tools=("get_current_time",))
    assert (web.transport, web.prefix, web.timeout_s, web.isolation, web.max_restarts) == (
        "http", "web_", 5, "shared", 3)
    assert parse_mcp_servers("") == ()


def test_preflight_names_the_install_when_the_sdk_is_missing(monkeypatch):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "mcp" else real_find_spec(name, *a))
    config = default_config()
    config.env.mcp_servers = '[{"name": "time", "command": "mcp-server-time"}]'
    with pytest.raises(preflight.MissingDependency) as error:
        preflight.check_runtime(config)
    assert str(error.value).endswith("Install with: pip install 'mcp>=2.3,<3'")
    assert "module 'mcp', needed by env.mcp_servers" in str(error.value)
    preflight.check_runtime(default_config())  # no servers: not needed


def test_an_sdk_outside_the_supported_range_is_refused_naming_the_install(monkeypatch):
    real_version = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version",
                        lambda name: "1.30.0" if name == "mcp" else real_version(name))
    with pytest.raises(McpSetupError, match=r"supports mcp >=2.3,<3, found mcp 1.30.0; "
                                            r"install with: pip install 'mcp>=2.3,<3'"):
        McpManager([stdio("never-started")])


# -- results --------------------------------------------------------------------------


def test_non_text_content_is_described_never_dumped():
    from mcp_types import (AudioContent, BlobResourceContents, CallToolResult,
                           EmbeddedResource, ImageContent, ResourceLink, TextContent,
                           TextResourceContents)

    blob = "QUJD" * 2500  # 7,500 bytes in base64
    result = CallToolResult(content=[
        TextContent(text="see:"), ImageContent(data=blob, mime_type="image/png"),
        AudioContent(data="AAA=", mime_type="audio/wav"),
        ResourceLink(uri="file:///r.csv", name="r", mime_type="text/csv", size=12),
        EmbeddedResource(resource=TextResourceContents(uri="mem://a", text="x" * 50)),
        EmbeddedResource(resource=BlobResourceContents(uri="mem://b", blob=blob))])
    assert mcp_lib.render_result(result, 1000).splitlines() == [
        "see:", "[image: image/png, 7500 bytes]", "[audio: audio/wav, 2 bytes]",
        "[resource link: file:///r.csv (r, text/csv, 12 bytes)]",
        "[embedded resource: mem://a (unknown type, 50 characters)]",
        "[embedded resource: mem://b (unknown type, 7500 bytes)]"]
    structured = CallToolResult(content=[], structured_content={"rows": [1] * 100, "n": 100})
    assert mcp_lib.render_result(structured, 1000) == (
        "[structured content: JSON object with keys rows, n, 320 characters]")
    assert mcp_lib.render_result(CallToolResult(content=[]), 1000) == "(no output)"
    cut = mcp_lib.render_result(CallToolResult(content=[TextContent(text="a" * 10**6)]), 100)
    assert len(cut) <= 100 and "characters omitted" in cut


# -- a real server from the package registry -------------------------------------------


def test_mcp_server_time_tools_reach_the_template_and_answer_in_an_episode():
    """mcp-server-time (PyPI), its tools through PythonEnv: schemas as the server lists
    them, a call's text as the observation, the server's own error as an error
    observation, arguments the schema refuses never sent."""
    server = parse_mcp_servers(json.dumps([{
        "name": "time", "command": sys.executable, "args": ["-m", "mcp_server_time"],
        "prefix": "clock_", "timeout_s": 20}]))[0]
    manager = McpManager([server])
    try:
        assert manager.tool_names == ["clock_get_current_time", "clock_convert_time"]
        tools = manager.tools()
        env = PythonEnv(tools=tools, max_turns=4)
        schema = next(s for s in env.tool_schemas
                      if s["function"]["name"] == "clock_get_current_time")["function"]
        assert schema["parameters"]["required"] == ["timezone"]
        assert "timezone" in schema["description"].lower()
        assert "clock_convert_time" in env.initial_messages(TASK)[0]["content"]

        observation, error = episode(tools, "clock_get_current_time", timezone="Etc/UTC")
        answer = json.loads(observation)
        assert answer["timezone"] == "Etc/UTC" and error is None
        assert abs(time.time() - _epoch(answer["datetime"])) < 120

        observation, error = episode(tools, "clock_convert_time", source_timezone="Etc/UTC",
                                     time="12:00", target_timezone="Asia/Tokyo")
        assert json.loads(observation)["target"]["datetime"].endswith("T21:00:00+09:00")

        observation, error = episode(tools, "clock_get_current_time", timezone="Mars/Olympus")
        assert "Mars/Olympus" in observation and error.startswith("clock_get_current_time:")

        observation, error = episode(tools, "clock_get_current_time", zone="UTC")
        assert "missing required argument(s): timezone" in observation
    finally:
        manager.close()


def _epoch(iso: str) -> float:
    import datetime
    return datetime.datetime.fromisoformat(iso).timestamp()


def test_the_python_suite_offers_the_configured_servers_tools(tmp_path, monkeypatch):
    from agentjax.config import presets
    from agentjax.envs import registry as suites

    config = presets.python_config("grpo", "test")
    config.sft.steps = 0
    config.env.mcp_servers = json.dumps([{
        "name": "tools", "command": sys.executable, "args": [SERVER, "stdio"],
        "env": {"TOKEN": "${MCP_TEST_TOKEN}"}, "tools": ["echo", "getenv", "pid"]}])
    monkeypatch.setenv("MCP_TEST_TOKEN", "s3cret")  # read when the server starts
    validate(config)
    suite = suites.build_suite(config, str(tmp_path / "data"))
    env = suite.make_env()
    names = ["python", "echo", "getenv", "pid"]
    assert list(env.tools) == names
    assert [s["function"]["name"] for s in env.tool_schemas] == names
    mcp_tools = list(env.tools.values())[1:]
    assert episode(mcp_tools, "echo", text="hi") == ("hi", None)
    assert episode(mcp_tools, "getenv", name="TOKEN") == ("s3cret", None)
    pid = int(episode(mcp_tools, "pid")[0])
    del suite, env
    gc.collect()  # the suite's manager is released: its servers stop
    assert wait_gone([pid]) == []


# -- a misbehaving server over stdio ---------------------------------------------------


@pytest.fixture(scope="module")
def misbehaving():
    """One shared stdio server with short timeouts, a second for the 10 MB result."""
    manager = McpManager([stdio("tools", timeout_s=1.5),
                          stdio("big", prefix="big_", timeout_s=30, tools=["huge"])],
                         max_result_chars=1000)
    yield manager
    manager.close()


def test_text_errors_and_other_content_become_observations(misbehaving):
    tools = misbehaving.tools()
    assert episode(tools, "echo", text="hello") == ("hello", None)
    observation, error = episode(tools, "fail", reason="no disk")
    assert observation == "Error executing tool fail: cannot do it: no disk"
    assert error == "fail: isError: Error executing tool fail: cannot do it: no disk"
    observation, error = episode(tools, "image")
    assert observation.splitlines() == [
        "a picture:", "[image: image/png, 100 bytes]", "[audio: audio/wav, 300 bytes]",
        "[resource link: file:///data/report.csv (report, text/csv)]",
        "[embedded resource: file:///data/blob.bin (application/octet-stream, 1000 bytes)]"]
    assert episode(tools, "structured", x=21) == ('{\n  "double": 42\n}', None)
    observation, error = episode(tools, "nope")
    assert "unknown tool" in observation.lower()  # refused by the env, never sent


def test_slow_and_hanging_calls_time_out_and_the_server_goes_on(misbehaving):
    tools = misbehaving.tools()
    pid = episode(tools, "pid")[0]
    assert episode(tools, "slow", seconds=0.2) == ("slept 0.2", None)
    start = time.monotonic()
    observation, error = episode(tools, "hang")
    assert time.monotonic() - start < 1.5 + 5 + 1
    assert observation == "MCP server 'tools': 'hang' did not answer within 1.5 s"
    assert error == "hang: timeout"
    observation, _ = episode(tools, "slow", seconds=3)
    assert "did not answer within 1.5 s" in observation
    assert episode(tools, "pid") == (pid, None)  # the same process answers


def test_a_10_mb_result_is_cut_to_the_observation_cap(misbehaving):
    tools = misbehaving.tools()
    observation, error = episode(tools, "big_huge", chars=10_000_000)
    assert error is None and len(observation) <= 1000
    assert observation.startswith("HEADxxx") and observation.endswith("xxxTAIL")
    assert "characters omitted" in observation


def test_concurrent_calls_from_worker_threads_share_one_session(misbehaving):
    tool = tools_of(misbehaving)["slow"]
    start = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda _: tool({"seconds": 0.5}), range(8)))
    assert results == ["slept 0.5"] * 8
    assert time.monotonic() - start < 8 * 0.5 / 2  # overlapped, not one after another


def test_a_malformed_result_is_an_error_observation():
    manager = McpManager([stdio("raw", mode="malformed")])
    try:
        observation, error = episode(manager.tools(), "broken")
        assert observation.startswith("MCP server 'raw': 'broken' returned a malformed "
                                      "result: ValidationError")
        assert error == "broken: malformed result"
        observation, error = episode(manager.tools(), "unstructured")
        assert observation.startswith("MCP server 'raw': 'unstructured' returned a malformed "
                                      "result: RuntimeError: Tool unstructured has an output "
                                      "schema but did not return structured content")
        assert error == "unstructured: malformed result"
        assert episode(manager.tools(), "broken")[1] == "broken: malformed result"
    finally:
        manager.close()


@pytest.mark.slow  # ~15 s: four server starts
def test_a_crashing_server_is_restarted_then_given_up():
    manager = McpManager([stdio("tools", max_restarts=1, timeout_s=10)])
    tools = manager.tools()
    first = episode(tools, "pid")[0]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:  # calls in flight see the crash
        slow = [pool.submit(episode, tools, "slow", seconds=5) for _ in range(3)]
        time.sleep(0.5)
        observation, error = episode(tools, "crash")
        assert observation == ("MCP server 'tools' stopped during the call to 'crash' "
                               "(connection closed); it is restarted for the next call")
        assert error == "crash: server crashed"
        for future in slow:
            assert future.result()[1] == "slow: server crashed"
    # One crash however many calls saw it: max_restarts=1 allows this restart, and a
    # success resets the count.
    second = episode(tools, "pid")[0]
    assert second != first and not alive(int(first))
    episode(tools, "crash")
    observation, _ = episode(tools, "crash")  # restarted once more, crashed again: gone
    gone = ("MCP server 'tools' is gone: it failed 2 times in a row (max_restarts=1); "
            "its tools cannot be called for the rest of the run.")
    assert observation.endswith(gone)
    assert episode(tools, "echo", text="x") == (gone, "echo: server gone")
    manager.close()
    assert wait_gone([int(first), int(second)]) == []


@pytest.mark.slow  # ~12 s: a wedged server, its probe, a restart
def test_a_server_that_stops_answering_is_restarted():
    manager = McpManager([stdio("tools", timeout_s=1.5)])
    tools = manager.tools()
    first = int(episode(tools, "pid")[0])
    observation, error = episode(tools, "wedge")
    assert observation == ("MCP server 'tools': 'wedge' did not answer within 1.5 s; the "
                           "server stopped answering and is restarted for the next call")
    assert episode(tools, "echo", text="back") == ("back", None)
    second = int(episode(tools, "pid")[0])
    assert second != first and wait_gone([first]) == []
    manager.close()
    assert wait_gone([second]) == []


@pytest.mark.slow  # ~15 s: a fresh interpreter imports agentjax and starts two servers
def test_no_server_outlives_a_run_that_exits_without_closing(tmp_path):
    """The manager's finalizer runs at interpreter exit: a shared server with a call
    still hanging and an episode's own server both stop."""
    servers = json.dumps([{"name": "tools", "command": sys.executable,
                           "args": [SERVER, "stdio"], "timeout_s": 60},
                          {"name": "own", "command": sys.executable, "prefix": "own_",
                           "args": [SERVER, "stdio"], "isolation": "episode"}])
    script = tmp_path / "run.py"
    script.write_text(f"""
import threading
from agentjax.config.mcp_servers import parse_mcp_servers
from agentjax.envs.mcp import McpManager
manager = McpManager(parse_mcp_servers({servers!r}))
tools = {{tool.name: tool for tool in manager.tools()}}
print(tools["pid"]({{}}), tools["own_pid"]({{}}), flush=True)
threading.Thread(target=tools["hang"], args=({{}},), daemon=True).start()
""")
    root = pathlib.Path(__file__).parents[2]
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=120, cwd=root, env={**os.environ, "PYTHONPATH": str(root)})
    assert run.returncode == 0, run.stderr
    pids = [int(p) for p in run.stdout.split()]
    assert len(pids) == 2 and wait_gone(pids) == []


# -- isolation -------------------------------------------------------------------------


@pytest.mark.slow  # ~10 s (19 s on a loaded machine): three server processes
def test_shared_servers_keep_state_across_episodes_episode_servers_do_not():
    manager = McpManager([stdio("shared"), stdio("own", prefix="own_", isolation="episode")])
    try:
        first, second = manager.tools(), manager.tools()  # two episodes' envs
        assert [episode(first, "count")[0], episode(second, "count")[0],
                tools_of(manager)["count"]({})] == ["1", "2", "3"]
        assert [episode(first, "own_count")[0], episode(first, "own_count")[0],
                episode(second, "own_count")[0]] == ["1", "2", "1"]
        pids = [int(episode(tools, "own_pid")[0]) for tools in (first, second)]
        shared = int(episode(first, "pid")[0])
        assert len({*pids, shared}) == 3
        del first  # the first episode is over: its own server stops, the rest run on
        gc.collect()
        assert wait_gone([pids[0]]) == [] and alive(pids[1]) and alive(shared)
        assert episode(second, "own_count")[0] == "2"
    finally:
        manager.close()
    assert wait_gone([pids[1], shared]) == []


# -- streamable HTTP -------------------------------------------------------------------


@pytest.fixture(scope="module")
def http_url():
    port = free_port()
    process = subprocess.Popen([sys.executable, SERVER, "http", str(port)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/mcp"
    deadline = time.monotonic() + 60
    try:
        while True:
            with contextlib.suppress(httpx.HTTPError):
                httpx.get(url, timeout=1)
                break
            assert process.poll() is None and time.monotonic() < deadline, "no server"
            time.sleep(0.1)
        yield url
    finally:
        process.kill()  # its hung tool thread would hold a graceful shutdown
        process.wait(10)


def test_a_streamable_http_server_answers_fails_and_is_cut(http_url):
    manager = McpManager(parse_mcp_servers(json.dumps([{
        "name": "web", "url": http_url, "prefix": "web_", "timeout_s": 1.5,
        "tools": ["echo", "fail", "hang", "huge", "image"]}])), max_result_chars=500)
    try:
        tools = manager.tools()
        assert manager.tool_names == ["web_echo", "web_fail", "web_hang", "web_huge",
                                      "web_image"]
        assert tool_schema(tools[0])["function"]["parameters"]["required"] == ["text"]
        assert episode(tools, "web_echo", text="over http") == ("over http", None)
        observation, error = episode(tools, "web_fail", reason="x")
        assert "cannot do it: x" in observation and error.startswith("web_fail: isError")
        observation, _ = episode(tools, "web_huge", chars=10_000_000)
        assert len(observation) <= 500 and observation.endswith("TAIL")
        assert "[image: image/png, 100 bytes]" in episode(tools, "web_image")[0]
        observation, error = episode(tools, "web_hang")
        assert observation == "MCP server 'web': 'hang' did not answer within 1.5 s"
        assert episode(tools, "web_echo", text="still here") == ("still here", None)
    finally:
        manager.close()


# -- setup errors ----------------------------------------------------------------------


def test_a_server_that_cannot_start_is_a_setup_error_naming_it():
    with pytest.raises(McpSetupError, match=r"MCP server 'ghost' \(stdio: /nonexistent/mcp"
                                            r"\) could not start or list its tools: failed"):
        McpManager(parse_mcp_servers('[{"name": "ghost", "command": "/nonexistent/mcp"}]'))
    dies = parse_mcp_servers(json.dumps([{
        "name": "dies", "command": sys.executable,
        "args": ["-c", "import sys; sys.exit('no API key given')"]}]))
    with pytest.raises(McpSetupError, match=r"(?s)'dies'.*failed: MCPError: Connection "
                                            r"closed\nits stderr ends with:\nno API key"):
        McpManager(dies)
    silent = parse_mcp_servers(json.dumps([{
        "name": "silent", "command": sys.executable, "connect_timeout_s": 1,
        "args": ["-c", "import time; print('started', flush=True); time.sleep(60)"]}]))
    with pytest.raises(McpSetupError, match="'silent'.*did not start and answer within 1 s"):
        McpManager(silent)
    with pytest.raises(McpSetupError, match=r"MCP server 'away' \(http: http://127.0.0.1:"
                                            r".*failed: ConnectError"):
        McpManager(parse_mcp_servers(json.dumps([{
            "name": "away", "url": f"http://127.0.0.1:{free_port()}/mcp",
            "connect_timeout_s": 5}])))


def test_missing_allowed_tools_and_clashing_names_are_setup_errors():
    with pytest.raises(McpSetupError, match=r"'raw' .* has no tool\(s\) \['fix'\] of its "
                                            r"allow-list; it offers \['broken', "
                                            r"'unstructured'\]"):
        McpManager([stdio("raw", mode="malformed", tools=["fix"])])
    with pytest.raises(McpSetupError, match="offers tool 'broken', which MCP server 'one' "
                                            "already has: give the server a 'prefix'"):
        McpManager([stdio("one", mode="malformed"), stdio("two", mode="malformed")])
    with pytest.raises(McpSetupError, match="offers tool 'broken', which the env already"):
        McpManager([stdio("one", mode="malformed")], reserved=("broken",))
    manager = McpManager([stdio("one", mode="malformed"),
                          stdio("two", mode="malformed", prefix="two_")])
    assert manager.tool_names == ["broken", "unstructured", "two_broken", "two_unstructured"]
    manager.close()


# -- the run goes on -------------------------------------------------------------------


def test_episodes_in_a_rollout_pool_survive_every_failure(misbehaving, tokenizer):
    """Eight episodes at once through RolloutPool (env.step in worker threads): each
    calls a tool that answers, fails, hangs or returns 10 MB, then answers. Every
    trajectory is complete and unflagged; the failures are in its env log."""
    from agentjax.agents.loop import EpisodeLimits
    from agentjax.agents.pool import RolloutPool
    from agentjax.engine.protocol import SamplingParams
    from tests.agents.fakes import ScriptedEngine

    calls = {"echo": {"text": "ok"}, "fail": {"reason": "r"}, "hang": {},
             "big_huge": {"chars": 10_000_000}}
    tasks = [Task(name, name) for name in calls]

    in_prompt = PythonEnv(tools=misbehaving.tools()).initial_messages(tasks[0])[0][
        "content"].count("</tool_call>")  # the system message shows the format

    def script(context, index):
        text = tokenizer.decode(context)
        if text.count("</tool_call>") > in_prompt:  # called already: answer
            return "<answer>done</answer>"
        name = next(n for n in calls if f"Problem: {n}\n" in text)
        return ("<tool_call>" + json.dumps({"name": name, "arguments": calls[name]})
                + "</tool_call>")

    with RolloutPool(ScriptedEngine(tokenizer, script),
                     lambda: PythonEnv(tools=misbehaving.tools(), max_turns=3), tokenizer,
                     limits=EpisodeLimits(max_turns=3, max_context_tokens=100_000),
                     concurrency=8) as pool:
        groups = pool.collect_sync(tasks, group_size=2,
                                   sampling=SamplingParams(max_new_tokens=64))
    for task, group in zip(tasks, groups):
        for trajectory in group:
            log = trajectory.metadata["env_log"]
            assert not trajectory.metadata["failed"], trajectory.metadata
            assert log.final_answer == "done" and len(log.turns) == 2
            assert (log.turns[0].error is None) == (task.task_id in ("echo", "big_huge"))
            assert len(log.turns[0].observation) <= 1000
