"""The judge over an OpenAI-compatible chat server: what it sends, what it reads, and
that a server that fails is a loud JudgeError, never a score."""
import asyncio
import json

import httpx
import pytest

from agentjax.core.task import Task
from agentjax.models.tokenizer import build_tokenizer
from agentjax.rewards.composite import make_reward_fn
from agentjax.rewards.judge import JudgeError, LLMJudge
from agentjax.rewards.judge_http import ChatJudgeModel
from agentjax.engine.protocol import SamplingParams
from agentjax.agents.pool import RolloutPool
from tests.rewards.episodes import TWO_HOP, episode
from tests.rewards.test_judge import NO, YES
from tests.agents.fakes import CORPUS, ScriptedEngine, ToyEnv

LOG = episode(TWO_HOP, "<answer> Dara Voss </answer>")


def chat_reply(*texts):
    return {"choices": [{"index": i, "message": {"role": "assistant", "content": t},
                         "finish_reason": "stop"} for i, t in enumerate(texts)]}


def server(*replies):
    """A transport answering with `replies` in turn (httpx.Response or a JSON body);
    the requests it saw are in `.seen`."""
    queue = list(replies)

    def handle(request):
        handle.seen.append(request)
        reply = queue.pop(0)
        return reply if isinstance(reply, httpx.Response) else httpx.Response(200, json=reply)

    handle.seen = []
    return handle


def model(handler, **options):
    return ChatJudgeModel("http://judge.test:30000", "judge-7b", backoff_s=0.001,
                          transport=httpx.MockTransport(handler), **options)


def test_asks_the_chat_endpoint_for_n_replies_to_the_prompt():
    handler = server(chat_reply(YES, NO, None))
    judge = LLMJudge(model(handler, temperature=0.7, max_tokens=64), votes_per_model=3)
    verdict = asyncio.run(judge.averdict(TWO_HOP, LOG))
    assert (verdict.yes, verdict.no, verdict.unparsable, verdict.score) == (1, 1, 1, 0.0)
    [request] = handler.seen
    assert str(request.url) == "http://judge.test:30000/v1/chat/completions"
    assert json.loads(request.content) == {
        "model": "judge-7b", "n": 3,
        "messages": [{"role": "user", "content": judge.prompt(TWO_HOP, LOG)}], "temperature": 0.7, "max_tokens": 64}


def test_a_full_endpoint_url_is_kept():
    handler = server(chat_reply(YES))
    url = "http://judge.test/api/v1/chat/completions"
    judge = LLMJudge(ChatJudgeModel(url, "m", transport=httpx.MockTransport(handler)))
    assert judge(TWO_HOP, LOG) == 1.0
    assert str(handler.seen[0].url) == url


def test_server_errors_and_malformed_replies_are_retried():
    handler = server(httpx.Response(503, text="busy"), {"choices": []}, chat_reply(YES))
    assert LLMJudge(model(handler))(TWO_HOP, LOG) == 1.0
    assert len(handler.seen) == 3


@pytest.mark.parametrize("replies, attempts, phrase", [
    ([httpx.Response(404, text="model 'judge-7b' not found")], 1, "HTTP 404"),
    ([httpx.Response(500, text="oom")] * 3, 3, "3 attempts failed; last: HTTP 500"),
    ([{"choices": [{"message": {"content": 3}}]}] * 3, 3, "no message with string content"),
    ([httpx.Response(200, content=b"<html>")] * 3, 3, "not JSON"),
    ([chat_reply("I think it is fine.")], 1, "I think it is fine."),
])
def test_no_verdict_is_a_judge_error_naming_why(replies, attempts, phrase):
    handler = server(*replies)
    with pytest.raises(JudgeError, match="no judge gave a verdict") as info:
        LLMJudge(model(handler))(TWO_HOP, LOG)
    assert phrase in str(info.value)
    assert len(handler.seen) == attempts


def test_bad_arguments():
    with pytest.raises(ValueError, match="http"):
        ChatJudgeModel("judge.test:30000", "m")
    with pytest.raises(ValueError, match="model name"):
        ChatJudgeModel("http://judge.test", "")


def test_in_the_rollout_pool_verdicts_are_rewards_and_no_verdict_fails_the_episode():
    """The pool calls the reward from its worker threads while its event loop runs."""
    tokenizer = build_tokenizer(CORPUS * 4, vocab_size=384)

    def handle(request):
        prompt = json.loads(request.content)["messages"][0]["content"]
        reply = YES if "Task: question 0" in prompt else "no idea"
        return httpx.Response(200, json=chat_reply(reply))

    judge = LLMJudge(model(handle, retries=0))
    reward_fn = make_reward_fn({"components": {"judge": 1.0}}, judge=judge)
    engine = ScriptedEngine(tokenizer, lambda context, index: "<answer>Paris</answer>")
    tasks = [Task(f"t{i}", f"question {i}", ("Paris",)) for i in range(2)]
    with RolloutPool(engine, ToyEnv, tokenizer, concurrency=4, reward_fn=reward_fn) as pool:
        solved, unjudged = pool.collect_sync(tasks, group_size=2,
                                             sampling=SamplingParams(max_new_tokens=16))
    for traj in solved:
        assert traj.final_reward == 1.0 and not traj.metadata["failed"]
        assert traj.metadata["reward_components"] == {"judge": 1.0}
    for traj in unjudged:
        assert traj.metadata["failed"] and traj.final_reward == 0.0
        assert "JudgeError: no judge gave a verdict on task 't1'" in traj.metadata["error"]
        assert "no idea" in traj.metadata["reward_error"]
