"""The code suite (env.name="code"): write, run and fix programs against tests — the
synthetic code world with its scripted imperfect programmer (data.source="synthetic"),
or a user's HumanEval / MBPP / stdin-stdout task files (data.source="files", the
canonical solutions as SFT demonstrations).

The reward: reward.outcome "tests" (the fraction of hidden tests passed) or "em" (1
only when every one passes: all-or-nothing), both logged; format (reward.format_weight, the code
env's `code_format`) and tool shaping (reward.tool_weight) as for search. An episode
succeeds when it passes every hidden test.
"""
from __future__ import annotations

import concurrent.futures
from typing import Sequence

import numpy as np

from agentjax.config.choices import OUTCOMES
from agentjax.core.task import Task
from agentjax.data.demonstrations import Demonstration, DemoTurn
from agentjax.data.rows import accept_rows
from agentjax.envs.code import world as code_world
from agentjax.envs.code.tasks import load_code_tasks, verify_solutions
from agentjax.envs.code.env import (DEFAULT_INSTRUCTION, MINIMAL_INSTRUCTION, CodeEnv,
                                    final_block, run_call, system_prompt)
from agentjax.envs.python.env import default_sandbox
from agentjax.envs.turns import NATIVE, native_demonstration
from agentjax.envs.registry import (TaskSuite, parse_counts, register_env, reward_config,
                                    turn_texts)
from agentjax.rewards.composite import make_reward_fn

# Per test: a program of these tasks runs in milliseconds; a hang costs this much.
TEST_TIMEOUT_S = 2.0
TEST_MEMORY_MB = 512
# Demonstrations (and baseline episodes) played at once: each waits on the sandbox.
PLAY_WORKERS = 16


def code_reward_fn(config, sandbox, *, timeout_s: float = TEST_TIMEOUT_S,
                   memory_mb: int = TEST_MEMORY_MB):
    """The composite of reward_config with the code env's terms: the outcome terms run
    the hidden tests in `sandbox` with these per-test limits, the format term is
    `code_format`."""
    components = reward_config(config)["components"]
    # code_format reads validity and the submission, whatever the call format.
    format_spec = components.pop("format")
    components["code_format"] = (format_spec["weight"] if isinstance(format_spec, dict)
                                 else format_spec)
    for name in OUTCOMES["code"].values():
        components[name] = {"weight": components[name], "timeout_s": timeout_s,
                            "memory_mb": memory_mb}
    return make_reward_fn({"components": components}, sandbox=sandbox)


def canonical_demonstration(env: CodeEnv, task: Task) -> Demonstration:
    """A task's canonical solution as an episode: run against the visible tests (when
    the env allows a second turn and the task has any), then submitted."""
    messages = env.reset(task)
    solution = task.metadata["solution"]
    turns = []
    if env.max_turns >= 2 and task.metadata.get("visible_tests"):
        action = run_call(solution)
        result = env.step(action)
        turns.append(DemoTurn(action, result.observation, True))
    action = final_block(solution)
    env.step(action)
    turns.append(DemoTurn(action, None, True))
    return Demonstration(task, messages, turns, env.log, 0.0, "canonical")


def _play(play, tasks: Sequence[Task]) -> list[Demonstration]:
    """`play(index, task)` for every task, PLAY_WORKERS at once, in order."""
    with concurrent.futures.ThreadPoolExecutor(PLAY_WORKERS) as pool:
        return list(pool.map(play, range(len(tasks)), tasks))


def _load(path: str, config, sandbox) -> list[Task]:
    skip = config.data.skip_bad_rows
    tasks = accept_rows(load_code_tasks(path), path, skip_bad_rows=skip)
    return accept_rows(verify_solutions(tasks, sandbox, path=path, timeout_s=TEST_TIMEOUT_S,
                                        memory_mb=TEST_MEMORY_MB), path, skip_bad_rows=skip)


@register_env("code")
def build_code_suite(config, data_dir: str) -> TaskSuite:
    """Code tasks with a sandboxed `run` tool (module docstring)."""
    sandbox = default_sandbox()
    minimal = config.env.instruction == "minimal"
    env_kwargs = dict(max_turns=config.env.max_turns, timeout_s=TEST_TIMEOUT_S,
                      max_failures_shown=config.env.failures_shown,
                      submit_at_limit=config.env.submit_at_limit,
                      memory_mb=TEST_MEMORY_MB, tool_prompt=not minimal,
                      instruction=MINIMAL_INSTRUCTION if minimal else DEFAULT_INSTRUCTION,
                      tool_format={"default": "hermes_prompt"}.get(config.env.tool_format,
                                                                   config.env.tool_format),
                      tool_parser=config.env.tool_parser)

    def make_env():
        return CodeEnv(sandbox, **env_kwargs)

    def text_env(**kwargs):  # the format the demonstrators write
        return CodeEnv(sandbox, **{**env_kwargs, "tool_format": "hermes_prompt", **kwargs})

    rewards = code_reward_fn(config, sandbox)
    success_key = OUTCOMES["code"]["em"]
    baselines = {}
    if config.data.source == "synthetic":
        world = code_world.CodeWorldConfig(
            seed=config.data.world_seed, depth=config.data.code_depth,
            train_tasks=sum(parse_counts(config.data.train_questions).values()),
            test_tasks=sum(parse_counts(config.data.test_questions).values()))
        train_tasks, test_tasks = code_world.make_code_splits(world)
        coder = code_world.ScriptedCoder(code_world.CoderConfig(
            "demonstrator", p_guess=config.sft.guess_prob,
            p_wrong_first=config.sft.wrong_first_prob), depth=config.data.code_depth)

        def play(index, task, split="train"):
            rng = np.random.default_rng([config.data.world_seed, index, split == "test"])
            # The coder's programs are the world's own: run in-process, not sandboxed.
            env = text_env(tests_runner=code_world.run_world_tests)
            return coder.run(env, task, rng)

        demos = _play(play, train_tasks[:config.sft.num_demos] if config.sft.steps else [])
        # The demonstrator's held-out success (every hidden test passed).
        measured = _play(lambda i, t: play(i, t, "test"), test_tasks)
        wins = [code_world.solves(d.log.final_answer, d.task.metadata["tests"])
                for d in measured]
        baselines["demonstrator"] = {"success": float(np.mean(wins)), "by_hops": {}}
    else:
        train_tasks = _load(config.data.train_path, config, sandbox)
        test_tasks = _load(config.data.test_path, config, sandbox) if config.data.test_path else []
        with_solution = [t for t in train_tasks if t.metadata.get("solution")]
        demos = (_play(lambda i, t: canonical_demonstration(text_env(), t),
                       with_solution[:config.sft.num_demos]) if config.sft.steps else [])
    texts = [DEFAULT_INSTRUCTION, system_prompt(config.env.submit_at_limit)]
    texts += [t.question for t in train_tasks + test_tasks]
    texts += turn_texts(demos)
    if env_kwargs["tool_format"] == NATIVE:  # the calls in the policy's own format
        demos = [native_demonstration(d, text_env(), make_env()) for d in demos]
    return TaskSuite(train_tasks, test_tasks, make_env, rewards, success_key, "tool", demos,
                     texts, baselines, tools=make_env().template_tools)
