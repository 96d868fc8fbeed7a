"""Where the engine's page pool goes: beside its weights, by the rules of their model."""
import dataclasses

import jax
from flax import nnx
from jax.sharding import PartitionSpec

from agentjax.core import parallel
from agentjax.models.config import ModelConfig
from agentjax.models.decoder import Decoder
from agentjax.engine.jax.programs import engine_weights, mesh_and_rules, new_cache

PAGES, PAGE_SIZE = 4, 16
# kv_heads replicated and a page's slots split instead: not what the default rules give.
RULES = {"kv_heads": None, "page": "tensor"}


def _model():
    config = ModelConfig(arch="qwen2", vocab_size=64, hidden_size=32, intermediate_size=64,
                         num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8, qkv_bias=True)
    return Decoder(config, rngs=nnx.Rngs(0))


def _mesh(devices):
    return parallel.make_mesh({"data": 4, "fsdp": 1, "tensor": 2}, devices=devices)


def _cache_spec(weights, config):
    cache = new_cache(weights, config, PAGES, PAGE_SIZE, None)
    return cache.k[0].sharding.spec, cache.k[0].sharding.mesh


def test_the_cache_follows_the_rules_the_model_was_sharded_by(eight_devices):
    mesh = _mesh(eight_devices)
    model = parallel.shard_model(_model(), mesh, RULES)
    weights = engine_weights(*nnx.split(model))
    assert mesh_and_rules(weights) == (mesh, parallel.resolve_rules(RULES))
    spec, cache_mesh = _cache_spec(weights, model.config)
    assert cache_mesh == mesh
    assert spec == PartitionSpec(None, None, None, "tensor")  # pages replicated


def test_params_on_a_mesh_without_rules_take_the_default_rules(eight_devices):
    mesh = _mesh(eight_devices)
    graphdef, params = nnx.split(_model())
    weights = engine_weights(graphdef, parallel.shard_params(params, mesh))
    assert mesh_and_rules(weights) == (mesh, None)
    assert _cache_spec(weights, weights.config)[0] == PartitionSpec(None, "tensor", None, None)


def test_the_mesh_is_found_behind_a_leaf_on_one_device(eight_devices):
    mesh = _mesh(eight_devices)
    graphdef, params = nnx.split(_model())
    weights = engine_weights(graphdef, parallel.shard_params(params, mesh))
    first_on_one_device = dataclasses.replace(
        weights, embed=jax.device_put(weights.embed, eight_devices[0]))
    assert jax.tree.leaves(first_on_one_device)[0].sharding.device_set == {eight_devices[0]}
    assert mesh_and_rules(first_on_one_device) == (mesh, None)


def test_single_device_weights_keep_the_cache_on_their_device():
    graphdef, params = nnx.split(_model())
    device = jax.devices()[-1]
    weights = engine_weights(graphdef, jax.device_put(params, device))
    assert mesh_and_rules(weights) is None
    cache = new_cache(weights, weights.config, PAGES, PAGE_SIZE, None)
    assert cache.k[0].sharding.device_set == {device}


def test_weights_on_a_one_device_mesh_compile_each_program_once():
    """The pool starts where the programs return it (a sharding on that mesh), so the
    second call hits the first call's executable."""
    from agentjax.engine.jax.engine import JaxEngine
    from agentjax.engine.protocol import GenerateRequest, SamplingParams

    mesh = parallel.make_mesh({"data": 1}, devices=jax.devices()[:1])
    model = parallel.shard_model(_model(), mesh)
    with JaxEngine.from_model(model, max_slots=1, max_len=32, prefill_chunks=(8,),
                              decode_steps=2, page_size=8, eos_token_ids=()) as engine:
        assert engine._cache.k[0].sharding.mesh == mesh
        request = GenerateRequest([3, 4, 5], SamplingParams(max_new_tokens=4))
        engine.generate_sync([request])
        compiles = engine.compile_counts
        engine.generate_sync([request])
        assert engine.compile_counts == compiles
