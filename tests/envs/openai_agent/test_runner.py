"""The agent API: `async def agent(client, task)` rolled out by the pool through the
endpoint's app, its calls merged into trajectories and segments."""
import asyncio
import dataclasses
import json
import os
import subprocess
import sys
import time

import pytest

from agentjax.agents.pool import RolloutPool
from agentjax.core.task import Task
from agentjax.endpoint.sessions import RecordedCall
from agentjax.engine.protocol import EnginesUnavailable, SamplingParams
from agentjax.envs.openai_agent.calls import merge_calls
from agentjax.envs.openai_agent.runner import AgentRunner, load_agent
from agentjax.envs.retrieval import Document
from agentjax.envs.search.env import SearchEnv
from agentjax.models.chat import hermes_call_text
from agentjax.train.episodes import (EpisodesFailed, check_failures, episode_segments,
                                     render_episode)
from tests.agents.fakes import ScriptedEngine
from tests.train.runs import ROOT

EXAMPLES = os.path.join(ROOT, "examples")
TASKS = [Task(f"t{i}", f"question {i}", answers=("Paris",)) for i in range(3)]
SAMPLING = SamplingParams(max_new_tokens=64, seed=3)


def _call(prompt, completion, version=1):
    return RecordedCall(tuple(prompt), tuple(completion), tuple(-0.1 * t for t in completion),
                        (version,) * len(completion), "stop", version, (), (), "sampling")


def test_calls_merge_while_prompts_extend_and_start_segments_where_not():
    calls = [_call([1, 2], [3, 4]),
             _call([1, 2, 3, 4, 5], [6]),             # extends: observation [5]
             _call([1, 2, 3, 4, 5, 6], [7, 8], 2),     # extends: empty observation
             _call([1, 9], [10]),                      # rewritten history: new segment
             _call([1, 9, 10, 11, 12], [13])]          # extends the new segment
    rollout = merge_calls(calls, task=TASKS[0], group_id=4)
    [first] = rollout.segments
    assert first.prompt_ids == [1, 2] and [t.action_ids for t in first.turns] == [[3, 4], [6],
                                                                                 [7, 8]]
    assert [t.observation_ids for t in first.turns] == [[5], [], []]
    assert first.turns[2].versions == [2, 2] and first.turns[2].logprobs == pytest.approx(
        [-0.7, -0.8])
    # The segments' tokens are exactly the calls' contexts: nothing re-tokenized.
    assert list(first.token_ids) == [1, 2, 3, 4, 5, 6, 7, 8]
    assert list(rollout.token_ids) == [1, 9, 10, 11, 12, 13]
    assert list(rollout.action_mask) == [0, 0, 1, 0, 0, 1]
    assert rollout.metadata == {"calls": 5, "calls_extended": 3, "merge_reused_tokens": 4 + 6 + 3,
                                "calls_aborted": 0}
    assert (rollout.group_id, rollout.task_id) == (4, "t0")


def test_aborted_calls_are_skipped_and_counted():
    # The endpoint records a call whose client went away as an abort with no completion;
    # the agent's retry of the same prompt is the call that trains.
    aborted = dataclasses.replace(_call([1, 2], []), finish_reason="abort", versions=())
    rollout = merge_calls([aborted, _call([1, 2], [3, 4]), aborted, _call([1, 2, 3, 4, 5], [6])])
    assert rollout.segments == [] and list(rollout.token_ids) == [1, 2, 3, 4, 5, 6]
    assert [t.finish_reason for t in rollout.turns] == ["stop", "stop"]
    assert rollout.metadata == {"calls": 2, "calls_extended": 1, "merge_reused_tokens": 4,
                                "calls_aborted": 2}


def _engine(tokenizer, latency_s=0.0):
    """Answers "Paris" once the conversation holds a tool result, else calls `lookup`."""
    def script(context, index):
        if "xof" in tokenizer.decode(context):
            return "<answer>Paris</answer><|im_end|>"
        # As the template writes the call back when the agent re-sends it: the next
        # prompt then extends this one token for token.
        return CALL + "<|im_end|>"
    return ScriptedEngine(tokenizer, script, latency_s=latency_s)


