"""Tiny files in Search-R1's own formats, as its scripts write them.

`scripts/data_process/nq_search.py` (and `qa_search_train_merge.py`, which concatenates
the per-source files it builds the same way) keeps FlashRAG's columns (`id`, `question`
with a "?" appended, `golden_answers`, `metadata` for HotpotQA) and adds `data_source`,
`prompt`, `ability`, `reward_model` and `extra_info` ({"split", "index"}, the index
restarting at 0 for every source). FlashRAG's ids restart too: `train_0` is in both
sources of the merged file. The corpus is Search-R1's wiki-18 jsonl: one
`{"id", "contents": "\\"Title\\"\\ntext"}` a line.
"""
from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq

# nq_search.py's `make_prefix` (template_type "base"), verbatim.
PREFIX = ("Answer the given question. "
          "You must conduct reasoning inside <think> and </think> first every time you get "
          "new information. "
          "After reasoning, if you find you lack some knowledge, you can call a search engine "
          "by <search> query </search> and it will return the top searched results between "
          "<information> and </information>. "
          "You can search as many times as your want. "
          "If you find no further external knowledge needed, you can directly provide the "
          "answer inside <answer> and </answer>, without detailed illustrations. For example, "
          "<answer> Beijing </answer>. Question: {question}\n")

# (FlashRAG id, question as FlashRAG has it, golden answers) per source.
NQ = [("train_0", "total number of death row inmates in the us", ["2,718"]),
      ("train_1", "big little lies season 2 how many episodes", ["seven"]),
      ("train_2", "who sang waiting for a girl like you", ["Foreigner"]),
      ("train_3", "where do you cross the arctic circle in norway", ["Saltfjellet"])]
HOTPOTQA = [("train_0", "Which magazine was started first Arthur's Magazine or First for "
             "Women?", ["Arthur's Magazine"]),
            ("train_1", "The Oberoi family is part of a hotel company that has a head "
             "office in what city?", ["Delhi"])]

CORPUS = [
    {"id": "0", "contents": '"Death row"\nThe total number of death row inmates in the '
                            'United States was 2,718.'},
    {"id": "1", "contents": '"Big Little Lies (TV series)"\nThe second season of Big Little '
                            'Lies has seven episodes.'},
    {"id": "2", "contents": '"Waiting for a Girl Like You"\nWaiting for a Girl Like You is a '
                            'song by the band Foreigner.'},
    {"id": "3", "contents": '"Arctic Circle"\nIn Norway the Arctic Circle is crossed at '
                            'Saltfjellet.'},
    {"id": "4", "contents": '"Arthur\'s Magazine"\nArthur\'s Magazine was started in 1844, '
                            'before First for Women.'},
    {"id": "5", "contents": '"The Oberoi Group"\nThe Oberoi Group is a hotel company with '
                            'its head office in Delhi.'},
]


def search_r1_rows(source: str, examples, split: str = "train") -> list[dict]:
    """Rows of one source as nq_search.py's `process_fn` writes them (FlashRAG columns
    kept)."""
    rows = []
    for index, (flashrag_id, question, answers) in enumerate(examples):
        question = question.strip()
        if question[-1] != "?":
            question += "?"
        row = {"id": flashrag_id, "question": question, "golden_answers": answers,
               "data_source": source,
               "prompt": [{"role": "user", "content": PREFIX.replace("{question}", question)}],
               "ability": "fact-reasoning",
               "reward_model": {"style": "rule", "ground_truth": {"target": answers}},
               "extra_info": {"split": split, "index": index},
               # HotpotQA's question type and level; NQ carries none here.
               "metadata": ({"type": "comparison", "level": "hard"} if source == "hotpotqa"
                            else None)}
        rows.append(row)
    return rows


def write_merged_train(path: str) -> list[dict]:
    """qa_search_train_merge.py's train.parquet over NQ and HotpotQA; returns the rows."""
    rows = search_r1_rows("nq", NQ) + search_r1_rows("hotpotqa", HOTPOTQA)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return rows


def write_corpus(path: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(record) + "\n" for record in CORPUS)
