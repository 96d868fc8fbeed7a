"""Everything a stage needs to sample episodes: the task suite, the engine and the pool
that drives the agent loop over it, the sampling of each step, weight sync, the record
of errors and samples, and held-out evaluation.

    rollouts = Rollouts.build(config, runtime, policy, suite)
    rollouts.sync_weights(params, version)            # the engine samples with params
    groups = rollouts.pool.collect_sync(tasks, G, sampling=rollouts.sampling(step))
    rollouts.inspect(episodes, step, stage="rl", where=f"RL step {step}",
                     fatal=True)                      # errors.jsonl, samples/
    metrics = rollouts.evaluate(params, "eval")
    rollouts.close()
"""
from __future__ import annotations

import dataclasses
import json
import time
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from agentjax.agents.evaluation import evaluate
from agentjax.agents.loop import EpisodeLimits
from agentjax.agents.pool import RolloutPool
from agentjax.config import ConfigError
from agentjax.core.trajectory import Trajectory
from agentjax.engine.protocol import SamplingParams
from agentjax.envs.registry import TaskSuite
from agentjax.models.lora import has_adapters, join_adapters, split_adapters
from agentjax.models.tokenizer import prompt_ids
from agentjax.train.engines import build_engine
from agentjax.train.episodes import EpisodeRecorder, check_failures
from agentjax.train.policy import Policy
from agentjax.train.runtime import Runtime

EVAL_SEED_OFFSET = 10_000  # evaluation samples with seeds of its own


def temperature_at(config: ml_collections.ConfigDict, step: int) -> float:
    """Linear rollout-temperature schedule from rollout.temperature to final_temperature."""
    fraction = step / max(config.total_steps - 1, 1)
    r = config.rollout
    return float(r.temperature + fraction * (r.final_temperature - r.temperature))


def undonated_copy(params):
    """A copy of `params` the learner's next update cannot donate (weights the engine
    swaps in later, from the asynchronous producer). A LoRA policy's frozen base is
    never donated: only its adapters are copied."""
    if has_adapters(params):
        adapters, base = split_adapters(params)
        return join_adapters(jax.tree.map(jnp.copy, adapters), base)
    return jax.tree.map(jnp.copy, params)