CALL = hermes_call_text({"name": "lookup", "arguments": {"q": "fox"}})
TOOLS = [{"type": "function", "function": {
    "name": "lookup", "description": "looks a word up",
    "parameters": {"type": "object", "properties": {"q": {"type": "string"}},
                   "required": ["q"]}}}]


async def tool_agent(client, task):
    """A multi-turn tool-using agent on the plain openai client; keeps its history."""
    messages = [{"role": "user", "content": task.question}]
    for _ in range(4):
        reply = await client.chat.completions.create(model="policy", messages=messages,
                                                     tools=TOOLS)
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            return {"answer": message.content.replace("<answer>", "").replace("</answer>", "")}
        for call in message.tool_calls:
            messages.append({"role": "tool", "tool_call_id": call.id, "content": "xof"})
    return {"answer": ""}


def _reward(task, log):
    correct = float(log.final_answer == task.answers[0])
    return correct, {"em": correct}


def _pool(tokenizer, agent, engine, **kwargs):
    runner = AgentRunner(agent, _reward, "em")
    return RolloutPool(engine, None, tokenizer, runner=runner, **kwargs), runner


def test_a_tool_using_agent_trains_through_the_pool(tokenizer):
    pool, runner = _pool(tokenizer, tool_agent, _engine(tokenizer), concurrency=8)
    with pool:
        groups = pool.collect_sync(TASKS, group_size=2, sampling=SAMPLING)
    for group in groups:
        assert len(group) == 2 and len({t.group_id for t in group}) == 1
        for traj in group:
            assert not traj.metadata["failed"], traj.metadata["error"]
            assert traj.final_reward == 1.0 and traj.metadata["reward_components"] == {"em": 1.0}
            # The agent kept its history: one segment, two action turns, the tool
            # result between them an observation.
            assert traj.metadata["calls"] == 2 and traj.metadata["calls_extended"] == 1
            assert len(traj.turns) == 2 and not traj.segments
            assert "xof" in tokenizer.decode(traj.turns[0].observation_ids)
    # The session's sampling is the run's: each episode its own seed.
    seeds = {r.sampling.seed for r in pool.engine.requests}
    assert len(seeds) == 6 and SAMPLING.seed not in seeds
    assert not runner.sessions._open  # every session closed


async def summarizing_agent(client, task):
    """Keeps a summary instead of its history: no prompt extends the one before."""
    summary = task.question
    for turn in range(3):
        reply = await client.chat.completions.create(
            model="policy", messages=[{"role": "user", "content": f"{turn}: {summary}"}])
        summary = reply.choices[0].message.content[:20]
    return 1.0


def test_an_agent_that_summarizes_its_history_gives_segments(tokenizer):
    pool, _ = _pool(tokenizer, summarizing_agent, _engine(tokenizer), concurrency=4)
    with pool:
        [[traj]] = pool.collect_sync(TASKS[:1], group_size=1, sampling=SAMPLING)
    assert len(traj.segments) == 2 and traj.metadata["calls_extended"] == 0
    assert traj.final_reward == 1.0 and traj.metadata["reward_components"]["em"] == 1.0
    assert all(s.final_reward == 0 and len(s.turns) == 1 for s in traj.segments)


async def one_call_agent(client, task):
    reply = await client.chat.completions.create(
        model="policy", messages=[{"role": "user", "content": task.question}])
    return {"answer": reply.choices[0].message.content}


def test_hundreds_of_agents_run_at_once_on_one_loop(tokenizer):
    """208 agents, each one call of 100 ms on the engine: all in flight together, so the
    collection takes a fraction of the 20.8 s they would take one after another."""
    engine = _engine(tokenizer, latency_s=0.1)
    tasks = [Task(f"t{i}", "q", answers=("Paris",)) for i in range(52)]
    pool, runner = _pool(tokenizer, one_call_agent, engine, concurrency=256)
    start = time.perf_counter()
    with pool:
        groups = pool.collect_sync(tasks, group_size=4, sampling=SAMPLING)
    elapsed = time.perf_counter() - start
    episodes = [t for g in groups for t in g]
    assert len(episodes) == 208 and not any(t.metadata["failed"] for t in episodes)
    assert engine.max_in_flight >= 200, engine.max_in_flight
    assert elapsed < 10, elapsed
    assert not runner.sessions._open


