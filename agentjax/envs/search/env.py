"""SearchEnv: Search-R1's search-and-answer loop over any Retriever.

Tags format (default, as Search-R1): the policy writes `<think>…</think>`,
`<search> q </search>` or `<answer> a </answer>` inside one assistant turn; the sampler
stops at `</search>` / `</answer>`, and the env's observation
`"\\n\\n<information>Doc 1(Title: …) …</information>\\n\\n"` continues the same assistant
turn as plain text (`observation_role=None`).

Tool-call format: the policy writes hermes-style
`<tool_call>{"name": "search", "arguments": {"query": q}}</tool_call>`; documents come
back as a `tool` chat turn.

Native format: the search tool's schema goes to the model's chat template, the reply is
read by the parser `tool_parser` names, each search's documents come back as a `tool`
message, and a reply without a call is the answer (envs/turns.py).
"""
from __future__ import annotations

import re
from typing import Sequence

from agentjax.core.task import Task, TurnLog
from agentjax.parsers.actions import Action, invalid, parse_search_r1, parse_tool_call
from agentjax.envs.retrieval import Document, Retriever, format_docs, make_retriever
from agentjax.envs.tools import tools_system_prompt, validate_arguments
from agentjax.envs.turns import (DEFAULT_MAX_OBSERVATION_CHARS, NATIVE, TurnEnv,
                                 check_instruction, fill_question)

ACTION_FORMATS = ("tags", "tool_call", NATIVE)

# Search-R1's prompt (its data_process/nq_search.py), verbatim, typos included, so that
# checkpoints trained by Search-R1 see the text they were trained on.
DEFAULT_INSTRUCTION = (
    "Answer the given question. You must conduct reasoning inside <think> and </think> "
    "first every time you get new information. After reasoning, if you find you lack some "
    "knowledge, you can call a search engine by <search> query </search> and it will "
    "return the top searched results between <information> and </information>. You can "
    "search as many times as your want. If you find no further external knowledge needed, "
    "you can directly provide the answer inside <answer> and </answer>, without detailed "
    "illustrations. For example, <answer> Beijing </answer>. Question: {question}\n"
)

# For tiny CPU models: fewer tokens to read, the same tags.
SHORT_INSTRUCTION = (
    "Search with <search> query </search>; results appear in <information> </information>. "
    "Answer with <answer> answer </answer>. Question: {question}\n"
)

TOOL_CALL_INSTRUCTION = (
    "Answer the given question. Call the search tool when you lack knowledge; give the "
    "final answer between <answer> and </answer>. Question: {question}\n"
)

# Search-R1's corrective observation for a turn with no valid action, verbatim.
INVALID_OBSERVATION = (
    "\nMy previous action is invalid. If I want to search, I should put the query between "
    "<search> and </search>. If I want to give the final answer, I should put the answer "
    "between <answer> and </answer>. Let me try again.\n"
)

NO_RESULTS = "No documents found."


class _SearchTool:
    """The search tool's schema as the tool-call format shows it (the env runs it)."""

    name = "search"
    description = "Searches the document collection; returns the top documents."
    parameters = {
        "type": "object",
        "properties": {"query": {"type": "string", "description": "the search query"}},
        "required": ["query"],
        "additionalProperties": False,
    }


