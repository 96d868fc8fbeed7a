"""A user's agent as the rollout pool's episode runner: `async def agent(client, task)`.

    async def agent(client: openai.AsyncOpenAI, task: Task) -> float | dict: ...

Each episode opens a session on the OpenAI-compatible endpoint (agentjax/endpoint)
served on the run's engine, hands the agent an `openai.AsyncOpenAI` bound to it
(base URL `http://agentjax/sessions/<id>/v1`, in process through
`httpx.ASGITransport`: every agent of the pool is a coroutine on the pool's event loop,
and the engine batches their calls), awaits the agent, closes the session and merges
its calls into the rollout's trajectory (calls.py). The session's sampling is the run's
(`session_sampling`: the rollout temperature, top-p, the episode's own seed and
max_new_tokens per call), whatever the agent asks.

The agent returns its reward (a float: the task counts as solved when it is >= 1), or
a dict with "answer" (a string, scored by the task env's reward function as that env
would score its final answer) or "messages" (the conversation; the last assistant
message's content is the answer). An agent that also takes `env`
(`async def agent(client, task, env)`) is handed a fresh env of the task env
(`TaskSuite.make_env`), for the env's own prompt, tool schemas and tools
(`env.initial_messages(task)`, `env.template_tools`, `env.run_tool(name, arguments)`):
examples/tool_agent.py. One that plays its episode through that env
(`env.reset(task)`, then `env.step(text)` per reply) is scored on the env's own episode
log, every reward term of the built-in env included (format, tool shaping, process),
whatever it returns, also when it stopped before the env was done (its context full):
examples/search_r1_agent.py. An agent that raises, returns something else, makes
no model call or runs past the episode timeout (its task is cancelled, its session
closed) is a failed episode: flagged with the reason and, for a raise, its traceback
(errors.jsonl), its calls so far kept.

An agent that must run as a subprocess or CLI needs a real URL: with
`transport="http"` (env.agent_transport) the same app is served by uvicorn on a free
local port in a thread of its own, and `str(client.base_url)`
(`http://127.0.0.1:<port>/sessions/<id>/v1`) is what the program is given. The engine is
called from that server's event loop then (engines serve any loop: a synchronous run
rolls out each step on a new one); the sessions are the same.
"""
from __future__ import annotations

import asyncio
import dataclasses
import importlib
import importlib.util
import inspect
import os
import threading
import time
import traceback
import uuid
from concurrent.futures import Executor
from typing import Any, Callable, Mapping

import httpx

from agentjax.config.choices import AGENT_TRANSPORTS
from agentjax.core.task import EpisodeLog, Task, TurnLog
from agentjax.core.trajectory import Trajectory
from agentjax.endpoint.sessions import Sessions
from agentjax.engine.protocol import EnginesUnavailable, SamplingParams
from agentjax.envs.openai_agent.calls import merge_calls

AGENT_HOST = "http://agentjax"
# The model name the endpoint answers to (any name the agent sends is served).
MODEL_NAME = "agentjax-policy"


def load_agent(spec: str) -> Callable:
    """The function `spec` names (env.agent): 'package.module:function', or
    'path/to/file.py:function' for a file that is not on the import path."""
    module, _, name = spec.rpartition(":")
    if not (module and name):
        raise ValueError(f"an agent is named 'package.module:function', got {spec!r}")
    try:
        if module.endswith(".py"):
            loaded = importlib.util.spec_from_file_location(
                os.path.splitext(os.path.basename(module))[0], module)
            if loaded is None or not os.path.isfile(module):
                raise ImportError(f"no file {module!r}")
            imported = importlib.util.module_from_spec(loaded)
            loaded.loader.exec_module(imported)
        else:
            imported = importlib.import_module(module)
        agent = getattr(imported, name)
    except (ImportError, AttributeError) as error:
        raise ValueError(f"env.agent={spec!r}: {type(error).__name__}: {error}") from None
    if not asyncio.iscoroutinefunction(agent):
        raise ValueError(f"env.agent={spec!r} must be an `async def agent(client, task)`")
    return agent


def default_app(engine, tokenizer, *, sessions, sampling_defaults, max_context, model_name,
                session_sampling):
    """The endpoint's app (agentjax/endpoint) on `engine`."""
    from agentjax.endpoint.app import build_app
    return build_app(engine, tokenizer, sessions=sessions, sampling_defaults=sampling_defaults,
                     max_context=max_context, model_name=model_name,
                     session_sampling=session_sampling)


