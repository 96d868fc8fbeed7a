"""The next-token stages before RL: pretraining on a text corpus, then SFT on
demonstrations with corpus documents mixed in.

    params = run_sft(config, runtime, policy, suite, params)

With LoRA each trains adapters over the policy it starts from (train/policy.py:
`Policy.next_stage`). Both stages are a `NextTokenStage` that train/fit.py runs: whole
trajectories packed into rows (`train.packing`) drawn from a seeded endless stream
(`shuffled_stream`), checkpointed into <workdir>/<stage> with the stream's cursor, the
final policy exported to <workdir>/<stage>/hf.
"""
from __future__ import annotations

import os
from typing import Callable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from agentjax.core.trajectory import Trajectory
from agentjax.envs.registry import TaskSuite
from agentjax.rl import objectives
from agentjax.train import update as step_lib
from agentjax.train.fit import Stage, fit, micro_batches
from agentjax.train.packing import pack
from agentjax.train.policy import HF_DIR, Policy
from agentjax.train.precision import master_copy
from agentjax.train.runtime import Runtime


def shuffled_stream(items: list, seed: int, position: int, count: int) -> list:
    """Items `position .. position + count` of an endless stream over `items` that
    visits them in a fresh seeded permutation each epoch — a function of (seed,
    position) only, so a checkpointed cursor resumes the data order exactly."""
    out = []
    while len(out) < count:
        epoch, offset = divmod(position + len(out), len(items))
        order = np.random.default_rng([seed, 1, epoch]).permutation(len(items))
        out += [items[i] for i in order[offset:offset + count - len(out)]]
    return out


def replies_past_max_new_tokens(demos: list[Trajectory], max_new_tokens: int) -> str | None:
    """What is wrong when demonstrated replies are longer than a reply the policy may
    write (rollout.max_new_tokens): SFT teaches them, every rollout cuts them (a native
    tool call of the search world is 38 tokens with the tiny tokenizer, its Search-R1
    search 7), and the agent fails for no reason it could learn. None when all fit."""
    lengths = [len(turn.action_ids) for demo in demos for turn in demo.turns
               if turn.trainable]
    longer = [n for n in lengths if n > max_new_tokens]
    if not longer:
        return None
    return (f"{len(longer)} of the {len(lengths)} demonstrated replies are longer than "
            f"rollout.max_new_tokens={max_new_tokens} (the longest {max(longer)} tokens): "
            "the policy cannot write them whole; raise rollout.max_new_tokens")


def corpus_sample(corpus: list[Trajectory], demos: list[Trajectory], fraction: float,
                  seed: int) -> list[Trajectory]:
    """Corpus documents to mix into SFT so that they hold about `fraction` of its tokens:
    a seeded sample, whole documents, as many as the corpus has."""
    if not fraction:
        return []
    wanted = fraction / (1.0 - fraction) * sum(t.num_tokens for t in demos)
    order = np.random.default_rng(seed).permutation(len(corpus))
    tokens = np.cumsum([corpus[i].num_tokens for i in order])
    return [corpus[i] for i in order[:int(np.searchsorted(tokens, wanted)) + 1]]


def demonstration_trajectories(suite: TaskSuite, tokenizer, max_tokens: int,
                               log: Callable[[str], None]) -> list[Trajectory]:
    """The suite's demonstrations as trajectories, those longer than the context
    (`max_tokens`) left out: the policy trains on what it could have generated."""
    trajs = [Trajectory.from_demonstration(
        tokenizer, d.messages, d.turns, observation_role=suite.observation_role,
        tools=suite.tools,
        reward=d.reward, task=d.task) for d in suite.demonstrations]
    kept = [t for t in trajs if t.num_tokens <= max_tokens]
    if len(kept) < len(trajs):
        log(f"SFT: {len(trajs) - len(kept)} demonstrations longer than "
            f"rollout.max_tokens={max_tokens} left out")
    if not kept:
        raise ValueError("SFT: no demonstration fits rollout.max_tokens")
    return kept


def corpus_trajectories(suite: TaskSuite, tokenizer, env_name: str) -> list[Trajectory]:
    """The suite's pretraining corpus, a trajectory per document."""
    if suite.pretrain_corpus is None:
        raise ValueError(f"pretrain.steps > 0 or sft.corpus_mix > 0 but the {env_name!r} "
                         "suite has no pretraining corpus (synthetic search worlds have one)")
    return [Trajectory.from_text(tokenizer, text) for text in suite.pretrain_corpus()]


