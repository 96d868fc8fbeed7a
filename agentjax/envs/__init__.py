"""agentjax.envs: environments the agent loop drives, their tools, and each env's world.

Importing the package registers the built-in tool ("python") so that
`make_tool(name, **kwargs)` finds it (`agentjax.envs.tools.TOOLS`). Runs choose their env
by `config.env.name`: `agentjax.envs.registry.build_suite` builds the suite an env's
folder registers (`envs/<name>/suite.py`, `@register_env("<name>")`). Each env folder owns
its world: its env, task generator or task-file loaders, scripted demonstrators and
suite (`envs/search/`: the multi-hop world, Search-R1 files, `ScriptedSearcher`). The
suites are not imported here: one builds its world and reads its files, which a user
of one env class does not need.
"""
from agentjax.core.task import EpisodeLog, Task, TurnLog
from agentjax.envs.base import Env, StepResult
from agentjax.envs.python.env import PythonEnv, PythonTool
from agentjax.envs.retrieval import (BM25Retriever, Document, HttpRetriever, RetrievalError,
                                     Retriever, format_docs, read_corpus)
from agentjax.envs.sandbox import Sandbox, SandboxResult, SandboxUnavailableError
from agentjax.envs.search.env import SearchEnv
from agentjax.envs.tools import Tool, ToolError, make_tool, register_tool

__all__ = [
    "BM25Retriever", "Document", "Env", "EpisodeLog", "HttpRetriever",
    "PythonEnv", "PythonTool", "RetrievalError", "Retriever", "Sandbox", "SandboxResult",
    "SandboxUnavailableError", "SearchEnv", "StepResult", "Task", "Tool", "ToolError",
    "TurnLog", "format_docs", "make_tool", "read_corpus", "register_tool",
]
