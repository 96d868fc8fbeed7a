"""The openai_agent suite (env.name="openai_agent"): a user's agent (env.agent) plays
the tasks of another env (env.agent_tasks) through the OpenAI-compatible endpoint, and
that env's reward function scores what it returns (runner.py; docs/agents.md)."""
from __future__ import annotations

from agentjax.config.choices import AGENT_ENV
from agentjax.envs.openai_agent.runner import AgentRunner, load_agent
from agentjax.envs.registry import SUITES, TaskSuite, register_env


@register_env(AGENT_ENV)
def build_openai_agent_suite(config, data_dir: str) -> TaskSuite:
    """The task env's suite (its tasks, reward, demonstrations, tokenizer texts) with the
    agent as its episode runner."""
    # The task env's builder reads its outcomes through `choices.task_env`.
    suite = SUITES.get(config.env.agent_tasks)(config, data_dir)
    suite.episode_runner = AgentRunner(load_agent(config.env.agent), suite.reward_fn,
                                       suite.success_key,
                                       transport=config.env.agent_transport,
                                       make_env=suite.make_env)
    return suite
