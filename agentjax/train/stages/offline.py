"""The offline stages after SFT: rejection-sampling fine-tuning (RFT) and DPO on the
agent's own episodes.

    params, last_eval = run_offline(trainer, params)      config.stage "rft" or "dpo"

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
stream over the training tasks (data.curriculum applies to RL only). A user's own RFT set or pair file (rft.data_path,
dpo.data_path) goes through the same reader.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os
from typing import Any, Callable

import jax
import numpy as np
from tqdm.auto import tqdm

from agentjax.core import atomic
from agentjax.data.offline_jsonl import read_episodes, read_pairs, write_episodes, write_pairs
from agentjax.engine.protocol import EnginesUnavailable, SamplingParams
from agentjax.core.trajectory import collate
from agentjax.train import update as step_lib
from agentjax.agents.evaluation import solved
from agentjax.train.hooks import Hook, run_hooks
from agentjax.train.stages.offline_data import (
    collection_info,
    episode_key,
    preference_pairs,
    rft_set,
)
from agentjax.train.packing import pack
from agentjax.train.stages.rl import guard_nonfinite, init_rl_state, inspect_episodes
from agentjax.train.stages.sft import shuffled_stream


@dataclasses.dataclass(frozen=True)
class OfflineStage:
    """What differs between RFT and DPO.

    Attributes:
      loss_fn / norm_fn: the update's loss and its global denominators (step.py).
      window: steps trained on one collection.
      collect: (params, first step of the window) -> (items, info): the window's data,
        collected or read back, and what its collection measured.
      make_batch: (items, cursor) -> (numpy batch, items used from the cursor on).
      prepare: (state, device batch) -> device batch, before the update (None: none).
    """

    loss_fn: step_lib.LossFn
    norm_fn: step_lib.NormFn | None
    window: int
    collect: Callable[[Any, int], tuple[list, dict]]
    make_batch: Callable[[list, int], tuple[dict, int]]
    prepare: Callable[[Any, dict], dict] | None = None


def run_offline(trainer, params):
    """RFT or DPO (config.stage) from `params` for total_steps, resuming from the
    workdir's last committed checkpoint; exports to <workdir>/hf and returns (final
    params, last evaluation metrics and the episodes the stage sampled)."""
    return _train(trainer, params, STAGES[trainer.config.stage](trainer))


# ------------------------------------------------------------------ collections


def _sampling(trainer, step: int, salt: int = 0) -> SamplingParams:
    """Sampling of the collection at `step`: the rollout temperature, a seed of its own
    (`salt` 1: the branch rollouts')."""
    sampling = trainer.sampling(step)
    seed = int(np.random.SeedSequence([sampling.seed, salt]).generate_state(1)[0] & 0x7FFFFFFF)
    return dataclasses.replace(sampling, temperature=trainer.config.rollout.temperature,
                               seed=seed)


def _rollouts(trainer, params, step: int, num_tasks: int, index: int):
    """The groups of collection `index` (at `step`): rollout.group_size episodes of
    `num_tasks` training tasks, a seeded slice of an endless shuffled stream over them."""
    config = trainer.config
    trainer.sync_weights(params)
    tasks = shuffled_stream(list(trainer.suite.train_tasks), config.seed, index * num_tasks,
                            num_tasks)
    groups = trainer.pool.collect_sync(tasks, config.rollout.group_size,
                                       sampling=_sampling(trainer, step), first_group_id=0)
    inspect_episodes(trainer, groups, step + 1, first=True, stage=config.stage)
    info = collection_info(groups, trainer.config[config.stage].min_reward)
    info["success/train"] = float(np.mean([solved(t, trainer.suite.success_key)
                                           for g in groups for t in g]))
    return groups, info


def _stored(trainer, index: int, collect: Callable[[str], dict] | None = None
            ) -> tuple[str, dict]:
    """(data path, info) of collection `index`: `collect(data path)` writes the data and
    returns the info unless an earlier run of this workdir finished the collection (its
    info file, written last, is there); without `collect` it must have."""
    folder = os.path.join(trainer.workdir, trainer.config.stage)
    data, info_path = (os.path.join(folder, f"{index:04d}.{ext}") for ext in ("jsonl", "json"))
    if not os.path.exists(info_path):
        if collect is None:
            raise FileNotFoundError(f"{info_path}: an earlier collection of this run is "
                                    "missing")
        os.makedirs(folder, exist_ok=True)
        atomic.write_json(info_path, collect(data))
    with open(info_path) as f:
        return data, json.load(f)


def _read_bounds(trainer) -> dict:
    return {"vocab_size": trainer.model_config.vocab_size,
            "max_tokens": trainer.config.rollout.max_tokens}


def rft_stage(trainer) -> OfflineStage:
    config, rft = trainer.config, trainer.config.rft
    window = config.total_steps // rft.rounds
    bounds = _read_bounds(trainer)
    own = read_episodes(rft.data_path, **bounds) if rft.data_path else []

    def kept_before(index):
        """Episodes kept by the rounds before `index` (their data files)."""
        return [t for i in range(index) for t in _round_episodes(*_stored(trainer, i), bounds)]

    def collect(params, step):
        index = step // window
        earlier = kept_before(index) if rft.accumulate else []

        def write(path):
            groups, info = _rollouts(trainer, params, step, rft.tasks, index)
            kept = rft_set(groups, min_reward=rft.min_reward,
                           seen={episode_key(t) for t in earlier})
            if kept:
                write_episodes(path, kept, trainer.tokenizer)
            return {**info, "data/kept": len(kept)}

        path, info = _stored(trainer, index, write)
        items = earlier + _round_episodes(path, info, bounds) + own
        if not items:
            raise ValueError(
                f"RFT round {index + 1}: no episode of {info['data/episodes']} reached "
                f"rft.min_reward={rft.min_reward} (and nothing else to train on): lower it, "
                "or raise rft.tasks or rollout.group_size")
        return items, {**info, "data/size": len(items)}

    def make_batch(items, cursor):
        upcoming = shuffled_stream(items, config.seed, cursor, rft.batch_size * 16)
        batch, used = pack(upcoming, length=trainer.buckets[-1], rows=rft.batch_size,
                           pad_id=trainer.tokenizer.pad_token_id)
        batch["loss_mask"] = batch.pop("action_mask")
        return batch, used

    return OfflineStage(step_lib.sft_loss(trainer.graphdef, chunk_size=config.model.logprob_chunk),
                        None, window, collect, make_batch)


def _round_episodes(path: str, info: dict, bounds: dict) -> list:
    """A round's kept episodes (a round that kept none wrote no data file)."""
    return read_episodes(path, **bounds) if info["data/kept"] else []


def dpo_stage(trainer) -> OfflineStage:
    config, dpo = trainer.config, trainer.config.dpo
    window = dpo.refresh_every or config.total_steps
    levels = PAIR_LEVELS_OF[dpo.pairs]
    bounds = _read_bounds(trainer)

    def collect(params, step):
        if dpo.data_path:
            pairs = read_pairs(dpo.data_path, **bounds)
            return pairs, {"data/size": len(pairs)}
        index = step // window

        def write(path):
            groups, info = _rollouts(trainer, params, step, dpo.tasks, index)
            pairs, pair_info = preference_pairs(
                trainer.pool, groups, levels=levels, branches=dpo.branches,
                branch_sampling=_sampling(trainer, step, salt=1), min_reward=dpo.min_reward,
                per_task=dpo.pairs_per_task, seed=config.seed + index)
            if pairs:
                write_pairs(path, pairs, trainer.tokenizer)
            return {**info, **pair_info, "data/size": len(pairs)}

        path, info = _stored(trainer, index, write)
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
                       buckets=trainer.buckets, pad_id=trainer.tokenizer.pad_token_id)
        size = dpo.batch_size
        batch = {k: np.stack([rows[k][:size], rows[k][size:]], axis=1)
                 for k in step_lib.PAIR_KEYS}
        batch["loss_mask"] = np.stack([rows["action_mask"][:size],
                                       rows["action_mask"][size:]], axis=1)
        return batch, size

    reference_logprobs = jax.jit(functools.partial(
        step_lib.pair_logprobs, trainer.graphdef, chunk_size=config.model.logprob_chunk))

    def prepare(state, batch):
        return {**batch, "ref_logp": reference_logprobs(state.ref_params, batch)}

    return OfflineStage(step_lib.dpo_loss(trainer.graphdef, dpo,
                                          chunk_size=config.model.logprob_chunk),
                        step_lib.pair_norm, window, collect, make_batch, prepare)