def run_sft(config: ml_collections.ConfigDict, runtime: Runtime, policy: Policy,
            suite: TaskSuite, params):
    """Pretraining on the suite's corpus (pretrain.steps), then SFT on the
    demonstrations (sft.steps), with corpus documents mixed in (sft.corpus_mix);
    returns the new params."""
    tokenizer = policy.tokenizer
    corpus = (corpus_trajectories(suite, tokenizer, config.env.name)
              if config.pretrain.steps or (config.sft.steps and config.sft.corpus_mix)
              else [])
    if config.pretrain.steps:
        params = fit_next_token(config, runtime, policy, "pretrain", corpus, config.pretrain,
                                params)
        if config.sft.steps:
            params = policy.next_stage(
                params, os.path.join(runtime.workdir, "pretrain", HF_DIR), seed=config.seed)
    if config.sft.steps:
        demos = demonstration_trajectories(suite, tokenizer, config.rollout.max_tokens,
                                           runtime.log)
        warning = replies_past_max_new_tokens(demos, config.rollout.max_new_tokens)
        if warning:
            runtime.log(f"warning: {warning}")
        params = fit_next_token(
            config, runtime, policy, "sft",
            demos + corpus_sample(corpus, demos, config.sft.corpus_mix, config.seed),
            config.sft, params)
    return params


def next_token_batch(trajs: list[Trajectory], *, seed: int, cursor: int, rows: int,
                     length: int, pad_id: int) -> tuple[dict, int]:
    """(packed rows of `trajs` from the stream's `cursor` on, trajectories used): the
    masked next-token loss trains their trainable tokens (RFT reuses it)."""
    upcoming = shuffled_stream(trajs, seed, cursor, rows * 16)
    batch, used = pack(upcoming, length=length, rows=rows, pad_id=pad_id)
    batch["loss_mask"] = batch.pop("action_mask")
    return batch, used


def fit_next_token(config: ml_collections.ConfigDict, runtime: Runtime, policy: Policy,
                   stage: str, trajs: list[Trajectory], section, params):
    """`section.steps` steps (batch `section.batch_size` packed rows, lr `section.lr`,
    cosine) of next-token loss on the trainable tokens of `trajs`, checkpointed and
    resumable under <workdir>/<stage>; exports to <workdir>/<stage>/hf."""
    optimizer = step_lib.make_optimizer(section.lr, total_steps=section.steps,
                                        warmup_steps=min(20, section.steps // 10),
                                        schedule="cosine", grad_clip=config.optim.grad_clip)
    params = master_copy(params)
    state = step_lib.TrainState(step=jnp.int32(0), params=params,
                                opt_state=step_lib.init_opt_state(optimizer, params),
                                rng=jax.random.key(config.seed))
    update, state = runtime.jit_update(step_lib.build_update(
        objectives.sft_loss(policy.graphdef, chunk_size=config.model.logprob_chunk,
                            positions_frac=config.model.logprob_positions), optimizer,
        epochs=1, minibatches=1,
        micro_batches=micro_batches(section.batch_size, config.algo.microbatch_size)), state)
    loop = NextTokenStage(stage, os.path.join(runtime.workdir, stage), trajs, update=update,
                          device_batch=runtime.device_batch, steps=section.steps,
                          batch_size=section.batch_size, length=config.rollout.max_tokens,
                          pad_id=policy.tokenizer.pad_token_id, seed=config.seed,
                          log_every=config.log.every)
    state = fit(runtime, loop, state, checkpoint_every=config.checkpoint.every)
    policy.export(state.params, os.path.join(loop.folder, HF_DIR))
    return state.params


class NextTokenStage(Stage):
    """Next-token steps on packed rows of `trajs` from a seeded stream; `cursor` is
    the stream's position, checkpointed with the state."""

    def __init__(self, name: str, folder: str, trajs: list[Trajectory], *, update,
                 device_batch: Callable[[dict], dict], steps: int, batch_size: int,
                 length: int, pad_id: int, seed: int, log_every: int):
        self.name = self.desc = name
        self.folder, self.steps, self.log_every = folder, steps, log_every
        self.trajs, self.update, self.device_batch = trajs, update, device_batch
        self.batch_size, self.length, self.pad_id, self.seed = batch_size, length, pad_id, seed
        self.cursor = 0

    def resume(self, state, host: dict) -> None:
        self.cursor = host.get("cursor", 0)

    def host_state(self, done: int) -> dict:
        return {"step": done, "cursor": self.cursor}

    def draw(self, state, step: int):
        batch, used = next_token_batch(self.trajs, seed=self.seed, cursor=self.cursor,
                                       rows=self.batch_size, length=self.length,
                                       pad_id=self.pad_id)
        self.cursor += used
        return batch, used

    def train(self, state, data, step: int):
        batch, used = data
        state, metrics = self.update(state, self.device_batch(batch))
        return state, {**metrics, "episodes_per_step": used}  # fetched when logged

    def postfix(self, row: dict) -> dict:
        return {"nll": f"{row['nll']:.3f}"}
