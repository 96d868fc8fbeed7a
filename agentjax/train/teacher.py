"""On-policy distillation's teacher (algo.teacher): a model loaded beside the policy
whose log-probs of the policy's own samples give the distillation signal
(rl/distillation.py).

    teacher = load_teacher(config, runtime, tokenizer=policy.tokenizer,
                           vocab_size=policy.model_config.vocab_size)
    logp, _ = model_logprob_fn(teacher.graphdef, chunk_size=...)(teacher.params, batch, t)

The teacher may be another shape (layers, width, heads: its own graphdef) but must read
the same token ids as the policy: the same tokenizer, and an embedding with a row for
every id the policy can sample. It is frozen and never trained, so it is held in the
compute dtype (model.dtype), not as float32 masters; the memory plan counts it
(train/memory.py). Like prime-rl's teacher inference server and slime's `--opd-type
megatron` teacher, it scores by one forward pass over the sampled sequence (prefill, no
generation), once per RL step.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import jax
import ml_collections
from flax import nnx

from agentjax.models import ModelConfig, load_hf
from agentjax.models.tokenizer import load_tokenizer
from agentjax.train.policy import check_context, teacher_config, teacher_folder
from agentjax.train.runtime import Runtime


@dataclasses.dataclass(frozen=True)
class Teacher:
    """The loaded teacher.

    Attributes:
      graphdef: its decoder's nnx graph.
      params: its params in the compute dtype (frozen).
      model_config: its ModelConfig.
      path: the HF folder it was loaded from.
    """

    graphdef: nnx.GraphDef
    params: Any
    model_config: ModelConfig
    path: str


def check_same_vocabulary(teacher_tokenizer, student_tokenizer, *, teacher_vocab: int,
                          student_vocab: int, path: str) -> None:
    """ValueError unless the teacher reads the policy's token ids as the policy does: the
    same token -> id map (added and special tokens included), and an embedding with a
    row for each id the policy's embedding has (a larger one, as a bigger model of the
    family pads, is fine)."""
    teacher_ids, student_ids = teacher_tokenizer.get_vocab(), student_tokenizer.get_vocab()
    if teacher_ids != student_ids:
        differ = sorted(token for token in teacher_ids.keys() | student_ids.keys()
                        if teacher_ids.get(token) != student_ids.get(token))
        examples = ", ".join(f"{token!r}: teacher {teacher_ids.get(token)}, policy "
                             f"{student_ids.get(token)}" for token in differ[:3])
        raise ValueError(
            f"the teacher at {path} has another tokenizer than the policy "
            f"({len(teacher_ids)} vs {len(student_ids)} tokens, {len(differ)} with another "
            f"id, e.g. {examples}): its log-probs of the policy's token ids would score "
            "other tokens. Distil from a teacher of the policy's tokenizer")
    if teacher_vocab < student_vocab:
        raise ValueError(
            f"the teacher at {path} has {teacher_vocab} embedding rows, the policy "
            f"{student_vocab}: the policy can sample ids the teacher cannot score")


def load_teacher(config: ml_collections.ConfigDict, runtime: Runtime, *, tokenizer,
                 vocab_size: int) -> Teacher:
    """The teacher algo.teacher names, on the runtime's mesh in config.model.dtype,
    after checking its tokenizer and embedding against the policy's (`tokenizer`,
    `vocab_size`) and its context against rollout.max_tokens, before any weight is
    read."""
    folder, model_config = teacher_folder(config.algo.teacher), teacher_config(config)
    check_context(config, model_config, folder)
    check_same_vocabulary(load_tokenizer(folder), tokenizer,
                          teacher_vocab=model_config.vocab_size, student_vocab=vocab_size,
                          path=folder)
    m = config.model
    model, model_config = load_hf(folder, mesh=runtime.mesh, rules=runtime.rules,
                                  dtype=m.dtype, attention=m.attention,
                                  attention_block=m.attention_block)
    graphdef, params = nnx.split(model)
    runtime.log(f"teacher: {folder}, {model_config.arch}, "
                f"{sum(x.size for x in jax.tree.leaves(params)) / 1e6:.2f}M "
                f"params in {m.dtype}")
    return Teacher(graphdef, params, model_config, folder)
