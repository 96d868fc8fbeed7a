"""A synthetic code world a tiny model can learn on a CPU: list functions of a small
language, each task specified by examples only, and a scripted imperfect programmer.

A program is `def f(x): return EXPR` where EXPR is one list step (`sorted(x)`,
`x[::-1]`, `[v * 2 for v in x]`, ...) or one reduction (`sum(x)`, `max(x)`, ...): the
depth-1 language of 10 programs; at depth 2 also a reduction or a second list step applied
to a list step (64 programs). A task shows
`f([3, 1, 2]) == [1, 2, 3]`-style examples (its visible tests); its hidden tests are the
examples and further inputs. Train and test tasks are different inputs to the same
programs (held-out success asks the agent to infer a program from examples it never saw).

`ScriptedCoder` plays the code env as a model would, from the question alone: a "solver"
episode finds the first program of the language that fits the examples — after a wrong
first attempt it runs and reads the failure of, with probability p_wrong_first — runs
it, and submits it; with probability p_guess it instead submits a random program of the
language at once, without running anything (the imperfection SFT imitates and RL has to
unlearn).
"""
from __future__ import annotations

import dataclasses
import itertools
from typing import Sequence

import numpy as np

from agentjax.core.task import Task
from agentjax.data.demonstrations import Demonstration, DemoTurn
from agentjax.envs.code.env import final_block, run_call
from agentjax.rewards import code as code_lib

DATA_SOURCE = "synthetic_code"

# name -> expression over the list `{x}`.
LIST_STEPS = {
    "sort": "sorted({x})",
    "reverse": "{x}[::-1]",
    "double": "[v * 2 for v in {x}]",
    "increment": "[v + 1 for v in {x}]",
    "evens": "[v for v in {x} if v % 2 == 0]",
    "drop_first": "{x}[1:]",
}
REDUCTIONS = {
    "sum": "sum({x})",
    "length": "len({x})",
    "maximum": "max({x})",
    "first": "{x}[0]",
}


def language(depth: int = 2) -> list[str]:
    """Every expression of the language of programs composing at most `depth` (1 or 2)
    steps, in the order the scripted solver tries them."""
    if depth not in (1, 2):
        raise ValueError(f"the code world's depth is 1 or 2, got {depth}")
    steps = [s.format(x="x") for s in LIST_STEPS.values()]
    reductions = [r.format(x="x") for r in REDUCTIONS.values()]
    composed = [outer.format(x=inner) for outer, inner in itertools.product(
        list(REDUCTIONS.values()) + list(LIST_STEPS.values()), steps)
        if outer.format(x="x") != inner] if depth == 2 else []
    return list(dict.fromkeys(steps + reductions + composed))


_PROGRAM_HEAD = "def f(x): return "


def program(expression: str) -> str:
    return _PROGRAM_HEAD + expression


_LANGUAGE = frozenset(language())


def evaluate(expression: str, value: list[int]):
    """The expression's value on `value`, or None when it raises (max of an empty list)."""
    try:
        return eval(expression, {"__builtins__": {"sorted": sorted, "sum": sum, "len": len,
                                                  "max": max}}, {"x": list(value)})
    except (ValueError, IndexError):
        return None


@dataclasses.dataclass(frozen=True)
class CodeWorldConfig:
    """Sizes of the world.

    Attributes:
      seed: everything is a function of it.
      depth: steps a program composes (`language`).
      train_tasks, test_tasks: task counts (programs drawn uniformly).
      visible: examples shown (and run by the `run` tool).
      hidden_extra: further hidden inputs beyond the examples.
      min_len, max_len: input list lengths.
      max_value: list items are 0..max_value.
    """

    seed: int = 0
    depth: int = 2
    train_tasks: int = 2000
    test_tasks: int = 200
    visible: int = 3
    hidden_extra: int = 3
    min_len: int = 3
    max_len: int = 5
    max_value: int = 9


def _inputs(expression: str, count: int, config: CodeWorldConfig,
            rng: np.random.Generator) -> list[list[int]]:
    values: list[list[int]] = []
    while len(values) < count:
        n = int(rng.integers(config.min_len, config.max_len + 1))
        value = [int(v) for v in rng.integers(0, config.max_value + 1, size=n)]
        if value not in values and evaluate(expression, value) is not None:
            values.append(value)
    return values


def make_task(expression: str, index: int, split: str, config: CodeWorldConfig,
              rng: np.random.Generator) -> Task:
    inputs = _inputs(expression, config.visible + config.hidden_extra, config, rng)
    asserts = [f"assert f({v!r}) == {evaluate(expression, v)!r}" for v in inputs]
    examples = "\n".join(a.removeprefix("assert ") for a in asserts[:config.visible])
    return Task(task_id=f"code{config.seed}-{split}-{index:05d}", question=examples,
                data_source=DATA_SOURCE,
                metadata={"tests": asserts, "visible_tests": asserts[:config.visible],
                          "entry_point": "f", "prefix": "", "starter": "",
                          "solution": program(expression), "expression": expression,
                          "format": "synthetic", "split": split})


