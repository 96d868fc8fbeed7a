"""Demonstration records survive their JSONL file, and a bad line names itself."""
import pytest

from agentjax.core.task import Task
from agentjax.data.demonstrations import (Demonstration, DemoTurn, read_demonstrations_jsonl,
                                          write_demonstrations_jsonl)


def _demos() -> list[Demonstration]:
    chain = [{"subject": "Varo Kessin", "relation": "employer", "object": "Quellon Corp."}]
    search = Task("w-0", "Who is the employer of Varo Kessin?", ("Quellon Corp.", "Quellon"),
                  "synthetic_multihop", {"hops": 1, "chain": chain})
    code = Task("c-0", "f([3, 1]) == [1, 3]", ("def f(x): return sorted(x)",))
    return [
        Demonstration(search, [{"role": "user", "content": "Question: Who … Kessin?"}],
                      [DemoTurn("<query> Varo </query>", "Use <search> … </search>.", False),
                       DemoTurn("<search> Varo Kessin </search>", "Varo Kessin works for "
                                "Quellon Corp.", True),
                       DemoTurn("<answer> Quellon Corp. </answer>", None, True)],
                      None, 1.0, "negative"),
        Demonstration(code, [{"role": "system", "content": "tools"},
                             {"role": "user", "content": "f([3, 1]) == [1, 3]"}],
                      [DemoTurn('<tool_call>{"name": "submit"}</tool_call>', None, True)],
                      None, 0.0, "canonical"),
    ]


def test_demonstrations_jsonl_round_trip(tmp_path):
    demos = _demos()
    path = str(tmp_path / "demos.jsonl")
    write_demonstrations_jsonl(path, demos)
    assert read_demonstrations_jsonl(path) == demos


@pytest.mark.parametrize("line, error", [('{"task": {}}', "KeyError"),
                                         ("{not json", "JSONDecodeError")])
def test_a_malformed_line_is_an_error_naming_it(tmp_path, line, error):
    path = str(tmp_path / "demos.jsonl")
    write_demonstrations_jsonl(path, _demos())
    with open(path, "a") as f:
        f.write(line + "\n")
    with pytest.raises(ValueError, match=f"line 3: malformed demonstration \\({error}"):
        read_demonstrations_jsonl(path)
