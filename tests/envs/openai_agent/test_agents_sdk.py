"""A real agent framework, the OpenAI Agents SDK (`openai-agents`), driving a multi-turn
tool-using agent against the endpoint as an `env.agent`: unchanged, its client the one
the runner hands it."""
import pytest

from agentjax.agents.pool import RolloutPool
from agentjax.core.task import Task
from agentjax.agents.loop import EpisodeLimits
from agentjax.engine.protocol import SamplingParams
from agentjax.envs.openai_agent.runner import AgentRunner
from tests.envs.openai_agent.test_runner import _engine

agents = pytest.importorskip("agents")
agents.set_tracing_disabled(True)  # the SDK's traces go to OpenAI's servers otherwise
LOOKUPS = []


@agents.function_tool
def lookup(q: str) -> str:
    """Looks a word up."""
    LOOKUPS.append(q)
    return q[::-1]


async def sdk_agent(client, task):
    """An Agents SDK agent with one tool, on the client the run hands it."""
    agent = agents.Agent(
        name="solver", instructions="Answer the question; look words up with the tool.",
        tools=[lookup],
        model=agents.OpenAIChatCompletionsModel(model="policy", openai_client=client))
    result = await agents.Runner.run(agent, task.question, max_turns=4)
    return {"answer": result.final_output}


def _reward(task, log):
    correct = float("Paris" in (log.final_answer or ""))
    return correct, {"em": correct}


def _collect(tokenizer, engine, sampling, tasks):
    runner = AgentRunner(sdk_agent, _reward, "em")
    with RolloutPool(engine, None, tokenizer, runner=runner, concurrency=4) as pool:
        return pool.collect_sync(tasks, group_size=2, sampling=sampling)


def test_an_agents_sdk_agent_calls_its_tool_and_trains(tokenizer):
    LOOKUPS.clear()
    groups = _collect(tokenizer, _engine(tokenizer), SamplingParams(max_new_tokens=64, seed=0),
                      [Task("t0", "capital of France?", answers=("Paris",))])
    assert LOOKUPS == ["fox", "fox"]  # the SDK ran the tool the model called
    for traj in groups[0]:
        assert not traj.metadata["failed"], traj.metadata["error"]
        assert traj.final_reward == 1.0
        parts = [*traj.segments, traj]
        assert traj.metadata["calls"] == 2 == sum(len(p.turns) for p in parts)
        # The tool's result reached the model: in the second call's context.
        assert "xof" in tokenizer.decode(list(parts[-1].token_ids))


async def sdk_agent_without_tools(client, task):
    agent = agents.Agent(name="solver", instructions="Answer.", model=(
        agents.OpenAIChatCompletionsModel(model="policy", openai_client=client)))
    result = await agents.Runner.run(agent, task.question, max_turns=2)
    return {"answer": result.final_output}


def test_an_agents_sdk_agent_on_the_tiny_jax_engine(engine, tokenizer):
    """The real engine (the shared tiny one: a 96-token context, so no tool schemas in
    the prompt): the trajectory holds exactly the ids it sampled, with their
    log-probs."""
    runner = AgentRunner(sdk_agent_without_tools, _reward, "em")
    with RolloutPool(engine, None, tokenizer, runner=runner, concurrency=2,
                     limits=EpisodeLimits(max_context_tokens=96)) as pool:
        groups = pool.collect_sync([Task("t0", "capital of France?")], group_size=2,
                                   sampling=SamplingParams(max_new_tokens=8, seed=1))
    for traj in groups[0]:
        assert not traj.metadata["failed"], traj.metadata["error"]
        for part in [*traj.segments, traj]:
            assert part.prompt_ids and part.turns
            for turn in part.turns:
                assert 0 < len(turn.action_ids) <= 8
                assert len(turn.logprobs) == len(turn.action_ids)
                assert all(p <= 0 for p in turn.logprobs)
    a, b = groups[0]
    assert a.turns[0].action_ids != b.turns[0].action_ids or a.turns[0].logprobs != \
        b.turns[0].logprobs  # each episode its own seed
