"""agentjax.envs: environments the agent loop drives, their tools and parsers.

Importing the package registers the built-in tool ("python") so that
`make_tool(name, **kwargs)` finds it (`agentjax.envs.tools.TOOLS`). Runs choose their env
by `config.env.name`: `agentjax.envs.registry.build_suite` builds the suite an env's
folder registers (`envs/<name>/suite.py`, `@register_env("<name>")`; not imported here:
the data loaders the suites use import this package).
"""
from agentjax.core.task import EpisodeLog, Task, TurnLog
from agentjax.envs.base import Env, StepResult
from agentjax.envs.parsers import Action, parse_search_r1, parse_tool_call
from agentjax.envs.python.env import PythonEnv, PythonTool
from agentjax.envs.retrieval import (BM25Retriever, Document, HttpRetriever, RetrievalError,
                                     Retriever, format_docs, read_corpus)
from agentjax.envs.sandbox import Sandbox, SandboxResult, SandboxUnavailableError
from agentjax.envs.search.env import SearchEnv
from agentjax.envs.tools import Tool, ToolError, make_tool, register_tool

__all__ = [
    "Action", "BM25Retriever", "Document", "Env", "EpisodeLog", "HttpRetriever",
    "PythonEnv", "PythonTool", "RetrievalError", "Retriever", "Sandbox", "SandboxResult",
    "SandboxUnavailableError", "SearchEnv", "StepResult", "Task", "Tool", "ToolError",
    "TurnLog", "format_docs", "make_tool", "parse_search_r1", "parse_tool_call",
    "read_corpus", "register_tool",
]
