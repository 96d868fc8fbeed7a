"""The policy a run trains: its nnx graph, initial params, model config and tokenizer,
loaded from an HF folder and exported back to one.

    policy = Policy.load(config, runtime, texts=lambda: suite.texts)
    policy.export(params, folder)                    # safetensors + config + tokenizer

The folder is `init_from`'s export, `model.path`, or (neither given) a tiny random-init
decoder built once in <workdir>/init_model with a tokenizer trained on `texts()`, so
every later stage and every rerun loads HF.
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Callable, Sequence

import jax
import ml_collections
from flax import nnx

from agentjax.config.errors import reject
from agentjax.models import Decoder, ModelConfig, load_hf, save_hf
from agentjax.models.tokenizer import AGENT_TAGS, build_tokenizer, load_tokenizer
from agentjax.train.memory import memory_plan
from agentjax.train.precision import model_precision
from agentjax.train.runtime import Runtime

HF_DIR = "hf"  # every stage exports its final policy here (init_from / SGLang / eval)
TINY_MODEL_DIR = "init_model"


@dataclasses.dataclass
class Policy:
    """The trained model's structure and starting point (module docstring).

    Attributes:
      graphdef: the decoder's nnx graph (params are merged into it to run it).
      params: the initial params (float32 masters; the model computes in its dtype).
      model_config: the decoder's ModelConfig.
      tokenizer: its tokenizer, with the chat template's end-of-turn handling.
      path: the HF folder it was loaded from (launched rollout servers load it too).
    """

    graphdef: nnx.GraphDef
    params: Any
    model_config: ModelConfig
    tokenizer: Any
    path: str

    @classmethod
    def load(cls, config: ml_collections.ConfigDict, runtime: Runtime, *,
             texts: Callable[[], Sequence[str]], plan_memory: bool = True) -> "Policy":
        """Loads the configured policy onto the runtime's mesh. Params load as float32
        (the master weights; exact for a bfloat16 checkpoint), the model computes in
        config.model.dtype. Before any weight is read, the context is checked
        (`check_context`) and the training run's memory plan logged and checked
        (`plan_memory`; a tool that only reads weights skips it)."""
        path = model_folder(config, runtime.workdir)
        if path == os.path.join(runtime.workdir, TINY_MODEL_DIR) and not os.path.exists(
                os.path.join(path, "config.json")):
            build_tiny_model(config, path, texts())
        precision = model_precision(config)
        with open(os.path.join(path, "config.json")) as f:
            folder_config = ModelConfig.from_hf(json.load(f), **precision)
        check_context(config, folder_config, path)
        if plan_memory:
            plan = memory_plan(config, folder_config, runtime.mesh)
            runtime.log(f"memory plan per device:\n{plan.table()}")
            plan.check()
        model, model_config = load_hf(path, mesh=runtime.mesh, rules=runtime.rules,
                                      **precision)
        tokenizer = load_tokenizer(path, template_kwargs=json.loads(
            config.tokenizer.template_kwargs or "{}"))
        graphdef, params = nnx.split(model)
        runtime.log(f"policy: {model_config.arch}, "
                    f"{sum(x.size for x in jax.tree.leaves(params)) / 1e6:.2f}M params, "
                    f"vocab {model_config.vocab_size}")
        return cls(graphdef, params, model_config, tokenizer, path)

    def export(self, params, folder: str) -> None:
        """Saves `params` as an HF folder, in the compute dtype, what inference runs: a
        bfloat16 model exports bfloat16 (as it was published), not its float32
        training masters."""
        save_hf(nnx.merge(self.graphdef, params), self.model_config, folder,
                dtype=self.model_config.dtype, tokenizer=self.tokenizer)


def check_context(config: ml_collections.ConfigDict, model_config: ModelConfig,
                  path: str) -> None:
    """A ConfigError when an episode may be longer than the model's positions
    (rollout.max_tokens beyond the max_position_embeddings of the model at `path`)."""
    limit = model_config.max_position_embeddings
    if config.rollout.max_tokens > limit:
        reject("rollout.max_tokens", config.rollout.max_tokens,
               f"episodes that long exceed the model's max_position_embeddings={limit} "
               f"({os.path.join(path, 'config.json')}): lower it to at most {limit}")


def model_folder(config: ml_collections.ConfigDict, workdir: str) -> str:
    """The HF folder a run starts from: init_from's export (or init_from itself, an HF
    folder), model.path, else the run's own tiny model."""
    if config.init_from:
        path = os.path.join(config.init_from, HF_DIR)
        return path if os.path.exists(path) else config.init_from
    if config.model.path:
        return config.model.path
    return os.path.join(workdir, TINY_MODEL_DIR)


def build_tiny_model(config: ml_collections.ConfigDict, path: str,
                     texts: Sequence[str]) -> None:
    """A random-init decoder sized by config.model with a tokenizer trained on `texts`,
    saved as an HF checkpoint."""
    m = config.model
    tokenizer = build_tokenizer(texts, vocab_size=config.tokenizer.vocab_size,
                                special_tokens=AGENT_TAGS)
    model_config = ModelConfig(
        arch=m.arch, vocab_size=len(tokenizer), hidden_size=m.hidden_size,
        intermediate_size=m.intermediate_size, num_layers=m.num_layers,
        num_heads=m.num_heads, num_kv_heads=m.num_kv_heads, head_dim=m.hidden_size // m.num_heads,
        tie_embeddings=True, qkv_bias=m.arch == "qwen2", qk_norm=m.arch == "qwen3",
        max_position_embeddings=max(config.rollout.max_tokens, 2048),
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id)
    save_hf(Decoder(model_config, rngs=nnx.Rngs(config.seed)), model_config, path,
            tokenizer=tokenizer)
