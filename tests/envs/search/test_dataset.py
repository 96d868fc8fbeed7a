import json
import os
import runpy

from agentjax.data.demonstrations import read_demonstrations_jsonl
from agentjax.envs.search.demonstrators import DemonstratorConfig
from agentjax.envs.search.loaders import load_search_r1_parquet
from agentjax.envs.search.dataset import make_search_dataset
from agentjax.envs.retrieval import BM25Retriever
from tests.envs.search.test_loaders import without_prompt
from tests.envs.search.worlds import SMALL

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "..", "scripts",
                      "make_search_data.py")


def test_dataset_folder_is_complete_and_consistent(tmp_path):
    data = make_search_dataset(str(tmp_path), SMALL,
                               DemonstratorConfig("imperfect", p_guess=0.5, p_negative=0.2),
                               demo_hops=(1, 2))
    train, errors = load_search_r1_parquet(data.paths["train"])
    assert errors == [] and without_prompt(train) == data.world.train_tasks
    assert without_prompt(load_search_r1_parquet(data.paths["test"]).tasks) == (
        data.world.test_tasks)
    retriever = BM25Retriever.load(data.paths["index"])
    assert len(retriever.documents) == len(data.world.entities)
    demos = read_demonstrations_jsonl(data.paths["demos"])
    assert len(demos) == 80 and {d.task.metadata["hops"] for d in demos} == {1, 2}
    assert any(not t.trainable for d in demos for t in d.turns)
    with open(data.paths["summary"]) as f:
        summary = json.load(f)
    success = summary["success"]
    assert success["gold"]["test"]["success"] == 1.0
    assert success["demonstrator"]["train"]["success"] == sum(d.reward for d in demos) / 80
    assert success["closed_book"]["test"]["success"] < success["demonstrator"]["test"]["success"]
    assert summary["env"]["max_turns"] == 6 and summary["demo_hops"] == [1, 2]


def test_script_prints_the_measured_success(tmp_path, capsys):
    main = runpy.run_path(SCRIPT, run_name="make_search_data")["main"]
    assert main(["--out", str(tmp_path), "--seed", "5", "--people", "30", "--companies", "8",
                 "--cities", "8", "--countries", "4", "--train", "1:20,2:20",
                 "--test", "1:5,2:5", "--p-guess", "0.5", "--demo-hops", "1,2:0.25"]) == 0
    out = capsys.readouterr().out
    assert "| gold | test | 1.000 |" in out and "| demonstrator | train |" in out
    assert sorted(os.listdir(tmp_path)) == ["corpus.jsonl", "demos.jsonl", "index",
                                            "summary.json", "test.parquet", "train.parquet"]
    demos = read_demonstrations_jsonl(str(tmp_path / "demos.jsonl"))
    assert sorted(d.task.metadata["hops"] for d in demos) == [1] * 20 + [2] * 5