def make_code_splits(config: CodeWorldConfig) -> tuple[list[Task], list[Task]]:
    """Train and test tasks (module docstring); no test task's examples are a train
    task's."""
    rng = np.random.default_rng([config.seed, 29])
    expressions = language(config.depth)
    out: dict[str, list[Task]] = {"train": [], "test": []}
    seen = set()
    for split, count in (("test", config.test_tasks), ("train", config.train_tasks)):
        while len(out[split]) < count:
            expression = expressions[int(rng.integers(len(expressions)))]
            task = make_task(expression, len(out[split]), split, config, rng)
            if task.question not in seen:
                seen.add(task.question)
                out[split].append(task)
    return out["train"], out["test"]


def fits(expression: str, examples: Sequence[tuple[list[int], object]]) -> bool:
    return all(evaluate(expression, x) == y for x, y in examples)


def parse_examples(question: str) -> list[tuple[list[int], object]]:
    """The `f(X) == Y` lines of a question as (X, Y) pairs."""
    pairs = []
    for line in question.splitlines():
        call, _, result = line.partition(" == ")
        if call.startswith("f(") and call.endswith(")"):
            pairs.append((eval(call[2:-1], {"__builtins__": {}}),
                          eval(result, {"__builtins__": {}})))
    return pairs


def run_world_tests(source: str, tests: Sequence[str], **limits) -> list[code_lib.TestResult]:
    """A program of the language (`program(expression)`) against `f(X) == Y` assertion
    tests, in this process: exactly what `rewards.code.run_tests` reports for it from the
    sandbox (the observations of the scripted coder's `run` calls, without a sandbox run
    each). `limits` (timeout_s, memory_mb) are accepted and unused: these programs run in
    microseconds.

    Raises:
      ValueError: `source` is not a program of the language, or raises on a test's
        input (the sandbox would report a traceback).
    """
    expression = _expression(source)
    results = []
    for value, want in parse_examples("\n".join(t.removeprefix("assert ") for t in tests)):
        got = evaluate(expression, value)
        if got is None:
            raise ValueError(f"{source!r} raises on f({value!r}): run it in the sandbox")
        results.append(code_lib.TestResult(True, "passed") if got == want else
                       code_lib.TestResult(False, "failed", expected=repr(want), got=repr(got)))
    return results


def solves(source: str, tests: Sequence[str]) -> bool:
    """Whether a program of the language passes every `f(X) == Y` test (in-process)."""
    expression = _expression(source)
    return fits(expression, parse_examples("\n".join(t.removeprefix("assert ") for t in tests)))


def _expression(source: str) -> str:
    expression = source.strip().removeprefix(_PROGRAM_HEAD)
    if not source.strip().startswith(_PROGRAM_HEAD) or expression not in _LANGUAGE:
        raise ValueError(f"not a program of the code world's language: {source!r}")
    return expression


@dataclasses.dataclass(frozen=True)
class CoderConfig:
    """The scripted programmer's imperfection (module docstring)."""

    name: str = "coder"
    p_guess: float = 0.0
    p_wrong_first: float = 0.0

    def __post_init__(self):
        for field in ("p_guess", "p_wrong_first"):
            if not 0.0 <= getattr(self, field) <= 1.0:
                raise ValueError(f"CoderConfig.{field} must be in [0, 1], got "
                                 f"{getattr(self, field)}")


class ScriptedCoder:
    """Plays a code-world task in a CodeEnv (module docstring)."""

    def __init__(self, config: CoderConfig = CoderConfig(), depth: int = 2):
        self.config = config
        self.expressions = language(depth)

    def run(self, env, task: Task, rng: np.random.Generator) -> Demonstration:
        """Plays one episode of `task` in `env` (reset here); a single-turn env gets the
        program submitted at once."""
        messages = env.reset(task)
        turns = []
        solution = self._solve(task)
        if rng.random() < self.config.p_guess:
            solution = self.expressions[int(rng.integers(len(self.expressions)))]
            attempts = []
        else:
            attempts = [solution]
            if env.max_turns >= 3 and rng.random() < self.config.p_wrong_first:
                examples = parse_examples(task.question)
                wrong = [e for e in self.expressions if e != solution
                         and all(evaluate(e, x) is not None for x, _ in examples)]
                attempts.insert(0, wrong[int(rng.integers(len(wrong)))])
        for expression in attempts if env.max_turns >= 2 else ():
            action = run_call(program(expression))
            result = env.step(action)
            turns.append(DemoTurn(action, None if result.done else result.observation,
                                           True))
            ran = env.log.turns[-1].extra
            if result.done or ran.get("visible_passed") == ran.get("visible_total"):
                break
        if not env.log.done:
            action = final_block(program(solution))
            env.step(action)
            turns.append(DemoTurn(action, None, True))
        return Demonstration(task, messages, turns, env.log, 0.0, self.config.name)

    def _solve(self, task: Task) -> str:
        examples = parse_examples(task.question)
        return next((e for e in self.expressions if fits(e, examples)), self.expressions[0])
