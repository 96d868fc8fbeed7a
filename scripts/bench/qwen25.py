"""Qwen2.5's shapes as agentjax ModelConfigs, for the benches that size things by the
published models without downloading them (serve.py's weight sync on paper, device.py's
random-weight runs).

The benches import it as a sibling module: `python scripts/bench/<bench>.py` puts this
folder first on sys.path.
"""
from __future__ import annotations

import jax
from flax import nnx

from agentjax.models.config import ModelConfig
from agentjax.models.decoder import Decoder

# Qwen2.5's config.json shapes: hidden, intermediate, layers, heads, kv heads, vocab,
# tied embeddings.
QWEN25 = {"0.5B": (896, 4864, 24, 14, 2, 151936, True),
          "3B": (2048, 11008, 36, 16, 2, 151936, True),
          "7B": (3584, 18944, 28, 28, 4, 152064, False)}
# With a tiny shape of the same fields, for runs on CPU in seconds (the benches' --tiny).
SHAPES = {**QWEN25, "tiny": (32, 64, 1, 2, 1, 256, True)}


def model_config(hidden, intermediate, layers, heads, kv_heads, vocab, tied,
                 **fields) -> ModelConfig:
    """A Qwen2 ModelConfig of that shape (q/k/v biases, head_dim = hidden / heads);
    `fields` set the rest (dtypes, remat, ...)."""
    return ModelConfig(arch="qwen2", vocab_size=vocab, hidden_size=hidden,
                       intermediate_size=intermediate, num_layers=layers, num_heads=heads,
                       num_kv_heads=kv_heads, head_dim=hidden // heads, tie_embeddings=tied,
                       qkv_bias=True, **fields)


def parameter_count(*shape) -> int:
    """Parameters of the decoder of `shape` (a QWEN25 value), counted without building
    it."""
    config = model_config(*shape)
    shapes = nnx.state(nnx.eval_shape(lambda: Decoder(config, rngs=nnx.Rngs(0))))
    return sum(x.size for x in jax.tree.leaves(shapes))
