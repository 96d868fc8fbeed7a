"""The trainer's precision: float32 master weights, computed in config.model.dtype.

Every stage (pretraining, SFT, RL) trains float32 copies of the params it starts from,
whatever dtype they were loaded or exported in; the decoder casts them to its compute
dtype at use (tests/train/test_precision.py shows why bfloat16 masters lose updates).
With LoRA (model.lora.rank > 0) only the adapters train: they are float32 masters, and
the frozen base is stored in the compute dtype (it never receives an update to lose).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections

from agentjax.models.lora import has_adapters, join_adapters, split_adapters


def model_precision(config: ml_collections.ConfigDict) -> dict[str, str]:
    """ModelConfig fields of the trainer's policy: float32 params (the master weights
    the optimizer updates; with LoRA a base in the compute dtype, adapters float32
    whatever it is), computed in config.model.dtype."""
    m = config.model
    return dict(param_dtype=m.dtype if m.lora.rank else "float32", dtype=m.dtype,
                remat=m.remat, attention=m.attention, attention_block=m.attention_block)


def master_copy(params):
    """Fresh float32 copies of `params` on their shardings: the master weights a
    TrainState owns (every update donates them), whatever dtype the model was loaded in
    — the model computes in its `config.dtype` either way. With LoRA, the adapters'
    copies beside the base as it is (frozen, never donated: no copy)."""
    def copy(tree):
        return jax.tree.map(lambda x: jnp.array(x, dtype=jnp.float32, copy=True), tree)

    if not has_adapters(params):
        return copy(params)
    adapters, base = split_adapters(params)
    return join_adapters(copy(adapters), base)
