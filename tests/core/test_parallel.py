"""Meshes, logical-axis rules and sharded execution on 8 fake CPU devices."""
import socket
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import AxisType, PartitionSpec as P

from agentjax.core import parallel
from agentjax.models.cache import KVCache, init_cache
from agentjax.models.config import ModelConfig
from agentjax.models.decoder import Decoder, positions_from_segments
from agentjax.models.hf import load_hf, make_tiny_hf, save_hf
from tests.models.reference_decoder import random_model
from tests.train.runs import ONE_DEVICE

# Every sharded dimension divides 2 and 4: heads 8, kv heads 4, vocab 128, mlp 128, D 64.
CFG = ModelConfig(arch="qwen2", vocab_size=128, hidden_size=64, intermediate_size=128,
                  num_layers=2, num_heads=8, num_kv_heads=4, head_dim=8, qkv_bias=True)
B, T = 8, 8

# What DEFAULT_RULES say, written out by hand.
EXPECTED_SPECS = {
    ("embed",): P("tensor", "fsdp"),
    ("layers", "q_proj"): P(None, "fsdp", "tensor", None),
    ("layers", "k_proj"): P(None, "fsdp", "tensor", None),
    ("layers", "q_bias"): P(None, "tensor", None),
    ("layers", "o_proj"): P(None, "tensor", None, "fsdp"),
    ("layers", "gate_proj"): P(None, "fsdp", "tensor"),
    ("layers", "down_proj"): P(None, "tensor", "fsdp"),
    ("layers", "attn_norm"): P(None, None),
    ("final_norm",): P(None),
    ("lm_head",): P("fsdp", "tensor"),
}


def test_make_mesh_sizes_and_errors(eight_devices):
    mesh = parallel.make_mesh()
    assert dict(mesh.shape) == {"data": 8, "fsdp": 1, "tensor": 1}
    assert all(t == AxisType.Auto for t in mesh.axis_types)
    assert dict(parallel.make_mesh({"data": -1, "fsdp": 2, "tensor": 2}).shape) == \
        {"data": 2, "fsdp": 2, "tensor": 2}
    assert dict(parallel.make_mesh({"fsdp": 1}, devices=eight_devices[:1]).shape) == \
        {"data": 1, "fsdp": 1, "tensor": 1}
    with pytest.raises(ValueError, match="at most one"):
        parallel.make_mesh({"data": -1, "fsdp": -1})
    with pytest.raises(ValueError, match="needs 6 devices"):
        parallel.make_mesh({"data": 3, "fsdp": 2})
    with pytest.raises(ValueError, match="not divisible"):
        parallel.make_mesh({"data": -1, "fsdp": 3})
    with pytest.raises(ValueError, match="unknown axes"):
        parallel.make_mesh({"pipeline": 2})


def test_logical_to_spec_rules(eight_devices):
    mesh = parallel.make_mesh({"fsdp": 2, "tensor": 4})
    rules = parallel.resolve_rules()
    assert parallel.logical_to_spec(("batch", "seq", "act_embed"), rules, mesh) == \
        P(("data", "fsdp"), None, None)
    # 2 KV heads cannot split 4 ways: replicated instead of failing.
    assert parallel.logical_to_spec(("embed", "kv_heads"), rules, mesh, shape=(64, 2)) == \
        P("fsdp", None)
    # A batch of 2 on data(2) x fsdp(2): the trailing axis that does not fit is dropped.
    cube = parallel.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
    assert parallel.logical_to_spec(("batch",), rules, cube, shape=(2,)) == P("data")
    assert parallel.logical_to_spec(("batch",), rules, cube, shape=(4,)) == P(("data", "fsdp"))
    # A mesh axis is used at most once per array.
    custom = parallel.resolve_rules({"mlp": "fsdp"})
    assert parallel.logical_to_spec(("embed", "mlp"), custom, mesh) == P("fsdp", None)
    with pytest.raises(ValueError, match="no sharding rule"):
        parallel.logical_to_spec(("experts",), rules, mesh)
    with pytest.raises(ValueError, match="unknown mesh axes"):
        parallel.resolve_rules({"embed": "model"})


