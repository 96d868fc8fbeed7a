"""agentjax.rl.shaping against tests/reference.py and hand-computed values."""
import functools

import chex
import jax.numpy as jnp
import numpy as np
import pytest

from agentjax.rl import shaping
from tests import reference as ref
from tests.rl._inputs import edge_groups


class ReferenceTest(chex.TestCase):
    def setUp(self):
        super().setUp()
        rng = np.random.default_rng(0)
        self.lengths = rng.integers(0, 140, 16).astype(np.int32)
        self.rewards = rng.standard_normal(16).astype(np.float32)

    @chex.variants(with_jit=True, without_jit=True)
    def test_overlong_penalty(self):
        fn = self.variant(functools.partial(
            shaping.overlong_penalty, max_len=128, buffer=32, factor=1.5))
        np.testing.assert_allclose(fn(self.lengths), ref.overlong_penalty(self.lengths, 128, 32, 1.5),
                                   rtol=1e-6, atol=1e-7)

    @chex.variants(with_jit=True, without_jit=True)
    def test_length_penalty(self):
        for kind, kwargs in (("linear", dict(coef=0.01)), ("sigmoid", dict(tau=10.0))):
            fn = self.variant(functools.partial(
                shaping.length_penalty, target=64, kind=kind, **kwargs))
            expected = ref.length_penalty(self.rewards, self.lengths, 64, kind, **kwargs)
            np.testing.assert_allclose(fn(self.rewards, self.lengths), expected, rtol=1e-5,
                                       atol=1e-7)

    @chex.variants(with_jit=True, without_jit=True)
    def test_dynamic_sampling_keep(self):
        scores, group_ids, num_groups = edge_groups(np.random.default_rng(1))
        fn = self.variant(functools.partial(shaping.dynamic_sampling_keep, num_groups=num_groups))
        np.testing.assert_array_equal(fn(scores, group_ids),
                                      ref.dynamic_sampling_keep(scores, group_ids, num_groups))


def test_hand_computed():
    # max_len 100, buffer 20: free up to 80, linear to -factor at 100, -factor beyond.
    np.testing.assert_allclose(
        shaping.overlong_penalty(jnp.array([50, 80, 90, 100, 120]), max_len=100, buffer=20,
                                 factor=1.0),
        [0.0, 0.0, -0.5, -1.0, -1.0])
    np.testing.assert_allclose(
        shaping.length_penalty(jnp.array([1.0, 1.0]), jnp.array([5, 15]), target=10,
                               kind="linear", coef=0.1),
        [1.0, 0.5])
    np.testing.assert_allclose(
        shaping.length_penalty(jnp.array([1.0]), jnp.array([10]), target=10, kind="sigmoid",
                               tau=2.0),
        [0.5])
    keep = shaping.dynamic_sampling_keep(jnp.array([1.0, 1.0, 0.0, 1.0, 3.0]),
                                         jnp.array([0, 0, 1, 1, 2]), 3)
    np.testing.assert_array_equal(keep, [False, False, True, True, False])


def test_bad_arguments_name_the_argument():
    lengths = jnp.array([1, 2])
    with pytest.raises(ValueError, match="buffer"):
        shaping.overlong_penalty(lengths, max_len=10, buffer=0, factor=1.0)
    with pytest.raises(ValueError, match="max_len"):
        shaping.overlong_penalty(lengths, max_len=10, buffer=20, factor=1.0)
    with pytest.raises(ValueError, match="lengths"):
        shaping.overlong_penalty(jnp.zeros((2, 2)), max_len=10, buffer=2, factor=1.0)
    with pytest.raises(ValueError, match="kind"):
        shaping.length_penalty(lengths, lengths, target=1, kind="cubic", coef=1.0)
    with pytest.raises(ValueError, match="coef"):
        shaping.length_penalty(lengths, lengths, target=1, kind="linear")
    with pytest.raises(ValueError, match="tau"):
        shaping.length_penalty(lengths, lengths, target=1, kind="sigmoid", tau=0.0)
    with pytest.raises(ValueError, match="lengths"):
        shaping.length_penalty(lengths, jnp.array([1]), target=1, coef=1.0)
    with pytest.raises(ValueError, match="group_ids"):
        shaping.dynamic_sampling_keep(jnp.zeros(2), jnp.zeros(2), 1)
