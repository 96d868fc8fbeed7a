"""Task suites: everything env-specific a run needs, chosen by `config.env.name`.

A suite bundles the train/test tasks, an env factory, the reward function, SFT
demonstrations and the texts a tiny tokenizer is trained on. A run is written
against this one small interface, so adding a world is adding its folder: an
`agentjax/envs/<name>/suite.py` whose builder registers itself,

    @register_env("<name>")
    def build_<name>_suite(config, data_dir: str) -> TaskSuite: ...

(and its outcomes in `agentjax.config.choices.OUTCOMES`, which validation reads).
`build_suite` imports every such `suite.py` first, so a run finds the built-in envs
without importing them; an env registered anywhere else (a test, a user's module) is
found once its module is imported.

    suite = build_suite(config, data_dir)
"""
from __future__ import annotations

import dataclasses
import importlib
import json
import importlib.util
import os
import pkgutil
from typing import Any, Callable, Mapping

from agentjax.config.choices import OUTCOMES, task_env
from agentjax.core.registry import Registry
from agentjax.core.task import EpisodeLog, Task
from agentjax.envs.base import Env
from agentjax.models.chat import hermes_tools_text
from agentjax.rewards.composite import RewardFn, make_reward_fn
from agentjax.rewards.judge import LLMJudge
from agentjax.rewards.judge_http import ChatJudgeModel


@dataclasses.dataclass
class TaskSuite:
    """What a run needs from a world.

    Attributes:
      train_tasks, test_tasks: the splits (train_tasks: what RL samples from).
      make_env: builds a fresh env per episode (called from worker threads).
      reward_fn: `reward_fn(task, log) -> (total, components)`; "success" of a task is
        its outcome component (`success_key`) reaching 1.
      success_key: the reward component that says the task was solved.
      observation_role: as `Env.observation_role`.
      demonstrations: SFT data: objects with `task`, `messages`, `turns` of
        `(action, observation, trainable)` and `reward`.
      texts: texts a locally built tokenizer is trained on.
      baselines: measured test success of scripted policies, {name: {"success": s,
        "by_hops": {...}}} — the demonstrator that wrote the SFT data among them.
      pretrain_corpus: builds the language-model pretraining corpus (config.pretrain)
        when pretraining runs; None where the suite has none.
      relabel: (task, log) -> the task the episode's answer solved, or None
        (data.hindsight, agents/hindsight.py); None where the suite cannot relabel.
      tools: the function schemas of a native tool-calling env (env.tool_format
        "native"; its demonstrations' turns are messages), else None.
      episode_runner: plays an episode instead of `make_env` and the agent loop (the
        rollout pool's `EpisodeRunner`: a user's agent, envs/openai_agent), else None.
    """

    train_tasks: list[Task]
    test_tasks: list[Task]
    make_env: Callable[[], Env]
    reward_fn: Callable
    success_key: str
    observation_role: str | None
    demonstrations: list
    texts: list[str]
    baselines: dict[str, dict[str, Any]]
    pretrain_corpus: Callable[[], list[str]] | None = None
    relabel: Callable[[Task, EpisodeLog], Task | None] | None = None
    tools: list[dict] | None = None
    episode_runner: Callable | None = None

    def __post_init__(self):
        if self.tools:
            # A tokenizer built from `texts` (the tiny model's) has a template without
            # tool support: the schemas reach the policy as the Hermes fallback's text,
            # which it must tokenize compactly too.
            self.texts = [*self.texts, hermes_tools_text(self.tools)]


SuiteBuilder = Callable[[Any, str], TaskSuite]
# env name -> `builder(config, data_dir) -> TaskSuite`.
SUITES: Registry[SuiteBuilder] = Registry("env")


def register_env(name: str) -> Callable[[SuiteBuilder], SuiteBuilder]:
    """Decorator: `builder(config, data_dir) -> TaskSuite` is the suite of env.name=`name`."""
    return SUITES.register(name)


