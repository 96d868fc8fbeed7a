"""Mixed precision: float32 master weights train at lr 1e-6 under the hf preset's
bfloat16 compute, the forward really runs in bfloat16, and a rounded-away update warns."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from agentjax.core import parallel
from agentjax.models import Decoder, ModelConfig, ValueModel
from agentjax.engine.jax.engine import JaxEngine
from agentjax.rl import objectives
from agentjax.rl.aggregation import loss_norm
from agentjax.train import diagnostics
from agentjax.train import update as step_lib
from agentjax.train.precision import master_copy, model_precision
from agentjax.config.presets import search_config

STEPS, B, T = 3, 4, 16


def _hf_config():
    """The hf preset's precision and optimizer with the test variant's model shapes."""
    config, test = search_config("grpo", "hf"), search_config("grpo", "test")
    for key in ("hidden_size", "intermediate_size", "num_layers", "num_heads",
                "num_kv_heads"):
        config.model[key] = test.model[key]
    return config, test.tokenizer.vocab_size


def _policy(config, vocab):
    m = config.model
    model_config = ModelConfig(
        arch=m.arch, vocab_size=vocab, hidden_size=m.hidden_size,
        intermediate_size=m.intermediate_size, num_layers=m.num_layers,
        num_heads=m.num_heads, num_kv_heads=m.num_kv_heads,
        head_dim=m.hidden_size // m.num_heads, tie_embeddings=True, qkv_bias=True,
        **model_precision(config))
    return nnx.split(Decoder(model_config, rngs=nnx.Rngs(0)))


def _batch(vocab, seed=0):
    rng = np.random.default_rng(seed)
    return dict(inputs=rng.integers(0, vocab, (B, T)).astype(np.int32),
                targets=rng.integers(0, vocab, (B, T)).astype(np.int32),
                positions=np.tile(np.arange(T, dtype=np.int32), (B, 1)),
                segment_ids=np.ones((B, T), np.int32),
                loss_mask=np.ones((B, T), np.float32))


def _linear_loss(params):
    """A loss linear in every weight (fixed random coefficients): every weight gets a
    gradient and the program compiles in a second. What these tests measure — how the
    optimizer's update is stored — does not depend on the loss."""
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(1), len(leaves))
    coefs = tree.unflatten([jax.random.normal(k, x.shape) for k, x in zip(keys, leaves)])

    def loss_fn(params, batch, norm):
        terms = jax.tree.map(lambda x, c: jnp.sum(x.astype(jnp.float32) * c), params, coefs)
        return sum(jax.tree.leaves(terms)), {}

    return loss_fn


def _train(config, params):
    """STEPS updates with the config's RL optimizer (as rl_loop.init_rl_state makes
    it); returns (final state, metrics of each step)."""
    o = config.optim
    optimizer = step_lib.make_optimizer(
        o.lr, total_steps=100, warmup_steps=o.warmup_steps, schedule=o.schedule,
        weight_decay=o.weight_decay, b1=o.b1, b2=o.b2, grad_clip=o.grad_clip)
    update = jax.jit(step_lib.build_update(_linear_loss(params), optimizer, epochs=1,
                                           minibatches=1, micro_batches=1))
    state = step_lib.TrainState(step=jnp.int32(0), params=params,
                                opt_state=optimizer.init(params), rng=jax.random.key(0))
    batch = {"loss_mask": np.ones((B, T), np.float32)}
    history = []
    for _ in range(STEPS):
        state, metrics = update(state, batch)
        history.append({k: float(v) for k, v in metrics.items()})
    return state, history


def _changed_fraction(before, after) -> float:
    changed = sum(int((np.asarray(a) != np.asarray(b)).sum())
                  for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(after)))
    return changed / sum(x.size for x in jax.tree.leaves(before))


def test_hf_preset_trains_at_lr_1e6():
    """The trainer's policy under the hf preset (model_precision, master_copy) moves
    most of its weights in a few steps at lr 1e-6, with the preset's warmup."""
    config, vocab = _hf_config()
    assert config.optim.lr == 1e-6 and config.model.dtype == "bfloat16"
    _, params = _policy(config, vocab)
    initial = jax.tree.map(np.asarray, params)
    state, history = _train(config, master_copy(params))
    assert {x.dtype for x in jax.tree.leaves(state.params)} == {jnp.dtype(jnp.float32)}
    assert {x.dtype for x in jax.tree.leaves(state.opt_state)
            if jnp.issubdtype(x.dtype, jnp.floating)} == {jnp.dtype(jnp.float32)}
    assert _changed_fraction(initial, state.params) > 0.5
    # The warmup's first step has lr 0: nothing asked, nothing moved, no warning.
    assert history[0]["update/intended_rel_size"] == history[0]["update/rel_size"] == 0
    for metrics in history[1:]:
        assert metrics["update/rel_size"] == pytest.approx(
            metrics["update/intended_rel_size"], rel=1e-2)
    assert not any(diagnostics.rounding_warnings(m) for m in history)


def test_bfloat16_weights_round_the_update_away_and_warn():
    """What the hf preset did with bfloat16 params: the update is a no-op that only
    the diagnostic reveals."""
    config, vocab = _hf_config()
    _, params = _policy(config, vocab)
    params = jax.tree.map(lambda x: x.astype(jnp.bfloat16), params)
    initial = jax.tree.map(np.asarray, params)
    state, history = _train(config, params)
    assert _changed_fraction(initial, state.params) < 0.05
    last = history[-1]
    assert last["grad_norm"] > 0
    assert last["update/rel_size"] < 0.5 * last["update/intended_rel_size"]
    [warning] = diagnostics.rounding_warnings(last)
    assert "policy update rounded away" in warning