# choices.STAGES after SFT other than "rl", and the pair levels of each dpo.pairs.
STAGES = {"rft": rft_stage, "dpo": dpo_stage}
PAIR_LEVELS_OF = {"trajectory": ("trajectory",), "turn": ("turn",),
                  "both": ("trajectory", "turn")}


# ------------------------------------------------------------------ the loop


def _train(trainer, params, stage: OfflineStage):
    config = trainer.config
    name = config.stage.upper()
    state, optimizer, _, _ = init_rl_state(trainer, params)
    update, state = trainer.jit_update(step_lib.build_update(
        stage.loss_fn, optimizer, epochs=1, minibatches=1,
        micro_batches=trainer.micro_batches(config[config.stage].batch_size),
        norm_fn=stage.norm_fn), state)
    state, host, checkpointer, writer = trainer.restore_or_start(trainer.workdir, state, name)
    start = host.get("step", 0)
    cursor, episodes = host.get("cursor", 0), host.get("episodes", 0)
    last_eval = host.get("last_eval", {})
    bar = tqdm(range(start, config.total_steps), desc=config.stage,
               disable=not (trainer.is_main and config.log.progress))
    bad_steps, items = 0, None

    def host_state(done: int) -> dict:
        return {"step": done, "cursor": cursor, "episodes": episodes, "last_eval": last_eval}

    def evaluate(step, state, metrics):
        nonlocal last_eval
        last_eval = trainer.evaluate(state.params, "eval")
        metrics.update(last_eval)

    def log(step, state, metrics):
        row = writer.write(step, metrics)
        bar.set_postfix(loss=f"{row['loss']:.3f}")

    def save(step, state, metrics):
        checkpointer.save(step, state, host_state(step), force=True)

    hooks = [Hook(config.eval.every, evaluate), Hook(config.log.every, log),
             Hook(config.checkpoint.every, save)]
    for step in bar:
        resume = (step, host_state(step))  # until this step's update (see rl_loop.run_rl)
        try:
            metrics = {}
            window_start = step - step % stage.window
            if items is None or step == window_start:
                items, info = stage.collect(state.params, window_start)
                if step == window_start:
                    cursor = 0
                    episodes += info.get("data/episodes", 0) + info.get(
                        "data/branch_episodes", 0)
                    metrics.update(info)
            batch, used = stage.make_batch(items, cursor)
            resume = None
            cursor += used
            batch = trainer.device_batch(batch)
            if stage.prepare is not None:
                batch = stage.prepare(state, batch)
            state, update_metrics = update(state, batch)
            metrics.update(jax.device_get(update_metrics))
            metrics["episodes_total"] = episodes
            state, bad_steps = guard_nonfinite(trainer, state, metrics, step + 1, bad_steps,
                                               checkpointer, host_state(step + 1))
            run_hooks(hooks, step + 1, config.total_steps, state, metrics)
        except EnginesUnavailable:
            if resume is not None:
                checkpointer.save(resume[0], state, resume[1], force=True)
            checkpointer.wait()
            raise
    checkpointer.wait()
    writer.close()
    trainer.export(state.params, "")
    return state.params, {**last_eval, f"{config.stage}/episodes": episodes}