def _loss(graphdef, params, tokens, positions, segments):
    model = nnx.merge(graphdef, params)
    hidden, _ = model(tokens, positions, segments)
    logp = jax.nn.log_softmax(model.logits(hidden))
    target = jnp.take_along_axis(logp[:, :-1], tokens[:, 1:, None], axis=-1)[..., 0]
    mask = segments[:, 1:] != 0
    return -(target * mask).sum() / mask.sum(), hidden


_loss_and_grad = jax.jit(jax.value_and_grad(_loss, argnums=1, has_aux=True), static_argnums=0)


def _batch():
    rng = np.random.default_rng(0)
    tokens = jnp.asarray(rng.integers(0, CFG.vocab_size, (B, T)), jnp.int32)
    lengths = rng.integers(2, T + 1, B)
    segments = jnp.asarray(np.arange(T)[None] >= T - lengths[:, None], jnp.int32)
    return tokens, positions_from_segments(segments), segments


@pytest.fixture(scope="module")
def reference():
    """Model, loss, hidden and grads on a single device."""
    model = random_model(lambda: Decoder(CFG, rngs=nnx.Rngs(0)), seed=5)
    graphdef, params = nnx.split(model)
    (loss, hidden), grads = _loss_and_grad(graphdef, params, *_batch())
    return nnx.state(model), loss, hidden, grads


@pytest.mark.parametrize("mesh_config, n_devices", [
    ({"data": 1, "fsdp": 2, "tensor": 4}, 8),
    ({"data": 4, "fsdp": 2, "tensor": 1}, 8),
    ({}, 1),   # a one-device mesh runs the same sharded code path
])
def test_sharded_forward_and_grads_equal_single_device(eight_devices, reference, mesh_config,
                                                       n_devices):
    state, loss_ref, hidden_ref, grads_ref = reference
    mesh = parallel.make_mesh(mesh_config, devices=eight_devices[:n_devices])
    model = nnx.eval_shape(lambda: Decoder(CFG, rngs=nnx.Rngs(0)))
    nnx.update(model, state)
    parallel.shard_model(model, mesh)
    graphdef, params = nnx.split(model)

    arrays = nnx.to_pure_dict(params)
    for path, spec in EXPECTED_SPECS.items():
        array = arrays[path[0]] if len(path) == 1 else arrays[path[0]][path[1]]
        assert array.sharding.spec == spec, (path, array.sharding.spec)

    batch_sharding = parallel.batch_sharding(mesh)
    batch = [jax.device_put(x, batch_sharding) for x in _batch()]
    (loss, hidden), grads = _loss_and_grad(graphdef, params, *batch)
    expected = jax.sharding.NamedSharding(mesh, P(("data", "fsdp"), None, None))
    assert hidden.sharding.is_equivalent_to(expected, hidden.ndim)
    np.testing.assert_allclose(loss, loss_ref, rtol=1e-5)
    real = np.asarray(_batch()[2]) != 0
    np.testing.assert_allclose(np.asarray(hidden)[real], np.asarray(hidden_ref)[real],
                               rtol=1e-5, atol=1e-5)
    # float32 sums in another order: errors are relative to each gradient's scale.
    for g, g_ref in zip(jax.tree.leaves(grads), jax.tree.leaves(grads_ref)):
        np.testing.assert_allclose(g, g_ref, rtol=1e-5, atol=1e-5 * np.abs(g_ref).max())


def test_load_hf_places_shards_directly(eight_devices, tmp_path):
    cfg = make_tiny_hf(tmp_path, arch="llama", vocab_size=CFG.vocab_size, hidden_size=64,
                 intermediate_size=128, num_heads=8, num_kv_heads=4, head_dim=8, num_layers=1)
    mesh = parallel.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
    sharded, _ = load_hf(tmp_path, mesh=mesh)
    plain, _ = load_hf(tmp_path)
    gate = sharded.layers["gate_proj"][...]
    assert gate.sharding.spec == P(None, "fsdp", "tensor")
    assert gate.addressable_shards[0].data.shape == (1, 32, 64)
    assert sharded.activation_sharding is not None
    for a, b in zip(jax.tree.leaves(nnx.state(sharded)), jax.tree.leaves(nnx.state(plain))):
        np.testing.assert_array_equal(a, b)
    # Saving gathers the shards: reloading gives the same parameters.
    save_hf(sharded, cfg, tmp_path / "export")
    again, _ = load_hf(tmp_path / "export")
    for a, b in zip(jax.tree.leaves(nnx.state(again)), jax.tree.leaves(nnx.state(plain))):
        np.testing.assert_array_equal(a, b)


