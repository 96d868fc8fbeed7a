"""PEFT LoRA adapter folders in and out: what transformers' peft, SGLang and vLLM load.

    save_peft(model, "run/adapter", base_model="/ckpt/Qwen2.5-7B")   # a LoRA Decoder
    lora = read_peft_config("some/adapter")                         # checked, a LoraConfig
    model = load_peft(add_adapters(base, lora, seed=0), "some/adapter")

A folder holds `adapter_config.json` (peft_type "LORA", task_type "CAUSAL_LM", r,
lora_alpha, target_modules as an explicit list of projection names,
base_model_name_or_path, bias "none", no DoRA, no modules_to_save) and
`adapter_model.safetensors`, one A and one B per layer and target, named as peft saves
them (without the adapter's name) and in torch's layout, alpha / r not baked in:

    base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight   [r, d_in]
    base_model.model.model.layers.{i}.self_attn.q_proj.lora_B.weight   [d_out, r]
    base_model.model.model.layers.{i}.mlp.gate_proj.lora_A.weight ...

d_in / d_out flatten agentjax's axes as models/hf.py's weight maps do (q_proj's output
heads x head_dim, o_proj's input heads x head_dim). Tensors are matched to projections
by name, never by shape (k and v have equal shapes: a shape match would load one into
the other); every layer's A and B of every target must be there with the model's
shapes, and nothing else.
"""
from __future__ import annotations

import json
import os
from typing import Any, Mapping

import jax
import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

from agentjax.core import atomic
from agentjax.models.hf import host_value
from agentjax.models.decoder import layer_param_specs
from agentjax.models.lora import TARGETS, LoraConfig, adapter_specs

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
_PREFIX = "base_model.model.model.layers.{i}."
_MODULE = {"q_proj": "self_attn.", "k_proj": "self_attn.", "v_proj": "self_attn.",
           "o_proj": "self_attn.", "gate_proj": "mlp.", "up_proj": "mlp.",
           "down_proj": "mlp."}
_PROJECTIONS = {proj: short for short, proj in TARGETS.items()}
# adapter_config.json fields whose other values change what the adapter computes.
_MUST_BE = {"peft_type": ("LORA",), "bias": ("none",), "use_dora": (False, None),
            "use_rslora": (False, None), "fan_in_fan_out": (False, None),
            "modules_to_save": (None, []), "layers_to_transform": (None,),
            "rank_pattern": (None, {}), "alpha_pattern": (None, {})}


def tensor_name(proj: str, layer: int, which: str) -> str:
    """The PEFT tensor name of projection `proj`'s A or B ("a" | "b") in `layer`."""
    return (_PREFIX.format(i=layer) + _MODULE[proj] + proj
            + f".lora_{which.upper()}.weight")


def _to_peft(which: str, x: np.ndarray, rank: int) -> np.ndarray:
    """One layer's agentjax A [d_in..., r] / B [r, d_out...] -> torch's [r, d_in] /
    [d_out, r]."""
    if which == "a":
        return x.reshape(-1, rank).T
    return x.reshape(rank, -1).T


