"""Task suites: everything env-specific a run needs, chosen by `config.env.name`.

A suite bundles the train/test tasks, an env factory, the reward function, SFT
demonstrations and the texts a tiny tokenizer is trained on. The trainer is written
against this one small interface, so adding a world means adding one builder here.

    suite = build_suite(config, data_dir)
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os
from typing import Any, Callable

import numpy as np

from agentjax.config.choices import OUTCOMES
from agentjax.data import demonstrators as demo_lib
from agentjax.data import hindsight
from agentjax.data.arith import make_arith_splits
from agentjax.data.loaders import load_jsonl, load_search_r1_parquet
from agentjax.data.search_data import make_search_dataset
from agentjax.data.world import WorldConfig, other_worlds_documents
from agentjax.core.task import EpisodeLog, Task
from agentjax.envs.base import Env
from agentjax.envs.python.env import DEFAULT_INSTRUCTION as PYTHON_INSTRUCTION
from agentjax.envs.python.env import PythonEnv
from agentjax.envs.retrieval import BM25Retriever, DelayedRetriever, HttpRetriever
from agentjax.envs.search.env import DEFAULT_INSTRUCTION, SHORT_INSTRUCTION, SearchEnv
from agentjax.rewards import process
from agentjax.rewards.composite import RewardFn, make_reward_fn
from agentjax.rewards.judge import LLMJudge
from agentjax.rewards.judge_http import ChatJudgeModel


@dataclasses.dataclass
class TaskSuite:
    """What the trainer needs from a world.

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


def parse_counts(spec: str) -> dict[int, int]:
    """"1:300,2:300" -> {1: 300, 2: 300} (also accepts fractions: "3:0.1")."""
    out = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        key, _, value = part.partition(":")
        if not value:
            raise ValueError(f"expected 'hops:count' entries, got {part!r} in {spec!r}")
        out[int(key)] = float(value) if "." in value else int(value)
    return out


def _reward_config(config) -> dict:
    """The composite reward: the outcome component reward.outcome names gets weight 1, the
    env's other outcome components are logged with weight 0 (the judge, which asks a
    server about every episode, only when it is the outcome)."""
    weights = config.reward
    components = {name: float(key == weights.outcome)
                  for key, name in OUTCOMES[config.env.name].items()
                  if key != "judge" or key == weights.outcome}
    components.update({"format": weights.format_weight, "tool_shaping": weights.tool_weight})
    if config.env.name == "search":
        # Scores (and is logged for) the multi-hop tasks of the synthetic world only: a
        # dataset question has no subgoals (Term.applies in rewards.composite).
        components["process"] = weights.process_weight
    if weights.length_weight:
        components["length"] = {"weight": weights.length_weight, "penalty": "linear",
                                "unit": "turns", "target": 2, "coef": 0.5, "max_penalty": 1.0}
    return {"components": components}


def _reward_fn(config) -> RewardFn:
    """The run's reward function (`_reward_config`), with the LLM judge of reward.judge
    when reward.outcome is "judge"."""
    resources = {}
    if config.reward.outcome == "judge":
        judge = config.reward.judge
        resources["judge"] = LLMJudge(
            ChatJudgeModel(judge.url, judge.model, temperature=judge.temperature,
                           max_tokens=judge.max_tokens, timeout_s=judge.timeout_s),
            votes_per_model=judge.votes)
    return make_reward_fn(_reward_config(config), **resources)


def _report(report: demo_lib.SuccessReport) -> dict[str, Any]:
    return {"success": float(report.success),
            "by_hops": {str(k): float(v) for k, v in report.by_hops.items()}}


# The prompt a tiny model trained from scratch needs: it learns the action format from
# the demonstrations, and every prompt token costs compute in SFT, rollouts and updates.
MINIMAL_INSTRUCTION = "Question: {question}\n"
INSTRUCTIONS = {"minimal": MINIMAL_INSTRUCTION, "short": SHORT_INSTRUCTION,
                "search_r1": DEFAULT_INSTRUCTION}


