import dataclasses
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from agentjax.envs.search import loaders
from agentjax.core.task import Task
from agentjax.envs.search.env import DEFAULT_INSTRUCTION
from agentjax.envs.retrieval import read_corpus
from tests.envs.search import search_r1_files
from tests.envs.search.worlds import world


def without_prompt(tasks):
    """The tasks less the prompt a parquet file gives them."""
    return [dataclasses.replace(t, metadata={k: v for k, v in t.metadata.items()
                                             if k != "prompt"}) for t in tasks]


def test_world_round_trips_through_search_r1_parquet(tmp_path):
    tasks = world().train_tasks
    path = str(tmp_path / "train.parquet")
    loaders.write_search_r1_parquet(path, tasks, split="train")
    back, errors = loaders.load_search_r1_parquet(path)
    assert errors == [] and without_prompt(back) == tasks
    # The file's prompt comes along, and a task read from a file is written back with it.
    assert back[0].metadata["prompt"] == [{"role": "user", "content": DEFAULT_INSTRUCTION
                                           .replace("{question}", tasks[0].question)}]
    again = str(tmp_path / "again.parquet")
    loaders.write_search_r1_parquet(again, back, split="train", template="Q: {question}")
    assert loaders.load_search_r1_parquet(again) == (back, [])
    # The columns Search-R1 / verl read.
    row = pq.read_table(path).slice(0, 1).to_pylist()[0]
    assert row["data_source"] == "synthetic_multihop" and row["ability"] == "fact-reasoning"
    assert row["reward_model"] == {"style": "rule",
                                   "ground_truth": {"target": list(tasks[0].answers)}}
    assert row["prompt"][0]["role"] == "user"
    assert row["prompt"][0]["content"].endswith(f"Question: {tasks[0].question}\n")
    assert row["extra_info"]["split"] == "train" and row["extra_info"]["index"] == 0


def test_reads_search_r1_rows_without_a_question_column(tmp_path):
    # As Search-R1's own preprocessing writes them when the source columns are dropped.
    rows = [{"data_source": "nq", "prompt": [{"role": "user", "content":
             DEFAULT_INSTRUCTION.replace("{question}", "who wrote hamlet?")}],
             "ability": "fact-reasoning",
             "reward_model": {"style": "rule", "ground_truth": {"target": ["Shakespeare"]}},
             "extra_info": {"split": "test", "index": 0}},
            {"data_source": "nq", "prompt": [{"role": "user", "content": "Question: q2"}],
             "ability": "fact-reasoning",
             "reward_model": {"style": "rule", "ground_truth": {"target": []}},
             "extra_info": {"split": "test", "index": 1}}]
    path = str(tmp_path / "nq.parquet")
    pq.write_table(pa.Table.from_pylist(rows), path)
    tasks, errors = loaders.load_search_r1_parquet(path)
    assert tasks == [Task("nq-0", "who wrote hamlet?", ("Shakespeare",), "nq",
                          {"prompt": rows[0]["prompt"]})]
    assert [e.index for e in errors] == [1]
    assert "reward_model.ground_truth.target" in errors[0].message and "row 1" in errors[0].message


def test_search_r1_merged_nq_hotpotqa_file_loads_every_row(tmp_path):
    """qa_search_train_merge.py repeats FlashRAG's ids across sources: ids are qualified
    by the data source, and the file's prompt (Search-R1's template) comes along."""
    path = str(tmp_path / "train.parquet")
    rows = search_r1_files.write_merged_train(path)
    tasks, errors = loaders.load_search_r1_parquet(path)
    assert errors == [] and len(tasks) == len(rows) == 6
    assert [t.task_id for t in tasks] == [
        "nq/train_0", "nq/train_1", "nq/train_2", "nq/train_3",
        "hotpotqa/train_0", "hotpotqa/train_1"]
    nq, hotpot = tasks[0], tasks[4]
    assert nq.question == "total number of death row inmates in the us?"
    assert nq.answers == ("2,718",) and nq.data_source == "nq"
    assert search_r1_files.PREFIX == DEFAULT_INSTRUCTION
    assert nq.metadata == {"prompt": [{"role": "user", "content": DEFAULT_INSTRUCTION
                                       .replace("{question}", nq.question)}]}
    assert hotpot.metadata["type"] == "comparison" and hotpot.answers == ("Arthur's Magazine",)
    # The same source twice is still a repeated id: an error row, not a silent drop.
    twice = str(tmp_path / "twice.parquet")
    pq.write_table(pa.Table.from_pylist(rows + rows[:1]), twice)
    tasks, errors = loaders.load_search_r1_parquet(twice)
    assert len(tasks) == 6 and [e.index for e in errors] == [6]
    assert "duplicate task id 'nq/train_0'" in errors[0].message


