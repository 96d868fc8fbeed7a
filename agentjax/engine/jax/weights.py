"""The JaxEngine's own copy of the weights, and the checks a weight swap passes.

New params must have the tree, shapes and dtypes the engine was built with; they are
placed on the construction shardings (a no-op when already there) and cast to the
model's compute dtype (`config.dtype`: float32 master weights become a bfloat16 copy)
into fresh per-layer buffers (`programs.engine_weights`). So a swap hits the same
executables (nothing recompiles), and the trainer may donate or mutate its own buffers
afterwards. When the swap takes effect is the scheduler's part (`engine/jax/scheduler.py`).

tests/engine/jax/test_engine.py, tests/train/test_precision.py.
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from agentjax.engine.jax.programs import engine_weights
from agentjax.models.decoder import LayerwiseWeights


class WeightLoader:
    """Turns params shaped as the engine's first ones into the engine's weights.

    Args:
      graphdef: the model's graphdef (`nnx.split(model)`).
      params: the params the engine starts with; later ones must match their tree,
        shapes and dtypes, and are placed on their shardings.
    """

    def __init__(self, graphdef: nnx.GraphDef, params: Any):
        self._graphdef = graphdef
        leaves, self._tree = jax.tree.flatten(params)
        self._specs = [(tuple(x.shape), x.dtype, x.sharding) for x in leaves]
        self._paths = [jax.tree_util.keystr(path) for path, _ in
                       jax.tree_util.tree_leaves_with_path(params)]

    def load(self, params: Any) -> LayerwiseWeights:
        """The engine's weights from `params`; raises ValueError naming what differs."""
        leaves, tree = jax.tree.flatten(params)
        if tree != self._tree:
            raise ValueError(
                f"update_weights: params tree differs from the engine's:\n{tree}\nvs\n"
                f"{self._tree}")
        for path, (shape, dtype, _), new in zip(self._paths, self._specs, leaves):
            if tuple(new.shape) != shape or jnp.dtype(new.dtype) != dtype:
                raise ValueError(
                    f"update_weights: {path} has {jnp.dtype(new.dtype).name}"
                    f"{tuple(new.shape)}, the engine expects {dtype.name}{shape}")
        placed = [jax.device_put(x, sharding, may_alias=True)
                  for x, (_, _, sharding) in zip(leaves, self._specs)]
        return engine_weights(self._graphdef, jax.tree.unflatten(self._tree, placed))