def test_create_sharded_and_cache_shardings(eight_devices):
    mesh = parallel.make_mesh({"data": 2, "fsdp": 1, "tensor": 4})
    model = parallel.create_sharded(lambda: Decoder(CFG, rngs=nnx.Rngs(0)), mesh)
    assert model.layers["q_proj"][...].sharding.spec == P(None, "fsdp", "tensor", None)
    assert float(jnp.std(model.layers["q_proj"][...])) == pytest.approx(0.02, rel=0.1)

    cache = init_cache(CFG, batch=4, max_len=16)
    shardings = parallel.tree_shardings(KVCache.logical_axes(), cache, mesh)
    assert shardings.k.spec == P(None, ("data", "fsdp"), "tensor", None, None)
    assert shardings.lengths.spec == P(("data", "fsdp"))
    placed = jax.device_put(cache, shardings)
    assert placed.k.addressable_shards[0].data.shape == (2, 2, 1, 16, 8)


def test_placed_shardings_keep_rule_placement_and_replicate_the_rest(eight_devices):
    import optax
    mesh = parallel.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
    _, params = nnx.split(parallel.create_sharded(lambda: Decoder(CFG, rngs=nnx.Rngs(0)), mesh))
    state = {"params": params, "opt": optax.adam(1e-3).init(params),
             "step": jnp.int32(0), "rng": jax.random.key(0)}
    shardings = parallel.placed_shardings(state, mesh)
    assert shardings["params"]["layers"]["q_proj"].spec == P(None, "fsdp", "tensor", None)
    # Adam's moments were initialized from the placed params: same placement.
    assert shardings["opt"][0].mu["layers"]["q_proj"].spec == P(None, "fsdp", "tensor", None)
    assert shardings["step"].spec == P() and shardings["rng"].spec == P()
    assert shardings["opt"][0].count.spec == P()
    # A jitted step with these in/out shardings and a donated state keeps the placement.
    step = jax.jit(lambda s: jax.tree.map(lambda x: x, s), in_shardings=(shardings,),
                   out_shardings=shardings, donate_argnums=0)
    out = step(jax.device_put(state, shardings))
    assert jax.tree.map(lambda x: x.sharding, out) == shardings


_WORKER = """
import sys
import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec
from agentjax.core import parallel
process_id, port = int(sys.argv[1]), sys.argv[2]
mesh = parallel.make_mesh({"data": -1, "distributed": {
    "coordinator_address": f"127.0.0.1:{port}", "num_processes": 2, "process_id": process_id}})
sharding = parallel.batch_sharding(mesh, logical_axes=("batch", None))
rows = jax.make_array_from_callback((2, 3), sharding,
                                    lambda index: np.full((1, 3), index[0].start + 1.0))
total = jax.jit(lambda x: x.sum(), out_shardings=NamedSharding(mesh, PartitionSpec()))(rows)
print(dict(mesh.shape)["data"], jax.process_count(), float(total))
"""


def test_two_process_mesh_over_distributed_runtime():
    """make_mesh({"distributed": ...}) joins two processes into one data axis."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    procs = [subprocess.Popen([sys.executable, "-c", _WORKER, str(i), port], env=ONE_DEVICE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(2)]
    outputs = [p.communicate(timeout=120) for p in procs]
    for p, (out, err) in zip(procs, outputs):
        assert p.returncode == 0, err[-2000:]
        # 2 devices in the data axis, 2 processes, rows 1+1+1 and 2+2+2 summed globally.
        assert out.split()[-3:] == ["2", "2", "9.0"], out