@pytest.mark.parametrize("prompt, error", [
    ("a string", "non-empty list of messages"),
    ([], "non-empty list of messages"),
    ([{"role": "user"}], "prompt message 0"),
    ([{"role": "robot", "content": "hi"}], "prompt message 0"),
    ([{"role": "user", "content": "Question: q?"}, {"role": "assistant", "content": "a"}],
     "must end with a user message"),
])
def test_a_malformed_prompt_is_an_error(prompt, error):
    row = search_r1_files.search_r1_rows("nq", search_r1_files.NQ[:1])[0]
    with pytest.raises(ValueError, match=error):
        loaders.task_from_record({**row, "prompt": prompt}, 0, default_id="nq",
                                 default_source="nq")


def test_jsonl_schemas_and_bad_rows_by_index(tmp_path):
    lines = [
        {"id": "q1", "question": "a?", "golden_answers": ["x", "y"]},     # FlashRAG / NQ
        {"question": "b?", "answer": "z"},                               # HotpotQA
        "not json",
        {"question": "c?"},                                              # no answers
        {"question": "", "answers": ["w"]},                              # empty question
        {"task_id": "tasks/q1", "question": "d?", "answers": ["v"]},     # duplicate id
        [1, 2],                                                          # not an object
        {"task_id": "own", "question": "e?", "answers": ["u"], "metadata": {"hops": 2}},
        {"question": "f?", "answers": ["t", 3]},                         # non-string answer
    ]
    path = tmp_path / "tasks.jsonl"
    path.write_text("\n".join(l if isinstance(l, str) else json.dumps(l) for l in lines) + "\n\n")
    tasks, errors = loaders.load_jsonl(str(path))
    assert [(t.task_id, t.question, t.answers) for t in tasks] == [
        ("tasks/q1", "a?", ("x", "y")), ("tasks-1", "b?", ("z",)), ("own", "e?", ("u",))]
    assert tasks[2].metadata == {"hops": 2} and tasks[0].data_source == "tasks"
    assert [e.index for e in errors] == [2, 3, 4, 5, 6, 8]
    messages = " ".join(e.message for e in errors)
    for needle in ("invalid JSON", "no answers", "no question", "duplicate task id",
                   "not an object", "non-string answer"):
        assert needle in messages


def test_own_jsonl_round_trip(tmp_path):
    tasks = world().test_tasks
    path = str(tmp_path / "t.jsonl")
    loaders.write_tasks_jsonl(path, tasks)
    assert loaders.load_jsonl(path) == (tasks, [])


def test_corpus_writer_matches_the_retriever_reader(tmp_path):
    records = world().corpus_records()
    path = str(tmp_path / "corpus.jsonl")
    loaders.write_corpus_jsonl(path, records)
    docs = read_corpus(path)
    assert [d.contents for d in docs] == [r["contents"] for r in records]
    with pytest.raises(ValueError, match="corpus record 0"):
        loaders.write_corpus_jsonl(path, [{"id": 1, "contents": "x"}])


def test_file_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.parquet"):
        loaders.load_search_r1_parquet(str(tmp_path / "missing.parquet"))
    bad = tmp_path / "bad.parquet"
    bad.write_text("not parquet")
    with pytest.raises(ValueError, match="not a readable parquet"):
        loaders.load_search_r1_parquet(str(bad))
    with pytest.raises(ValueError, match="no tasks"):
        loaders.write_search_r1_parquet(str(tmp_path / "x.parquet"), [], split="train")
    with pytest.raises(ValueError, match="template"):
        loaders.write_search_r1_parquet(str(tmp_path / "x.parquet"), world().test_tasks,
                                        split="test", template="no slot")
