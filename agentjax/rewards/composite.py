"""Composite reward chosen by config: total = sum of weight * component.

    reward_fn = make_reward_fn({
        "components": {
            "exact_match": {"weight": 1.0},
            "format": {"weight": 0.2},
            "process": {"weight": 0.3, "include_answer": False},
            "f1": {"weight": 0.0},          # weight 0: computed and logged only
        },
        "min_outcome_share": 0.5,
    })
    total, components = reward_fn(task, log)

Every component is a pure function of `(task, log)` with known bounds [low, high] and a
kind: "outcome" (did the task succeed), "process" (subgoals) or "shaping" (format, tool
use, length). The outcome must decide at least `min_outcome_share` (default one half)
of the total's range: sum over outcome components of |w| * (high - low) must
be at least that share of the sum over all components. Hence a policy that maxes every
process and shaping term but fails the task can never out-score one that succeeds.
Components that need objects (a sandbox, a judge) receive them as keyword resources:
`make_reward_fn(config, sandbox=..., judge=...)`. A component scores only the tasks it
applies to (the process reward needs a multi-hop task's subgoals): on any other task it
is left out of the total and of the components dict, so one reward config serves the
synthetic world and a Search-R1 dataset alike.

Registered components (options in parentheses):
  outcome  exact_match, f1, math_match — on the last `<answer>` vs Task.answers;
           tests_pass, all_tests_pass (timeout_s, memory_mb; resource sandbox) — the
           fraction of metadata["tests"] passed, or 1 when all pass;
           judge (resource judge: an LLMJudge)
  process  process (include_answer) — subgoal_reward, on tasks with subgoals only
  shaping  format (action_tags, terminal_tags, think_tag; native: the turns of native
           tool calls read whole, format.native_format_score); code_format;
           tool_shaping (valid_bonus, max_bonus_calls, duplicate_penalty, invalid_penalty,
           cap); length (penalty: linear|sigmoid, unit: turns|tokens, and
           length_reward's target, coef, max_penalty, tau; resource tokenizer for
           tokens). DAPO's overlong shaping is the trainer's algo.overlong_* (exact
           sampled tokens; rewards/length.py).
"""
from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Awaitable, Callable, Mapping

from agentjax.core.registry import Registry
from agentjax.core.task import EpisodeLog, Task
from agentjax.rewards import code, format as format_lib, length, math as math_lib
from agentjax.rewards import outcome, process, tools

KINDS = ("outcome", "process", "shaping")
ScoreFn = Callable[[Task, EpisodeLog], float]


@dataclasses.dataclass(frozen=True)
class Term:
    """What a registered factory builds: a bounded score function.

    Attributes:
      fn: (task, log) -> float within [low, high].
      low, high: bounds of fn.
      afn: optional async version (judges); used by `RewardFn.ascore`.
      applies: task -> whether fn can score it; None: every task.
    """

    fn: ScoreFn
    low: float
    high: float
    afn: Callable[[Task, EpisodeLog], Awaitable[float]] | None = None
    applies: Callable[[Task], bool] | None = None


@dataclasses.dataclass(frozen=True)
class Component:
    """One configured reward term: a Term with its registry name and kind."""

    name: str
    kind: str
    term: Term

    def applies(self, task: Task) -> bool:
        return self.term.applies is None or self.term.applies(task)

    @property
    def low(self) -> float:
        return self.term.low

    @property
    def high(self) -> float:
        return self.term.high


@dataclasses.dataclass(frozen=True)
class Registered:
    """A registered component: its kind and `factory(**options_and_resources) -> Term`."""

    kind: str
    factory: Callable[..., Term]


# component name -> Registered.
REWARDS: Registry[Registered] = Registry("reward component")


def register_reward(name: str, kind: str):
    """Decorator: registers `factory(**options_and_resources) -> Term` under `name`.

    Keyword-only factory parameters are filled from the component's config options,
    else from `make_reward_fn`'s resources; those without a default are required.
    """
    if kind not in KINDS:
        raise ValueError(f"reward kind must be one of {KINDS}, got {kind!r}")

    def wrap(factory):
        REWARDS.register(name)(Registered(kind, factory))
        return factory

    return wrap


def registered_rewards() -> dict[str, str]:
    """Registered component names and their kinds."""
    return {name: REWARDS.get(name).kind for name in REWARDS}