async def raising_agent(client, task):
    await client.chat.completions.create(model="p", messages=[{"role": "user", "content": "x"}])
    raise ValueError(f"the agent broke on {task.task_id}")


def test_an_agent_that_raises_is_a_failed_episode_and_all_failing_says_why(tokenizer):
    pool, _ = _pool(tokenizer, raising_agent, _engine(tokenizer), concurrency=4)
    with pool:
        groups = pool.collect_sync(TASKS, group_size=2, sampling=SAMPLING)
    episodes = [t for g in groups for t in g]
    for traj in episodes:
        meta = traj.metadata
        assert meta["failed"] and meta["stop_reason"] == "agent_error"
        first, *rest = meta["error"].splitlines()
        assert first.startswith("agent raised ValueError: the agent broke on t")
        assert "Traceback" in rest[0] and "raising_agent" in meta["error"]
        assert len(traj.turns) == 1  # its call is kept
    with pytest.raises(EpisodesFailed, match="agent raised ValueError: the agent broke"):
        check_failures(episodes, where="RL step 1", fatal=True)


async def slow_agent(client, task):
    await client.chat.completions.create(model="p", messages=[{"role": "user", "content": "x"}])
    await asyncio.sleep(30)
    return 1.0


async def silent_agent(client, task):
    return 1.0


async def wrong_return_agent(client, task):
    await client.chat.completions.create(model="p", messages=[{"role": "user", "content": "x"}])
    return "Paris"


@pytest.mark.parametrize("agent, reason, message", [
    (slow_agent, "timeout", "agent exceeded the episode timeout_s=0.5"),
    (silent_agent, "agent_error", "the agent made no model call"),
    (wrong_return_agent, "agent_error", "must return its reward"),
])
def test_timeouts_and_bad_agents_are_flagged_and_their_sessions_closed(tokenizer, agent,
                                                                       reason, message):
    pool, runner = _pool(tokenizer, agent, _engine(tokenizer), concurrency=4,
                         episode_timeout_s=0.5)
    start = time.perf_counter()
    with pool:
        [[traj]] = pool.collect_sync(TASKS[:1], group_size=1, sampling=SAMPLING)
    assert time.perf_counter() - start < 5
    assert traj.metadata["failed"] and traj.metadata["stop_reason"] == reason
    assert message in traj.metadata["error"]
    assert not runner.sessions._open


class _GoneEngine:
    async def generate(self, requests):
        raise EnginesUnavailable("every server is gone")

    def end_session(self, session_id):
        pass


def test_no_engine_left_ends_the_rollout_not_the_agent(tokenizer):
    """The client wraps what the app raised; the runner finds it and raises it, for the
    trainer to checkpoint and exit (as the env loop does)."""
    pool, runner = _pool(tokenizer, one_call_agent, _GoneEngine(), concurrency=2)
    with pool, pytest.raises(EnginesUnavailable, match="every server is gone"):
        pool.collect_sync(TASKS[:1], group_size=2, sampling=SAMPLING)
    assert not runner.sessions._open


def test_samples_show_every_segment(tokenizer):
    pool, _ = _pool(tokenizer, summarizing_agent, _engine(tokenizer), concurrency=2)
    with pool:
        [[traj]] = pool.collect_sync(TASKS[:1], group_size=1, sampling=SAMPLING)
    parts = episode_segments(traj, tokenizer)
    assert [p.kind for p in parts] == ["prompt", "action"] * 3
    assert [p.turn for p in parts if p.kind == "action"] == [1, 2, 3]
    assert render_episode(traj, tokenizer).count("#### prompt") == 3