class SearchEnv(TurnEnv):
    """Search-R1-style multi-turn search.

    Args:
      retriever: a Retriever, or from config a string: an "http(s)://…/retrieve" URL of a
        Search-R1 server, or a saved BM25 index directory.
      topk: documents per search (Search-R1: 3).
      max_turns: policy turns per episode, the answering turn included.
      max_observation_words: the documents' text is cut after this many words
        (Search-R1 cuts observations at 500 tokens).
      max_observation_chars: every observation (documents, corrections, retrieval
        errors) is then cut to this many characters: a word can be arbitrarily long.
      instruction: the prompt template, with a `{question}` slot; default
        DEFAULT_INSTRUCTION (Search-R1's) for tags, TOOL_CALL_INSTRUCTION for tool calls.
        SHORT_INSTRUCTION suits tiny models.
      action_format: "tags" (Search-R1), "tool_call" (hermes JSON calls, the schema
        written into the prompt) or "native" (the chat template's own tool calls).
      tool_parser: the native format's parser name, or "auto" (from the tokenizer).

    A task that brings its own prompt (`task.metadata["prompt"]`, the chat messages of a
    Search-R1 parquet's `prompt` column) is shown exactly that, not the instruction: a
    checkpoint trained on the file sees the text it was trained on.

    The log records per turn: `tool_args={"query": q}`, `retrieved` (document ids in rank
    order), `error` for malformed actions and failed retrievals.
    """

    def __init__(self, retriever: Retriever | str, *, topk: int = 3, max_turns: int = 4,
                 max_observation_words: int = 400,
                 max_observation_chars: int = DEFAULT_MAX_OBSERVATION_CHARS,
                 instruction: str | None = None, action_format: str = "tags",
                 tool_parser: str = "auto"):
        super().__init__(max_turns, max_observation_chars)
        if action_format not in ACTION_FORMATS:
            raise ValueError(f"action_format must be one of {ACTION_FORMATS}, got "
                             f"{action_format!r}")
        if topk < 1 or max_observation_words < 1:
            raise ValueError(f"topk and max_observation_words must be >= 1, got {topk}, "
                             f"{max_observation_words}")
        self.retriever = make_retriever(retriever)
        self.topk = int(topk)
        self.max_observation_words = int(max_observation_words)
        self.action_format = self.tool_format = action_format
        self.tool_parser = tool_parser
        if action_format == "tags":
            self.stop = ("</search>", "</answer>")
            self.observation_role = None
            default = DEFAULT_INSTRUCTION
        else:
            # Native: the turn ends at the template's end-of-turn token.
            self.stop = () if action_format == NATIVE else ("</tool_call>", "</answer>")
            self.observation_role = "tool"
            default = TOOL_CALL_INSTRUCTION
        self.instruction = check_instruction(instruction or default)
        self._tools = {_SearchTool.name: _SearchTool()}

    def initial_messages(self, task: Task) -> list[dict[str, str]]:
        if "prompt" in task.metadata:
            prompt = [dict(m) for m in task.metadata["prompt"]]
        else:
            prompt = [{"role": "user",
                       "content": fill_question(self.instruction, task.question)}]
        if self.action_format in ("tags", NATIVE):
            return prompt  # Search-R1 has no system message; native: the template's tools
        tools = tools_system_prompt(self._tools)
        if prompt[0]["role"] == "system":  # one system message: the tools, then the file's
            return [{"role": "system", "content": f"{tools}\n\n{prompt[0]['content']}"},
                    *prompt[1:]]
        return [{"role": "system", "content": tools}, *prompt]

    def parse(self, action_text: str) -> Action:
        if self.action_format == "tags":
            return parse_search_r1(action_text)
        action = parse_tool_call(action_text, tools=self._tools)
        if action.kind != "tool_call":
            return action
        problem = validate_arguments(_SearchTool.parameters, action.arguments)
        query = str(action.arguments.get("query", "")).strip()
        if problem is None and not query:
            problem = "empty query"
        return invalid(problem) if problem else Action(kind="search", query=query)

    def native_tools(self) -> dict[str, _SearchTool]:
        return self._tools

    def native_action(self, name, arguments) -> Action:
        query = str(arguments["query"]).strip()
        return Action(kind="search", query=query) if query else invalid("empty query")

    def native_content(self, observation: str) -> str:
        if self.action_format == "tags":  # the documents inside <information>
            start, end = observation.find("<information>"), observation.rfind("</information>")
            if 0 <= start < end:
                return observation[start + len("<information>"):end]
        return observation

    def corrective_observation(self, action: Action) -> str:
        if self.action_format == "tags":
            return INVALID_OBSERVATION
        return (f"Invalid action: {action.error}. Search with <tool_call>"
                '{"name": "search", "arguments": {"query": "..."}}</tool_call> or answer '
                "with <answer>...</answer>.")

    def act(self, action: Action, turn: TurnLog) -> None:
        if action.kind == "invalid":  # a native call with an empty query
            turn.observation = turn.error = f"Invalid search: {action.error}."
            return
        try:
            docs = self.retriever.search([action.query], self.topk)[0]
        except Exception as e:  # a dead server or broken index must not end the run
            turn.error = f"retrieval failed: {type(e).__name__}: {e}"
            turn.observation = self._wrap(f"Search failed: {e}")
            return
        turn.retrieved = tuple(d.id for d in docs)
        turn.observation = self._wrap(self._docs_text(docs))

    def _docs_text(self, docs: Sequence[Document]) -> str:
        text = format_docs(docs).strip() if docs else NO_RESULTS
        return truncate_words(text, self.max_observation_words)

    def _wrap(self, text: str) -> str:
        if self.action_format == "tags":
            return f"\n\n<information>{text}</information>\n\n"
        return text


_WORD = re.compile(r"\S+")


def truncate_words(text: str, max_words: int) -> str:
    """Cuts `text` after its `max_words`-th whitespace-separated word, keeping the
    original spacing of what remains."""
    for i, match in enumerate(_WORD.finditer(text), 1):
        if i == max_words:
            return text[:match.end()]
    return text
