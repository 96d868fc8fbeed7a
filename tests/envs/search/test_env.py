"""SearchEnv: Search-R1's turn loop, logging, caps, formats and failure handling."""
import socket

import pytest

from agentjax.core.task import Task
from agentjax.envs.base import Env
from agentjax.envs.retrieval import Document, HttpRetriever
from agentjax.envs.search.env import (DEFAULT_INSTRUCTION, INVALID_OBSERVATION,
                                  SHORT_INSTRUCTION, SearchEnv, truncate_words)

TASK = Task("q-dumont", "Which company does the person born in Thornbury work for?",
            ("Acme Dynamics",))


def test_search_r1_episode(bm25):
    env = SearchEnv(bm25)
    assert isinstance(env, Env)
    assert env.stop == ("</search>", "</answer>") and env.observation_role is None
    messages = env.reset(TASK)
    assert messages == [{"role": "user", "content": DEFAULT_INSTRUCTION.replace(
        "{question}", TASK.question)}]
    assert messages[0]["content"].endswith(f"Question: {TASK.question}\n")

    obs, done, reward, info = env.step("<think>Find who was born there.</think>\n"
                                       "<search> born in Thornbury </search>")
    assert not done and reward == 0.0 and info["kind"] == "search"
    docs = bm25.search(["born in Thornbury"], 3)[0]
    assert obs == ("\n\n<information>"
                   + "\n".join(f"Doc {i}(Title: {d.title}) {d.text}"
                               for i, d in enumerate(docs, 1))
                   + "</information>\n\n")
    assert "person-3" in [d.id for d in docs]

    obs, done, *_ = env.step("Dumont works for? <search>Dumont works for</search>")
    assert not done and "Acme Dynamics" in obs
    obs, done, reward, info = env.step("<think>ok</think><answer> Acme Dynamics </answer>")
    assert (obs, done, reward, info["stop_reason"]) == ("", True, 0.0, "answer")

    log = env.log
    assert log.final_answer == "Acme Dynamics" and log.done and log.stop_reason == "answer"
    assert [t.kind for t in log.turns] == ["search", "search", "answer"]
    assert log.turns[0].tool_name == "search"
    assert log.turns[0].tool_args == {"query": "born in Thornbury"}
    assert log.turns[0].retrieved == tuple(d.id for d in docs)
    assert log.turns[1].retrieved[0] == "person-3"
    assert log.num_tool_calls == 2 and log.num_invalid == 0
    with pytest.raises(RuntimeError, match="episode is over"):
        env.step("<answer>again</answer>")


def test_invalid_actions_get_search_r1_correction(bm25):
    env = SearchEnv(bm25, max_turns=5)
    env.reset(TASK)
    for text in ["I am not sure.", "<search>unclosed", "<search>  </search>"]:
        obs, done, _, info = env.step(text)
        assert obs == INVALID_OBSERVATION and not done and not info["valid"]
    assert env.log.num_invalid == 3 and env.log.num_tool_calls == 0
    assert [t.error for t in env.log.turns] == [
        "no action: expected <search>...</search> or <answer>...</answer>",
        "<search> without a closing </search>", "empty <search></search>"]
    assert env.step("<answer>x</answer>").done


def test_max_turns_ends_the_episode_without_running_the_last_search(bm25):
    calls = []

    class CountingRetriever:
        def search(self, queries, topk):
            calls.append(list(queries))
            return bm25.search(queries, topk)

    env = SearchEnv(CountingRetriever(), max_turns=2)
    env.reset(TASK)
    assert not env.step("<search>Thornbury</search>").done
    obs, done, _, info = env.step("<search>Dumont</search>")
    assert (obs, done, info["stop_reason"]) == ("", True, "max_turns")
    assert calls == [["Thornbury"]]  # the policy could never read a second result
    assert env.log.turns[-1].retrieved == () and env.log.final_answer is None
    # An answer on the last turn still counts as an answer.
    env.reset(TASK)
    env.step("junk")
    assert env.step("<answer>Acme Dynamics</answer>").info["stop_reason"] == "answer"
    # reset starts a fresh log.
    env.reset(TASK)
    assert env.log.turns == [] and not env.log.done


def test_observation_is_capped_in_words():
    long_doc = Document("d", '"Long"', " ".join(f"word{i}" for i in range(1000)))

    class OneDoc:
        def search(self, queries, topk):
            return [[long_doc] for _ in queries]

    env = SearchEnv(OneDoc(), max_observation_words=50)
    env.reset(TASK)
    obs = env.step("<search>long</search>").observation
    inner = obs.removeprefix("\n\n<information>").removesuffix("</information>\n\n")
    assert len(inner.split()) == 50 and inner.startswith('Doc 1(Title: "Long") word0')
    assert truncate_words("a  b\nc d", 3) == "a  b\nc" and truncate_words("a b", 5) == "a b"


def test_no_hits_and_failing_retrievers_give_error_observations(bm25):
    env = SearchEnv(bm25)
    env.reset(TASK)
    obs = env.step("<search>zyzzyva</search>").observation
    assert obs == "\n\n<information>No documents found.</information>\n\n"
    assert env.log.turns[-1].error is None

    class Broken:
        def search(self, queries, topk):
            raise OSError("disk on fire")

    env = SearchEnv(Broken())
    env.reset(TASK)
    obs, done, _, info = env.step("<search>anything</search>")
    assert not done and "Search failed: disk on fire" in obs
    assert info["error"] == "retrieval failed: OSError: disk on fire"
    assert env.log.turns[0].valid and env.log.turns[0].error == info["error"]


