"""CodeEnv: run reports what failed (the assertion, expected vs got, stderr, a timeout,
each clipped), a fenced block or submit ends the episode with the final program, bad
actions get corrections, the run budget is enforced, and hostile programs fail their
tests and leave the env (and the sandbox) usable."""
import json

import pytest

from agentjax.core.task import Task
from agentjax.envs import sandbox as sandbox_lib
from agentjax.envs.code.env import CodeEnv, final_block, run_call
from agentjax.envs.code.suite import code_reward_fn
from agentjax.envs.sandbox import Sandbox
from agentjax.sweep import plan
from tests.envs.attacks import ATTACKS

pytestmark = pytest.mark.skipif(sandbox_lib.shutil.which("bwrap") is None,
                                reason="bubblewrap missing: apt-get install -y bubblewrap")

TASK = Task("t1", "Write add(a, b).", metadata={
    "visible_tests": ["assert add(1, 2) == 3", "assert add(0, 0) == 0",
                      "assert add(-1, 1) == 0"],
    "tests": ["assert add(1, 2) == 3", "assert add(2, 2) == 4", "assert add(-5, 5) == 0"],
    "entry_point": "add", "prefix": "", "starter": ""})
RIGHT = "def add(a, b):\n    return a + b\n"
OFF_BY_ONE = "def add(a, b):\n    return a + b + (a >= 0)\n"


@pytest.fixture(scope="module")
def sandbox():
    return Sandbox(max_parallel=4, memory_mb=256)


@pytest.fixture(scope="module")
def reward_fn(sandbox):
    config = plan.load_config_module("configs/grpo_code.py").get_config("test")
    return code_reward_fn(config, sandbox)


def make_env(sandbox, **kwargs):
    env = CodeEnv(sandbox, timeout_s=1.0, **kwargs)
    env.reset(TASK)
    return env


def test_run_reports_failures_then_a_fenced_block_submits(sandbox, reward_fn):
    env = make_env(sandbox)
    observation, done, _, _ = env.step(run_call(OFF_BY_ONE))
    assert not done
    assert observation == ("1 of 3 tests passed.\nFAILED: assert add(1, 2) == 3\n"
                           "expected: 3\ngot: 4\nFAILED: assert add(0, 0) == 0\n"
                           "expected: 0\ngot: 1")
    assert env.log.turns[0].tool_name == "run" and env.log.turns[0].extra == {
        "visible_passed": 1, "visible_total": 3}
    _, done, _, _ = env.step(f"Fixed it:\n{final_block(RIGHT)}")
    assert done and env.log.stop_reason == "answer"
    assert env.log.final_answer == RIGHT
    total, components = reward_fn(TASK, env.log)
    # A valid run call (tool bonus 0.1), two valid turns, a final program that parses.
    assert components == {"tests_pass": 1.0, "all_tests_pass": 1.0, "tool_shaping": 0.1,
                          "code_format": 1.0}
    assert total == pytest.approx(1.0 + 0.05 * 0.1 + 0.1 * 1.0)


def test_partial_credit_and_submit_call(sandbox, reward_fn):
    env = make_env(sandbox)
    action = ('<tool_call>{"name": "submit", "arguments": {"code": '
              + json.dumps(OFF_BY_ONE) + "}}</tool_call>")
    _, done, _, _ = env.step(action)
    assert done and env.log.final_answer == OFF_BY_ONE
    _, components = reward_fn(TASK, env.log)
    # add(1, 2) and add(2, 2) are off by one; add(-5, 5) is right: 1 of 3.
    assert components["tests_pass"] == pytest.approx(1 / 3)
    assert components["all_tests_pass"] == 0.0


def test_io_failures_show_input_expected_and_got(sandbox):
    task = Task("io", "Sum two numbers.", metadata={
        "visible_tests": [{"stdin": "1 2\n", "stdout": "3\n"}],
        "tests": [{"stdin": "1 2\n", "stdout": "3\n"}], "prefix": "", "starter": ""})
    env = CodeEnv(sandbox)
    env.reset(task)
    observation, _, _, _ = env.step(run_call("print(sum(map(int, input().split())) + 1)"))
    assert observation == ("0 of 1 tests passed.\nFAILED: input '1 2\\n'\n"
                           "expected output: '3\\n'\ngot: '4\\n'")


def test_crashes_and_timeouts_are_described_and_clipped(sandbox):
    env = make_env(sandbox, max_detail_chars=120)
    observation, _, _, _ = env.step(run_call(
        "def add(a, b):\n    if a == 1:\n        raise ValueError('x' * 1000)\n"
        "    while a == 0:\n        pass\n    return a + b\n"))
    lines = observation.splitlines()
    assert lines[0] == "1 of 3 tests passed."
    assert lines[1] == "FAILED: assert add(1, 2) == 3"
    assert lines[2].startswith("stderr: Traceback") and "characters omitted]..." in observation
    assert "FAILED: assert add(0, 0) == 0\ntimed out after 1 s" in observation
    assert len(observation) < 600


# A program that leaves processes behind but computes right passes (they are killed
# after each test; the sandbox tests check that nothing outlives a run).
HOSTILE = sorted(set(ATTACKS) - {"children_left_behind"})


