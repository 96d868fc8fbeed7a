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
from agentjax.envs.mcp import mcp_manager
from agentjax.envs.python.env import DEFAULT_INSTRUCTION, PythonEnv
from agentjax.envs.registry import (TaskSuite, parse_counts, register_env, reward_fn,
                                    turn_texts)
from agentjax.envs.turns import NATIVE, native_demonstration

# The format the scripted demonstrator writes (hermes calls, the schemas in the prompt).
TEXT_FORMAT = "hermes_prompt"


def _arith_demonstration(task: Task, rng: np.random.Generator, guess_prob: float,
                         partial_prob: float, env: Env) -> Demonstration:
    """A scripted python-tool episode: compute with the tool (or guess), then answer.
    `partial_prob`: on an expression of >= 3 operands, the tool computes it without its
    last operand and that sub-result is the answer (wrong). Unlike a guess, this error
    keeps the tool call and sits at one token of the call (the operator or the closing
    parenthesis after the second-to-last operand): a greedy SFT policy copies whichever
    branch the demonstrations favour there, sampling explores the other."""
    messages = env.reset(task)
    turns = []
    if rng.random() >= guess_prob:
        expression = task.metadata.get("expression", task.question)
        # rng draws only where the setting is on: other recipes' demonstrations unchanged.
        if partial_prob and len(expression.split()) >= 5 and rng.random() < partial_prob:
            expression = expression.rsplit(" ", 2)[0]
        code = f"print({expression})"
        action = ('<tool_call>{"name": "python", "arguments": {"code": '
                  + json.dumps(code) + "}}</tool_call>")
        observation, done, _, _ = env.step(action)
        turns.append(DemoTurn(action, None if done else observation, True))
        answer = observation.strip().splitlines()[-1] if observation.strip() else "0"
    else:
        answer = str(int(rng.integers(0, 10 ** 6)))
    if not env.log.done:
        action = f"<answer> {answer} </answer>"
        env.step(action)
        turns.append(DemoTurn(action, None, True))
    return Demonstration(task, messages, turns, env.log, 0.0, "arith")


@register_env("python")
def build_python_suite(config, data_dir: str) -> TaskSuite:
    """Arithmetic with a sandboxed python tool (hermes-style tool calls)."""
    counts = parse_counts(config.data.train_questions)
    train_tasks, test_tasks = make_arith_splits(
        sum(counts.values()), sum(parse_counts(config.data.test_questions).values()),
        seed=config.data.world_seed)
    tool_format = {"default": TEXT_FORMAT}.get(config.env.tool_format, config.env.tool_format)
    env_kwargs = dict(max_turns=config.env.max_turns, tool_format=tool_format,
                      tool_parser=config.env.tool_parser)
    # Started (and their tools listed) here, before any training; one set of tools per env.
    mcp = mcp_manager(config.env.mcp_servers, reserved=("python",))

    def make_env():
        return PythonEnv(**env_kwargs, tools=mcp.tools() if mcp else ())

    def text_env():
        return PythonEnv(**{**env_kwargs, "tool_format": TEXT_FORMAT})

    rewards = reward_fn(config)
    rng = np.random.default_rng(config.data.world_seed)
    demos = []
    for task in train_tasks[:config.sft.num_demos] if config.sft.steps else []:
        demo = _arith_demonstration(task, rng, config.sft.guess_prob,
                                    config.sft.partial_tool_prob, text_env())
        demo.reward = rewards(task, demo.log)[0]
        demos.append(demo)
    texts = [DEFAULT_INSTRUCTION] + [t.question for t in train_tasks + test_tasks]
    texts += turn_texts(demos)
    if tool_format == NATIVE:  # the demonstrator's calls in the policy's own format
        demos = [native_demonstration(d, text_env(), make_env()) for d in demos]
    success = float(np.mean([d.reward >= 1 for d in demos])) if demos else 0.0
    baselines = {"demonstrator": {"success": success, "by_hops": {}}} if demos else {}
    tools = make_env().template_tools
    return TaskSuite(train_tasks, test_tasks, make_env, rewards, OUTCOMES["python"]["em"],
                     "tool", demos, texts, baselines, tools=tools)
