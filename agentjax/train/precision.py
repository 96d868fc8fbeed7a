"""The trainer's precision: float32 master weights, computed in config.model.dtype.

Every stage (pretraining, SFT, RL) trains float32 copies of the params it starts from,
whatever dtype they were loaded or exported in; the decoder casts them to its compute
dtype at use (tests/train/test_precision.py shows why bfloat16 masters lose updates).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections


def model_precision(config: ml_collections.ConfigDict) -> dict[str, str]:
    """ModelConfig fields of the trainer's policy: float32 params (the master weights
    the optimizer updates), computed in config.model.dtype."""
    m = config.model
    return dict(param_dtype="float32", dtype=m.dtype, remat=m.remat, attention=m.attention,
                attention_block=m.attention_block)


def master_copy(params):
    """Fresh float32 copies of `params` on their shardings: the master weights a
    TrainState owns (every update donates them), whatever dtype the model was loaded in
    — the model computes in its `config.dtype` either way."""
    return jax.tree.map(lambda x: jnp.array(x, dtype=jnp.float32, copy=True), params)
