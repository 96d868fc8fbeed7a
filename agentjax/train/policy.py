"""The policy a run trains: its nnx graph, initial params, model config and tokenizer,
loaded from an HF folder and exported back to one.

    policy = Policy.load(config, runtime, texts=lambda: suite.texts)
    policy.export(params, folder)                    # safetensors + config + tokenizer

The folder is `init_from`'s export, `model.path`, or (neither given) a tiny random-init
decoder built once in <workdir>/init_model with a tokenizer trained on `texts()`, so
every later stage and every rerun loads HF.

With LoRA (model.lora.rank > 0) the loaded model is the frozen base and the policy gets
adapters (fresh, seeded by config.seed, or model.lora.adapter_path's PEFT adapter);
`export` writes the merged HF folder (what init_from, evaluation and servers without
LoRA load) and the PEFT adapter beside it, and `next_stage` folds a finished stage's
adapters into the base the next stage's fresh adapters train over: every stage is LoRA
over the policy it starts from, its KL or DPO reference that policy.
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Callable, Sequence

import jax
import ml_collections
from flax import nnx

from agentjax.config.errors import ConfigError, reject
from agentjax.models import Decoder, ModelConfig, load_hf, save_hf
from agentjax.models.decoder import layer_param_specs
from agentjax.models.lora import LoraConfig, adapter_specs, add_adapters, fold_adapters
from agentjax.models.peft import check_peft_tensors, load_peft, read_peft_config, save_peft
from agentjax.models.tokenizer import AGENT_TAGS, build_tokenizer, load_tokenizer
from agentjax.train.memory import host_plan, memory_plan
from agentjax.train.precision import model_precision
from agentjax.train.runtime import Runtime

HF_DIR = "hf"  # every stage exports its final policy here (init_from / SGLang / eval)
ADAPTER_DIR = "adapter"  # and with LoRA its PEFT adapter here, beside HF_DIR
# "LoRA Without Regret" and arXiv 2512.23165 report collapses from this rank on at GRPO
# batches of this many episodes.
WIDE_RANK, LARGE_BATCH = 64, 128
TINY_MODEL_DIR = "init_model"
# What scripts/export_hf.py writes into each folder it exports to (the run and step):
# a folder with it is an earlier export, which a new one may replace.
EXPORT_MARKER = "agentjax_export.json"


@dataclasses.dataclass
class Policy:
    """The trained model's structure and starting point (module docstring).

    Attributes:
      graphdef: the decoder's nnx graph (params are merged into it to run it).
      params: the initial params (float32 masters; the model computes in its dtype).
      model_config: the decoder's ModelConfig.
      tokenizer: its tokenizer, with the chat template's end-of-turn handling.
      path: the HF folder it was loaded from (launched rollout servers load it too).
      base_path: with LoRA, the HF folder of the frozen base the adapters train over
        (path, or the merged export of the stage before: `next_stage`).
    """

    graphdef: nnx.GraphDef
    params: Any
    model_config: ModelConfig
    tokenizer: Any
    path: str
    base_path: str = ""

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
        lora = lora_config(config, folder_config, runtime.log)
        if plan_memory:
            plan = memory_plan(config, dataclasses.replace(folder_config, lora=lora),
                               runtime.mesh, teacher=teacher_config(config))
            local = [d for d in runtime.mesh.devices.flat
                     if d.process_index == jax.process_index()]
            if local[0].platform == "cpu":  # the devices are the host's memory
                plan = host_plan(plan, devices=len(local))
            runtime.log(f"memory plan per device:\n{plan.table()}")
            plan.check()
        model, model_config = load_hf(path, mesh=runtime.mesh, rules=runtime.rules,
                                      **precision)
        if lora is not None:
            model = add_adapters(model, lora, seed=config.seed)
            if config.model.lora.adapter_path:
                model = load_peft(model, config.model.lora.adapter_path)
            model_config = model.config
        tokenizer = load_tokenizer(path, template_kwargs=json.loads(
            config.tokenizer.template_kwargs or "{}"))
        graphdef, params = nnx.split(model)
        runtime.log(f"policy: {model_config.arch}, "
                    f"{sum(x.size for x in jax.tree.leaves(params)) / 1e6:.2f}M params, "
                    f"vocab {model_config.vocab_size}")
        return cls(graphdef, params, model_config, tokenizer, path, base_path=path)

    @property
    def lora(self) -> LoraConfig | None:
        return self.model_config.lora

    def export(self, params, folder: str, *, extra_files: dict[str, str] | None = None
               ) -> None:
        """Saves `params` as an HF folder, in the compute dtype, what inference runs: a
        bfloat16 model exports bfloat16 (as it was published), not its float32
        training masters. With LoRA: the merged weights (`lora.fold_adapters`), and the
        PEFT adapter over `base_path` in the sibling folder ADAPTER_DIR. Each folder
        (export_folders) is replaced as a whole; `extra_files` (name -> text) are
        written into each."""
        model = nnx.merge(self.graphdef, params)
        hf_folder, *adapter_folder = export_folders(folder, lora=self.lora is not None)
        if adapter_folder:
            save_peft(model, adapter_folder[0], base_model=self.base_path,
                      extra_files=extra_files)
            model = fold_adapters(model)
        save_hf(model, model.config, hf_folder, dtype=self.model_config.dtype,
                tokenizer=self.tokenizer, extra_files=extra_files)

    def next_stage(self, params, exported: str, *, seed: int):
        """The params a stage after another starts from: without LoRA `params`; with it
        the finished stage's adapters folded into the base (float32 merge, one rounding:
        the policy the stage exported to `exported`, now the base_path) and fresh
        adapters (B = 0: the same policy, A seeded by `seed`)."""
        if self.lora is None:
            return params
        folded = fold_adapters(nnx.merge(self.graphdef, params))
        self.base_path = exported
        return nnx.state(add_adapters(folded, self.lora, seed=seed))


def export_folders(folder: str, *, lora: bool) -> list[str]:
    """The folders `Policy.export(params, folder)` replaces: `folder`, and with LoRA
    its sibling ADAPTER_DIR."""
    folder = os.path.normpath(folder)  # "out/" is "out": its sibling, not a subfolder
    return [folder] + ([os.path.join(os.path.dirname(folder), ADAPTER_DIR)] if lora else [])


def export_refusal(folder: str, *, lora: bool) -> str | None:
    """Why scripts/export_hf.py must not export into `folder`: a folder it replaces
    (export_folders) holds something that is not an earlier export of the script (one
    with EXPORT_MARKER). None when each is missing, empty or such an export."""
    why = []
    for target in export_folders(folder, lora=lora):
        if not os.path.lexists(target):
            continue
        if not os.path.isdir(target):
            why.append(f"{target} is a file")
            continue
        names = sorted(os.listdir(target))
        if names and EXPORT_MARKER not in names:
            shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more"
                                            if len(names) > 5 else "")
            why.append(f"{target} holds {shown} and is no earlier export (it has no "
                       f"{EXPORT_MARKER})")
    if not why:
        return None
    return ("an export replaces its folder as a whole, and " + "; ".join(why)
            + ": choose a missing or empty folder")


def lora_config(config: ml_collections.ConfigDict, model_config: ModelConfig,
                log: Callable[[str], None]) -> LoraConfig | None:
    """The adapters config.model.lora asks for (model.lora.adapter_path's when given)
    on the model of `model_config`, checked against its shapes before any weight is
    read (a ConfigError naming the key), with the setup's warnings; None without LoRA."""
    section = config.model.lora
    if not section.rank:
        return None
    try:
        if section.adapter_path:
            lora, base = read_peft_config(section.adapter_path)
            check_peft_tensors(section.adapter_path,
                               dataclasses.replace(model_config, lora=lora))
            log(f"LoRA: continuing {section.adapter_path} (rank {lora.rank}, alpha "
                f"{lora.alpha}, targets {','.join(lora.targets)}; trained over "
                f"{base or 'an unnamed base'})")
        else:
            lora = LoraConfig(rank=section.rank, alpha=section.alpha,
                              targets=tuple(t.strip() for t in section.targets.split(",")),
                              dropout=section.dropout)
            adapter_specs(layer_param_specs(model_config), lora)
    except ValueError as error:
        raise ConfigError(f"{error} (the model's shapes: its config.json)") from error
    if lora.dropout:
        log(f"warning: {section.adapter_path} was trained with lora_dropout={lora.dropout}; "
            "agentjax trains without dropout")
    if lora.attention_only:
        log(f"warning: LoRA on attention only (model.lora.targets={','.join(lora.targets)}): "
            "at equal parameter count it learns less than adapters that include the MLP "
            "('LoRA Without Regret', 2025); add gate,up,down")
    batch = config.rollout.prompts_per_step * config.rollout.group_size
    if lora.rank >= WIDE_RANK and batch >= LARGE_BATCH and config.stage == "rl":
        log(f"warning: LoRA rank {lora.rank} >= {WIDE_RANK} with {batch} episodes a step: "
            f"ranks this high collapsed at GRPO batches >= {LARGE_BATCH} in one study "
            "(arXiv 2512.23165 and others); policy-gradient RL matches full fine-tuning at "
            "low ranks (try 8-32)")
    return lora


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


def teacher_folder(path: str) -> str:
    """The HF folder of algo.teacher `path`: a run's workdir gives its final export
    (HF_DIR), an HF folder itself."""
    for folder in (os.path.join(path, HF_DIR), path):
        if os.path.isfile(os.path.join(folder, "config.json")):
            return folder
    raise FileNotFoundError(f"algo.teacher={path!r} holds no HF model: neither "
                            f"{os.path.join(path, HF_DIR, 'config.json')} (a finished run's "
                            f"export) nor {os.path.join(path, 'config.json')} exists")


def teacher_config(config: ml_collections.ConfigDict) -> ModelConfig | None:
    """The ModelConfig of on-policy distillation's teacher (algo.teacher, read when
    algo.distill_coef > 0; None otherwise), without its weights: frozen, it is held and
    computes in config.model.dtype (train/teacher.py)."""
    if not config.algo.distill_coef:
        return None
    m = config.model
    with open(os.path.join(teacher_folder(config.algo.teacher), "config.json")) as f:
        return ModelConfig.from_hf(json.load(f), param_dtype=m.dtype, dtype=m.dtype,
                                   attention=m.attention, attention_block=m.attention_block)


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
