"""Random test inputs that always contain the edge cases the numerics must survive."""
from __future__ import annotations

import numpy as np

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