def build_search_suite(config, data_dir: str) -> TaskSuite:
    """The Search-R1-style world: synthetic multi-hop questions over a BM25 corpus, or a
    user's Search-R1 parquet/jsonl files with a corpus (data.source="files")."""
    instruction = INSTRUCTIONS[config.env.instruction]
    env_kwargs = dict(topk=config.env.topk, max_turns=config.env.max_turns,
                      max_observation_words=config.env.max_observation_words,
                      instruction=instruction)
    baselines, demonstrations, demo_texts, pretrain_corpus = {}, [], [], None
    relabel = None
    if config.data.source == "synthetic":
        world_config = WorldConfig(
            seed=config.data.world_seed, num_people=config.data.num_people,
            num_companies=config.data.num_companies, num_cities=config.data.num_cities,
            num_countries=config.data.num_countries,
            train_questions=parse_counts(config.data.train_questions),
            test_questions=parse_counts(config.data.test_questions))
        sft = config.sft
        demonstrator = demo_lib.DemonstratorConfig(
            "demonstrator", p_guess=sft.guess_prob, p_stop_early=sft.early_stop_prob,
            p_repeat=sft.repeat_prob, p_poor_query=sft.poor_query_prob,
            p_negative=sft.negative_frac, guess=sft.guess)
        dataset = make_search_dataset(
            data_dir, world_config, demonstrator, env_kwargs=env_kwargs,
            demo_hops=parse_counts(config.data.demo_hops) if config.data.demo_hops else None,
            seed=config.data.world_seed)
        world = dataset.world
        train_tasks, test_tasks = world.train_tasks, world.test_tasks
        demonstrations = demo_lib.read_demonstrations_jsonl(dataset.paths["demos"])
        # The tokenizer learns the world's own texts, whatever SFT trains on.
        demo_texts = _turn_texts(demonstrations)
        if sft.rename_frac:
            demonstrations = demo_lib.rename_some(demonstrations, world.entities,
                                                  sft.rename_frac, seed=config.data.world_seed)
        taught = demo_lib.taught_facts(demonstrations)
        test_tasks = [demo_lib.mark_taught(t, taught) for t in test_tasks]
        if config.data.rl_excludes_demo_tasks:
            # SFT memorizes its own questions (a deterministic first move per question
            # leaves GRPO groups without variance): RL trains on the other questions.
            demonstrated = {d.task.task_id for d in demonstrations}
            train_tasks = [t for t in train_tasks if t.task_id not in demonstrated]
        index = dataset.paths["index"]
        baselines = {name: _report(by_split["test"]) for name, by_split in dataset.reports.items()}
        texts = [r["contents"] for r in world.corpus_records()]
        pretrain_corpus = functools.partial(other_worlds_documents, world_config,
                                            config.pretrain.worlds)
        # Relabeled questions never ask a held-out one.
        relabel = functools.partial(hindsight.relabel, world=world, exclude_questions=frozenset(
            t.question for t in test_tasks))
    else:
        load = functools.partial(_load_tasks, skip_bad_rows=config.data.skip_bad_rows,
                                 file_prompt=config.data.file_prompt)
        train_tasks = load(config.data.train_path)
        test_tasks = load(config.data.test_path) if config.data.test_path else []
        if config.reward.process_weight and not any(
                process.has_subgoals(t) for t in train_tasks):
            raise ValueError(f"reward.process_weight={config.reward.process_weight} rewards "
                             "the subgoals of multi-hop tasks, and no task of "
                             f"{config.data.train_path} has any; set it to 0")
        index = os.path.join(data_dir, "index")
        texts = [m["content"] for t in train_tasks + test_tasks
                 for m in t.metadata.get("prompt", ())]
        if config.retrieval.kind == "bm25":
            if not config.data.corpus_path:
                raise ValueError("data.source='files' with retrieval.kind='bm25' needs "
                                 "data.corpus_path (Search-R1 corpus jsonl)")
            BM25Retriever.from_corpus(config.data.corpus_path, index_dir=index)
    if config.retrieval.kind == "http":
        retriever = HttpRetriever(config.retrieval.url, timeout_s=config.retrieval.timeout_s)
    else:
        retriever = BM25Retriever.load(index)
    if config.retrieval.latency_s:
        retriever = DelayedRetriever(retriever, config.retrieval.latency_s)

    def make_env():
        return SearchEnv(retriever, **env_kwargs)

    texts += [instruction] + [t.question for t in train_tasks + test_tasks] + demo_texts
    return TaskSuite(train_tasks, test_tasks, make_env,
                     _reward_fn(config), OUTCOMES["search"]["em"],
                     None, demonstrations, texts, baselines, pretrain_corpus, relabel)