def test_load_agent_names_what_is_wrong():
    assert load_agent("tests.envs.openai_agent.test_runner:tool_agent") is tool_agent
    assert load_agent(f"{EXAMPLES}/tool_agent.py:agent").__name__ == "agent"
    for spec, error in [("nocolon", "package.module:function"),
                        ("no/such/file.py:agent", "no file"),
                        ("tests.envs.openai_agent.test_runner:missing", "AttributeError"),
                        ("tests.envs.openai_agent.test_runner:_reward", "async def")]:
        with pytest.raises(ValueError, match=error):
            load_agent(spec)


# A CLI agent: its own process, the sync openai client, the URL it was given.
CLI_AGENT = """
import json, sys
import openai
client = openai.OpenAI(base_url=sys.argv[1], api_key="x", max_retries=0)
messages = [{"role": "user", "content": sys.argv[2]}]
tools = json.loads(sys.argv[3])
for _ in range(4):
    message = client.chat.completions.create(model="policy", messages=messages,
                                             tools=tools).choices[0].message
    messages.append(message.model_dump(exclude_none=True))
    if not message.tool_calls:
        print(message.content.replace("<answer>", "").replace("</answer>", ""))
        break
    for call in message.tool_calls:
        messages.append({"role": "tool", "tool_call_id": call.id, "content": "xof"})
"""


async def cli_agent(client, task):
    url = str(client.base_url)
    assert url.startswith("http://127.0.0.1:") and "/sessions/" in url, url
    done = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-c", CLI_AGENT, url, task.question, json.dumps(TOOLS)],
        capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return {"answer": done.stdout.strip()}


def test_over_http_a_subprocess_agent_trains_through_a_real_url(tokenizer):
    runner = AgentRunner(cli_agent, _reward, "em", transport="http")
    pool = RolloutPool(_engine(tokenizer), None, tokenizer, runner=runner, concurrency=4)
    with pool:
        groups = pool.collect_sync(TASKS[:2], group_size=2, sampling=SAMPLING)
        [server] = runner._servers.values()
        # A second step runs on a new event loop; the server and its sessions go on.
        again = pool.collect_sync(TASKS[2:], group_size=1, sampling=SAMPLING)
    for traj in [t for group in groups + again for t in group]:
        assert not traj.metadata["failed"], traj.metadata["error"]
        assert traj.final_reward == 1.0
        assert traj.metadata["calls"] == 2 and traj.metadata["calls_extended"] == 1
        assert "xof" in tokenizer.decode(traj.turns[0].observation_ids)
    assert not runner._servers and not server._thread.is_alive()  # closed with the pool
    with pytest.raises(ValueError, match="transport must be one of"):
        AgentRunner(cli_agent, _reward, "em", transport="tcp")


class _OneDocRetriever:
    def search(self, queries, topk):
        return [[Document("d1", "Fox", f"The fox of {queries[0]} lives in Paris.")]]


def test_run_tool_runs_a_call_as_a_step_does_and_says_what_is_wrong():
    env = SearchEnv(_OneDocRetriever(), action_format="native")
    assert "lives in Paris" in env.run_tool("search", '{"query": "x"}')
    assert env.run_tool("search", {"query": "x"}) == env.run_tool("search", '{"query": "x"}')
    for name, arguments, problem in [
            ("search", "{not json", "arguments are not JSON"),
            ("search", "[1]", "arguments must be a JSON object"),
            ("lookup", "{}", "unknown tool 'lookup'; available: search"),
            ("search", '{"q": "x"}', "search:"),
            ("search", '{"query": " "}', "empty query")]:
        result = env.run_tool(name, arguments)
        assert problem in result and "Invalid" in result, (name, arguments, result)


def _search_engine(tokenizer):
    """Searches once, then answers "Paris" when the documents are in the context."""
    def script(context, index):
        if "lives in Paris" in tokenizer.decode(context):
            return "<answer>Paris</answer><|im_end|>"
        return hermes_call_text({"name": "search", "arguments": {"query": "fox"}}) + "<|im_end|>"
    return ScriptedEngine(tokenizer, script)


