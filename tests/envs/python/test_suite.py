"""The python suite: arithmetic tasks, sandboxed python-tool episodes, scripted
demonstrations rewarded by answer match."""
import pytest

from agentjax.config import presets
from agentjax.envs import registry as suites
from agentjax.envs.python.env import DEFAULT_INSTRUCTION, PythonEnv


@pytest.fixture(scope="module")
def config():
    config = presets.python_config("grpo", "test")
    config.sft.num_demos, config.sft.guess_prob = 4, 0.0
    return config


def test_the_python_suite_demonstrates_with_the_tool(config, tmp_path):
    suite = suites.build_suite(config, str(tmp_path / "data"))
    assert (len(suite.train_tasks), len(suite.test_tasks)) == (24, 4)
    assert suite.success_key == "math_match" and suite.observation_role == "tool"
    assert isinstance(suite.make_env(), PythonEnv)
    assert len(suite.demonstrations) == 4
    for demo in suite.demonstrations:  # the tool computes, the answer matches
        assert '"name": "python"' in demo.turns[0].action and demo.reward == 1.0
        assert suite.reward_fn(demo.task, demo.log)[1]["math_match"] == 1.0
    assert suite.baselines == {"demonstrator": {"success": 1.0, "by_hops": {}}}
    assert DEFAULT_INSTRUCTION in suite.texts and suite.demonstrations[0].turns[0].action in (
        suite.texts)
    assert suite.pretrain_corpus is None and suite.relabel is None


def test_the_python_suite_has_no_process_reward(config, tmp_path):
    """Arithmetic has no subgoals: reward.process_weight does not reach its reward."""
    config = config.copy_and_resolve_references()
    config.reward.process_weight, config.sft.steps = 0.3, 0
    suite = suites.build_suite(config, str(tmp_path / "data"))
    assert [c.name for c in suite.reward_fn.components] == [
        "math_match", "format", "tool_shaping"]
    assert suite.demonstrations == [] and suite.baselines == {}


def test_native_demonstrations_train_the_policys_own_call_format(config, tmp_path):
    """env.tool_format='native': the demonstrator's hermes calls become native turns,
    which SFT writes in each model's own format (Llama 3.1 here)."""
    from agentjax.core.trajectory import Trajectory
    from tests.models.chat_templates import chat_tokenizer
    config = config.copy_and_resolve_references()
    config.env.tool_format = "native"
    suite = suites.build_suite(config, str(tmp_path / "data"))
    assert [t["function"]["name"] for t in suite.tools] == ["python"]
    assert suite.make_env().tool_format == "native"
    # The format term reads the parse (tags would fail the demonstrator's tool calls).
    format_term = [c for c in suite.reward_fn.components if c.name == "format"][0]
    demo = suite.demonstrations[0]
    assert format_term.term.fn(demo.task, demo.log) == 1.0
    demo = suite.demonstrations[0]
    assert demo.messages[0]["role"] == "user" and len(demo.messages) == 1  # no hand-written tools
    call, answer = demo.turns
    assert call.action["tool_calls"][0]["function"]["name"] == "python"
    assert call.observation[0]["tool_call_id"] == call.action["tool_calls"][0]["id"]
    tokenizer = chat_tokenizer("llama3.1", tmp_path)
    traj = Trajectory.from_demonstration(tokenizer, demo.messages, demo.turns,
                                         observation_role=suite.observation_role,
                                         tools=suite.tools, reward=demo.reward)
    text = tokenizer.decode(traj.token_ids[traj.action_mask == 1].tolist())
    assert text.startswith('{"name": "python", "parameters": {"code": "print(')
    assert text.endswith(f"{answer.action['content']}<|eot_id|>")
    assert "<|start_header_id|>ipython<|end_header_id|>" in tokenizer.decode(
        traj.turns[0].observation_ids)


def test_the_partial_tool_demonstrator_always_calls_the_tool_on_a_sub_expression(
        config, tmp_path):
    """sft.partial_tool_prob=1: every episode calls the tool; one of >= 3 operands
    computes the expression without its last operand and answers that sub-result, one of
    2 operands the whole expression."""
    config = config.copy_and_resolve_references()
    config.sft.partial_tool_prob, config.sft.num_demos = 1.0, 12
    suite = suites.build_suite(config, str(tmp_path / "data"))
    operands = set()
    for demo in suite.demonstrations:
        expression = demo.task.metadata["expression"]
        terms = expression.split()
        operands.add((len(terms) + 1) // 2)
        call, answer = demo.turns
        code = expression if len(terms) == 3 else " ".join(terms[:-2])
        assert call.action == ('<tool_call>{"name": "python", "arguments": {"code": '
                               f'"print({code})"}}}}</tool_call>')
        sub_result = str(eval(code))  # the sandbox's print of the same expression
        assert answer.action == f"<answer> {sub_result} </answer>"
        assert demo.reward == float(sub_result == demo.task.answers[0])
    assert operands == {2, 3, 4}
