"""A tiny decoder, an RL batch it prepares and DPO pairs: shared by the loss-builder tests
(tests/rl/test_objectives.py) and the update tests (tests/train/test_update.py)."""
from __future__ import annotations

import functools

import jax
import numpy as np
from flax import nnx

from agentjax.config.schema import default_config
from agentjax.models import Decoder, ModelConfig
from agentjax.rl.prepare import build_prepare, model_logprob_fn

B, T, V = 8, 16, 64
P = 4  # pairs of the DPO tests: [P, 2, T] arrays, index 0 chosen, 1 rejected
CONFIG = ModelConfig(arch="qwen2", vocab_size=V, hidden_size=16, intermediate_size=32,
                     num_layers=1, num_heads=2, num_kv_heads=1, head_dim=8,
                     tie_embeddings=True, qkv_bias=True)


def rollout_batch(seed=0):
    """A collated batch of 2 groups of 4 with an all-masked row, before `prepare`."""
    rng = np.random.default_rng(seed)
    action = (rng.random((B, T)) < 0.5).astype(np.float32)
    action[:, :4] = 0  # the prompt
    action[3] = 0  # an all-masked row
    seq_rewards = rng.integers(0, 2, B).astype(np.float32)
    rewards = np.zeros((B, T), np.float32)
    rewards[:, -1] = seq_rewards
    return dict(
        inputs=rng.integers(0, V, (B, T)).astype(np.int32),
        targets=rng.integers(0, V, (B, T)).astype(np.int32),
        positions=np.tile(np.arange(T, dtype=np.int32), (B, 1)),
        segment_ids=np.ones((B, T), np.int32),
        turn_ids=np.tile((np.arange(T) >= 4).astype(np.int32), (B, 1)),
        action_mask=action,
        behavior_logp=np.where(action > 0, -rng.random((B, T)) * 3, 0).astype(np.float32),
        rewards=rewards, seq_rewards=seq_rewards,
        group_ids=np.repeat(np.arange(2, dtype=np.int32), B // 2),
        temperature=np.full((B,), 0.9, np.float32))


def rl_algo():
    """The default algo section with a KL term, an entropy bonus and the engine's
    log-probs as the old ones (ratios != 1, so the clip paths are exercised)."""
    algo = default_config().algo
    algo.kl_coef = 0.01
    algo.entropy_coef = 0.001
    algo.old_logp = "behavior"
    return algo


@functools.cache
def prepared():
    """(graphdef, params, algo, batch): the tiny model and `rollout_batch()` prepared by it."""
    graphdef, params = nnx.split(Decoder(CONFIG, rngs=nnx.Rngs(0)))
    algo = rl_algo()
    prepare = jax.jit(build_prepare(model_logprob_fn(graphdef, chunk_size=8), algo,
                                    num_groups=2))
    batch, _ = prepare(params, params, None, rollout_batch())
    return graphdef, params, algo, batch


def pairs(seed=0):
    """[P, 2, T] DPO pairs; pair 2's rejected side has no action token (it does not count)."""
    rng = np.random.default_rng(seed)
    mask = (rng.random((P, 2, T)) < 0.5).astype(np.float32)
    mask[..., :4] = 0  # the prompt
    mask[2, 1] = 0  # a rejected side without action tokens: the pair does not count
    return dict(inputs=rng.integers(0, V, (P, 2, T)).astype(np.int32),
                targets=rng.integers(0, V, (P, 2, T)).astype(np.int32),
                positions=np.tile(np.arange(T, dtype=np.int32), (P, 2, 1)),
                segment_ids=np.ones((P, 2, T), np.int32), loss_mask=mask,
                ref_logp=(-rng.random((P, 2, T)) * 3).astype(np.float32))


def dpo_section():
    section = default_config().dpo
    section.beta, section.kind = 0.5, "sigmoid"
    return section


def max_diff(a, b):
    return max(jax.tree.leaves(jax.tree.map(lambda x, y: float(np.abs(x - y).max()), a, b)))
