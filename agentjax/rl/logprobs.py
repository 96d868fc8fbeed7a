"""Log-probs and entropy of target tokens straight from hidden states and the lm-head.

`token_logprobs` never materializes the [B, T, V] float32 logits: it walks over chunks of
`chunk_size` positions along T, computing [B, chunk, V] logits, their log-sum-exp, the
target's log-prob and the entropy, and keeps only [B, T] results. Its custom VJP saves
only the per-token log-sum-exp and entropy and recomputes each chunk's logits in the
backward pass, accumulating d lm_head chunk by chunk. Peak extra memory is therefore
O(B * chunk_size * V) instead of O(B * T * V). Chunking along T (not B) keeps a sharded
batch axis sharded.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from agentjax.rl import _common
from agentjax.rl import kl as kl_lib


def _check_inputs(hidden, lm_head, targets, temperature):
    _common.check_rank("hidden", hidden, 3)
    _common.check_rank("lm_head", lm_head, 2)
    _common.check_rank("targets", targets, 2)
    _common.check_integer("targets", targets)
    if hidden.shape[2] != lm_head.shape[0]:
        raise ValueError(
            f"lm_head has shape {lm_head.shape}, its first axis must equal the hidden size "
            f"{hidden.shape[2]} of hidden {hidden.shape}"
        )
    if targets.shape != hidden.shape[:2]:
        raise ValueError(f"targets has shape {targets.shape}, expected {hidden.shape[:2]}")
    _common.check_range("temperature", temperature, low=0.0, low_open=True)


def _logits(hidden, lm_head, temperature):
    logits = jnp.einsum("...d,dv->...v", hidden, lm_head, preferred_element_type=jnp.float32)
    return logits / temperature


def token_logprobs_full(hidden, lm_head, targets, *, temperature=1.0):
    """Reference path of `token_logprobs` that materializes the full [B, T, V] logits.

    Fine for tiny vocabularies (tests, CPU toy models); for real vocabularies use
    `token_logprobs`, which gives the same results without the [B, T, V] buffer.

    Args:
      hidden: [B, T, D] final hidden states; hidden[b, t] predicts targets[b, t].
      lm_head: [D, V] output projection.
      targets: [B, T] int token ids in [0, V).
      temperature: Python float > 0 dividing the logits.

    Returns:
      (logp, entropy), both [B, T] float32.
    """
    _check_inputs(hidden, lm_head, targets, temperature)
    logits = _logits(hidden, lm_head, temperature)
    logp = jnp.take_along_axis(jax.nn.log_softmax(logits), targets[..., None], axis=-1)[..., 0]
    return logp, kl_lib.entropy_from_logits(logits)


def _chunk_forward(hidden, lm_head, targets, temperature):
    """[B, C, D] hidden chunk -> (logp, entropy, lse), each [B, C] float32."""
    logits = _logits(hidden, lm_head, temperature)
    # Work with max-shifted logits: entropy = lse' - E_p[z'] then cancels small numbers,
    # not two copies of a large logit (which costs ~1e-5 absolute on peaked rows).
    peak = jnp.max(logits, axis=-1, keepdims=True)
    shifted = logits - peak
    shifted_lse = jnp.log(jnp.sum(jnp.exp(shifted), axis=-1))
    probs = jnp.exp(shifted - shifted_lse[..., None])
    entropy = shifted_lse - jnp.sum(probs * shifted, axis=-1)
    target = jnp.take_along_axis(shifted, targets[..., None], axis=-1)[..., 0]
    return target - shifted_lse, entropy, peak[..., 0] + shifted_lse


def _to_chunks(x, chunk_size):
    """[B, T, ...] -> [T / chunk, B, chunk, ...] (T already padded to a multiple)."""
    b, t = x.shape[:2]
    x = x.reshape(b, t // chunk_size, chunk_size, *x.shape[2:])
    return jnp.moveaxis(x, 1, 0)


def _from_chunks(x):
    """[T / chunk, B, chunk, ...] -> [B, T, ...]."""
    x = jnp.moveaxis(x, 0, 1)
    return x.reshape(x.shape[0], x.shape[1] * x.shape[2], *x.shape[3:])


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _chunked(hidden, lm_head, targets, chunk_size, temperature):
    logp, entropy, _ = _chunked_forward(hidden, lm_head, targets, chunk_size, temperature)
    return logp, entropy


def _chunked_forward(hidden, lm_head, targets, chunk_size, temperature):
    def body(_, chunk):
        h, t = chunk
        return None, _chunk_forward(h, lm_head, t, temperature)

    _, outs = lax.scan(body, None, (_to_chunks(hidden, chunk_size), _to_chunks(targets, chunk_size)))
    return tuple(_from_chunks(o) for o in outs)


def _chunked_fwd(hidden, lm_head, targets, chunk_size, temperature):
    logp, entropy, lse = _chunked_forward(hidden, lm_head, targets, chunk_size, temperature)
    return (logp, entropy), (hidden, lm_head, targets, entropy, lse)


def _chunked_bwd(chunk_size, temperature, residuals, cotangents):
    hidden, lm_head, targets, entropy, lse = residuals
    g_logp, g_entropy = cotangents

    def body(g_head, chunk):
        h, t, ent, z_lse, g_lp, g_ent = chunk
        log_probs = _logits(h, lm_head, temperature) - z_lse[..., None]
        probs = jnp.exp(log_probs)
        # d logp / dz = onehot - p ;  d H / dz = -p (z - E_p[z]) = -p (log p + H).
        onehot = lax.broadcasted_iota(jnp.int32, log_probs.shape, 2) == t[..., None]
        g_logits = jnp.where(onehot, g_lp[..., None], 0.0) - probs * (
            g_lp[..., None] + g_ent[..., None] * (log_probs + ent[..., None])
        )
        g_logits = (g_logits / temperature).astype(lm_head.dtype)
        g_h = jnp.einsum("bcv,dv->bcd", g_logits, lm_head, preferred_element_type=jnp.float32)
        g_head = g_head + jnp.einsum(
            "bcd,bcv->dv", h, g_logits, preferred_element_type=jnp.float32
        )
        return g_head, g_h.astype(hidden.dtype)

    chunks = tuple(
        _to_chunks(x, chunk_size) for x in (hidden, targets, entropy, lse, g_logp, g_entropy)
    )
    g_head, g_hidden = lax.scan(body, jnp.zeros(lm_head.shape, jnp.float32), chunks)
    return _from_chunks(g_hidden), g_head.astype(lm_head.dtype), None


_chunked.defvjp(_chunked_fwd, _chunked_bwd)


def token_logprobs(hidden, lm_head, targets, *, chunk_size, temperature=1.0):
    """Log-prob of each target token and the entropy of each next-token distribution.

    logits[b, t] = hidden[b, t] @ lm_head / temperature, computed chunk by chunk in float32
    (float32 accumulation for bf16 inputs); logp[b, t] = log softmax(logits[b, t])[targets
    [b, t]] and entropy[b, t] = H(softmax(logits[b, t])). The caller shifts: hidden[b, t]
    is the state that predicts targets[b, t]. Differentiable w.r.t. hidden and lm_head
    (custom VJP; gradients have the inputs' dtypes); works under jit, grad and a batch
    sharded along B.

    Args:
      hidden: [B, T, D] final hidden states (after the final norm).
      lm_head: [D, V] output projection (transpose the tied embedding if needed).
      targets: [B, T] int token ids in [0, V) (any valid id at padding positions).
      chunk_size: static Python int, positions along T per step; each step materializes
        B * chunk_size * V float32 logits (pick it so that is a few hundred MB at most).
        T is padded up to a multiple of it internally.
      temperature: static Python float > 0, the sampling temperature the log-probs
        should match (1.0 = raw logits).

    Returns:
      (logp, entropy), both [B, T] float32.
    """
    _check_inputs(hidden, lm_head, targets, temperature)
    _common.check_positive_int("chunk_size", chunk_size)
    seq_len = hidden.shape[1]
    chunk_size = min(chunk_size, seq_len)
    pad = -seq_len % chunk_size
    if pad:
        hidden = jnp.pad(hidden, ((0, 0), (0, pad), (0, 0)))
        targets = jnp.pad(targets, ((0, 0), (0, pad)))
    logp, entropy = _chunked(hidden, lm_head, targets, chunk_size, float(temperature))
    return logp[:, :seq_len], entropy[:, :seq_len]


def masked_token_logprobs(hidden, lm_head, targets, mask, *, chunk_size, positions,
                          temperature=1.0):
    """`token_logprobs` at the positions where `mask` > 0 only, 0 elsewhere.

    A loss reads the log-probs of its masked tokens (an agent's actions: often a small
    share of an episode, the prompt and tool outputs being the rest), and the lm-head's
    [T, D] x [D, V] product is a large share of a small model's forward at a real
    vocabulary (a fifth of SmolLM2-135M's). So each row's first `positions` masked
    positions are gathered, and only those go through the lm-head, with static shapes.
    When some row has more masked positions than `positions`, every position is
    computed (`lax.cond`: both are compiled, one runs): the result is the same either
    way, the budget only decides the cost.

    Args:
      hidden, lm_head, targets, chunk_size, temperature: as `token_logprobs`.
      mask: [B, T] the positions whose log-probs are read (a loss mask).
      positions: static int, the masked positions per row the gathered path holds.

    Returns:
      (logp, entropy), both [B, T] float32, 0 where mask is 0.
    """
    _common.check_rank("mask", mask, 2)
    _common.check_positive_int("positions", positions)
    if mask.shape != targets.shape:
        raise ValueError(f"mask has shape {mask.shape}, expected {targets.shape}")
    rows, seq_len = targets.shape
    budget = min(positions, seq_len)
    read = mask > 0
    counts = read.sum(axis=1)

    def gathered():
        # Each row's masked positions first, in order (the rest fill up to the budget).
        index = jax.vmap(lambda r: jnp.nonzero(r, size=budget, fill_value=0)[0])(read)
        logp, entropy = token_logprobs(
            jnp.take_along_axis(hidden, index[..., None], axis=1), lm_head,
            jnp.take_along_axis(targets, index, axis=1), chunk_size=chunk_size,
            temperature=temperature)
        filled = jnp.arange(budget)[None, :] < counts[:, None]
        row = jnp.arange(rows)[:, None]
        return tuple(jnp.zeros((rows, seq_len), jnp.float32).at[row, index].add(
            jnp.where(filled, x, 0.0)) for x in (logp, entropy))

    def everywhere():
        logp, entropy = token_logprobs(hidden, lm_head, targets, chunk_size=chunk_size,
                                       temperature=temperature)
        return jnp.where(read, logp, 0.0), jnp.where(read, entropy, 0.0)

    if budget == seq_len:
        return everywhere()
    return lax.cond(jnp.all(counts <= budget), gathered, everywhere)
