"""References shared by the rollout tests: the sampling distribution in float64 and a
full (cache-free) forward of the model."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

# Full forwards are padded to this length so that they compile once.
PAD_TO = 128


def reference_logp(logits, temperature, top_k, top_p):
    """float64 log pi over the vocabulary for one row, straight from the definition."""
    logits = np.asarray(logits, np.float64)
    if temperature == 0:
        z = logits
        return z - np.log(np.exp(z - z.max()).sum()) - z.max()
    z = logits / temperature
    order = np.argsort(-z, kind="stable")
    keep = np.zeros(len(z), bool)
    k = len(z) if top_k <= 0 else min(top_k, len(z))
    top = order[:k]
    p_top = np.exp(z[top] - z[top].max())
    p_top /= p_top.sum()
    before = 0.0
    for token, p in zip(top, p_top):
        if top_p >= 1.0 or before < top_p:
            keep[token] = True
        before += p
    out = np.full(len(z), -np.inf)
    kept = z[keep]
    out[keep] = kept - (np.log(np.exp(kept - kept.max()).sum()) + kept.max())
    return out


@functools.partial(jax.jit, static_argnums=0)
def _forward_logits(graphdef, params, tokens, segment_ids):
    model = nnx.merge(graphdef, params)
    positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
    hidden, _ = model(tokens, positions, segment_ids)
    return model.logits(hidden)


def full_logits(model, ids) -> np.ndarray:
    """float32 logits [len(ids), V] of one cache-free forward of `model` over `ids`."""
    assert len(ids) <= PAD_TO, f"{len(ids)} ids > PAD_TO={PAD_TO}"
    tokens = np.zeros((1, PAD_TO), np.int32)
    segments = np.zeros((1, PAD_TO), np.int32)
    tokens[0, :len(ids)] = ids
    segments[0, :len(ids)] = 1
    graphdef, params = nnx.split(model)
    return np.asarray(_forward_logits(graphdef, params, tokens, segments))[0, :len(ids)]