@pytest.mark.parametrize("name", HOSTILE)
def test_attack_programs_score_zero_and_leave_the_env_usable(sandbox, name):
    # One visible and one hidden test, short limits: a hanging program costs each test
    # its deadline.
    task = Task("t", "Write add(a, b).", metadata={
        "visible_tests": TASK.metadata["visible_tests"][:1], "tests": TASK.metadata["tests"][:1],
        "entry_point": "add", "prefix": "", "starter": ""})
    config = plan.load_config_module("configs/grpo_code.py").get_config("test")
    reward_fn = code_reward_fn(config, sandbox, timeout_s=0.5, memory_mb=128)
    env = CodeEnv(sandbox, timeout_s=0.5, memory_mb=128)
    env.reset(task)
    attack = RIGHT + ATTACKS[name]
    observation, done, _, _ = env.step(run_call(attack))
    assert not done and observation.startswith("0 of 1 tests passed.")
    env.step(final_block(attack))
    assert reward_fn(task, env.log)[1]["tests_pass"] == 0.0
    # The same sandbox, a fresh episode: everything works.
    env.reset(task)
    assert env.step(run_call(RIGHT))[0] == "1 of 1 tests passed."


def test_leftover_processes_do_not_hold_up_a_run(sandbox):
    env = make_env(sandbox)
    observation, _, _, _ = env.step(run_call(RIGHT + ATTACKS["children_left_behind"]))
    assert observation == "3 of 3 tests passed."
    assert env.log.turns[-1].extra["visible_passed"] == 3
    assert env._time_used < 1.0  # no test waited for the daemon holding its stdout


def test_an_attack_inside_a_test_fails_that_test_alone(sandbox):
    task = Task("t2", "?", metadata={"visible_tests": [
        "assert add(1, 1) == 2", ATTACKS["fork_bomb"], ATTACKS["output_flood"],
        ATTACKS["infinite_loop"], "assert add(2, 2) == 4"], "prefix": "", "starter": ""})
    env = CodeEnv(sandbox, timeout_s=2.0, max_failures_shown=5)
    env.reset(task)
    observation, _, _, _ = env.step(run_call(RIGHT))
    assert observation.startswith("2 of 5 tests passed.")
    assert "printed too much: stopped" in observation and "timed out after 2 s" in observation


def test_invalid_actions_get_corrections(sandbox):
    env = make_env(sandbox, max_turns=3)
    observation, done, _, _ = env.step("I think it is easy.")
    assert not done and observation.startswith("Invalid action: no action")
    observation, _, _, _ = env.step('<tool_call>{"name": "run", "arguments": {}}</tool_call>')
    assert "run: missing required argument(s): code" in observation
    # A malformed call next to a code block is a bad call, not a submission.
    observation, done, _, _ = env.step(f"{final_block(RIGHT)}<tool_call>oops</tool_call>")
    assert done and env.log.stop_reason == "max_turns" and env.log.final_answer is None
    assert env.log.num_invalid == 3


@pytest.mark.parametrize("submit_at_limit", [True, False])
def test_a_run_on_the_last_turn(sandbox, reward_fn, submit_at_limit):
    env = make_env(sandbox, max_turns=2, submit_at_limit=submit_at_limit)
    env.step(run_call(OFF_BY_ONE))
    observation, done, _, _ = env.step(run_call(RIGHT))
    # The last turn's call is not run (the policy could never read its report).
    assert done and observation == "" and "visible_passed" not in env.log.turns[-1].extra
    _, components = reward_fn(TASK, env.log)
    if submit_at_limit:
        assert env.log.stop_reason == "submitted_at_limit" and env.log.final_answer == RIGHT
        # Every hidden test passes; the format term counts only the policy's own
        # submission: two valid turns, no submitted program.
        assert components["all_tests_pass"] == 1.0 and components["code_format"] == 0.5
    else:
        assert env.log.stop_reason == "max_turns" and env.log.final_answer is None
        assert components["tests_pass"] == 0.0 and components["code_format"] == 0.5
    # The system prompt says what the last turn's run does.
    system = env.reset(TASK)[0]["content"]
    assert system.endswith("a program you run on your last turn is submitted."
                           if submit_at_limit else "the last ```python block of your last "
                           "message.")
    # A last turn that is not a run call ends as before, with or without the option.
    env = make_env(sandbox, max_turns=1, submit_at_limit=submit_at_limit)
    env.step("no program here")
    assert env.log.stop_reason == "max_turns" and env.log.final_answer is None


def test_the_episode_run_budget(sandbox):
    env = make_env(sandbox, episode_time_s=0.5, max_turns=5)
    observation, _, _, _ = env.step(run_call("import time\ndef add(a, b):\n"
                                             "    time.sleep(0.6)\n    return a + b\n"))
    # Each test's deadline is within the budget left; the budget is then spent.
    assert "timed out after 0.5 s" in observation
    observation, _, _, _ = env.step(run_call(RIGHT))
    assert observation.startswith("The run budget of this episode (0.5 s")
    assert env.log.turns[-1].error == "run: episode time budget spent"
    # A new episode has its budget back.
    env.reset(TASK)
    assert env.step(run_call(RIGHT))[0] == "3 of 3 tests passed."


def test_humaneval_programs_run_after_the_prompt(sandbox):
    prompt = 'import math\n\n\ndef floor_sqrt(n: int) -> int:\n    """floor of sqrt"""\n'
    task = Task("h", prompt, metadata={
        "visible_tests": ["assert floor_sqrt(10) == 3"], "tests": ["assert floor_sqrt(16) == 4"],
        "entry_point": "floor_sqrt", "prefix": prompt, "starter": prompt})
    env = CodeEnv(sandbox)
    messages = env.reset(task)
    assert f"```python\n{prompt.rstrip()}\n```" in messages[-1]["content"]
    assert env.step(run_call("    return math.isqrt(n)\n"))[0] == "1 of 1 tests passed."
    assert env.step(run_call("def floor_sqrt(n):\n    return int(math.sqrt(n))\n"))[0] == \
        "1 of 1 tests passed."