def test_every_observation_goes_through_the_character_cap(bm25):
    """Corrections, retrieval errors and over-long "words" all come back capped."""
    huge_word = Document("d", '"Huge"', "w" * 10**6)

    class Retriever:
        def search(self, queries, topk):
            if queries[0] == "fail":
                raise RuntimeError("e" * 10**6)
            return [[huge_word]]

    for action_format, actions in [
        ("tags", ["<search>huge</search>", "<search>fail</search>", "<search>" * 10**5]),
        ("tool_call", [
            '<tool_call>{"name": "search", "arguments": {"query": "fail"}}</tool_call>',
            '<tool_call>{"name": "' + "n" * 10**6 + '", "arguments": {}}</tool_call>',
            '<tool_call>{"name": "search", "arguments": {"' + "k" * 10**6 + '": 1}}'
            "</tool_call>"]),
    ]:
        env = SearchEnv(Retriever(), max_turns=10, max_observation_chars=1000,
                        action_format=action_format)
        env.reset(TASK)
        for action in actions:
            obs, done, _, info = env.step(action)
            assert not done and 0 < len(obs) <= 1000 and len(info["error"] or "") <= 1000


def test_dead_retrieval_server_does_not_crash_the_episode():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = SearchEnv(HttpRetriever(f"http://127.0.0.1:{port}/retrieve", timeout_s=0.5,
                                  retries=1, backoff_s=0.01))
    env.reset(TASK)
    obs, done, _, info = env.step("<search>q</search>")
    assert not done and "Search failed" in obs and "2 attempts failed" in info["error"]
    assert env.step("<answer>guess</answer>").done


def test_instruction_is_configurable(bm25):
    env = SearchEnv(bm25, instruction=SHORT_INSTRUCTION)
    content = env.reset(TASK)[0]["content"]
    assert content.endswith(TASK.question + "\n") and len(content) < 200
    custom = SearchEnv(bm25, instruction="Q: {question} {not a slot}")
    assert custom.reset(TASK)[0]["content"] == f"Q: {TASK.question} {{not a slot}}"
    with pytest.raises(ValueError, match="instruction"):
        SearchEnv(bm25, instruction="no slot")
    with pytest.raises(ValueError, match="action_format"):
        SearchEnv(bm25, action_format="xml")


def test_a_task_with_its_own_prompt_is_shown_that_prompt(bm25):
    """A Search-R1 parquet's `prompt` column (kept by the loader) is what the agent sees,
    whatever the env's instruction."""
    prompt = [{"role": "user", "content": DEFAULT_INSTRUCTION.replace(
        "{question}", TASK.question)}]
    task = Task(TASK.task_id, TASK.question, TASK.answers, metadata={"prompt": prompt})
    assert SearchEnv(bm25, instruction=SHORT_INSTRUCTION).reset(task) == prompt
    system, user = SearchEnv(bm25, action_format="tool_call").reset(task)
    assert '"name": "search"' in system["content"] and user == prompt[0]
    with_system = Task("t", "q?", ("a",), metadata={"prompt": [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "q?"}]})
    system, user = SearchEnv(bm25, action_format="tool_call").reset(with_system)
    assert system["content"].endswith("\n\nBe brief.") and user["content"] == "q?"


def test_tool_call_format(bm25):
    env = SearchEnv(bm25, action_format="tool_call", max_turns=5)
    assert env.stop == ("</tool_call>", "</answer>") and env.observation_role == "tool"
    system, user = env.reset(TASK)
    assert system["role"] == "system" and '"name": "search"' in system["content"]
    assert user["content"].endswith(TASK.question + "\n")
    obs, done, *_ = env.step(
        '<tool_call>{"name": "search", "arguments": {"query": "Dumont works"}}</tool_call>')
    assert not done and obs.startswith('Doc 1(Title: "Dumont")')
    assert env.log.turns[0].tool_args == {"query": "Dumont works"}
    bad = [
        '<tool_call>{"name": "search", "arguments": {"q": "x"}}</tool_call>',
        '<tool_call>{"name": "search", "arguments": {"query": " "}}</tool_call>',
        '<tool_call>{"name": "browse", "arguments": {}}</tool_call>',
    ]
    for text in bad:
        result = env.step(text)
        assert not result.info["valid"] and result.observation.startswith("Invalid action")
    assert env.log.turns[3].extra == {"unknown_tool": "browse"}
    assert env.log.num_invalid == 3


def test_retriever_from_config_strings(tmp_path, bm25):
    bm25.save(tmp_path / "index")
    env = SearchEnv(str(tmp_path / "index"), topk=1)
    env.reset(TASK)
    env.step("<search>Dumont</search>")
    assert env.log.turns[0].retrieved == ("person-3",)
    assert isinstance(SearchEnv("http://127.0.0.1:1").retriever, HttpRetriever)


def test_step_before_reset_is_an_error(bm25):
    with pytest.raises(RuntimeError, match="reset"):
        SearchEnv(bm25).step("<answer>x</answer>")
    with pytest.raises(ValueError, match="max_turns"):
        SearchEnv(bm25, max_turns=0)