def _from_peft(x: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """The inverse of _to_peft (A and B alike), to one layer's agentjax `shape`."""
    return x.T.reshape(shape)


def save_peft(model: Any, folder: str | os.PathLike, *, base_model: str,
              extra_files: Mapping[str, str] | None = None) -> None:
    """Writes `model`'s adapters (a Decoder with config.lora) as a PEFT folder, replaced
    as a whole (atomically); `base_model` is the base_model_name_or_path it records,
    `extra_files` file name -> text written into the folder with the adapter."""
    lora = model.config.lora
    if lora is None:
        raise ValueError("save_peft needs a Decoder with LoRA adapters (config.lora)")
    tensors = {}
    for proj, pair in model.lora.items():
        for which, param in pair.items():
            stacked = host_value(param[...]).astype(np.float32)
            for i, layer in enumerate(stacked):
                tensors[tensor_name(proj, i, which)] = np.ascontiguousarray(
                    _to_peft(which, layer, lora.rank))
    config = {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": lora.rank,
        "lora_alpha": lora.alpha, "lora_dropout": lora.dropout,
        "target_modules": list(lora.projections), "base_model_name_or_path": base_model,
        "bias": "none", "use_dora": False, "use_rslora": False, "fan_in_fan_out": False,
        "modules_to_save": None, "layers_to_transform": None, "layers_pattern": None,
        "rank_pattern": {}, "alpha_pattern": {}, "init_lora_weights": True,
        "inference_mode": True, "revision": None,
    }
    if jax.process_index() != 0:
        return
    with atomic.folder(folder) as out:
        save_file(tensors, os.path.join(out, ADAPTER_WEIGHTS), metadata={"format": "pt"})
        with open(os.path.join(out, ADAPTER_CONFIG), "w") as f:
            json.dump(config, f, indent=2)
        for name in (ADAPTER_WEIGHTS, ADAPTER_CONFIG):
            os.chmod(os.path.join(out, name), 0o644)  # servers may run as another user
        for name, text in (extra_files or {}).items():
            with open(os.path.join(out, name), "w") as f:
                f.write(text)


def read_peft_config(folder: str | os.PathLike) -> tuple[LoraConfig, str]:
    """(the LoraConfig, base_model_name_or_path) of a PEFT adapter folder. Raises
    ValueError naming the folder and field of anything agentjax's LoRA does not
    compute: another PEFT type, DoRA, rsLoRA, modules_to_save, biases, per-layer
    ranks, a target that is not one of the seven projections."""
    file = os.path.join(folder, ADAPTER_CONFIG)
    if not os.path.isfile(file):
        raise FileNotFoundError(f"model.lora.adapter_path: {file} not found")
    with open(file) as f:
        config = json.load(f)
    for key, allowed in _MUST_BE.items():
        if config.get(key) not in allowed:
            raise ValueError(f"model.lora.adapter_path: {file} has {key}="
                             f"{config.get(key)!r}; agentjax's LoRA needs {allowed[0]!r}")
    modules = config.get("target_modules")
    if not isinstance(modules, list):
        raise ValueError(f"model.lora.adapter_path: {file} has target_modules={modules!r}; "
                         "an explicit list of projection names is needed")
    unknown = [m for m in modules if m not in _PROJECTIONS]
    if unknown:
        raise ValueError(f"model.lora.adapter_path: {file} targets {unknown}, which are not "
                         f"among the decoder's projections {list(_PROJECTIONS)}")
    lora = LoraConfig(rank=int(config["r"]), alpha=float(config["lora_alpha"]),
                      targets=tuple(_PROJECTIONS[p] for p in _PROJECTIONS if p in modules),
                      dropout=float(config.get("lora_dropout") or 0.0))
    return lora, str(config.get("base_model_name_or_path") or "")


def _expected(model_config: Any) -> dict[str, tuple[str, str, tuple[int, ...]]]:
    """PEFT tensor name -> (projection, "a" | "b", its torch shape) of every adapter of
    a model with `model_config` (whose lora is set)."""
    lora = model_config.lora
    specs = adapter_specs(layer_param_specs(model_config), lora)
    return {tensor_name(proj, i, which): (proj, which, _to_peft(
                which, np.zeros(shape[1:], np.int8), lora.rank).shape)
            for proj, pair in specs.items() for which, (shape, _) in pair.items()
            for i in range(model_config.num_layers)}


def check_peft_tensors(folder: str | os.PathLike, model_config: Any) -> None:
    """ValueError, naming the folder and tensor, when the adapter file of `folder` does
    not fit a model of `model_config` (its lora the folder's): a missing or unexpected
    tensor (other layers, other targets), another shape. Reads the header only."""
    file = os.path.join(folder, ADAPTER_WEIGHTS)
    if not os.path.isfile(file):
        raise FileNotFoundError(f"model.lora.adapter_path: {file} not found")
    with safe_open(file, framework="numpy") as f:
        shapes = {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}
    expected = _expected(model_config)
    unexpected = sorted(shapes.keys() - expected.keys())
    if unexpected:
        raise ValueError(f"model.lora.adapter_path: {file} has tensors the model "
                         f"({model_config.num_layers} layers, targets "
                         f"{list(model_config.lora.projections)}) does not: {unexpected[:4]}")
    for name, (_, _, shape) in expected.items():
        if name not in shapes:
            raise ValueError(f"model.lora.adapter_path: {file} lacks {name}")
        if shapes[name] != shape:
            raise ValueError(f"model.lora.adapter_path: {file}: {name} has shape "
                             f"{list(shapes[name])}, the model needs {list(shape)} (an "
                             "adapter of another base model?)")


def load_peft(model: Any, folder: str | os.PathLike) -> Any:
    """`model` (a Decoder whose config.lora is the folder's, `read_peft_config`) with its
    adapters replaced by the folder's, placed where the model's were; the file is
    checked first (`check_peft_tensors`)."""
    lora, _ = read_peft_config(folder)
    if model.config.lora != lora:
        raise ValueError(f"model.lora.adapter_path: {folder} holds {lora}, the model's "
                         f"adapters are {model.config.lora}")
    check_peft_tensors(folder, model.config)
    stacks: dict[tuple[str, str], list] = {}
    with safe_open(os.path.join(folder, ADAPTER_WEIGHTS), framework="numpy") as f:
        for name, (proj, which, _) in _expected(model.config).items():
            layer_shape = model.lora[proj][which].shape[1:]
            stacks.setdefault((proj, which), []).append(
                _from_peft(f.get_tensor(name), layer_shape))
    for (proj, which), layers in stacks.items():
        param = model.lora[proj][which]
        value = np.stack(layers).astype(np.float32)
        param[...] = jax.make_array_from_callback(
            value.shape, param[...].sharding, lambda index, v=value: v[index])
    return model
