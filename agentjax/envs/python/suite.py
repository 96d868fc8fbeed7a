"""The python suite (env.name="python"): arithmetic with a sandboxed python tool
(hermes-style tool calls), and scripted demonstrations for SFT."""
from __future__ import annotations

import json

import numpy as np

from agentjax.config.choices import OUTCOMES
from agentjax.core.task import Task
from agentjax.data.demonstrations import Demonstration, DemoTurn
from agentjax.envs.python.arith import make_arith_splits
from agentjax.envs.base import Env
from agentjax.envs.python.env import DEFAULT_INSTRUCTION, PythonEnv
from agentjax.envs.turns import NATIVE
from agentjax.envs.registry import (TaskSuite, parse_counts, register_env, reward_fn,
                                    turn_texts)


def _arith_demonstration(task: Task, rng: np.random.Generator, guess_prob: float,
                         env: Env) -> Demonstration:
    """A scripted python-tool episode: compute with the tool (or guess), then answer."""
    messages = env.reset(task)
    turns = []
    if rng.random() >= guess_prob:
        code = f"print({task.metadata.get('expression', task.question)})"
        action = ('<tool_call>{"name": "python", "arguments": {"code": '
                  + json.dumps(code) + "}}</tool_call>")
        observation, done, _, info = env.step(action)
        turns.append(_demo_turn(env, action, info, None if done else observation))
        answer = observation.strip().splitlines()[-1] if observation.strip() else "0"
    else:
        answer = str(int(rng.integers(0, 10 ** 6)))
    if not env.log.done:
        action = f"<answer> {answer} </answer>"
        _, _, _, info = env.step(action)
        turns.append(_demo_turn(env, action, info, None))
    return Demonstration(task, messages, turns, env.log, 0.0, "arith")


def _demo_turn(env: PythonEnv, action: str, info: dict, observation: str | None) -> DemoTurn:
    """A native env's turn is the assistant message it parsed and the messages answering
    it (rendered in the model's own format by Trajectory.from_demonstration)."""
    if env.tool_format != NATIVE:
        return DemoTurn(action, observation, True)
    assistant, *answers = info["messages"]
    return DemoTurn(assistant, None if observation is None else answers, True)


@register_env("python")
def build_python_suite(config, data_dir: str) -> TaskSuite:
    """Arithmetic with a sandboxed python tool (hermes-style tool calls)."""
    counts = parse_counts(config.data.train_questions)
    train_tasks, test_tasks = make_arith_splits(
        sum(counts.values()), sum(parse_counts(config.data.test_questions).values()),
        seed=config.data.world_seed)
    tool_format = {"default": "hermes_prompt"}.get(config.env.tool_format,
                                                    config.env.tool_format)
    env_kwargs = dict(max_turns=config.env.max_turns, tool_format=tool_format,
                      tool_parser=config.env.tool_parser)

    def make_env():
        return PythonEnv(**env_kwargs)

    rewards = reward_fn(config)
    rng = np.random.default_rng(config.data.world_seed)
    demos = []
    for task in train_tasks[:config.sft.num_demos] if config.sft.steps else []:
        # The demonstrator writes hermes calls; a native demonstration is re-rendered
        # in the policy's own format.
        demo = _arith_demonstration(task, rng, config.sft.guess_prob,
                                    PythonEnv(**{**env_kwargs, "tool_parser": "hermes"}))
        demo.reward = rewards(task, demo.log)[0]
        demos.append(demo)
    texts = [DEFAULT_INSTRUCTION] + [t.question for t in train_tasks + test_tasks]
    texts += turn_texts(demos)
    success = float(np.mean([d.reward >= 1 for d in demos])) if demos else 0.0
    baselines = {"demonstrator": {"success": success, "by_hops": {}}} if demos else {}
    tools = make_env().template_tools
    return TaskSuite(train_tasks, test_tasks, make_env, rewards, OUTCOMES["python"]["em"],
                     "tool", demos, texts, baselines, tools=tools)
