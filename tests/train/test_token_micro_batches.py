"""Micro-batches by token budget (`micro_tokens`): the packing itself, and losses and
gradients equal to the full minibatch's for every aggregation, policy loss and the critic."""
import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from agentjax.core import parallel
from agentjax.models import ValueModel
from agentjax.rl import objectives, token_packing
from agentjax.rl.aggregation import aggregate
from agentjax.rl.prepare import build_prepare, model_logprob_fn
from agentjax.train import update as step_lib
from tests.rl._model import B, T, max_diff, prepared, rl_algo, rollout_batch

# Episode lengths of the skewed batch's rows (row 3 is an empty padding row, row 7 has
# no action token) and which rows are padded on the left.
LENGTHS = (16, 3, 9, 0, 12, 5, 14, 2)
LEFT = (False, True, False, False, True, False, True, False)


def _segments(lengths, left, length):
    """segment_ids [rows, length]: 1 on each row's episode, padded left or right."""
    segment_ids = np.zeros((len(lengths), length), np.int32)
    for row, (size, on_left) in enumerate(zip(lengths, left)):
        if on_left:
            segment_ids[row, length - size:] = 1
        else:
            segment_ids[row, :size] = 1
    return segment_ids


def _positions(segment_ids):
    """RoPE positions counting from 0 at each row's first real token."""
    return np.where(segment_ids > 0, np.cumsum(segment_ids, axis=1) - 1, 0).astype(np.int32)


@functools.cache
def skewed():
    """(graphdef, params, batch): `rollout_batch()` with episodes of `LENGTHS` tokens,
    prepared by the tiny model, plus a critic's old values and returns."""
    graphdef, params = prepared()[:2]
    batch = rollout_batch()
    segment_ids = _segments(LENGTHS, LEFT, T)
    real = segment_ids > 0
    batch.update(segment_ids=segment_ids, positions=_positions(segment_ids),
                 action_mask=batch["action_mask"] * real, turn_ids=batch["turn_ids"] * real,
                 behavior_logp=batch["behavior_logp"] * real)
    # The episode's reward on its last real token.
    last = np.where(real.any(1), T - 1 - np.argmax(real[:, ::-1], axis=1), 0)
    batch["rewards"] = np.zeros((B, T), np.float32)
    batch["rewards"][np.arange(B), last] = batch["seq_rewards"] * real.any(1)
    prepare = jax.jit(build_prepare(model_logprob_fn(graphdef, chunk_size=8), rl_algo(),
                                    num_groups=2))
    batch, _ = prepare(params, params, None, batch)
    rng = np.random.default_rng(1)
    batch["old_values"] = jnp.asarray(rng.standard_normal((B, T)), jnp.float32)
    batch["returns"] = jnp.asarray(rng.standard_normal((B, T)), jnp.float32)
    return graphdef, params, batch


@functools.cache
def critic():
    """(critic graphdef, critic params): the tiny decoder with a random value head (a
    zero head would give the trunk no gradient)."""
    graphdef, params = prepared()[:2]
    model = ValueModel(nnx.merge(graphdef, params))
    model.value_head[...] = jax.random.normal(jax.random.key(2), model.value_head[...].shape)
    return nnx.split(model)


# ------------------------------------------------------------------ the packing


def test_packing_by_hand():
    """Lengths [7, 2, 3, 1] in rows of 8, longest first: 7 -> row 0, 3 -> row 1,
    2 -> row 1 after it, 1 -> the last slot of row 0."""
    segment_ids = _segments((7, 2, 3, 1), (False, True, False, True), 8)
    plan = jax.jit(token_packing.plan_packing)(segment_ids)
    np.testing.assert_array_equal(plan.rows, [0, 1, 1, 0])
    np.testing.assert_array_equal(plan.segments, [1, 2, 1, 2])
    # Row 1's episode starts at t = 6 and lands at column 3 (shift -3); row 3's starts
    # at t = 7 and lands at column 7.
    np.testing.assert_array_equal(plan.shift, [0, -3, 0, 0])
    assert int(plan.num_rows) == 2
    batch = {k: segment_ids for k in token_packing.MODEL_KEYS}
    batch["inputs"] = (np.arange(32, dtype=np.int32).reshape(4, 8) + 1) * segment_ids
    packed = token_packing.pack(batch, plan, rows=2)
    np.testing.assert_array_equal(packed["inputs"], [[1, 2, 3, 4, 5, 6, 7, 32],
                                                     [17, 18, 19, 15, 16, 0, 0, 0]])
    np.testing.assert_array_equal(packed["segment_ids"], [[1, 1, 1, 1, 1, 1, 1, 2],
                                                          [1, 1, 1, 2, 2, 0, 0, 0]])


