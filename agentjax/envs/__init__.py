"""agentjax.envs: environments the agent loop drives, their tools and parsers.

Importing the package registers the built-in envs ("search", "python") and tools
("python") so that `make_env(name, **kwargs)` / `make_tool(name, **kwargs)` find them.
"""
from agentjax.envs.base import (Env, EpisodeLog, StepResult, Task, TurnLog, make_env,
                                register_env)
from agentjax.envs.parsers import Action, parse_search_r1, parse_tool_call
from agentjax.envs.python_env import PythonEnv, PythonTool
from agentjax.envs.retrieval import (BM25Retriever, Document, HttpRetriever, RetrievalError,
                                     Retriever, format_docs, read_corpus)
from agentjax.envs.sandbox import Sandbox, SandboxResult, SandboxUnavailableError
from agentjax.envs.search import SearchEnv
from agentjax.envs.tools import Tool, ToolError, make_tool, register_tool

__all__ = [
    "Action", "BM25Retriever", "Document", "Env", "EpisodeLog", "HttpRetriever",
    "PythonEnv", "PythonTool", "RetrievalError", "Retriever", "Sandbox", "SandboxResult",
    "SandboxUnavailableError", "SearchEnv", "StepResult", "Task", "Tool", "ToolError",
    "TurnLog", "format_docs", "make_env", "make_tool", "parse_search_r1", "parse_tool_call",
    "read_corpus", "register_env", "register_tool",
]
