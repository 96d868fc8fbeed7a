"""The jitted update: micro-batching, sharding and jit never change the result."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from agentjax.core import parallel
from agentjax.rl import objectives
from agentjax.train import update as step_lib
from tests.rl._model import dpo_section, max_diff, pairs, prepared


@pytest.fixture(scope="module")
def setup():
    return prepared()


def _run_update(graphdef, params, algo, batch, *, micro_batches, minibatches=2):
    optimizer = optax.sgd(0.1)
    update = step_lib.build_update(objectives.rl_loss(graphdef, algo, chunk_size=8), optimizer,
                                   epochs=2, minibatches=minibatches,
                                   micro_batches=micro_batches, shuffle=False)
    state = step_lib.TrainState(step=jnp.int32(0), params=params,
                                opt_state=optimizer.init(params), rng=jax.random.key(1))
    return jax.jit(update)(state, batch)


def test_micro_batches_equal_full_batch(setup):
    graphdef, params, algo, batch = setup
    full, full_metrics = _run_update(graphdef, params, algo, batch, micro_batches=1)
    micro, micro_metrics = _run_update(graphdef, params, algo, batch, micro_batches=2)
    assert max_diff(full.params, micro.params) < 1e-6
    np.testing.assert_allclose(micro_metrics["loss"], full_metrics["loss"], rtol=1e-5)
    np.testing.assert_allclose(micro_metrics["grad_norm"], full_metrics["grad_norm"], rtol=1e-5)
    assert full_metrics["grad_norm"] > 0
    moved = max_diff(full.params, params)
    assert moved > 1e-4  # the update did something measurable


def test_eight_devices_equal_one(setup, eight_devices):
    graphdef, params, algo, batch = setup
    single, single_metrics = _run_update(graphdef, params, algo, batch, micro_batches=2)
    mesh = parallel.make_mesh({"data": 4, "fsdp": 2, "tensor": 1}, devices=eight_devices)
    sharded_params = parallel.shard_params(params, mesh)
    rows = parallel.batch_sharding(mesh, logical_axes=("batch",))
    tokens = parallel.batch_sharding(mesh)
    sharded_batch = {k: jax.device_put(v, tokens if v.ndim == 2 else rows)
                     for k, v in batch.items()}
    sharded, sharded_metrics = _run_update(graphdef, sharded_params, algo, sharded_batch,
                                           micro_batches=2)
    assert max_diff(jax.device_get(sharded.params), single.params) < 1e-6
    np.testing.assert_allclose(sharded_metrics["loss"], single_metrics["loss"], rtol=1e-5)


def test_nonfinite_updates_are_refused_per_optimizer_step():
    """A minibatch with a NaN loss leaves params and optimizer state as they were; the
    other minibatch of the same update still applies (metric: the refused fraction)."""
    params = {"w": jnp.ones((3,))}

    def loss_fn(params, batch, norm):
        loss = jnp.sum(params["w"] * batch["x"].sum(0)) * batch["scale"][0]
        return loss, {}

    optimizer = optax.adam(0.1)
    state = step_lib.TrainState(step=jnp.int32(0), params=params,
                                opt_state=optimizer.init(params), rng=jax.random.key(0))
    update = jax.jit(step_lib.build_update(loss_fn, optimizer, epochs=1, minibatches=2,
                                           micro_batches=1, shuffle=False))
    batch = {"x": jnp.ones((2, 3)), "loss_mask": jnp.ones((2, 1)),
             "scale": jnp.array([jnp.nan, 1.0])}
    new_state, metrics = update(state, batch)
    assert float(metrics["nonfinite_updates"]) == 0.5
    # Only the second (finite) minibatch moved the weights: one Adam step of size lr.
    np.testing.assert_allclose(new_state.params["w"], 0.9, rtol=1e-6)
    assert int(new_state.opt_state[0].count) == 1

    all_nan = {**batch, "scale": jnp.array([jnp.nan, jnp.inf])}
    new_state, metrics = update(state, all_nan)
    assert float(metrics["nonfinite_updates"]) == 1.0
    np.testing.assert_array_equal(new_state.params["w"], params["w"])


def _norm64(tree) -> float:
    return float(np.sqrt(sum(np.sum(np.asarray(x, np.float64) ** 2)
                             for x in jax.tree.leaves(tree))))


def test_update_size_metrics_measure_the_stored_params():
    """Against float64 numpy on what the params store, bfloat16 leaves included: XLA
    may keep a bfloat16 sum in float32 inside the program, the metric must not."""
    rng = np.random.default_rng(0)
    old = {"w": jnp.asarray(0.02 * rng.standard_normal((64, 32)), jnp.bfloat16),
           "b": jnp.asarray(rng.standard_normal(32), jnp.float32)}
    updates = jax.tree.map(lambda x: jnp.full(x.shape, 1e-6, x.dtype), old)

    @jax.jit
    def step(old, updates):
        new = optax.apply_updates(old, updates)
        return new, step_lib.update_size_metrics(old, new, updates)

    new, metrics = step(old, updates)
    moved = jax.tree.map(lambda n, o: np.asarray(n, np.float64) - np.asarray(o, np.float64),
                         new, old)
    assert float(metrics["update/rel_size"]) == pytest.approx(
        _norm64(moved) / _norm64(old), rel=1e-5)
    assert float(metrics["update/intended_rel_size"]) == pytest.approx(
        _norm64(updates) / _norm64(old), rel=1e-5)
    # 1e-6 is under half a bfloat16 ulp of all but the smallest w: almost none moved.
    assert (moved["w"] != 0).mean() < 0.05 and (moved["b"] != 0).all()


def _linear_loss(coef):
    def loss_fn(params, batch, norm):
        return sum(jnp.sum(x * coef) for x in jax.tree.leaves(params)), {}
    return loss_fn


def test_update_reports_its_relative_size_and_a_frozen_policy_none():
    params = {"w": jnp.ones((4, 4)), "b": jnp.full((4,), 2.0)}
    critic = {"v": jnp.ones((4,))}
    optimizer = optax.sgd(0.1)
    update = jax.jit(step_lib.build_update(
        _linear_loss(1.0), optimizer, epochs=1, minibatches=1, micro_batches=1,
        critic_loss_fn=_linear_loss(0.5), critic_optimizer=optimizer,
        critic_warmup_steps=1))
    state = step_lib.TrainState(step=jnp.int32(0), params=params,
                                opt_state=optimizer.init(params), rng=jax.random.key(0),
                                critic_params=critic, critic_opt_state=optimizer.init(critic))
    state, frozen = update(state, {"loss_mask": np.ones((2, 2), np.float32)})
    assert float(frozen["update/rel_size"]) == float(frozen["update/intended_rel_size"]) == 0
    # Every weight moves by lr x gradient = 0.1 (critic: 0.05).
    assert float(frozen["critic/update/rel_size"]) == pytest.approx(0.05 * 2 / 2, rel=1e-6)
    state, thawed = update(state, {"loss_mask": np.ones((2, 2), np.float32)})
    expected = 0.1 * np.sqrt(20) / np.sqrt(16 + 4 * 4)
    assert float(thawed["update/rel_size"]) == pytest.approx(expected, rel=1e-6)
    assert float(thawed["update/intended_rel_size"]) == pytest.approx(expected, rel=1e-6)


def _run_dpo(graphdef, params, batch, *, micro_batches):
    optimizer = optax.sgd(0.1)
    update = step_lib.build_update(objectives.dpo_loss(graphdef, dpo_section(), chunk_size=8),
                                   optimizer, epochs=1, minibatches=1,
                                   micro_batches=micro_batches, norm_fn=objectives.pair_norm,
                                   shuffle=False)
    state = step_lib.TrainState(step=jnp.int32(0), params=params,
                                opt_state=optimizer.init(params), rng=jax.random.key(1))
    return jax.jit(update)(state, batch)


def test_dpo_micro_batches_equal_the_full_batch(setup):
    """Each micro-batch divides by the minibatch's pair count (pair_norm), so the summed
    gradient is the full batch's although the uncounted pair sits in one half."""
    graphdef, params = setup[:2]
    full, full_metrics = _run_dpo(graphdef, params, pairs(), micro_batches=1)
    micro, micro_metrics = _run_dpo(graphdef, params, pairs(), micro_batches=2)
    assert max_diff(full.params, micro.params) < 1e-6
    np.testing.assert_allclose(micro_metrics["loss"], full_metrics["loss"], rtol=1e-5)
    assert full_metrics["grad_norm"] > 0 and max_diff(full.params, params) > 1e-4


def test_dpo_on_eight_devices_equals_one(setup, eight_devices):
    """Pairs [P, 2, T] sharded by rows, as the trainer places them (row sharding for
    arrays that are not [B, T])."""
    graphdef, params = setup[:2]
    single, single_metrics = _run_dpo(graphdef, params, pairs(), micro_batches=2)
    mesh = parallel.make_mesh({"data": 4, "fsdp": 1, "tensor": 2}, devices=eight_devices)
    rows = parallel.batch_sharding(mesh, logical_axes=("batch",))
    sharded, sharded_metrics = _run_dpo(
        graphdef, parallel.shard_params(params, mesh),
        {k: jax.device_put(v, rows) for k, v in pairs().items()}, micro_batches=1)
    assert max_diff(jax.device_get(sharded.params), single.params) < 1e-6
    np.testing.assert_allclose(sharded_metrics["loss"], single_metrics["loss"], rtol=1e-5)
