"""The offline stages after SFT: rejection-sampling fine-tuning (RFT) and DPO on the
agent's own episodes.

    params, last_eval = run_offline(config, runtime, policy, rollouts, params)

Both train total_steps optimizer steps from the policy SFT (or init_from) gave them, in
the workdir as RL does (checkpoints, metrics.jsonl, evaluations, the export to
<workdir>/hf, the report's row), and start every window of steps with a collection from
the current policy:
  RFT   a round (total_steps / rft.rounds steps): roll out rollout.group_size episodes of
        rft.tasks training tasks, keep the successful ones (train/stages/offline_data.py),
        train the masked SFT loss on them (packed rows, as SFT).
  DPO   rollout.group_size episodes of dpo.tasks tasks, paired (trajectory- and/or
        turn-level), trained with the preference loss of rl/preference.py against the
        frozen starting policy; once (dpo.refresh_every=0: offline DPO) or every
        dpo.refresh_every steps from the current policy (online / iterative DPO).
Collection k writes its data to <workdir>/<stage>/<k>.jsonl (0000.jsonl, 0001.jsonl, ...;
data/offline_jsonl.py) and what it measured to <k>.json, atomically and before any step
trains on it; every step reads the data back from there, so a run resumed at any step
trains on the data of the uninterrupted run. Tasks are drawn from a seeded shuffled
stream over the training tasks (data.curriculum applies to RL only). A user's own RFT
set or pair file (rft.data_path, dpo.data_path) goes through the same reader.
`OfflineStage` holds the loop's state and steps (train/fit.py runs them); an
`OfflineMethod` (from STAGES) is what differs between RFT and DPO.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os
from typing import Any, Callable

import jax
import ml_collections
import numpy as np
from flax import nnx

from agentjax.agents.evaluation import solved
from agentjax.core import atomic
from agentjax.core.trajectory import collate
from agentjax.data.offline_jsonl import read_episodes, read_pairs, write_episodes, write_pairs
from agentjax.engine.protocol import SamplingParams
from agentjax.models.lora import base_graphdef, has_adapters, split_adapters
from agentjax.rl import objectives
from agentjax.core.registry import Registry
from agentjax.train import update as step_lib
from agentjax.train.fit import Hook, Stage, fit, micro_batches
from agentjax.train.policy import HF_DIR, Policy
from agentjax.train.rollouts import Rollouts
from agentjax.train.runtime import Runtime
from agentjax.train.stages.offline_data import (
    collection_info,
    episode_key,
    preference_pairs,
    rft_set,
)
from agentjax.train.stages.rl import init_rl_state, length_buckets
from agentjax.train.stages.sft import next_token_batch, shuffled_stream


@dataclasses.dataclass(frozen=True)
class OfflineMethod:
    """What differs between RFT and DPO.

    Attributes:
      loss_fn / norm_fn: the update's loss and its global denominators (step.py).
      window: steps trained on one collection.
      collect: (params, first step of the window) -> (items, info): the window's data,
        collected or read back, and what its collection measured.
      make_batch: (items, cursor) -> (numpy batch, items used from the cursor on).
      prepare: (state, device batch) -> device batch, before the update (None: none).
    """

    loss_fn: objectives.LossFn
    norm_fn: objectives.NormFn | None
    window: int
    collect: Callable[[Any, int], tuple[list, dict]]
    make_batch: Callable[[list, int], tuple[dict, int]]
    prepare: Callable[[Any, dict], dict] | None = None


def run_offline(config: ml_collections.ConfigDict, runtime: Runtime, policy: Policy,
                rollouts: Rollouts, params):
    """RFT or DPO (config.stage) from `params` for total_steps, resuming from the
    workdir's last committed checkpoint; exports to <workdir>/hf and returns (final
    params, last evaluation metrics and the episodes the stage sampled)."""
    method = STAGES.get(config.stage)(_Context(config, runtime.workdir, policy, rollouts))
    state, optimizer, _, _ = init_rl_state(config, policy.graphdef, params)
    update, state = runtime.jit_update(step_lib.build_update(
        method.loss_fn, optimizer, epochs=1, minibatches=1,
        micro_batches=micro_batches(config[config.stage].batch_size,
                                    config.algo.microbatch_size),
        norm_fn=method.norm_fn), state)
    loop = OfflineStage(config, runtime, rollouts, method, update=update)
    state = fit(runtime, loop, state, checkpoint_every=config.checkpoint.every)
    policy.export(state.params, os.path.join(runtime.workdir, HF_DIR))
    return state.params, {**loop.last_eval, f"{config.stage}/episodes": loop.episodes}


@dataclasses.dataclass(frozen=True)
class _Context:
    """What a stage's collections read: the config, the workdir (where collections are
    stored), the policy's tokenizer and model, and the rollouts."""

    config: ml_collections.ConfigDict
    workdir: str
    policy: Policy
    rollouts: Rollouts

    @property
    def section(self):
        return self.config[self.config.stage]

    def bounds(self) -> dict:
        """What a stored row must fit (data/offline_jsonl.py checks it)."""
        return {"vocab_size": self.policy.model_config.vocab_size,
                "max_tokens": self.config.rollout.max_tokens}


