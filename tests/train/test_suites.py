"""The search suite over a user's Search-R1 files (data.source="files"): what it loads,
what the agent sees and how its episodes are rewarded."""
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from agentjax.envs.search import DEFAULT_INSTRUCTION, SHORT_INSTRUCTION
from agentjax.train import presets, suites
from tests.data import search_r1_files


@pytest.fixture
def files(tmp_path):
    train, corpus = str(tmp_path / "train.parquet"), str(tmp_path / "corpus.jsonl")
    rows = search_r1_files.write_merged_train(train)
    search_r1_files.write_corpus(corpus)
    return {"train": train, "corpus": corpus, "rows": rows}


def files_config(files, **data):
    config = presets.search_config("grpo", "test")
    config.data.source, config.data.corpus_path = "files", files["corpus"]
    config.data.train_path = config.data.test_path = files["train"]
    config.data.update(data)
    return config


def test_search_r1_episodes_are_rewarded(files, tmp_path):
    """The suite's reward logs the process component on the synthetic world; Search-R1's
    questions have no subgoals, and their episodes are still scored."""
    suite = suites.build_suite(files_config(files), str(tmp_path / "data"))
    assert len(suite.train_tasks) == 6  # both sources' "train_0", "train_1"
    task = suite.train_tasks[4]
    env = suite.make_env()
    env.reset(task)
    env.step("<search> Arthur's Magazine First for Women </search>")
    env.step("<answer> Arthur's Magazine </answer>")
    total, parts = suite.reward_fn(task, env.log)
    assert parts == {"exact_match": 1.0, "f1": 1.0, "format": 1.0, "tool_shaping": 0.1}
    assert total == 1.0
    assert parts[suite.success_key] == 1.0


def test_the_agent_sees_the_files_prompt_unless_told_otherwise(files, tmp_path):
    suite = suites.build_suite(files_config(files), str(tmp_path / "a"))
    task = suite.train_tasks[0]
    assert suite.make_env().reset(task) == files["rows"][0]["prompt"] == [
        {"role": "user", "content": DEFAULT_INSTRUCTION.replace("{question}", task.question)}]
    assert files["rows"][0]["prompt"][0]["content"] in suite.texts  # tokenizer texts
    rebuilt = suites.build_suite(files_config(files, file_prompt=False), str(tmp_path / "b"))
    assert rebuilt.make_env().reset(rebuilt.train_tasks[0]) == [
        {"role": "user", "content": SHORT_INSTRUCTION.replace("{question}", task.question)}]


def test_rows_that_do_not_load_are_an_error_unless_skipped(files, tmp_path, capsys):
    bad = str(tmp_path / "bad.parquet")
    rows = files["rows"]
    no_answer = {**rows[1], "id": "train_9", "golden_answers": [],
                 "reward_model": {"style": "rule", "ground_truth": {"target": []}}}
    pq.write_table(pa.Table.from_pylist(rows + [rows[0], no_answer]), bad)
    config = files_config(files, train_path=bad)
    with pytest.raises(ValueError, match="2 of the rows .* do not load") as info:
        suites.build_suite(config, str(tmp_path / "a"))
    assert "duplicate task id 'nq/train_0'" in str(info.value)
    assert "data.skip_bad_rows=True" in str(info.value)
    config.data.skip_bad_rows = True
    suite = suites.build_suite(config, str(tmp_path / "b"))
    assert len(suite.train_tasks) == 6 and "skipped" in capsys.readouterr().out


def test_a_process_reward_without_subgoals_is_a_config_error(files, tmp_path):
    config = files_config(files)
    config.reward.process_weight = 0.3
    with pytest.raises(ValueError, match="reward.process_weight"):
        suites.build_suite(config, str(tmp_path / "data"))

