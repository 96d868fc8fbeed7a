"""Native tool calling in the turn envs: schemas for the template, several calls a turn,
each result a tool message with its call id, malformed and cut calls, the final answer."""
import pytest

from agentjax.core.task import Task
from agentjax.envs.python.env import PythonEnv

TASK = Task("t1", "What is 6 * 7?", ("42",))



class Lookup:
    """An ordinary Tool object, as envs/mcp.py makes them."""

    name = "lookup"
    description = "Looks a word up."
    parameters = {"type": "object", "properties": {"word": {"type": "string"}},
                  "required": ["word"]}

    def __call__(self, arguments):
        return f"{arguments['word']}: a word"


def _env(**kwargs):
    return PythonEnv(tools=[Lookup()], tool_format="native", tool_parser="hermes",
                     **kwargs)


def _call(name, **arguments):
    import json
    return ('<tool_call>\n' + json.dumps({"name": name, "arguments": arguments})
            + "\n</tool_call>")


def test_every_tool_schema_goes_to_the_template_and_no_stop_strings():
    env = _env()
    assert [s["function"]["name"] for s in env.template_tools] == ["python", "lookup"]
    assert env.stop == ()
    assert env.reset(TASK) == [{"role": "user", "content": env.instruction.replace(
        "{question}", TASK.question)}]
    assert PythonEnv().template_tools is None  # the hermes-in-prompt format


def test_several_calls_run_in_order_each_its_own_tool_message():
    env = _env()
    env.reset(TASK)
    text = "Let me look.\n" + _call("lookup", word="six") + "\n" + _call("lookup", word="seven")
    result = env.step(text)
    assistant, *answers = result.info["messages"]
    assert assistant["content"] == "Let me look."
    assert [c["id"] for c in assistant["tool_calls"]] == ["call00000", "call00001"]
    assert answers == [
        {"role": "tool", "tool_call_id": "call00000", "name": "lookup", "content": "six: a word"},
        {"role": "tool", "tool_call_id": "call00001", "name": "lookup",
         "content": "seven: a word"}]
    turn = env.log.turns[0]
    assert (turn.kind, turn.valid, turn.tool_name, turn.action_text) == (
        "tool_call", True, "lookup", text)
    assert [c["arguments"] for c in turn.extra["calls"]] == [{"word": "six"}, {"word": "seven"}]
    assert not result.done


@pytest.mark.parametrize("text,kind,error,said", [
    (_call("lookup", word="x") + '<tool_call>{"name": oops}</tool_call>', "invalid",
     "tool call 2: <tool_call> is not valid JSON", None),
    (_call("nope", word="x"), "invalid", "unknown tool 'nope'", None),
    (_call("lookup", letter="x"), "invalid", "lookup: missing required argument(s): word",
     None),
    ('<tool_call>\n{"name": "lookup", "argum', "truncated", "cut by max_tokens", "cut off"),
])
def test_bad_calls_run_nothing_and_say_why(text, kind, error, said):
    env = _env()
    env.reset(TASK)
    result = env.step(text)
    assistant, answer = result.info["messages"]
    assert "tool_calls" not in assistant and assistant["content"] == text
    assert answer["role"] == "user" and (said or error) in answer["content"]
    turn = env.log.turns[0]
    assert turn.kind == kind and error in turn.error and turn.valid == (kind == "truncated")
    assert "calls" not in turn.extra and not result.done


def test_a_reply_without_calls_is_the_final_answer():
    env = _env()
    env.reset(TASK)
    result = env.step("The product is <answer> 42 </answer>.")
    assert result.done and env.log.final_answer == "42" and env.log.stop_reason == "answer"
    env.reset(TASK)
    assert env.step("42").done and env.log.final_answer == "42"
    env.reset(TASK)  # Qwen3 reasons first: the answer is what follows the reasoning
    assert env.step("<think>\n6 * 7 = 42\n</think>\n\n42").done
    assert env.log.final_answer == "42"


def test_calls_on_the_last_turn_are_logged_not_run():
    env = _env(max_turns=1)
    env.reset(TASK)
    result = env.step(_call("lookup", word="six"))
    assert result.done and env.log.stop_reason == "max_turns"
    assert env.log.turns[0].tool_name == "lookup" and "calls" not in env.log.turns[0].extra