def _answers_required(task: Task) -> tuple[str, ...]:
    if not task.answers:
        raise ValueError(f"task {task.task_id!r} has no answers; an answer-match reward "
                         "needs Task.answers")
    return task.answers


def _check_options(component: str, options: Mapping[str, Any], fn: Callable,
                   reserved: tuple[str, ...] = ("log",)) -> None:
    """Config-time check that `options` are keyword parameters of `fn`."""
    params = inspect.signature(fn).parameters
    unknown = [k for k in options if k in reserved or k not in params]
    if unknown:
        known = [p for p in params if p not in reserved]
        raise ValueError(f"reward component {component!r}: unknown options {unknown}; "
                         f"it takes {known}")


@register_reward("exact_match", "outcome")
def _exact_match():
    return Term(lambda task, log: outcome.exact_match(
        outcome.episode_answer(log), _answers_required(task)), 0.0, 1.0)


@register_reward("f1", "outcome")
def _f1():
    return Term(lambda task, log: outcome.f1_score(
        outcome.episode_answer(log), _answers_required(task)), 0.0, 1.0)


@register_reward("math_match", "outcome")
def _math_match():
    return Term(lambda task, log: math_lib.math_answer_match(
        outcome.episode_answer(log), _answers_required(task)), 0.0, 1.0)


@register_reward("tests_pass", "outcome")
def _tests_pass(*, sandbox, timeout_s: float = 5.0, memory_mb: int = 512):
    return Term(lambda task, log: code.tests_score(
        task, log, sandbox, timeout_s=timeout_s, memory_mb=memory_mb), 0.0, 1.0)


@register_reward("all_tests_pass", "outcome")
def _all_tests_pass(*, sandbox, timeout_s: float = 5.0, memory_mb: int = 512):
    return Term(lambda task, log: code.tests_score(
        task, log, sandbox, all_or_nothing=True, timeout_s=timeout_s,
        memory_mb=memory_mb), 0.0, 1.0)


@register_reward("judge", "outcome")
def _judge(*, judge):
    fallback = judge.unparsable_score
    low, high = (0.0, 1.0) if fallback is None else (min(0.0, fallback), max(1.0, fallback))
    return Term(judge, low, high, afn=judge.ascore)


@register_reward("format", "shaping")
def _format(*, action_tags=("search", "answer"), terminal_tags=("answer",),
            think_tag="think", native=False):
    if native:  # native tool calls: the model's own markup, read by the parser
        return Term(lambda task, log: format_lib.native_format_score(log), 0.0, 1.0)
    return Term(lambda task, log: format_lib.format_score(
        log, action_tags=tuple(action_tags), terminal_tags=tuple(terminal_tags),
        think_tag=think_tag), 0.0, 1.0)


@register_reward("code_format", "shaping")
def _code_format():
    return Term(lambda task, log: code.code_format_score(log), 0.0, 1.0)


@register_reward("tool_shaping", "shaping")
def _tool_shaping(**options):
    _check_options("tool_shaping", options, tools.tool_shaping)
    cap = options.get("cap", inspect.signature(tools.tool_shaping).parameters["cap"].default)
    return Term(lambda task, log: tools.tool_shaping(log, **options), -cap, cap)


@register_reward("length", "shaping")
def _length(*, penalty: str = "linear", unit: str = "turns", tokenizer=None, **params):
    length.check_kind(penalty)
    _check_options("length", params, length.length_reward, reserved=("length", "kind"))
    if unit == "tokens" and tokenizer is None:
        raise ValueError("reward component 'length' counts tokens: pass "
                         "make_reward_fn(config, tokenizer=...)")
    if unit not in length.LENGTH_UNITS:
        raise ValueError(f"reward component 'length': unit must be one of "
                         f"{length.LENGTH_UNITS}, got {unit!r}")
    length.length_reward(0, kind=penalty, **params)  # a bad config fails now, not mid-run
    bounds = length.length_bounds(penalty, max_penalty=params.get("max_penalty", 1.0))
    return Term(lambda task, log: length.length_reward(
        length.episode_length(log, unit=unit, tokenizer=tokenizer), kind=penalty, **params),
        *bounds)


@register_reward("process", "process")
def _process(*, include_answer: bool = True):
    return Term(lambda task, log: process.subgoal_reward(
        task, log, include_answer=include_answer), 0.0, 1.0, applies=process.has_subgoals)