def _dot_operand_dtypes(jaxpr) -> list[tuple[str, str]]:
    """Operand dtypes of every dot_general between matrices (rank >= 2 on both sides),
    in the jaxpr and every sub-jaxpr (scan, remat, custom_vjp, pjit)."""
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            lhs, rhs = (v.aval for v in eqn.invars)
            if lhs.ndim >= 2 and rhs.ndim >= 2:
                found.append((lhs.dtype.name, rhs.dtype.name))
        for param in eqn.params.values():
            for sub in param if isinstance(param, (tuple, list)) else (param,):
                if isinstance(sub, jax.extend.core.ClosedJaxpr):
                    found += _dot_operand_dtypes(sub.jaxpr)
                elif isinstance(sub, jax.extend.core.Jaxpr):
                    found += _dot_operand_dtypes(sub)
    return found


def test_policy_and_critic_forwards_compute_in_bfloat16_from_float32_params():
    config, vocab = _hf_config()
    graphdef, params = _policy(config, vocab)
    batch = _batch(vocab)
    norm = loss_norm(batch["loss_mask"])
    policy_loss = objectives.sft_loss(graphdef, chunk_size=8)
    critic_graphdef, critic_params = nnx.split(ValueModel(nnx.merge(graphdef, params)))
    critic_loss = objectives.value_loss_fn(critic_graphdef, config.algo)
    critic_batch = {**batch, "old_values": np.zeros((B, T), np.float32),
                    "returns": np.ones((B, T), np.float32)}
    for loss_fn, p, b in ((policy_loss, params, batch),
                          (critic_loss, critic_params, critic_batch)):
        assert {x.dtype for x in jax.tree.leaves(p)} == {jnp.dtype(jnp.float32)}
        dtypes = _dot_operand_dtypes(jax.make_jaxpr(loss_fn)(p, b, norm).jaxpr)
        # q, k, v, o, gate, up, down, two attention products (+ the policy's logits);
        # the critic's value head (a vector) is float32 on purpose.
        assert len(dtypes) >= 9, dtypes
        assert set(dtypes) == {("bfloat16", "bfloat16")}


def test_engine_holds_its_own_compute_dtype_copy():
    config, vocab = _hf_config()
    graphdef, params = _policy(config, vocab)
    params = master_copy(params)
    engine = JaxEngine(graphdef, params, max_slots=2, max_len=16)
    try:
        def matrices():
            weights = engine._device.weights
            return [weights.embed] + [w for layer in weights.layers for w in layer.values()]

        assert {x.dtype.name for x in matrices()} == {"bfloat16"}
        new_params = jax.tree.map(lambda x: x + 1, params)
        expected_embed = np.asarray(new_params["embed"].get_value().astype(jnp.bfloat16))
        engine.update_weights(new_params)
        # The trainer donates its params after every sync: the engine's copy is its own.
        jax.tree.map(lambda x: x.delete(), new_params)
        assert {x.dtype.name for x in matrices()} == {"bfloat16"}
        assert not any(x.is_deleted() for x in jax.tree.leaves(engine._device.weights))
        np.testing.assert_array_equal(np.asarray(engine._device.weights.embed), expected_embed)
    finally:
        engine.close()


def test_master_copy_is_fresh_float32_on_the_same_shardings(eight_devices):
    mesh = parallel.make_mesh({"data": 1, "fsdp": 8, "tensor": 1}, devices=eight_devices)
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("fsdp"))
    source = {"w": jax.device_put(jnp.arange(16, dtype=jnp.bfloat16), sharding),
              "b": jax.device_put(jnp.ones(8, jnp.float32), sharding)}
    copy = master_copy(source)
    for key in source:
        assert copy[key].dtype == jnp.float32 and copy[key].sharding == sharding
        np.testing.assert_array_equal(np.asarray(copy[key]),
                                      np.asarray(source[key]).astype(np.float32))
    source["b"].delete()  # a donated source leaves the copy intact
    np.testing.assert_array_equal(np.asarray(copy["b"]), np.ones(8, np.float32))


@pytest.mark.parametrize("metrics, warns", [
    ({"grad_norm": 1.0, "update/rel_size": 1e-6, "update/intended_rel_size": 1e-6}, False),
    ({"grad_norm": 1.0, "update/rel_size": 1e-8, "update/intended_rel_size": 1e-6}, True),
    ({"grad_norm": 1.0, "update/rel_size": 0.0, "update/intended_rel_size": 0.0}, False),
    ({"grad_norm": 0.0, "update/rel_size": 0.0, "update/intended_rel_size": 1e-6}, False),
    ({"critic/grad_norm": 1.0, "critic/update/rel_size": 0.0,
      "critic/update/intended_rel_size": 1e-5}, True),
])
def test_rounding_warning_rule(metrics, warns):
    """Warns when gradients are nonzero and the params moved by less than half of what
    the optimizer asked for; a step that asked for nothing (lr 0) never warns."""
    warnings = diagnostics.failure_warnings(metrics, max_action_tokens=100)
    assert any("rounded away" in w for w in warnings) == warns
