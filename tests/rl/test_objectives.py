"""The update's loss functions built from a model (agentjax.rl.objectives): jit, masking,
the DPO pairs, and the RL loss reading its kind's hyperparameters from the config."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentjax.config.schema import default_config
from agentjax.rl import objectives, preference
from agentjax.rl.aggregation import loss_norm
from agentjax.rl.losses import rl_objective
from agentjax.rl.policy_losses import POLICY_LOSSES, policy_loss_hyperparameters
from tests.rl._model import V, dpo_section, max_diff, pairs, prepared


@pytest.fixture(scope="module")
def setup():
    return prepared()


def test_jit_and_eager_loss_agree(setup):
    graphdef, params, algo, batch = setup
    loss_fn = objectives.rl_loss(graphdef, algo, chunk_size=8)
    norm = loss_norm(batch["loss_mask"])
    eager_loss, eager_metrics = loss_fn(params, batch, norm)
    jit_loss, jit_metrics = jax.jit(loss_fn)(params, batch, norm)
    np.testing.assert_allclose(jit_loss, eager_loss, rtol=1e-5)
    for key in eager_metrics:
        np.testing.assert_allclose(jit_metrics[key], eager_metrics[key], rtol=1e-5, atol=1e-6)


def test_no_gradient_reaches_masked_tokens(setup):
    graphdef, params, algo, batch = setup
    loss_fn = objectives.rl_loss(graphdef, algo, chunk_size=8)
    # Changing everything at mask-0 positions (targets, old log-probs, advantages)
    # leaves loss and gradient unchanged.
    changed = dict(batch)
    off = batch["loss_mask"] == 0
    changed["targets"] = jnp.where(off, (batch["targets"] + 7) % V, batch["targets"])
    changed["old_logp"] = jnp.where(off, -50.0, batch["old_logp"])
    changed["advantages"] = jnp.where(off, 1e3, batch["advantages"])
    norm = loss_norm(batch["loss_mask"])
    grads_of = jax.jit(jax.value_and_grad(lambda p, b: loss_fn(p, b, norm)[0]))
    loss_a, grads_a = grads_of(params, batch)
    loss_b, grads_b = grads_of(params, changed)
    np.testing.assert_allclose(loss_a, loss_b, rtol=1e-6)
    assert max_diff(grads_a, grads_b) < 1e-7


def test_rl_loss_is_the_objective_with_the_kinds_config_hyperparameters(setup):
    """rl_loss passes exactly `algo.<name>` for each hyperparameter of `algo.loss`: the
    dual clip of the config (0 = off) reaches the PPO kind, and a kind without it (gspo)
    is not given it."""
    graphdef, params, _, batch = setup
    norm = loss_norm(batch["loss_mask"])
    logp, entropy = objectives.policy_logprobs(graphdef, params, batch, chunk_size=8,
                                               temperature=batch["temperature"][0])
    for kind, knobs in (("ppo", dict(clip_low=0.1, clip_high=0.3, dual_clip=1.5)),
                        ("ppo", dict(dual_clip=0.0)),
                        ("gspo", dict(clip_low=0.01, clip_high=0.02, dual_clip=3.0)),
                        ("reinforce", dict(clip_low=0.5))):
        algo = default_config().algo
        algo.loss, algo.old_logp = kind, "behavior"
        for key, value in knobs.items():
            setattr(algo, key, value)
        loss, metrics = jax.jit(objectives.rl_loss(graphdef, algo, chunk_size=8))(
            params, batch, norm)
        own = {k: v for k, v in knobs.items() if k in policy_loss_hyperparameters(kind)}
        expected, expected_metrics = rl_objective(
            logp, batch["old_logp"], batch["advantages"], batch["loss_mask"], entropy=entropy,
            kind=kind, agg=algo.agg, norm=norm, **own)
        np.testing.assert_allclose(loss, expected, rtol=1e-5, err_msg=f"{kind} {knobs}")
        assert ("clipfrac_dual" in metrics) == bool(own.get("dual_clip")), (kind, knobs)
        assert set(metrics) == set(expected_metrics)


def test_every_policy_loss_hyperparameter_is_an_algo_config_key():
    """rl_loss reads `algo.<name>` for each of its kind's hyperparameters."""
    algo = default_config().algo
    for kind in POLICY_LOSSES:
        for name in policy_loss_hyperparameters(kind):
            assert name in algo, f"policy loss {kind!r}: algo.{name} is not a config key"


def test_dpo_loss_is_the_preference_loss_of_each_sides_log_probs(setup):
    graphdef, params = setup[:2]
    batch = pairs()
    loss_fn = objectives.dpo_loss(graphdef, dpo_section(), chunk_size=8)
    loss, metrics = jax.jit(loss_fn)(params, batch, objectives.pair_norm(batch))
    side = [objectives.policy_logprobs(graphdef, params, {k: batch[k][:, i]
                                                          for k in objectives.PAIR_KEYS},
                                       chunk_size=8)[0] for i in (0, 1)]
    m = batch["loss_mask"]
    expected, expected_metrics = preference.dpo_loss(
        side[0], side[1], batch["ref_logp"][:, 0], batch["ref_logp"][:, 1], m[:, 0],
        m[:, 1], beta=0.5)
    np.testing.assert_allclose(loss, expected, rtol=1e-5)
    assert float(objectives.pair_norm(batch)) == 3.0
    for key in ("reward_margin", "reward_accuracy", "logp_chosen"):
        np.testing.assert_allclose(metrics[f"dpo/{key}"], expected_metrics[key], rtol=1e-5)


def test_pair_logprobs_are_each_sides_rows(setup):
    graphdef, params = setup[:2]
    batch = pairs(1)
    both = jax.jit(lambda p, b: objectives.pair_logprobs(graphdef, p, b, chunk_size=8))(
        params, batch)
    assert both.shape == batch["targets"].shape
    for i in (0, 1):
        side = objectives.policy_logprobs(
            graphdef, params, {k: batch[k][:, i] for k in objectives.PAIR_KEYS}, chunk_size=8)
        np.testing.assert_allclose(both[:, i], side[0], rtol=1e-5, atol=1e-6)
