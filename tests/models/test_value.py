"""Critic: value head on the trunk, shared vs separate trunk."""
import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from agentjax.models.decoder import Decoder, positions_from_segments
from agentjax.models.value import ActorCritic, ValueModel
from tests.models.reference_decoder import TINY, numpy_params, random_model, reference_hidden

SEGMENTS = jnp.array([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]], jnp.int32)
TOKENS = jnp.array([[0, 0, 5, 6, 7, 8], [9, 10, 11, 12, 13, 14]], jnp.int32)
POSITIONS = positions_from_segments(SEGMENTS)


def _value_loss(graphdef, params):
    hidden, values = nnx.merge(graphdef, params)(TOKENS, POSITIONS, SEGMENTS)
    return jnp.sum(jnp.where(SEGMENTS != 0, (values - 1.0) ** 2, 0.0)), (hidden, values)


_value_grad = jax.jit(jax.value_and_grad(_value_loss, argnums=1, has_aux=True),
                      static_argnums=0)


def _norm(tree) -> float:
    return float(sum(jnp.abs(x).sum() for x in jax.tree.leaves(tree)))


def test_value_model_matches_reference_head():
    critic = random_model(lambda: ValueModel(Decoder(TINY, rngs=nnx.Rngs(0))), seed=3)
    values = critic(TOKENS, POSITIONS, SEGMENTS)
    chex.assert_shape(values, TOKENS.shape)
    chex.assert_type(values, jnp.float32)
    params = numpy_params(critic)
    hidden = reference_hidden(TINY, params["trunk"], TOKENS, POSITIONS, SEGMENTS)
    expected = hidden @ params["value_head"] + params["value_bias"]
    real = np.asarray(SEGMENTS) != 0
    np.testing.assert_allclose(np.asarray(values)[real], expected[real], rtol=1e-5, atol=1e-5)


def test_value_head_starts_at_zero():
    trunk = random_model(lambda: Decoder(TINY, rngs=nnx.Rngs(0)), seed=3)
    values = ValueModel(trunk)(TOKENS, POSITIONS, SEGMENTS)
    np.testing.assert_array_equal(values, 0.0)


@pytest.mark.parametrize("share_trunk", [True, False])
def test_actor_critic_trunk_sharing(share_trunk):
    policy = random_model(lambda: Decoder(TINY, rngs=nnx.Rngs(0)), seed=4)
    ac = ActorCritic(policy, share_trunk=share_trunk)
    assert ac.share_trunk == share_trunk
    nnx.update(ac.critic.value_head, jnp.full((TINY.hidden_size,), 0.1))
    graphdef, params = nnx.split(ac)
    n_policy = sum(x.size for x in jax.tree.leaves(nnx.state(policy)))
    n_params = sum(x.size for x in jax.tree.leaves(params))
    # A shared trunk is stored once; a separate one doubles the decoder.
    assert n_params == (1 if share_trunk else 2) * n_policy + TINY.hidden_size + 1

    (_, (hidden, values)), grads = _value_grad(graphdef, params)
    chex.assert_shape(hidden, (*TOKENS.shape, TINY.hidden_size))
    # The critic starts from the policy's weights either way, so its values are the
    # head applied to the policy's hidden states.
    np.testing.assert_allclose(values, ac.critic.values_from_hidden(hidden), rtol=1e-5, atol=1e-5)
    head = _norm(grads["critic"]["value_head"]) + _norm(grads["critic"]["value_bias"])
    trunk = _norm(grads) - head
    assert head > 0 and trunk > 0   # the value loss trains the head and a trunk ...
    if not share_trunk:
        assert _norm(grads["policy"]) == 0.0           # ... never a separate policy