class _OneDoc:
    def search(self, queries, topk):
        from agentjax.envs.retrieval import Document
        return [[Document("d1", "Paris", f"{queries[0]}: Paris is the capital.")]]


def test_search_native_documents_come_back_as_tool_messages():
    from agentjax.envs.search.env import SearchEnv
    env = SearchEnv(_OneDoc(), action_format="native", tool_parser="hermes")
    assert env.reset(TASK)[0]["role"] == "user" and env.stop == ()
    assert [s["function"]["name"] for s in env.template_tools] == ["search"]
    result = env.step(_call("search", query="France") + _call("search", query=" "))
    _, first, second = result.info["messages"]
    assert "France: Paris is the capital." in first["content"]
    assert "<information>" not in first["content"]
    assert second["content"] == "Invalid search: empty query."
    assert env.log.turns[0].retrieved == ("d1",)
    assert SearchEnv(_OneDoc()).template_tools is None  # Search-R1 tags stay the default


def test_code_native_run_and_submit_are_ordinary_schemas():
    from agentjax.envs.code.env import CodeEnv
    from agentjax.rewards.code import TestResult

    def runner(program, tests, **limits):
        return [TestResult(passed="return 1" in program, status="ok", stdout="",
                           stderr="", duration_s=0.01) for _ in tests]

    task = Task("c1", "Return one.", (), metadata={"visible_tests": ["assert f() == 1"]})
    env = CodeEnv(tool_format="native", tool_parser="hermes", tests_runner=runner)
    env.reset(task)
    assert [s["function"]["name"] for s in env.template_tools] == ["run", "submit"]
    result = env.step(_call("run", code="def f():\n    return 2"))
    assert result.info["messages"][1]["content"].startswith("0 of 1 tests passed.")
    result = env.step("Done. " + _call("submit", code="def f():\n    return 1"))
    assert result.done and env.log.final_answer == "def f():\n    return 1"
    env.reset(task)
    assert env.step("```python\ndef f():\n    return 1\n```").done
    assert env.log.final_answer == "def f():\n    return 1\n"


def test_text_demonstrations_convert_to_native_turns():
    """A code demonstration (a run call, a negative example with its correction, a
    submit call) as native turns: calls with ids, the run report as the tool message."""
    from agentjax.data.demonstrations import Demonstration, DemoTurn
    from agentjax.envs.code.env import CodeEnv, run_call
    from agentjax.envs.turns import native_demonstration
    task = Task("c1", "Return one.", ())
    submit = '<tool_call>{"name": "submit", "arguments": {"code": "x = 1"}}</tool_call>'
    demo = Demonstration(task, [], [
        DemoTurn("First a run. " + run_call("x = 2"), "0 of 1 tests passed.", True),
        DemoTurn("<tool_call>{oops", "Invalid action: ...", False),
        DemoTurn(submit, None, True)], None, 1.0, "canonical")
    native = native_demonstration(demo, CodeEnv(), CodeEnv(tool_format="native"))
    assert native.messages == [{"role": "user", "content": CodeEnv().instruction.replace(
        "{question}", "Return one.")}]
    run, submitted = native.turns
    assert run.action == {"role": "assistant", "content": "First a run.", "tool_calls": [
        {"id": "call00000", "type": "function",
         "function": {"name": "run", "arguments": {"code": "x = 2"}}}]}
    assert run.observation == [{"role": "tool", "tool_call_id": "call00000", "name": "run",
                                "content": "0 of 1 tests passed."}]
    assert submitted.action["tool_calls"][0]["function"] == {
        "name": "submit", "arguments": {"code": "x = 1"}}
    assert submitted.observation is None and native.reward == 1.0


def test_native_format_score_reads_the_parse_not_tags():
    from agentjax.rewards.format import format_score, native_format_score
    env = _env()
    env.reset(TASK)
    env.step('{"name": "lookup"')  # no hermes markup at all: plain text is an answer
    assert native_format_score(env.log) == 1.0 and format_score(env.log) < 1.0
    env.reset(TASK)
    env.step('<tool_call>\n{"name": oops}\n</tool_call>')
    env.step("<tool_call>\n{\"name\": \"lookup\", \"argu")
    env.step(_call("lookup", word="x"))
    assert native_format_score(env.log) == 0.5 * 1 / 3  # one of three read whole, no answer