class RewardFn:
    """`reward_fn(task, log) -> (total, {component name: unweighted value})`; components
    that do not apply to the task are absent from both.

    Attributes:
      components: the configured Components, in config order.
      weights: {name: weight}.
    """

    def __init__(self, components: list[Component], weights: Mapping[str, float]):
        self.components = components
        self.weights = dict(weights)

    def _total(self, values: dict[str, float]) -> tuple[float, dict[str, float]]:
        for c in self.components:
            if c.name in values and not c.low - 1e-9 <= values[c.name] <= c.high + 1e-9:
                raise AssertionError(f"reward component {c.name!r} returned {values[c.name]}, "
                                     f"outside its bounds [{c.low}, {c.high}]")
        return sum(self.weights[n] * v for n, v in values.items()), values

    def __call__(self, task: Task, log: EpisodeLog) -> tuple[float, dict[str, float]]:
        return self._total({c.name: float(c.term.fn(task, log)) for c in self.components
                            if c.applies(task)})

    async def ascore(self, task: Task, log: EpisodeLog) -> tuple[float, dict[str, float]]:
        """Same as calling, awaiting async components (judges) on the running loop."""
        values = {}
        for c in self.components:
            if not c.applies(task):
                continue
            term = c.term
            values[c.name] = float(await term.afn(task, log) if term.afn
                                   else term.fn(task, log))
        return self._total(values)


def _plain(config: Any) -> Any:
    if hasattr(config, "to_dict"):  # ml_collections.ConfigDict
        config = config.to_dict()
    if isinstance(config, Mapping):
        return {k: _plain(v) for k, v in config.items()}
    return config


def outcome_share(components: list[Component], weights: Mapping[str, float]) -> float:
    """Share of the total's range decided by outcome components (1.0 when no range)."""
    span = {c.name: abs(weights[c.name]) * (c.high - c.low) for c in components}
    total = sum(span.values())
    if total == 0:
        return 1.0
    return sum(span[c.name] for c in components if c.kind == "outcome") / total


def make_reward_fn(config: Mapping[str, Any], **resources: Any) -> RewardFn:
    """Builds the composite reward of `config` (module docstring).

    Args:
      config: {"components": {name: {"weight": w, **options} or w}, "min_outcome_share":
        s (default 0.5)}; a dict or an ml_collections ConfigDict.
      **resources: objects components need, e.g. sandbox=Sandbox(...) for "tests_pass",
        judge=LLMJudge(...) for "judge".

    Raises:
      ValueError: unknown component or option, missing resource, or an outcome share
        below `min_outcome_share`.
    """
    config = _plain(config)
    unknown = set(config) - {"components", "min_outcome_share"}
    if unknown or not config.get("components"):
        raise ValueError(f"reward config needs a non-empty 'components' mapping (and optional "
                         f"'min_outcome_share'); unknown keys: {sorted(unknown)}")
    components, weights = [], {}
    for name, spec in config["components"].items():
        registered = REWARDS.get(name)
        spec = {"weight": spec} if isinstance(spec, (int, float)) else dict(spec)
        if "weight" not in spec:
            raise ValueError(f"reward component {name!r} needs a 'weight'")
        weights[name] = float(spec.pop("weight"))
        factory = registered.factory
        params = inspect.signature(factory).parameters
        for key, param in params.items():
            if param.kind != param.KEYWORD_ONLY or key in spec:
                continue
            if key in resources:
                spec[key] = resources[key]
            elif param.default is param.empty:
                raise ValueError(f"reward component {name!r} needs {key!r}: pass it as "
                                 f"make_reward_fn(config, {key}=...)")
        if not any(p.kind == p.VAR_KEYWORD for p in params.values()):
            _check_options(name, spec, factory, reserved=())
        components.append(Component(name, registered.kind, factory(**spec)))
    share, required = outcome_share(components, weights), config.get("min_outcome_share", 0.5)
    if share < required:
        raise ValueError(
            f"reward config lets the outcome decide only {share:.0%} of the total (required: "
            f"{required:.0%}); raise the outcome weight or lower the process/shaping weights "
            "(a policy must not out-score a correct one by gaming subgoals or shaping)")
    return RewardFn(components, weights)
