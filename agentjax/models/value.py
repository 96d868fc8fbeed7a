"""Critic for PPO: the decoder trunk plus a scalar value head per token.

    critic = ValueModel(Decoder(cfg, rngs=nnx.Rngs(0)))        # own trunk
    values = critic(tokens, positions, segment_ids)              # [B, T] float32

    ac = ActorCritic(policy, share_trunk=True)                   # config: share or not
    hidden, values = ac(tokens, positions, segment_ids)          # one trunk pass if shared
    graphdef, params = nnx.split(ac)                             # shared trunk stored once

With `share_trunk=False` the critic's trunk starts as a copy of the policy's weights
(the usual PPO initialisation from the same checkpoint) and trains separately; with
`share_trunk=True` the value loss also trains the policy trunk. The head starts at zero
so initial values are 0.
"""
from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
from flax import nnx

from agentjax.models.decoder import Decoder


class ValueModel(nnx.Module):
    """A trunk (Decoder) and a linear head hidden [D] -> value.

    Attributes:
      trunk: the Decoder producing hidden states (its lm-head is unused).
      value_head: [D] head weight; value_bias: scalar bias.
    """

    def __init__(self, trunk: Decoder):
        """Args:
          trunk: the decoder to put the head on (shared if the caller keeps using it).
        """
        self.trunk = trunk
        d = trunk.config.hidden_size
        self.value_head = nnx.Param(jnp.zeros((d,), jnp.float32), logical_axes=("embed",))
        self.value_bias = nnx.Param(jnp.zeros((), jnp.float32), logical_axes=())

    def values_from_hidden(self, hidden: jax.Array) -> jax.Array:
        """[B, T] float32 values from final hidden states [B, T, D]."""
        chex.assert_rank(hidden, 3)
        return jnp.einsum("btd,d->bt", hidden.astype(jnp.float32),
                          self.value_head[...]) + self.value_bias[...]

    def __call__(self, tokens: jax.Array, positions: jax.Array,
                 segment_ids: jax.Array) -> jax.Array:
        """Values [B, T] (float32) of every token; inputs as `Decoder.__call__`."""
        hidden, _ = self.trunk(tokens, positions, segment_ids)
        return self.values_from_hidden(hidden)


class ActorCritic(nnx.Module):
    """Policy decoder plus critic, with the trunk shared or separate.

    Attributes:
      policy: the policy Decoder.
      critic: ValueModel whose trunk is `policy` (shared) or its own copy.
    """

    def __init__(self, policy: Decoder, *, share_trunk: bool):
        """Args:
          policy: the policy decoder (e.g. from `hf.load_hf`).
          share_trunk: True: the critic reads the policy's hidden states; False: the
            critic gets its own trunk initialised from the policy's weights.
        """
        self.policy = policy
        trunk = policy if share_trunk else nnx.clone(policy)
        self.critic = ValueModel(trunk)

    @property
    def share_trunk(self) -> bool:
        """Whether the critic reads the policy's trunk."""
        return self.critic.trunk is self.policy

    def __call__(self, tokens: jax.Array, positions: jax.Array,
                 segment_ids: jax.Array) -> tuple[jax.Array, jax.Array]:
        """(policy hidden [B, T, D], values [B, T] float32); inputs as `Decoder`."""
        hidden, _ = self.policy(tokens, positions, segment_ids)
        if self.share_trunk:
            return hidden, self.critic.values_from_hidden(hidden)
        return hidden, self.critic(tokens, positions, segment_ids)