class LocalServer:
    """`app` served by uvicorn on 127.0.0.1 at a free port, in a daemon thread with its
    own event loop, until `close`."""

    def __init__(self, app, *, start_timeout_s: float = 30.0):
        import uvicorn

        self._server = uvicorn.Server(uvicorn.Config(
            app, host="127.0.0.1", port=0, log_level="warning", lifespan="off",
            timeout_keep_alive=30))
        self._thread = threading.Thread(target=self._server.run, daemon=True,
                                        name="agent-endpoint")
        self._thread.start()
        deadline = time.monotonic() + start_timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the agents' local endpoint did not start (uvicorn "
                                   f"on 127.0.0.1 within {start_timeout_s} s)")
            time.sleep(0.01)
        [listener] = self._server.servers
        host, port = listener.sockets[0].getsockname()[:2]
        self.url = f"http://{host}:{port}"

    def close(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)


class AgentFailure(Exception):
    """Ends an agent's episode as failed with a stop reason."""

    def __init__(self, stop_reason: str, message: str):
        super().__init__(message)
        self.stop_reason = stop_reason


@dataclasses.dataclass
class AgentRunner:
    """The `agents.pool.EpisodeRunner` of a user's agent (module docstring).

    Attributes:
      agent: `async def agent(client, task) -> float | dict`.
      reward_fn: the task env's `reward_fn(task, log) -> (total, components)`, scoring a
        returned answer.
      success_key: the reward component that says a task was solved.
      app_factory: builds the endpoint's app on an engine (`default_app`'s arguments;
        None: `default_app`).
      request_timeout_s: the client's timeout per model call.
      transport: "in_process" (httpx's ASGI transport on the pool's event loop) or
        "http" (a `LocalServer`: a real URL; module docstring).
      make_env: builds a fresh env of the task env, for an agent that takes `env`.
    """

    agent: Callable
    reward_fn: Callable[[Task, EpisodeLog], tuple[float, Mapping[str, float]]]
    success_key: str
    app_factory: Callable | None = None
    request_timeout_s: float = 600.0
    transport: str = "in_process"
    make_env: Callable[[], Any] | None = None

    def __post_init__(self):
        if self.transport not in AGENT_TRANSPORTS:
            raise ValueError(f"transport must be one of {AGENT_TRANSPORTS}, got "
                             f"{self.transport!r}")
        self._takes_env = "env" in inspect.signature(self.agent).parameters
        if self._takes_env and self.make_env is None:
            raise ValueError(f"the agent {self.agent.__name__!r} takes `env` and this "
                             "runner has no make_env to build one")
        self.sessions = Sessions()
        self._sampling: dict[str, SamplingParams] = {}
        self._apps: dict[int, tuple[Any, Any]] = {}
        self._servers: dict[int, LocalServer] = {}
        self._lock = threading.Lock()  # an async run's producer thread builds them too

    def close(self) -> None:
        """Stops the local servers (transport "http")."""
        with self._lock:
            servers, self._servers = list(self._servers.values()), {}
        for server in servers:
            server.close()

    def app(self, engine, tokenizer, max_context: int):
        """The endpoint's app on `engine` (one per engine, built at its first episode)."""
        key = id(engine)
        with self._lock:
            if key not in self._apps:
                build = self.app_factory or default_app
                app = build(engine, tokenizer, sessions=self.sessions,
                            sampling_defaults=SamplingParams(), max_context=max_context,
                            model_name=MODEL_NAME, session_sampling=self._sampling.get)
                self._apps[key] = (engine, app)  # the engine kept: its id stays its own
            return self._apps[key][1]

    def _base_url(self, engine, app) -> str:
        """Where the agent's client sends its calls (before `/sessions/<id>/v1`)."""
        if self.transport == "in_process":
            return AGENT_HOST
        with self._lock:
            if id(engine) not in self._servers:
                self._servers[id(engine)] = LocalServer(app)
            return self._servers[id(engine)].url

    async def __call__(self, engine, tokenizer, task: Task, sampling: SamplingParams, limits,
                       *, group_id: int, executor: Executor) -> Trajectory:
        import openai  # the agent's client: imported by agent runs only (a run loads every suite)

        app = self.app(engine, tokenizer, limits.max_context_tokens)
        session = f"rollout-{uuid.uuid4().hex}"
        self.sessions.open(session)
        self._sampling[session] = dataclasses.replace(sampling, n=1)
        timer = asyncio.timeout(limits.timeout_s)
        outcome: Any = None
        env = None
        failure: tuple[str, str] | None = None
        try:
            host = self._base_url(engine, app)
            transport = (httpx.ASGITransport(app=app) if self.transport == "in_process"
                         else None)
            async with httpx.AsyncClient(transport=transport, base_url=host) as http:
                client = openai.AsyncOpenAI(
                    base_url=f"{host}/sessions/{session}/v1", api_key="agentjax",
                    http_client=http, max_retries=0, timeout=self.request_timeout_s)
                if self._takes_env:  # as the pool builds a built-in env: off the loop
                    env = await asyncio.get_running_loop().run_in_executor(
                        executor, self.make_env)
                async with timer:
                    outcome = await self.agent(client, task,
                                               **({"env": env} if self._takes_env else {}))
        except TimeoutError as error:
            failure = (("timeout", f"agent exceeded the episode timeout_s={limits.timeout_s}")
                       if timer.expired() else ("agent_error", _traceback(error)))
        except Exception as error:  # noqa: BLE001 - the agent's failure is its episode's
            unavailable = _engines_unavailable(error)
            if unavailable is not None:  # no engine left: the run's failure, not the agent's
                raise unavailable from error
            failure = ("agent_error", _traceback(error))
        finally:
            self._sampling.pop(session, None)
            calls = self.sessions.close(session)
        traj = merge_calls(calls, task=task, group_id=group_id)
        traj.metadata.update(stop_reason="done", failed=False, error=None,
                             num_turns=sum(len(part.turns) for part in [*traj.segments, traj]),
                             env_log=None)
        try:
            if failure is not None:
                raise AgentFailure(*failure)
            if not traj.turns:
                raise AgentFailure("agent_error", "the agent made no model call through "
                                   "its client that the engine answered: there is nothing "
                                   f"to train on ({len(calls)} calls, all aborted)"
                                   if calls else "the agent made no model call through "
                                   "its client: there is nothing to train on")
            played = getattr(env, "log", None)  # the env the agent stepped, if it did
            total, components = await self._score(task, outcome, executor, played)
        except AgentFailure as error:
            traj.metadata.update(stop_reason=error.stop_reason, failed=True, error=str(error))
            return traj
        if played is not None:  # its stop reason and tool metrics as the built-in env's
            traj.metadata.update(stop_reason=played.stop_reason or "agent_returned",
                                 env_log=played)
        traj.final_reward = float(total)
        traj.metadata["reward_components"] = dict(components)
        return traj

    async def _score(self, task: Task, outcome, executor,
                     played: EpisodeLog | None = None) -> tuple[float, Mapping]:
        """(total, components) of what the agent returned, or of the episode `played`
        through the env it was handed (module docstring)."""
        if played is not None:
            return await self._reward(task, played, executor)
        if isinstance(outcome, (int, float)) and not isinstance(outcome, bool):
            reward = float(outcome)
            return reward, {"agent": reward, self.success_key: float(reward >= 1.0)}
        if not isinstance(outcome, Mapping) or not ({"answer", "messages"} & set(outcome)):
            raise AgentFailure("agent_error", "the agent must return its reward (a float) or "
                               "a dict with 'answer' or 'messages', got "
                               f"{type(outcome).__name__}: {str(outcome)[:200]}")
        answer = outcome.get("answer")
        if answer is None:
            replies = [m for m in outcome["messages"] if m.get("role") == "assistant"]
            answer = (replies[-1].get("content") or "") if replies else ""
        # The answering turn as an env logs it: rewards read its `<answer>` tag or, without
        # one, the final answer (rewards/outcome.py: episode_answer).
        log = EpisodeLog(task=task, turns=[TurnLog(str(answer), "answer")],
                         final_answer=str(answer), done=True, stop_reason="answer")
        return await self._reward(task, log, executor)

    async def _reward(self, task: Task, log: EpisodeLog, executor) -> tuple[float, Mapping]:
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(executor, self.reward_fn, task, log)
        except Exception as error:  # noqa: BLE001
            raise AgentFailure("reward_error", f"reward_fn failed: {_traceback(error)}") from None


def _engines_unavailable(error: BaseException) -> EnginesUnavailable | None:
    """The `EnginesUnavailable` behind an agent's error (the client wraps what the app
    raised), if any."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, EnginesUnavailable):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


def _traceback(error: BaseException) -> str:
    """`Type: message` (the first line, what errors.jsonl groups by), then the
    traceback."""
    first = "".join(traceback.format_exception_only(type(error), error)).strip()
    return f"agent raised {first}\n" + "".join(traceback.format_exception(error)).rstrip()