@pytest.mark.parametrize("seed", [0, 1])
def test_every_token_is_packed_once_and_comes_back(seed):
    """Random lengths and padding sides: each episode is one contiguous run of one
    packed row, in order, with its positions; unpacking every micro-batch gives back
    exactly the real tokens of the rows (nothing lost, nothing twice)."""
    rng = np.random.default_rng(seed)
    rows, length, rows_per_micro = 12, 8, 3
    segment_ids = _segments(rng.integers(0, length + 1, rows), rng.random(rows) < 0.5, length)
    real = segment_ids > 0
    ids = np.arange(rows * length, dtype=np.int32).reshape(rows, length) + 1
    batch = {"inputs": np.where(real, ids, 0),
             "targets": segment_ids, "positions": _positions(segment_ids),
             "segment_ids": segment_ids, "loss_mask": real.astype(np.float32)}
    plan = token_packing.plan_packing(segment_ids)
    packed = token_packing.pack(batch, plan, rows=rows)
    # Each episode, by its token ids, is one run of one packed row in order.
    for row in np.flatnonzero(real.any(1)):
        where = np.argwhere(np.isin(packed["inputs"], batch["inputs"][row][real[row]]))
        assert (where[:, 0] == plan.rows[row]).all()
        np.testing.assert_array_equal(np.diff(where[:, 1]), 1)
        np.testing.assert_array_equal(packed["positions"][tuple(where.T)],
                                      np.arange(real[row].sum()))
        assert (packed["segment_ids"][tuple(where.T)] == plan.segments[row]).all()
    assert (packed["inputs"] > 0).sum() == real.sum()
    assert int(plan.num_rows) == (packed["segment_ids"] > 0).any(1).sum()
    back, seen = np.zeros((rows, length), np.int64), np.zeros((rows, length), np.int64)
    for index in range(rows // rows_per_micro):
        micro = token_packing.micro_batch(batch, packed, plan, jnp.int32(index),
                                          rows_per_micro)
        back += np.asarray(token_packing.forward_rows(lambda x: x["inputs"], micro))
        seen += np.asarray(micro["loss_mask"], np.int64)
    np.testing.assert_array_equal(back, batch["inputs"])
    np.testing.assert_array_equal(seen, real)


def test_one_long_episode_and_many_short_ones():
    """The motivating case in miniature: one episode of the full T = 16 and fifteen of 2
    tokens. A budget of 32 tokens makes micro-batches of 2 packed rows; the episodes fill
    3 packed rows (16 | 8 x 2 | 7 x 2), so 2 micro-batches of [2, 16] run (of
    ceil(16 / 2) = 8, the rest skipped), where micro-batches of 2 rows would run 8. The
    loss (seq-mean-token-mean of a token x position model) and its gradient are the
    full minibatch's."""
    rows, length = 16, 16
    segment_ids = _segments((16,) + (2,) * 15, (False, True) * 8, length)
    rng = np.random.default_rng(0)
    batch = {"inputs": rng.integers(0, 8, (rows, length)).astype(np.int32),
             "targets": np.zeros((rows, length), np.int32),
             "positions": _positions(segment_ids), "segment_ids": segment_ids,
             "loss_mask": (segment_ids * (rng.random((rows, length)) < 0.7)).astype(np.float32)}
    shapes = []

    def loss_fn(params, batch, norm):
        def forward(rows):
            shapes.append(rows["inputs"].shape)
            return params["w"][rows["inputs"]] * (rows["positions"] + 1)

        values = token_packing.forward_rows(forward, batch)
        return aggregate(values, batch["loss_mask"], "seq-mean-token-mean", norm=norm), {}

    params = {"w": jnp.asarray(rng.standard_normal(8), jnp.float32)}
    full = step_lib.accumulate_grads(loss_fn, params, batch, micro_batches=1)
    shapes.clear()
    loss, grads, metrics = jax.jit(functools.partial(
        step_lib.accumulate_grads, loss_fn, micro_batches=1, micro_tokens=32))(params, batch)
    assert set(shapes) == {(2, length)}
    assert float(metrics["micro_batches"]) == 2
    assert float(metrics["micro_fill"]) == pytest.approx((16 + 15 * 2) / (2 * 2 * 16))
    np.testing.assert_allclose(loss, full[0], rtol=1e-6)
    chex.assert_trees_all_close(grads, full[1], rtol=1e-6)


def test_a_budget_below_the_batch_length_or_with_row_micro_batches_is_an_error():
    batch = {"segment_ids": np.ones((2, 8), np.int32), "loss_mask": np.ones((2, 8))}

    def loss_fn(params, batch, norm):
        return jnp.zeros(()), {}

    with pytest.raises(ValueError, match="less than the batch length 8"):
        step_lib.accumulate_grads(loss_fn, {}, batch, micro_batches=1, micro_tokens=4)
    with pytest.raises(ValueError, match="not both"):
        step_lib.accumulate_grads(loss_fn, {}, batch, micro_batches=2, micro_tokens=8)


# ------------------------------------------------------------------ exact losses


def _loss_terms(metrics):
    return {k: v for k, v in metrics.items() if k.endswith("loss")}


def _assert_token_micro_batches_exact(loss_fn, params, batch, micro_tokens):
    """accumulate_grads by token budget == the full minibatch: loss, loss terms, grads."""
    def run(**micro):
        return jax.jit(functools.partial(step_lib.accumulate_grads, loss_fn,
                                         micro_batches=1, **micro))(params, batch)

    full_loss, full_grads, full_metrics = run()
    loss, grads, metrics = run(micro_tokens=micro_tokens)
    np.testing.assert_allclose(loss, full_loss, rtol=1e-6)
    chex.assert_trees_all_close(_loss_terms(metrics), _loss_terms(full_metrics), rtol=1e-6,
                                atol=1e-8)
    scale = max(float(jnp.abs(g).max()) for g in jax.tree.leaves(full_grads))
    assert scale > 0
    assert max_diff(grads, full_grads) <= 1e-6 * scale
    return metrics


# Every aggregation mode, each policy loss with a token-level and a sequence-level one
# (the aggregation is linear whatever the kind, tests/rl/test_losses.py; what the kind
# adds is GSPO's per-sequence ratio, whole only if the episode is).
@pytest.mark.parametrize("kind,agg", [("ppo", "token-mean"), ("ppo", "seq-mean-token-sum"),
                                      ("gspo", "seq-mean-token-mean"),
                                      ("gspo", "seq-mean-token-sum-norm")])
def test_token_micro_batches_equal_the_full_minibatch(kind, agg):
    """Rows of 0 to 16 tokens padded left and right, in micro-batches of 32 tokens (2
    packed rows; the 7 episodes fill 4: [16], [14, 2], [12, 3], [9, 5])."""
    graphdef, params, batch = skewed()
    algo = rl_algo()
    algo.loss, algo.agg = kind, agg
    metrics = _assert_token_micro_batches_exact(
        objectives.rl_loss(graphdef, algo, chunk_size=8), params, batch, micro_tokens=32)
    assert float(metrics["micro_batches"]) == 2


def test_token_micro_batches_of_the_critic_equal_the_full_minibatch():
    """The critic's value loss, one packed row (16 tokens) per micro-batch."""
    critic_graphdef, critic_params = critic()
    algo = rl_algo()
    algo.agg = "seq-mean-token-mean"
    metrics = _assert_token_micro_batches_exact(
        objectives.value_loss_fn(critic_graphdef, algo), critic_params, skewed()[2],
        micro_tokens=16)
    assert float(metrics["micro_batches"]) == 4


def _run_update(params, batch, **micro):
    """Two shuffled epochs of 2 minibatches of 4 rows (micro_tokens=32: 2 packed rows)."""
    graphdef, algo, optimizer = prepared()[0], rl_algo(), optax.sgd(0.1)
    update = step_lib.build_update(objectives.rl_loss(graphdef, algo, chunk_size=8),
                                   optimizer, epochs=2, minibatches=2, **micro)
    state = step_lib.TrainState(step=jnp.int32(0), params=params,
                                opt_state=optimizer.init(params), rng=jax.random.key(3))
    return jax.jit(update)(state, batch)


@functools.cache
def _token_update():
    _, params, batch = skewed()
    return _run_update(params, batch, micro_batches=1, micro_tokens=32)


def test_token_micro_batches_in_the_update_equal_the_full_minibatch():
    """Through build_update, minibatches shuffled in jit."""
    _, params, batch = skewed()
    full, full_metrics = _run_update(params, batch, micro_batches=1)
    token, token_metrics = _token_update()
    assert max_diff(token.params, full.params) < 1e-6
    assert max_diff(full.params, params) > 1e-4  # the update did something measurable
    np.testing.assert_allclose(token_metrics["loss"], full_metrics["loss"], rtol=1e-5)
    assert 1 <= float(token_metrics["micro_batches"]) <= 2


def test_token_micro_batches_on_eight_devices_equal_one(eight_devices):
    """Rows sharded over data x fsdp; the packed rows of a micro-batch are the batch axis."""
    _, params, batch = skewed()
    single, single_metrics = _token_update()
    mesh = parallel.make_mesh({"data": 4, "fsdp": 2, "tensor": 1}, devices=eight_devices)
    rows = parallel.batch_sharding(mesh, logical_axes=("batch",))
    tokens = parallel.batch_sharding(mesh)
    sharded, sharded_metrics = _run_update(
        parallel.shard_params(params, mesh),
        {k: jax.device_put(v, tokens if v.ndim == 2 else rows) for k, v in batch.items()},
        micro_batches=1, micro_tokens=32)
    assert max_diff(jax.device_get(sharded.params), single.params) < 1e-6
    np.testing.assert_allclose(sharded_metrics["loss"], single_metrics["loss"], rtol=1e-5)
    np.testing.assert_allclose(sharded_metrics["micro_batches"],
                               single_metrics["micro_batches"])


def test_prepare_within_the_token_budget_equals_one_pass():
    """prepare's forward passes (old and reference log-probs, the critic's values) run
    micro-batch by micro-batch under algo.micro_tokens and give the one-pass arrays."""
    from agentjax.rl.prepare import critic_value_fn

    graphdef, params, batch = skewed()
    critic_graphdef, critic_params = critic()
    raw = {k: v for k, v in batch.items()
           if k not in ("old_logp", "ref_logp", "advantages", "loss_mask", "is_weights")}
    outputs = {}
    for micro_tokens in (0, 2 * T):
        algo = rl_algo()
        algo.update(advantage="gae", kl_coef=0.1, micro_tokens=micro_tokens)
        prepare = jax.jit(build_prepare(model_logprob_fn(graphdef, chunk_size=8), algo,
                                        num_groups=2, value_fn=critic_value_fn(critic_graphdef)))
        outputs[micro_tokens], _ = prepare(params, params, critic_params, raw)
    real = np.asarray(batch["segment_ids"]) != 0
    for key in ("old_logp", "ref_logp", "old_values", "advantages"):
        np.testing.assert_allclose(np.where(real, outputs[2 * T][key], 0),
                                   np.where(real, outputs[0][key], 0), rtol=1e-6, atol=1e-6,
                                   err_msg=key)



def test_the_lm_head_at_the_loss_positions_only_equals_every_position():
    """model.logprob_positions: the loss, metrics and gradients with the lm-head run at
    the loss-mask positions only (rl.logprobs.masked_token_logprobs, tested there on
    both of its paths) equal those of every position, on packed micro-batches (their
    loss_mask packed with the model inputs): 8 positions of the packed rows of 16."""
    graphdef, params, batch = skewed()
    algo = rl_algo()
    run = [jax.jit(functools.partial(
        step_lib.accumulate_grads, objectives.rl_loss(graphdef, algo, chunk_size=8,
                                                      positions_frac=frac),
        micro_batches=1, micro_tokens=32))(params, batch) for frac in (1.0, 0.5)]
    (full_loss, full_grads, full_metrics), (loss, grads, metrics) = run
    np.testing.assert_allclose(loss, full_loss, rtol=1e-6)
    chex.assert_trees_all_close(metrics, full_metrics, rtol=1e-5, atol=1e-7)
    scale = max(float(jnp.abs(g).max()) for g in jax.tree.leaves(full_grads))
    assert max_diff(grads, full_grads) <= 1e-6 * scale