class Rollouts:
    """The run's sampling side (module docstring).

    Attributes:
      suite: the task suite (tasks, env factory, reward, success key).
      engine: the rollout engine (rollout.engine: in-process or SGLang servers).
      pool: the RolloutPool running episodes on the engine.
      eval_tasks: the fixed held-out evaluation subset.
      log: where messages go.
    """

    def __init__(self, config: ml_collections.ConfigDict, *, suite: TaskSuite, engine,
                 close_engine: Callable[[], None], pool: RolloutPool,
                 recorder: EpisodeRecorder, log: Callable[[str], None]):
        self.config = config
        self.suite, self.engine, self.pool = suite, engine, pool
        self.recorder, self.log = recorder, log
        self._close_engine = close_engine
        self._engine_params = None  # the params object the engine last received
        # A fixed random subset, so every hop count is represented whatever the order.
        order = np.random.default_rng(0).permutation(len(suite.test_tasks))
        self.eval_tasks = [suite.test_tasks[i] for i in order[:config.eval.num_tasks]]

    @classmethod
    def build(cls, config: ml_collections.ConfigDict, runtime: Runtime, policy: Policy,
              suite: TaskSuite) -> "Rollouts":
        """The configured engine holding the policy's initial params, and its pool."""
        check_token_budget(config.rollout, policy, suite, runtime.log)
        r = config.rollout
        engine, close_engine = build_engine(
            config, graphdef=policy.graphdef, params=policy.params,
            model_config=policy.model_config, tokenizer=policy.tokenizer,
            model_path=policy.path, workdir=runtime.workdir, log=runtime.log)
        pool = RolloutPool(
            engine, suite.make_env, policy.tokenizer,
            limits=EpisodeLimits(
                max_turns=config.env.max_turns, max_context_tokens=r.max_tokens,
                compact_at_tokens=config.env.compact_at_tokens,
                compaction=config.env.compaction,
                compaction_keep_turns=config.env.compaction_keep_turns,
                max_compactions=config.env.max_compactions),
            concurrency=r.concurrency, reward_fn=suite.reward_fn,
            episode_timeout_s=r.episode_timeout_s, runner=suite.episode_runner)
        recorder = EpisodeRecorder(runtime.workdir, policy.tokenizer, samples=config.log.samples,
                                   enabled=runtime.is_main, tracking=runtime.tracking)
        return cls(config, suite=suite, engine=engine, close_engine=close_engine, pool=pool,
                   recorder=recorder, log=runtime.log)

    def sampling(self, step: int, seed_index: int | None = None) -> SamplingParams:
        """Rollout sampling at `step`: the temperature schedule's value there and a seed
        drawn from `seed_index` (default: step; a step's several draws pass their own),
        so the episodes of a resumed run are those of an uninterrupted one."""
        r = self.config.rollout
        index = step if seed_index is None else seed_index
        return SamplingParams(
            temperature=temperature_at(self.config, step), top_p=r.top_p, top_k=r.top_k,
            max_new_tokens=r.max_new_tokens,
            seed=int(np.random.SeedSequence([self.config.seed, index]).generate_state(1)[0]
                     & 0x7FFFFFFF))

    def sync_weights(self, params, version: int | None = None) -> None:
        """Sends `params` to the engine unless it has them already (evaluation after an
        RL step: a second export and reload for an SGLang pool); `version` is what
        completions will report (default: the engine's previous + 1)."""
        if params is not self._engine_params:
            self.engine.update_weights(params, version=version)
            self._engine_params = params

    def inspect(self, episodes: Sequence[Trajectory], step: int, *, stage: str, where: str,
                fatal: bool, label: str | None = None) -> None:
        """Records the episodes' errors and samples (as `stage`'s `step`); warns when many
        failed, and stops when all of them did and `fatal` (`check_failures`, naming
        `where`). Messages start with `label` (default: `where`)."""
        for message in self.recorder.record(step, stage, episodes):
            self.log(f"{label or where}: new episode error: {message}")
        warning = check_failures(episodes, where=where, fatal=fatal)
        if warning:
            self.log(f"{label}: warning: {warning}" if label else f"warning: {warning}")

    def evaluate(self, params, prefix: str, tasks=None, *,
                 version: int | None = None) -> dict[str, float]:
        """Greedy and sampled success of `params` (also pass@k, per hops) on `tasks`
        (default: the fixed held-out evaluation subset) and its wall seconds
        (`time/eval_s`, `time/<prefix>_eval_s` for another prefix); the engine holds
        `params` as weight `version` afterwards (None: its next, unless it holds `params`
        already)."""
        started = time.perf_counter()
        self.sync_weights(params, version)
        sampling = dataclasses.replace(self.sampling(0), temperature=self.config.rollout.temperature,
                                       seed=self.config.seed + EVAL_SEED_OFFSET)
        results = evaluate(self.pool, self.eval_tasks if tasks is None else tasks,
                           success_key=self.suite.success_key, sampling=sampling,
                           samples=self.config.eval.samples, prefix=prefix,
                           inspect=lambda episodes: self.inspect(
                               episodes, 0, stage=prefix, where=f"{prefix} evaluation",
                               fatal=True))
        timing_key = "time/eval_s" if prefix == "eval" else f"time/{prefix}_eval_s"
        results[timing_key] = time.perf_counter() - started
        return results

    def close(self) -> None:
        self.pool.close()
        self._close_engine()


def check_token_budget(rollout: ml_collections.ConfigDict, policy: Policy, suite: TaskSuite,
                       log: Callable[[str], None]) -> None:
    """Setup errors for token budgets a run could never meet: a prompt that leaves no
    room to generate (a context beyond the model's positions stopped `Policy.load`)."""
    env, lengths = suite.make_env(), {}
    for task in list(suite.train_tasks) + list(suite.test_tasks):
        messages = env.reset(task)
        key = json.dumps(messages, sort_keys=True)
        if key not in lengths:
            lengths[key] = (len(prompt_ids(policy.tokenizer, messages)), task.task_id)
    longest, task_id = max(lengths.values())
    if longest >= rollout.max_tokens:
        raise ConfigError(
            f"config key 'rollout.max_tokens' is {rollout.max_tokens} but the prompt of task "
            f"{task_id!r} alone has {longest} tokens: raise rollout.max_tokens (or "
            "shorten env.instruction)")
    if longest + rollout.max_new_tokens > rollout.max_tokens:
        log(f"warning: the longest prompt ({longest} tokens, task {task_id!r}) leaves less "
            f"than rollout.max_new_tokens={rollout.max_new_tokens} of "
            f"rollout.max_tokens={rollout.max_tokens} for the first action")