def test_the_example_agent_plays_a_built_in_env_with_the_env_it_is_handed(tokenizer):
    agent = load_agent(f"{EXAMPLES}/tool_agent.py:agent")

    made = []

    def make_env():
        made.append(SearchEnv(_OneDocRetriever(), action_format="native", max_turns=3))
        return made[-1]

    runner = AgentRunner(agent, _reward, "em", make_env=make_env)
    pool = RolloutPool(_search_engine(tokenizer), None, tokenizer, runner=runner)
    with pool:
        [group] = pool.collect_sync(TASKS[:1], group_size=2, sampling=SAMPLING)
    assert len(made) == 2  # a fresh env per episode
    for traj in group:
        assert not traj.metadata["failed"], traj.metadata["error"]
        assert traj.final_reward == 1.0 and len(traj.turns) == 2 and not traj.segments
        observation = tokenizer.decode(traj.turns[0].observation_ids)
        assert "The fox of fox lives in Paris." in observation
    # The prompt is the env's own: its instruction and its tool schema.
    prompt = tokenizer.decode(group[0].prompt_ids)
    assert '"name": "search"' in prompt and "question 0" in prompt


def test_an_agent_that_takes_env_needs_a_runner_that_builds_one():
    agent = load_agent(f"{EXAMPLES}/tool_agent.py:agent")

    with pytest.raises(ValueError, match="takes `env`"):
        AgentRunner(agent, _reward, "em")


class _StopStringEngine(ScriptedEngine):
    """Ends a completion at the request's stop string, as the engines do (matched_stop;
    the endpoint then leaves it out of the reply's content, as OpenAI's API does)."""

    async def generate(self, requests):
        out = await super().generate(requests)
        for request, [completion] in zip(requests, out):
            text = self.tokenizer.decode(completion.output_ids)
            completion.matched_stop = next(
                (s for s in request.sampling.stop if text.endswith(s)), None)
        return out


def _searches_then_answers(tokenizer):
    def script(context, index):
        if "lives in Paris" in tokenizer.decode(context):
            return "<answer> Paris </answer>"
        return "<search> fox </search>"
    return _StopStringEngine(tokenizer, script)


def _reward_with_searches(task, log):
    """Exact match plus 0.1 a search: a term only the env's episode log can give."""
    searches = sum(turn.kind == "search" for turn in log.turns)
    correct = float(log.final_answer == task.answers[0])
    return correct + 0.1 * searches, {"em": correct, "searches": searches}


def test_an_agent_that_plays_its_env_is_scored_on_the_env_log_token_for_token(tokenizer):
    agent = load_agent(f"{EXAMPLES}/search_r1_agent.py:agent")
    played = []

    def make_env():
        played.append(SearchEnv(_OneDocRetriever(), max_turns=3))
        return played[-1]

    runner = AgentRunner(agent, _reward_with_searches, "em", make_env=make_env)
    pool = RolloutPool(_searches_then_answers(tokenizer), None, tokenizer, runner=runner)
    with pool:
        [[traj]] = pool.collect_sync(TASKS[:1], group_size=1, sampling=SAMPLING)
    assert not traj.metadata["failed"], traj.metadata["error"]
    [env] = played
    assert traj.metadata["env_log"] is env.log and traj.metadata["stop_reason"] == "answer"
    assert traj.final_reward == pytest.approx(1.1)
    assert traj.metadata["reward_components"] == {"em": 1.0, "searches": 1}
    # The closing tag the server left out of the reply went back into the history, so
    # the second prompt extends the first call's prompt and completion token for token.
    assert traj.metadata["calls_extended"] == 1 and not traj.segments
    assert [tokenizer.decode(t.action_ids) for t in traj.turns] == [
        "<search> fox </search>", "<answer> Paris </answer>"]
    assert "<information>" in tokenizer.decode(traj.turns[0].observation_ids)


def test_restore_stop_closes_only_the_tag_a_stop_string_cut():
    restore = load_agent(f"{EXAMPLES}/search_r1_agent.py:agent").__globals__["restore_stop"]
    assert restore("<search> fox ", "stop") == "<search> fox </search>"
    assert restore("x <answer> Paris ", "stop") == "x <answer> Paris </answer>"
    assert restore("<search> a </search> then", "stop") == "<search> a </search> then"
    assert restore("<search> fox ", "length") == "<search> fox "
