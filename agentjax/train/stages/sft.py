"""The next-token stages before RL: pretraining on a text corpus, then SFT on
demonstrations with corpus documents mixed in.

    params = run_sft(trainer, params)

Both stages pack whole trajectories into rows (`train.packing`) drawn from a seeded
endless stream (`shuffled_stream`), checkpoint into <workdir>/<stage> with the stream's
cursor, and export their final policy to <workdir>/<stage>/hf.
"""
from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from agentjax.core.trajectory import Trajectory
from agentjax.train import update as step_lib
from agentjax.train.packing import pack
from agentjax.train.precision import master_copy


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


def demonstration_trajectories(trainer) -> list[Trajectory]:
    """The suite's demonstrations as trajectories, those longer than the context left
    out (the policy trains on what it could have generated)."""
    max_tokens = trainer.config.rollout.max_tokens
    suite = trainer.suite
    trajs = [Trajectory.from_demonstration(
        trainer.tokenizer, d.messages, d.turns, observation_role=suite.observation_role,
        reward=d.reward, task=d.task) for d in suite.demonstrations]
    kept = [t for t in trajs if t.num_tokens <= max_tokens]
    if len(kept) < len(trajs):
        trainer.log(f"SFT: {len(trajs) - len(kept)} demonstrations longer than "
                    f"rollout.max_tokens={max_tokens} left out")
    if not kept:
        raise ValueError("SFT: no demonstration fits rollout.max_tokens")
    return kept


def corpus_trajectories(trainer) -> list[Trajectory]:
    """The suite's pretraining corpus, a trajectory per document."""
    if trainer.suite.pretrain_corpus is None:
        raise ValueError(f"pretrain.steps > 0 or sft.corpus_mix > 0 but the "
                         f"{trainer.config.env.name!r} suite has no pretraining corpus "
                         "(synthetic search worlds have one)")
    return [Trajectory.from_text(trainer.tokenizer, text)
            for text in trainer.suite.pretrain_corpus()]


def run_sft(trainer, params):
    """Pretraining on the suite's corpus (pretrain.steps), then SFT on the
    demonstrations (sft.steps), with corpus documents mixed in (sft.corpus_mix);
    returns the new params."""
    config = trainer.config
    corpus = (corpus_trajectories(trainer)
              if config.pretrain.steps or (config.sft.steps and config.sft.corpus_mix)
              else [])
    if config.pretrain.steps:
        params = fit_next_token(trainer, "pretrain", corpus, config.pretrain, params)
    if config.sft.steps:
        demos = demonstration_trajectories(trainer)
        params = fit_next_token(
            trainer, "sft",
            demos + corpus_sample(corpus, demos, config.sft.corpus_mix, config.seed),
            config.sft, params)
    return params


def fit_next_token(trainer, stage: str, trajs: list[Trajectory], section, params):
    """`section.steps` steps (batch `section.batch_size` packed rows, lr `section.lr`,
    cosine) of next-token loss on the trainable tokens of `trajs`, checkpointed and
    resumable under <workdir>/<stage>; exports to <workdir>/<stage>/hf."""
    config = trainer.config
    optimizer = step_lib.make_optimizer(section.lr, total_steps=section.steps,
                                        warmup_steps=min(20, section.steps // 10),
                                        schedule="cosine", grad_clip=config.optim.grad_clip)
    params = master_copy(params)
    state = step_lib.TrainState(step=jnp.int32(0), params=params,
                                opt_state=optimizer.init(params),
                                rng=jax.random.key(config.seed))
    update, state = trainer.jit_update(step_lib.build_update(
        step_lib.sft_loss(trainer.graphdef, chunk_size=config.model.logprob_chunk), optimizer,
        epochs=1, minibatches=1, micro_batches=trainer.micro_batches(section.batch_size)),
        state)
    state, host, checkpointer, writer = trainer.restore_or_start(
        os.path.join(trainer.workdir, stage), state, stage)
    start, cursor = host.get("step", 0), host.get("cursor", 0)
    bar = tqdm(range(start, section.steps), desc=stage,
               disable=not (trainer.is_main and config.log.progress))
    for step in bar:
        upcoming = shuffled_stream(trajs, config.seed, cursor, section.batch_size * 16)
        batch, used = pack(upcoming, length=trainer.buckets[-1], rows=section.batch_size,
                           pad_id=trainer.tokenizer.pad_token_id)
        cursor += used
        batch["loss_mask"] = batch.pop("action_mask")
        state, metrics = update(state, trainer.device_batch(batch))
        if (step + 1) % config.log.every == 0 or step + 1 == section.steps:
            row = writer.write(step + 1, {**jax.device_get(metrics), "episodes_per_step": used})
            bar.set_postfix(nll=f"{row['nll']:.3f}")
        checkpointer.save(step + 1, state, {"step": step + 1, "cursor": cursor})
    checkpointer.save(section.steps, state, {"step": section.steps, "cursor": cursor},
                      force=True)
    checkpointer.wait()
    writer.close()
    trainer.export(state.params, stage)
    return state.params
