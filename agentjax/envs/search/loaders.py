"""Task files in the public formats: Search-R1 parquet and jsonl, read and written.

Readers never drop a row silently: each bad row becomes a `RowError(index, message)` in
the result, next to the tasks that loaded (`data.rows`). Accepted rows:

* Search-R1 parquet (verl): `data_source`, `prompt` = [{"role", "content"}],
  `reward_model.ground_truth.target` (list or string), `extra_info` {"split", "index",
  ...}; the question is the `question` column when present (Search-R1 keeps the
  source columns), else the text after the last "Question:" of the last user message.
  The `prompt` messages are kept as `metadata["prompt"]`: the search env shows the
  agent exactly the prompt the file was made with.
* jsonl, one object a line, as FlashRAG / Search-R1 raw data (`question`,
  `golden_answers`), HotpotQA (`question`, `answer`) or this package's own
  (`task_id`, `question`, `answers`, `data_source`, `metadata`).

Task ids: an own `task_id` (column or `extra_info.task_id`) is used as it is; a FlashRAG
`id` is unique only within its dataset (Search-R1's merged NQ + HotpotQA file has
`train_0` in both), so it is qualified by the data source: `nq/train_0`; a row with
neither is `{file stem}-{row index}`. A repeated id is a RowError, never a silent drop.

Writers produce the same formats (and the Search-R1 corpus jsonl), so a world built here
can train Search-R1/verl directly and comes back through the readers as the same tasks,
each with the prompt it was written with.
"""
from __future__ import annotations

import json
import os
from typing import Any, Iterable, Mapping, Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from agentjax.core.jsonl import read_jsonl
from agentjax.core.task import Task
from agentjax.data.rows import LoadResult, load_rows
from agentjax.envs.search.env import DEFAULT_INSTRUCTION
from agentjax.envs.turns import check_instruction, fill_question


def _strings(value: Any, field: str) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)) or not value:
        raise ValueError(f"{field} must be a non-empty string or list of strings, got {value!r}")
    if not all(isinstance(v, str) and v.strip() for v in value):
        raise ValueError(f"{field} holds an empty or non-string answer: {value!r}")
    return tuple(v.strip() for v in value)


PROMPT_ROLES = ("system", "user", "assistant")


def prompt_messages(prompt: Any) -> list[dict[str, str]]:
    """A dataset's `prompt` column as chat messages: a non-empty list of
    `{"role": "system" | "user" | "assistant", "content": str}` ending with a user turn.

    Raises:
      ValueError: naming what is wrong.
    """
    if not isinstance(prompt, (list, tuple)) or not prompt:
        raise ValueError(f"prompt must be a non-empty list of messages, got {prompt!r}")
    messages = []
    for i, message in enumerate(prompt):
        if (not isinstance(message, Mapping) or message.get("role") not in PROMPT_ROLES
                or not isinstance(message.get("content"), str)):
            raise ValueError(f"prompt message {i} must be {{'role': one of {PROMPT_ROLES}, "
                             f"'content': str}}, got {message!r}")
        messages.append({"role": message["role"], "content": message["content"]})
    if messages[-1]["role"] != "user":
        raise ValueError(f"prompt must end with a user message, got {messages[-1]['role']!r}")
    return messages


def _question_from_prompt(messages: list[dict[str, str]]) -> str:
    return messages[-1]["content"].rsplit("Question:", 1)[-1].strip()


def task_from_record(record: Mapping[str, Any], index: int, *, default_id: str,
                     default_source: str) -> Task:
    """One row (any accepted schema, module docstring) as a Task.

    Args:
      record: the row as a dict.
      index: its 0-based row index (used in the default task id).
      default_id: prefix of the task id when the row carries none.
      default_source: data_source when the row carries none.

    Raises:
      ValueError: the row has no usable question or answers.
    """
    extra = record.get("extra_info") or {}
    if not isinstance(extra, Mapping):
        raise ValueError(f"extra_info must be a mapping, got {type(extra).__name__}")
    prompt = None if record.get("prompt") is None else prompt_messages(record["prompt"])
    question = record.get("question")
    if question is None and prompt is not None:
        question = _question_from_prompt(prompt)
    if not isinstance(question, str) or not question.strip():
        raise ValueError(f"no question: need a non-empty 'question' or 'prompt', "
                         f"got {question!r}")
    reward_model = record.get("reward_model") or {}
    truth = reward_model.get("ground_truth") if isinstance(reward_model, Mapping) else None
    target = truth.get("target") if isinstance(truth, Mapping) else None
    for field, value in (("reward_model.ground_truth.target", target),
                         ("golden_answers", record.get("golden_answers")),
                         ("answers", record.get("answers")),
                         ("answer", record.get("answer"))):
        if value is not None:
            answers = _strings(value, field)
            break
    else:
        raise ValueError("no answers: need reward_model.ground_truth.target, golden_answers, "
                         "answers or answer")
    metadata = record.get("metadata") or extra.get("metadata") or {}
    if isinstance(metadata, str):
        try:
            metadata = json.loads(metadata)
        except json.JSONDecodeError as err:
            raise ValueError(f"metadata is not valid JSON: {err}") from err
    if not isinstance(metadata, Mapping):
        raise ValueError(f"metadata must be a mapping, got {type(metadata).__name__}")
    metadata = dict(metadata)
    if prompt is not None:
        metadata["prompt"] = prompt
    data_source = str(record.get("data_source") or default_source)
    task_id = record.get("task_id") or extra.get("task_id")
    if task_id is None and record.get("id") is not None:
        task_id = f"{data_source}/{record['id']}"
    return Task(task_id=str(task_id) if task_id is not None else f"{default_id}-{index}",
                question=question.strip(), answers=answers, data_source=data_source,
                metadata=metadata)