# ------------------------------------------------------------------ collections


def _sampling(ctx: _Context, step: int, salt: int = 0) -> SamplingParams:
    """Sampling of the collection at `step`: the rollout temperature, a seed of its own
    (`salt` 1: the branch rollouts')."""
    sampling = ctx.rollouts.sampling(step)
    seed = int(np.random.SeedSequence([sampling.seed, salt]).generate_state(1)[0] & 0x7FFFFFFF)
    return dataclasses.replace(sampling, temperature=ctx.config.rollout.temperature, seed=seed)


def _rollouts(ctx: _Context, params, step: int, num_tasks: int, index: int):
    """The groups of collection `index` (at `step`): rollout.group_size episodes of
    `num_tasks` training tasks, a seeded slice of an endless shuffled stream over them."""
    config, rollouts = ctx.config, ctx.rollouts
    rollouts.sync_weights(params)
    tasks = shuffled_stream(list(rollouts.suite.train_tasks), config.seed, index * num_tasks,
                            num_tasks)
    groups = rollouts.pool.collect_sync(tasks, config.rollout.group_size,
                                        sampling=_sampling(ctx, step), first_group_id=0)
    rollouts.inspect([t for g in groups for t in g], step + 1, stage=config.stage,
                     where=f"{config.stage.upper()} step {step + 1}", fatal=True,
                     label=f"step {step + 1}")
    info = collection_info(groups, ctx.section.min_reward)
    info["success/train"] = float(np.mean([solved(t, rollouts.suite.success_key)
                                           for g in groups for t in g]))
    return groups, info


def _stored(ctx: _Context, index: int, collect: Callable[[str], dict] | None = None
            ) -> tuple[str, dict]:
    """(data path, info) of collection `index`: `collect(data path)` writes the data and
    returns the info unless an earlier run of this workdir finished the collection (its
    info file, written last, is there); without `collect` it must have."""
    folder = os.path.join(ctx.workdir, ctx.config.stage)
    data, info_path = (os.path.join(folder, f"{index:04d}.{ext}") for ext in ("jsonl", "json"))
    if not os.path.exists(info_path):
        if collect is None:
            raise FileNotFoundError(f"{info_path}: an earlier collection of this run is "
                                    "missing")
        os.makedirs(folder, exist_ok=True)
        atomic.write_json(info_path, collect(data))
    with open(info_path) as f:
        return data, json.load(f)


