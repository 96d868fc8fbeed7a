"""The search suite (env.name="search"): Search-R1's search-and-answer loop over the
synthetic multi-hop world on a BM25 corpus, or over a user's Search-R1 parquet/jsonl
files (data.source="files") with a local corpus or a retrieval server."""
from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any

from agentjax.config.choices import OUTCOMES
from agentjax.core.task import Task
from agentjax.data.demonstrations import read_demonstrations_jsonl
from agentjax.data.rows import accept_rows
from agentjax.envs.search import demonstrators as demo_lib
from agentjax.envs.search import hindsight
from agentjax.envs.search.loaders import load_jsonl, load_search_r1_parquet
from agentjax.envs.search.dataset import make_search_dataset
from agentjax.envs.search.world import WorldConfig, other_worlds_documents
from agentjax.envs.registry import (TaskSuite, parse_counts, register_env, reward_fn,
                                    turn_texts)
from agentjax.envs.retrieval import BM25Retriever, DelayedRetriever, HttpRetriever
from agentjax.envs.search.env import DEFAULT_INSTRUCTION, SHORT_INSTRUCTION, SearchEnv
from agentjax.envs.turns import NATIVE, native_demonstration
from agentjax.rewards import process

# The prompt a tiny model trained from scratch needs: it learns the action format from
# the demonstrations, and every prompt token costs compute in SFT, rollouts and updates.
MINIMAL_INSTRUCTION = "Question: {question}\n"
# env.instruction -> the prompt (choices.INSTRUCTIONS).
INSTRUCTIONS = {"minimal": MINIMAL_INSTRUCTION, "short": SHORT_INSTRUCTION,
                "search_r1": DEFAULT_INSTRUCTION}


def _report(report: demo_lib.SuccessReport) -> dict[str, Any]:
    return {"success": float(report.success),
            "by_hops": {str(k): float(v) for k, v in report.by_hops.items()}}


@register_env("search")
def build_search_suite(config, data_dir: str) -> TaskSuite:
    """The Search-R1-style world: synthetic multi-hop questions over a BM25 corpus, or a
    user's Search-R1 parquet/jsonl files with a corpus (data.source="files")."""
    instruction = INSTRUCTIONS[config.env.instruction]
    # env.tool_format -> SearchEnv's action_format ("default": Search-R1's tags).
    action_format = {"default": "tags", "hermes_prompt": "tool_call"}.get(
        config.env.tool_format, config.env.tool_format)
    # The demonstrators write Search-R1 tags; the dataset's manifest records these kwargs.
    env_kwargs = dict(topk=config.env.topk, max_turns=config.env.max_turns,
                      max_observation_words=config.env.max_observation_words,
                      instruction=instruction)
    # The prompt of another format: 'minimal' says nothing of tags, the others do.
    format_kwargs = {} if action_format == "tags" else dict(
        action_format=action_format, tool_parser=config.env.tool_parser,
        instruction=MINIMAL_INSTRUCTION if config.env.instruction == "minimal" else None)
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
        demonstrations = read_demonstrations_jsonl(dataset.paths["demos"])
        # The tokenizer learns the world's own texts, whatever SFT trains on.
        demo_texts = turn_texts(demonstrations)
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
        return SearchEnv(retriever, **{**env_kwargs, **format_kwargs})

    if action_format == NATIVE:  # the demonstrator's searches in the policy's own format
        tags_env = SearchEnv(retriever, **env_kwargs)
        demonstrations = [native_demonstration(d, tags_env, make_env())
                          for d in demonstrations]
    elif action_format != "tags":
        if demonstrations and config.sft.steps:
            raise ValueError(f"env.tool_format={config.env.tool_format!r} with SFT: the "
                             "search world's demonstrations are Search-R1 tags, which SFT "
                             "trains as they are or in 'native' form")
        demonstrations = []

    texts += [instruction] + [t.question for t in train_tasks + test_tasks] + demo_texts
    # The process reward scores (and is logged for) the multi-hop tasks of the synthetic
    # world only: a dataset question has no subgoals (Term.applies in rewards.composite).
    rewards = reward_fn(config, process=config.reward.process_weight)
    return TaskSuite(train_tasks, test_tasks, make_env,
                     rewards, OUTCOMES["search"]["em"],
                     make_env().observation_role, demonstrations, texts, baselines,
                     pretrain_corpus, relabel, tools=make_env().template_tools)


def _load_tasks(path: str, *, skip_bad_rows: bool, file_prompt: bool) -> list[Task]:
    """The tasks of a Search-R1 parquet / jsonl file; rows that do not load are an error
    unless `skip_bad_rows` (data.skip_bad_rows); without `file_prompt`
    (data.file_prompt) the file's prompts are dropped, so env.instruction builds them."""
    loaded = load_search_r1_parquet(path) if path.endswith(".parquet") else load_jsonl(path)
    tasks = accept_rows(loaded, path, skip_bad_rows=skip_bad_rows)
    if file_prompt:
        return tasks
    return [dataclasses.replace(t, metadata={k: v for k, v in t.metadata.items()
                                             if k != "prompt"}) for t in tasks]