def _turn_texts(demos) -> list[str]:
    """The actions and observations of `demos` (tokenizer training texts)."""
    return ([turn.action for d in demos for turn in d.turns]
            + [turn.observation for d in demos for turn in d.turns if turn.observation])


def _load_tasks(path: str, *, skip_bad_rows: bool, file_prompt: bool) -> list[Task]:
    """The tasks of a Search-R1 parquet / jsonl file; rows that do not load are an error
    unless `skip_bad_rows` (data.skip_bad_rows); without `file_prompt`
    (data.file_prompt) the file's prompts are dropped, so env.instruction builds them."""
    loaded = load_search_r1_parquet(path) if path.endswith(".parquet") else load_jsonl(path)
    if loaded.errors:
        shown = "; ".join(e.message for e in loaded.errors[:5])
        message = f"{len(loaded.errors)} of the rows of {path} do not load ({shown})"
        if not skip_bad_rows:
            raise ValueError(f"{message}; fix them, or set data.skip_bad_rows=True to skip them")
        print(f"warning: {message}; skipped (data.skip_bad_rows)")
    if not loaded.tasks:
        raise ValueError(f"no usable task in {path}")
    if file_prompt:
        return list(loaded.tasks)
    return [dataclasses.replace(t, metadata={k: v for k, v in t.metadata.items()
                                             if k != "prompt"}) for t in loaded.tasks]


def _arith_demonstration(task: Task, rng: np.random.Generator, guess_prob: float,
                         env: Env) -> demo_lib.Demonstration:
    """A scripted python-tool episode: compute with the tool (or guess), then answer."""
    messages = env.reset(task)
    turns = []
    if rng.random() >= guess_prob:
        code = f"print({task.metadata.get('expression', task.question)})"
        action = ('<tool_call>{"name": "python", "arguments": {"code": '
                  + json.dumps(code) + "}}</tool_call>")
        observation, done, _, _ = env.step(action)
        turns.append(demo_lib.DemoTurn(action, None if done else observation, True))
        answer = observation.strip().splitlines()[-1] if observation.strip() else "0"
    else:
        answer = str(int(rng.integers(0, 10 ** 6)))
    if not env.log.done:
        action = f"<answer> {answer} </answer>"
        env.step(action)
        turns.append(demo_lib.DemoTurn(action, None, True))
    return demo_lib.Demonstration(task, messages, turns, env.log, 0.0, "arith")


def build_python_suite(config, data_dir: str) -> TaskSuite:
    """Arithmetic with a sandboxed python tool (hermes-style tool calls)."""
    counts = parse_counts(config.data.train_questions)
    train_tasks, test_tasks = make_arith_splits(
        sum(counts.values()), sum(parse_counts(config.data.test_questions).values()),
        seed=config.data.world_seed)
    env_kwargs = dict(max_turns=config.env.max_turns)

    def make_env():
        return PythonEnv(**env_kwargs)

    reward_fn = _reward_fn(config)
    rng = np.random.default_rng(config.data.world_seed)
    demos = []
    for task in train_tasks[:config.sft.num_demos] if config.sft.steps else []:
        demo = _arith_demonstration(task, rng, config.sft.guess_prob, make_env())
        demo.reward = reward_fn(task, demo.log)[0]
        demos.append(demo)
    texts = [PYTHON_INSTRUCTION] + [t.question for t in train_tasks + test_tasks]
    texts += _turn_texts(demos)
    success = float(np.mean([d.reward >= 1 for d in demos])) if demos else 0.0
    baselines = {"demonstrator": {"success": success, "by_hops": {}}} if demos else {}
    return TaskSuite(train_tasks, test_tasks, make_env, reward_fn, OUTCOMES["python"]["em"],
                     "tool", demos, texts, baselines)


SUITES = {"search": build_search_suite, "python": build_python_suite}


def build_suite(config, data_dir: str) -> TaskSuite:
    """The suite of `config.env.name`, with its data written under `data_dir`."""
    if config.env.name not in SUITES:
        raise ValueError(f"config.env.name={config.env.name!r}; known: {sorted(SUITES)}")
    os.makedirs(data_dir, exist_ok=True)
    return SUITES[config.env.name](config, data_dir)