def _load_rows(rows: Iterable[tuple[int, Any]], path: str) -> LoadResult:
    stem = os.path.splitext(os.path.basename(path))[0]
    return load_rows(rows, path, lambda row, index: task_from_record(
        row, index, default_id=stem, default_source=stem))


def load_search_r1_parquet(path: str) -> LoadResult:
    """Reads a Search-R1 / verl parquet file (module docstring) into Tasks.

    Args:
      path: the parquet file.

    Raises:
      FileNotFoundError: no such file.
      ValueError: the file is not readable parquet.
    """
    if not os.path.exists(path):
        raise FileNotFoundError(f"no parquet file at {path}")
    try:
        rows = pq.read_table(path).to_pylist()
    except (pa.ArrowInvalid, OSError) as err:
        raise ValueError(f"{path}: not a readable parquet file: {err}") from err
    return _load_rows(enumerate(rows), path)


def load_jsonl(path: str) -> LoadResult:
    """Reads a jsonl task file (module docstring); blank lines are skipped, and a line
    that is not JSON is a RowError with its 0-based line index.

    Args:
      path: the jsonl file.
    """

    rows = ((index, ValueError(f"invalid JSON: {row}")
             if isinstance(row, json.JSONDecodeError) else row)
            for index, row in read_jsonl(path))
    return _load_rows(rows, path)


def write_search_r1_parquet(path: str, tasks: Sequence[Task], *, split: str,
                            template: str = DEFAULT_INSTRUCTION,
                            ability: str = "fact-reasoning") -> None:
    """Writes tasks as a Search-R1 / verl parquet file.

    Args:
      path: output file.
      tasks: the tasks (at least one).
      split: value of extra_info.split ("train", "test").
      template: user prompt with a `{question}` slot (default: Search-R1's, verbatim,
        as the search env uses it), for tasks without a `metadata["prompt"]` of their
        own (a task read from a file keeps the prompt it was read with).
      ability: the `ability` column.
    """
    if not tasks:
        raise ValueError(f"write_search_r1_parquet({path!r}): no tasks to write")
    check_instruction(template, "template")

    def prompt(task):
        if "prompt" in task.metadata:
            return prompt_messages(task.metadata["prompt"])
        return [{"role": "user", "content": fill_question(template, task.question)}]

    rows = [{"id": t.task_id, "question": t.question, "golden_answers": list(t.answers),
             "data_source": t.data_source, "prompt": prompt(t), "ability": ability,
             "reward_model": {"style": "rule", "ground_truth": {"target": list(t.answers)}},
             "extra_info": {"split": split, "index": i, "task_id": t.task_id,
                            "metadata": json.dumps({k: v for k, v in t.metadata.items()
                                                    if k != "prompt"}, sort_keys=True)}}
            for i, t in enumerate(tasks)]
    pq.write_table(pa.Table.from_pylist(rows), path)


def _write_jsonl(path: str, records: Iterable[Mapping[str, Any]]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")


def write_tasks_jsonl(path: str, tasks: Sequence[Task]) -> None:
    """Writes tasks as jsonl in this package's own schema (read back by `load_jsonl`)."""
    _write_jsonl(path, ({"task_id": t.task_id, "question": t.question,
                         "answers": list(t.answers), "data_source": t.data_source,
                         "metadata": dict(t.metadata)} for t in tasks))


def write_corpus_jsonl(path: str, records: Iterable[Mapping[str, str]]) -> None:
    """Writes a Search-R1 corpus: one `{"id", "contents": '"Title"\\ntext'}` a line."""
    def checked():
        for i, r in enumerate(records):
            if not isinstance(r.get("id"), str) or not isinstance(r.get("contents"), str):
                raise ValueError(f"corpus record {i} needs string 'id' and 'contents': {r!r}")
            yield {"id": r["id"], "contents": r["contents"]}

    _write_jsonl(path, checked())
