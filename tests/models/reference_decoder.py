"""Float64 numpy reference of the decoder, written from the formulas with explicit loops,
plus helpers shared by the model tests."""
from __future__ import annotations

import math
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from agentjax.models.config import ModelConfig

# Every optional feature on, head_dim (24) != hidden/heads (16), GQA 2 queries per kv head.
TINY = ModelConfig(arch="qwen3", vocab_size=128, hidden_size=64, intermediate_size=96,
                   num_layers=2, num_heads=4, num_kv_heads=2, head_dim=24, qkv_bias=True,
                   o_bias=True, qk_norm=True)


def randomize_params(model: nnx.Module, seed: int, scale: float = 0.2) -> None:
    """Overwrites every Param with random values in place (norm weights around 1) so
    biases, norm weights and heads are all exercised, not left at their init. Works on
    abstract models (`nnx.eval_shape`) too."""
    rng = np.random.default_rng(seed)
    state = nnx.state(model)

    def draw(path, leaf):
        name = "/".join(str(getattr(k, "key", k)) for k in path)
        value = rng.normal(0.0, scale, leaf.shape)
        if "norm" in name:
            value = 1.0 + value
        return jnp.asarray(value, leaf.dtype)

    nnx.update(model, jax.tree_util.tree_map_with_path(draw, state))


def random_model(make: Callable[[], nnx.Module], seed: int) -> nnx.Module:
    """`make()` with random params, built abstractly so no JAX random init is compiled."""
    model = nnx.eval_shape(make)
    randomize_params(model, seed)
    return model


def numpy_params(model: nnx.Module) -> dict:
    """The model's params as a nested dict of float64 numpy arrays."""
    return jax.tree.map(lambda x: np.asarray(x, np.float64), nnx.to_pure_dict(nnx.state(model)))


def _rms_norm(x, w, eps):
    return w * x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)


def _rope(x, position, theta):
    """Rotates each pair (x_i, x_{i+half}) by position * theta^(-2i/hd)."""
    hd = x.shape[-1]
    half = hd // 2
    out = np.empty_like(x)
    for i in range(half):
        angle = position * theta ** (-2.0 * i / hd)
        c, s = math.cos(angle), math.sin(angle)
        out[..., i] = x[..., i] * c - x[..., i + half] * s
        out[..., i + half] = x[..., i + half] * c + x[..., i] * s
    return out


def reference_hidden(cfg: ModelConfig, params: dict, tokens, positions, segment_ids):
    """Final hidden states [B, T, D] (float64); padding rows are left at zero."""
    assert cfg.rope.type == "default"
    p = params["layers"]
    tokens, positions, segment_ids = map(np.asarray, (tokens, positions, segment_ids))
    B, T = tokens.shape
    H, K, hd = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    group = H // K
    x = params["embed"][tokens]
    for l in range(cfg.num_layers):
        h = _rms_norm(x, p["attn_norm"][l], cfg.rms_norm_eps)
        q = np.einsum("btd,dhk->bthk", h, p["q_proj"][l])
        k = np.einsum("btd,dhk->bthk", h, p["k_proj"][l])
        v = np.einsum("btd,dhk->bthk", h, p["v_proj"][l])
        if cfg.qkv_bias:
            q, k, v = q + p["q_bias"][l], k + p["k_bias"][l], v + p["v_bias"][l]
        if cfg.qk_norm:
            q = _rms_norm(q, p["q_norm"][l], cfg.rms_norm_eps)
            k = _rms_norm(k, p["k_norm"][l], cfg.rms_norm_eps)
        for b in range(B):
            for t in range(T):
                q[b, t] = _rope(q[b, t], positions[b, t], cfg.rope.theta)
                k[b, t] = _rope(k[b, t], positions[b, t], cfg.rope.theta)
        attn = np.zeros((B, T, H, hd))
        for b in range(B):
            for t in range(T):
                if segment_ids[b, t] == 0:
                    continue
                keys = [s for s in range(t + 1) if segment_ids[b, s] == segment_ids[b, t]]
                for head in range(H):
                    kv = head // group
                    scores = np.array([q[b, t, head] @ k[b, s, kv] for s in keys]) / math.sqrt(hd)
                    weights = np.exp(scores - scores.max())
                    weights /= weights.sum()
                    attn[b, t, head] = sum(w * v[b, s, kv] for w, s in zip(weights, keys))
        out = np.einsum("bthk,hkd->btd", attn, p["o_proj"][l])
        if cfg.o_bias:
            out = out + p["o_bias"][l]
        x = x + out
        h = _rms_norm(x, p["mlp_norm"][l], cfg.rms_norm_eps)
        gate = h @ p["gate_proj"][l]
        x = x + (gate / (1 + np.exp(-gate)) * (h @ p["up_proj"][l])) @ p["down_proj"][l]
    hidden = _rms_norm(x, params["final_norm"], cfg.rms_norm_eps)
    return np.where((segment_ids != 0)[..., None], hidden, 0.0)