def load_builtin_envs() -> tuple[str, ...]:
    """Imports the `suite.py` of every env package of agentjax.envs (each registers its
    builder; imported here, not by the package: a suite builds its world and reads its
    files); returns the names those builders registered, in registration order.
    """
    package = os.path.dirname(__file__)
    modules = []
    for info in pkgutil.iter_modules([package]):
        module = f"{__package__}.{info.name}.suite"
        if info.ispkg and importlib.util.find_spec(module) is not None:
            importlib.import_module(module)
            modules.append(module)
    return tuple(name for name in SUITES if SUITES.get(name).__module__ in modules)


def build_suite(config, data_dir: str) -> TaskSuite:
    """The suite of `config.env.name`, with its data written under `data_dir`."""
    load_builtin_envs()
    try:
        builder = SUITES.get(config.env.name)
    except ValueError as error:
        raise ValueError(f"config.env.name={config.env.name!r}: {error}") from None
    os.makedirs(data_dir, exist_ok=True)
    return builder(config, data_dir)


# Helpers of the suite builders.


def parse_counts(spec: str) -> dict[int, int]:
    """"1:300,2:300" -> {1: 300, 2: 300} (also accepts fractions: "3:0.1")."""
    out = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        key, _, value = part.partition(":")
        if not value:
            raise ValueError(f"expected 'hops:count' entries, got {part!r} in {spec!r}")
        out[int(key)] = float(value) if "." in value else int(value)
    return out


def reward_config(config, **components: Any) -> dict:
    """The composite reward of an env: the outcome component reward.outcome names gets
    weight 1, the env's other outcome components (choices.OUTCOMES) are logged with weight
    0 (the judge, which asks a server about every episode, only when it is the outcome);
    then format (of native tool calls for env.tool_format 'native'), tool_shaping, length
    (reward.length_weight) and the env's own `components` ({name: weight or spec}, e.g.
    the search world's process reward)."""
    weights = config.reward
    out = {name: float(key == weights.outcome)
           for key, name in OUTCOMES[task_env(config)].items()
           if key != "judge" or key == weights.outcome}
    # Native tool calls are the model's own markup, checked by the parser, not tags.
    format_spec = ({"weight": weights.format_weight, "native": True}
                   if config.env.tool_format == "native" else weights.format_weight)
    out.update({"format": format_spec, "tool_shaping": weights.tool_weight})
    out.update(components)
    if weights.length_weight:
        out["length"] = {"weight": weights.length_weight, "penalty": "linear",
                         "unit": "turns", "target": 2, "coef": 0.5, "max_penalty": 1.0}
    return {"components": out}


def reward_fn(config, **components: Any) -> RewardFn:
    """The run's reward function (`reward_config(config, **components)`), with the LLM
    judge of reward.judge when reward.outcome is "judge"."""
    resources = {}
    if config.reward.outcome == "judge":
        judge = config.reward.judge
        resources["judge"] = LLMJudge(
            ChatJudgeModel(judge.url, judge.model, temperature=judge.temperature,
                           max_tokens=judge.max_tokens, timeout_s=judge.timeout_s),
            votes_per_model=judge.votes)
    return make_reward_fn(reward_config(config, **components), **resources)


def turn_texts(demos) -> list[str]:
    """The actions and observations of `demos` (tokenizer training texts)."""
    return ([text for d in demos for turn in d.turns for text in _texts(turn.action)]
            + [text for d in demos for turn in d.turns for text in _texts(turn.observation)])


def _texts(part) -> list[str]:
    """A demonstration turn's action or observation as texts: itself, or the contents
    and calls of a native turn's messages."""
    if not part:
        return []
    if isinstance(part, str):
        return [part]
    messages = [part] if isinstance(part, Mapping) else part
    return [str(m.get("content") or "") for m in messages] + [
        json.dumps(c["function"]) for m in messages for c in m.get("tool_calls", ())]
