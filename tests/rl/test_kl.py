"""agentjax.rl.kl against tests/reference.py."""
import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentjax.rl import kl as kl_lib
from tests import reference as ref
from tests.rl._inputs import B, T, floats


class KLTest(chex.TestCase):
    def setUp(self):
        super().setUp()
        rng = np.random.default_rng(0)
        self.logp = floats(rng, (B, T)) - 2.0
        self.ref_logp = self.logp + floats(rng, (B, T), 0.5)

    @chex.variants(with_jit=True, without_jit=True)
    def test_values_and_gradients(self):
        for kind in kl_lib.KL_KINDS:
            fn = self.variant(functools.partial(kl_lib.kl, kind=kind))
            value = fn(self.logp, self.ref_logp)
            np.testing.assert_allclose(value, ref.kl(self.logp, self.ref_logp, kind), rtol=1e-5,
                                       atol=1e-6)
            grad = jax.grad(lambda lp: fn(lp, self.ref_logp).sum())(self.logp)
            np.testing.assert_allclose(grad, ref.kl_grad(self.logp, self.ref_logp, kind),
                                       rtol=1e-5, atol=1e-6)

    @chex.variants(with_jit=True, without_jit=True)
    def test_entropy_from_logits(self):
        logits = floats(np.random.default_rng(1), (3, 4, 17), 3.0)
        got = self.variant(kl_lib.entropy_from_logits)(logits)
        np.testing.assert_allclose(got, ref.entropy(logits), rtol=1e-5, atol=1e-6)


def test_hand_computed():
    logp, ref_logp = jnp.array([0.0]), jnp.array([jnp.log(2.0)])
    # d = logp - ref = -log 2: k1 = -log 2, k2 = (log 2)^2 / 2, k3 = 2 - log 2 - 1.
    np.testing.assert_allclose(kl_lib.kl(logp, ref_logp, "k1"), [-np.log(2)], rtol=1e-6)
    np.testing.assert_allclose(kl_lib.kl(logp, ref_logp, "k2"), [np.log(2) ** 2 / 2], rtol=1e-6)
    np.testing.assert_allclose(kl_lib.kl(logp, ref_logp, "k3"), [1 - np.log(2)], rtol=1e-6)
    # uniform over 4 tokens: entropy log 4; a -inf logit has probability 0.
    np.testing.assert_allclose(kl_lib.entropy_from_logits(jnp.zeros(4)), np.log(4), rtol=1e-6)
    banned = jnp.array([0.0, 0.0, -jnp.inf])
    np.testing.assert_allclose(kl_lib.entropy_from_logits(banned), np.log(2), rtol=1e-6)
    grad = jax.grad(lambda z: kl_lib.entropy_from_logits(z))(banned)
    assert np.all(np.isfinite(grad))


def test_k3_is_clamped_and_finite():
    logp = jnp.array([-1000.0, 1000.0, 0.0])
    ref_logp = jnp.array([0.0, 0.0, -jnp.inf])
    for kind in ("k3", "k3+"):
        value = kl_lib.kl(logp, ref_logp, kind)
        assert np.all(np.isfinite(value)) and np.all(np.abs(value) <= 10.0)
        grad = jax.grad(lambda lp, k=kind: kl_lib.kl(lp, ref_logp[:2], k).sum())(logp[:2])
        assert np.all(np.isfinite(grad))


def test_bad_arguments_name_the_argument():
    with pytest.raises(ValueError, match="kind"):
        kl_lib.kl(jnp.zeros(3), jnp.zeros(3), "k4")
    with pytest.raises(ValueError, match="ref_logp"):
        kl_lib.kl(jnp.zeros(3), jnp.zeros(4), "k1")
    with pytest.raises(ValueError, match="logits"):
        kl_lib.entropy_from_logits(jnp.float32(1.0))
