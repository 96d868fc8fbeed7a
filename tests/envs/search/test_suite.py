"""The search suite (envs/search/suite.py) over the synthetic world and over a user's
Search-R1 files (data.source="files"): what it loads, what the agent sees and how its
episodes are rewarded."""
import contextlib
import http.server
import json
import threading

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from agentjax.envs.search.env import DEFAULT_INSTRUCTION, SHORT_INSTRUCTION
from agentjax.rewards.judge import JudgeError
from agentjax import config as config_lib
from agentjax.config import presets
from agentjax.envs import registry as suites
from agentjax.envs.search import suite as search_suite
from agentjax.envs.search.env import SearchEnv
from tests.envs.search import search_r1_files
from tests.envs.retrieval_server import free_port


def test_the_synthetic_world_rewards_subgoals_and_can_relabel(tmp_path):
    config = presets.search_config("grpo", "test")
    config.env.instruction = "minimal"
    suite = suites.build_suite(config, str(tmp_path / "data"))
    assert (len(suite.train_tasks), len(suite.test_tasks)) == (48, 8)
    assert isinstance(suite.make_env(), SearchEnv)
    assert [c.name for c in suite.reward_fn.components] == [
        "exact_match", "f1", "format", "tool_shaping", "process"]
    assert suite.success_key == "exact_match" and suite.observation_role is None
    assert "demonstrator" in suite.baselines and suite.demonstrations
    assert search_suite.MINIMAL_INSTRUCTION in suite.texts
    assert suite.pretrain_corpus is not None and suite.relabel is not None


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



@contextlib.contextmanager
def judge_server(reply: str):
    """An OpenAI-compatible chat server on a free local port whose every reply is
    `reply`; yields (its URL, the (path, request body) pairs it received)."""
    seen = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append((self.path, request))
            body = json.dumps({"choices": [{"message": {"role": "assistant", "content": reply}}]
                               * request["n"]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}", seen
    finally:
        server.shutdown()
        server.server_close()


def judged_episode(files, tmp_path, url):
    """(suite, task, log): a correct answer to a Search-R1 question, with the judge of
    `url` as the rewarded outcome."""
    config = files_config(files)
    config.reward.outcome = "judge"
    config.reward.judge.update(url=url, model="judge-7b", votes=3, temperature=0.5)
    config.pretrain.steps = 0  # validation: no pretraining corpus without the world
    suite = suites.build_suite(config_lib.validate(config), str(tmp_path / "data"))
    task = suite.train_tasks[4]
    env = suite.make_env()
    env.reset(task)
    env.step("<answer> Arthur's Magazine </answer>")
    return suite, task, env.log


def test_the_llm_judge_is_the_reward_when_it_is_the_outcome(files, tmp_path):
    """The judge decides the reward; exact match is still logged and still says which
    episodes solved their task."""
    with judge_server('{"success": false, "reason": "not supported"}') as (url, seen):
        suite, task, log = judged_episode(files, tmp_path, url)
        total, parts = suite.reward_fn(task, log)
    assert parts == {"exact_match": 1.0, "f1": 1.0, "judge": 0.0, "format": 1.0,
                     "tool_shaping": 0.0}
    assert total == 0.0 and suite.success_key == "exact_match"
    [(path, request)] = seen
    assert path == "/v1/chat/completions"
    assert (request["model"], request["n"], request["temperature"]) == ("judge-7b", 3, 0.5)
    assert task.question in request["messages"][0]["content"]


def test_a_judge_that_cannot_be_reached_fails_the_reward_loudly(files, tmp_path):
    suite, task, log = judged_episode(files, tmp_path, f"http://127.0.0.1:{free_port()}")
    with pytest.raises(JudgeError, match="no judge gave a verdict .*ConnectError"):
        suite.reward_fn(task, log)


def test_native_search_demonstrations_are_the_tag_demonstrations_as_calls(tmp_path):
    config = presets.search_config("grpo", "test")
    config.env.instruction, config.env.tool_format = "minimal", "native"
    suite = suites.build_suite(config, str(tmp_path / "data"))
    env = suite.make_env()
    assert env.tool_format == "native" and suite.observation_role == "tool"
    assert [t["function"]["name"] for t in suite.tools] == ["search"]
    searched = [d for d in suite.demonstrations if len(d.turns) > 1]
    first = searched[0].turns[0]
    query = first.action["tool_calls"][0]["function"]["arguments"]["query"]
    assert query and "<search>" not in first.action["content"]
    documents = first.observation[0]["content"]
    assert "<information>" not in documents and documents.startswith("Doc 1")
    assert env.reset(searched[0].task) == searched[0].messages
    assert searched[0].turns[-1].action["content"].count("<answer>") == 1
