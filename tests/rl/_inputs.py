"""Random test inputs that always contain the edge cases the numerics must survive."""
from __future__ import annotations

import numpy as np

from agentjax.rl.policy_losses import policy_loss_hyperparameters

# Fixed test shapes: every test reuses them so that jitted functions compile once.
B, T = 8, 12


def edge_mask(rng, batch=B, length=T):
    """[batch, length] bool action mask: interleaved random rows plus one row each that is
    all-masked, single-token, fully unmasked and multi-turn (2 action, 2 observation, ...)."""
    mask = rng.random((batch, length)) < 0.6
    mask[0] = False
    mask[1] = False
    mask[1, length // 2] = True
    mask[2] = True
    mask[3] = np.arange(length) % 4 < 2
    return mask


def floats(rng, shape, scale=1.0):
    return (scale * rng.standard_normal(shape)).astype(np.float32)


def edge_groups(rng, n=B):
    """(scores [n], group_ids [n], num_groups) with a zero-variance group (0), a size-1 group
    (1), random groups, an unused group id and a padding row with id -1."""
    assert n >= 8
    group_ids = np.array([0, 0, 0, 1, -1] + [2 + (i % 2) for i in range(n - 5)], np.int32)
    scores = rng.integers(0, 3, size=n).astype(np.float32) + floats(rng, n, 0.1)
    scores[:3] = 0.7  # zero variance, and 0.7 is not exact in binary
    return scores, group_ids, 5  # group 4 has no member


# The clip bounds of the policy-loss tests (asymmetric: DAPO's clip-higher).
CLIPS = dict(clip_low=0.2, clip_high=0.28)


def kind_params(kind, dual_clip=None):
    """The policy-loss hyperparameters of `kind` in the tests: CLIPS for the clipped kinds
    and, when given, ppo's dual clip (a kind takes only its own hyperparameters)."""
    params = {k: v for k, v in CLIPS.items() if k in policy_loss_hyperparameters(kind)}
    if dual_clip is not None:
        params["dual_clip"] = dual_clip
    return params


def policy_inputs(seed):
    """(logp, old_logp, advantages, mask) [B, T] with a token beyond the dual-clip bound."""
    rng = np.random.default_rng(seed)
    mask = edge_mask(rng)
    logp = floats(rng, (B, T), 0.5) - 1.0
    old_logp = logp + floats(rng, (B, T), 0.3)
    old_logp[4, :3] = logp[4, :3] - 1.5  # ratio ~4.5: beyond the dual-clip bound
    advantages = floats(rng, (B, T))
    advantages[4, :3] = -1.0
    return logp, old_logp, advantages, mask