def rft_stage(ctx: _Context) -> OfflineMethod:
    config, rft, tokenizer = ctx.config, ctx.config.rft, ctx.policy.tokenizer
    window = config.total_steps // rft.rounds
    bounds = ctx.bounds()
    own = read_episodes(rft.data_path, **bounds) if rft.data_path else []

    def kept_before(index):
        """Episodes kept by the rounds before `index` (their data files)."""
        return [t for i in range(index) for t in _round_episodes(*_stored(ctx, i), bounds)]

    def collect(params, step):
        index = step // window
        earlier = kept_before(index) if rft.accumulate else []

        def write(path):
            groups, info = _rollouts(ctx, params, step, rft.tasks, index)
            kept = rft_set(groups, min_reward=rft.min_reward,
                           seen={episode_key(t) for t in earlier})
            if kept:
                write_episodes(path, kept, tokenizer)
            return {**info, "data/kept": len(kept)}

        path, info = _stored(ctx, index, write)
        items = earlier + _round_episodes(path, info, bounds) + own
        if not items:
            raise ValueError(
                f"RFT round {index + 1}: no episode of {info['data/episodes']} reached "
                f"rft.min_reward={rft.min_reward} (and nothing else to train on): lower it, "
                "or raise rft.tasks or rollout.group_size")
        return items, {**info, "data/size": len(items)}

    def make_batch(items, cursor):
        return next_token_batch(items, seed=config.seed, cursor=cursor, rows=rft.batch_size,
                                length=config.rollout.max_tokens, pad_id=tokenizer.pad_token_id)

    return OfflineMethod(objectives.sft_loss(ctx.policy.graphdef,
                                           chunk_size=config.model.logprob_chunk),
                         None, window, collect, make_batch)


def _round_episodes(path: str, info: dict, bounds: dict) -> list:
    """A round's kept episodes (a round that kept none wrote no data file)."""
    return read_episodes(path, **bounds) if info["data/kept"] else []


def dpo_stage(ctx: _Context) -> OfflineMethod:
    config, dpo, tokenizer = ctx.config, ctx.config.dpo, ctx.policy.tokenizer
    graphdef = ctx.policy.graphdef
    window = dpo.refresh_every or config.total_steps
    levels = PAIR_LEVELS_OF[dpo.pairs]
    bounds = ctx.bounds()
    buckets = length_buckets(config.rollout.max_tokens)

    def collect(params, step):
        if dpo.data_path:
            pairs = read_pairs(dpo.data_path, **bounds)
            return pairs, {"data/size": len(pairs)}
        index = step // window

        def write(path):
            groups, info = _rollouts(ctx, params, step, dpo.tasks, index)
            pairs, pair_info = preference_pairs(
                ctx.rollouts.pool, groups, levels=levels, branches=dpo.branches,
                branch_sampling=_sampling(ctx, step, salt=1), min_reward=dpo.min_reward,
                per_task=dpo.pairs_per_task, seed=config.seed + index)
            if pairs:
                write_pairs(path, pairs, tokenizer)
            return {**info, **pair_info, "data/size": len(pairs)}

        path, info = _stored(ctx, index, write)
        if not info["data/size"]:
            raise ValueError(
                f"DPO collection {index + 1}: no task of {dpo.tasks} had both an episode "
                f"reaching dpo.min_reward={dpo.min_reward} and one below it (pairs="
                f"{dpo.pairs!r}): raise dpo.tasks or rollout.group_size, or move "
                "dpo.min_reward")
        return read_pairs(path, **bounds), info

    def make_batch(items, cursor):
        pairs = shuffled_stream(items, config.seed, cursor, dpo.batch_size)
        rows = collate([p.chosen for p in pairs] + [p.rejected for p in pairs],
                       buckets=buckets, pad_id=tokenizer.pad_token_id)
        size = dpo.batch_size
        batch = {k: np.stack([rows[k][:size], rows[k][size:]], axis=1)
                 for k in objectives.PAIR_KEYS}
        batch["loss_mask"] = np.stack([rows["action_mask"][:size],
                                       rows["action_mask"][size:]], axis=1)
        return batch, size

    reference = jax.jit(dpo_reference_logprobs(graphdef, ctx.policy.params,
                                               chunk_size=config.model.logprob_chunk))

    def prepare(state, batch):
        ref_params = state.params if state.ref_params is None else state.ref_params
        return {**batch, "ref_logp": reference(ref_params, batch)}

    return OfflineMethod(objectives.dpo_loss(graphdef, dpo,
                                             chunk_size=config.model.logprob_chunk),
                         objectives.pair_norm, window, collect, make_batch, prepare)


