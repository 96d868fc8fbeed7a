"""The synthetic code world: its language, tasks specified by examples, the scripted
programmer's episodes, and the in-process runner that stands in for the sandbox in
demonstrations (it must report exactly what the sandbox reports)."""
import numpy as np
import pytest

from agentjax.envs.code import world
from agentjax.envs import sandbox as sandbox_lib
from agentjax.envs.code.env import CodeEnv
from agentjax.envs.sandbox import Sandbox
from agentjax.rewards import code

CONFIG = world.CodeWorldConfig(seed=3, train_tasks=40, test_tasks=10)


def test_language_and_tasks():
    expressions = world.language()
    assert len(expressions) == len(set(expressions)) == 64
    assert expressions[:2] == ["sorted(x)", "x[::-1]"]
    assert "sum([v * 2 for v in x])" in expressions and "sorted(sorted(x))" not in expressions
    train, test = world.make_code_splits(CONFIG)
    assert (len(train), len(test)) == (40, 10)
    assert not {t.question for t in train} & {t.question for t in test}
    task = test[0]
    expression = task.metadata["expression"]
    # The question is the visible tests; hidden tests are those and three more.
    assert task.question == "\n".join(t.removeprefix("assert ")
                                      for t in task.metadata["visible_tests"])
    assert task.metadata["tests"][:3] == task.metadata["visible_tests"]
    assert len(task.metadata["tests"]) == 6
    for value, want in world.parse_examples(task.question):
        assert world.evaluate(expression, value) == want
    assert world.solves(task.metadata["solution"], task.metadata["tests"])
    assert world.make_code_splits(CONFIG)[1][0] == task  # deterministic


def test_the_depth_one_language_is_its_ten_single_steps():
    one = world.language(1)
    assert one == world.language()[:10] and len(set(one)) == 10
    assert "sorted(x)" in one and "sum(x)" in one and "sum(sorted(x))" not in one
    train, test = world.make_code_splits(world.CodeWorldConfig(seed=3, depth=1,
                                                               train_tasks=60, test_tasks=10))
    assert {t.metadata["expression"] for t in train + test} <= set(one)
    lazy = world.ScriptedCoder(world.CoderConfig(p_guess=1.0), depth=1)
    env, rng = CodeEnv(tests_runner=world.run_world_tests), np.random.default_rng(0)
    guesses = {lazy.run(env, t, rng).log.final_answer.strip() for t in train}
    assert guesses <= {world.program(e) for e in one} and len(guesses) > 5
    with pytest.raises(ValueError, match="depth is 1 or 2"):
        world.language(3)


def test_the_scripted_coder_guesses_or_solves():
    train, _ = world.make_code_splits(CONFIG)
    gold = world.ScriptedCoder()
    lazy = world.ScriptedCoder(world.CoderConfig(p_guess=1.0))
    env = CodeEnv(tests_runner=world.run_world_tests)
    rng = np.random.default_rng(0)
    solved = [gold.run(env, t, rng) for t in train]
    assert all(len(d.turns) == 2 for d in solved)  # run, then submit
    assert np.mean([world.solves(d.log.final_answer, d.task.metadata["tests"])
                    for d in solved]) >= 0.9
    guessed = lazy.run(env, train[0], rng)
    assert len(guessed.turns) == 1 and guessed.log.stop_reason == "answer"
    retry = world.ScriptedCoder(world.CoderConfig(p_wrong_first=1.0)).run(env, train[1], rng)
    assert len(retry.turns) == 3
    assert retry.turns[0].observation.split("\n")[0] != "3 of 3 tests passed."
    assert retry.turns[1].observation == "3 of 3 tests passed."
    single = CodeEnv(tests_runner=world.run_world_tests, max_turns=1)
    assert len(gold.run(single, train[2], rng).turns) == 1


@pytest.mark.skipif(sandbox_lib.shutil.which("bwrap") is None,
                    reason="bubblewrap missing: apt-get install -y bubblewrap")
def test_the_in_process_runner_reports_what_the_sandbox_reports():
    sandbox = Sandbox(max_parallel=4)
    _, test = world.make_code_splits(CONFIG)
    for task in test[:4]:
        for expression in ("sorted(x)", "sum([v + 1 for v in x])", task.metadata["expression"]):
            source = world.program(expression)
            tests = task.metadata["visible_tests"]
            local = world.run_world_tests(source, tests)
            sandboxed = code.run_tests(source, tests, sandbox)
            strip = [dict(vars(r), duration_s=0.0) for r in sandboxed]
            assert [dict(vars(r), duration_s=0.0) for r in local] == strip
    with pytest.raises(ValueError, match="not a program of the code world's language"):
        world.run_world_tests("import os", test[0].metadata["tests"])
    with pytest.raises(ValueError, match="raises on f"):
        world.run_world_tests(world.program("max(x)"), ["assert f([]) == 0"])