def dpo_reference_logprobs(graphdef, params, *, chunk_size: int):
    """(reference params, pair batch) -> the reference's log-probs of the pairs: the
    frozen starting policy's, or with LoRA the base model's over the policy's params
    (its adapters left out: no copy)."""
    if not has_adapters(params):
        return functools.partial(objectives.pair_logprobs, graphdef, chunk_size=chunk_size)
    base = base_graphdef(nnx.merge(graphdef, params))
    return lambda params, batch: objectives.pair_logprobs(
        base, split_adapters(params)[1], batch, chunk_size=chunk_size)


# config.choices.STAGES after SFT other than "rl", and the pair levels of each dpo.pairs.
STAGES = Registry("offline stage")
STAGES.register("rft")(rft_stage)
STAGES.register("dpo")(dpo_stage)
PAIR_LEVELS_OF = {"trajectory": ("trajectory",), "turn": ("turn",),
                  "both": ("trajectory", "turn")}


# ------------------------------------------------------------------ the loop


class OfflineStage(Stage):
    """The steps of RFT or DPO (module docstring) over `method`'s data and the jitted
    `update`: `items` is the window's data, `cursor` the position in it, `episodes` the
    episodes collected so far."""

    def __init__(self, config: ml_collections.ConfigDict, runtime: Runtime, rollouts: Rollouts,
                 method: OfflineMethod, *, update):
        self.config, self.runtime, self.rollouts = config, runtime, rollouts
        self.method, self.update = method, update
        self.name, self.desc = config.stage.upper(), config.stage
        self.folder, self.steps = runtime.workdir, config.total_steps
        self.log_every, self.optim = config.log.every, config.optim
        self.hooks = [Hook(config.eval.every, self.evaluate)]
        self.cursor, self.episodes, self.last_eval, self.items = 0, 0, {}, None

    def resume(self, state, host: dict) -> None:
        self.cursor, self.episodes = host.get("cursor", 0), host.get("episodes", 0)
        self.last_eval = host.get("last_eval", {})

    def host_state(self, done: int) -> dict:
        return {"step": done, "cursor": self.cursor, "episodes": self.episodes,
                "last_eval": self.last_eval}

    def draw(self, state, step: int):
        metrics = {}
        window_start = step - step % self.method.window
        if self.items is None or step == window_start:
            self.items, info = self.method.collect(state.params, window_start)
            if step == window_start:
                self.cursor = 0
                self.episodes += (info.get("data/episodes", 0)
                                  + info.get("data/branch_episodes", 0))
                metrics.update(info)
        batch, used = self.method.make_batch(self.items, self.cursor)
        self.cursor += used
        return batch, metrics

    def train(self, state, data, step: int):
        batch, metrics = data
        batch = self.runtime.device_batch(batch)
        if self.method.prepare is not None:
            batch = self.method.prepare(state, batch)
        state, update_metrics = self.update(state, batch)
        metrics.update(jax.device_get(update_metrics))
        metrics["episodes_total"] = self.episodes
        return state, metrics

    def evaluate(self, step: int, state, metrics: dict) -> None:
        self.last_eval = self.rollouts.evaluate(state.params, "eval")
        metrics.update(self.last_eval)

    def postfix(self, row: dict) -> dict:
        return {"loss": f"{row['loss']:.3f}"}
