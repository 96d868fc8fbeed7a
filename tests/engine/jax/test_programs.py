"""Where the engine's page pool goes: beside its weights, by the rules of their model."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import PartitionSpec

from agentjax.core import parallel
from agentjax.models.config import ModelConfig
from agentjax.models.decoder import Decoder
from agentjax.models.paged import AttentionItems, build_items
from agentjax.engine.jax.programs import (DecodeCarry, decode, engine_weights,
                                          mesh_and_rules, new_cache)

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
        assert engine._device.cache.k[0].sharding.mesh == mesh
        request = GenerateRequest([3, 4, 5], SamplingParams(max_new_tokens=4))
        engine.generate_sync([request])
        compiles = engine.compile_counts
        engine.generate_sync([request])
        assert engine.compile_counts == compiles


def _decode_setup():
    model = _model()
    graphdef, params = nnx.split(model)
    weights = engine_weights(graphdef, params)
    empty = new_cache(weights, model.config, PAGES, PAGE_SIZE, jnp.float32)
    rng = np.random.default_rng(0)
    before = jax.tree.map(lambda x: rng.standard_normal(x.shape).astype(np.float32), empty)
    return model, weights, before


PAGES_OF_ROWS = [[3, 0], [2, 1]]


def _decode(weights, pool, lengths, steps, stop_ids, *, last=(5, 6), carry=None,
            src=(-1, -1), positions=None, temperature=0.0):
    """`steps` decode steps of rows 0 and 1 from slots `lengths` of PAGES_OF_ROWS."""
    lengths = np.asarray(lengths, np.int32)
    write = np.array([[p * PAGE_SIZE + s for s in range(n, n + steps)]
                      for p, n in zip((3, 2), lengths)], np.int32)
    host = build_items(PAGES_OF_ROWS, [n + steps for n in lengths], 2, PAGE_SIZE, 4, tile=1)
    items = AttentionItems(row=host.row, page=host.page, first_slot=host.first_slot)
    cache = jax.tree.map(jnp.asarray, pool)  # a fresh copy: decode donates it
    return decode(weights, cache, lengths, np.asarray(last, np.int32), np.ones(2, bool),
                  write, items, np.array([[0, 1], [0, 2]], np.uint32),
                  lengths if positions is None else np.asarray(positions, np.int32),
                  np.full(2, steps, np.int32), stop_ids, np.full(2, temperature, np.float32),
                  np.full(2, -1, np.int32), np.ones(2, np.float32),
                  DecodeCarry.empty(4) if carry is None else carry,
                  np.asarray(src, np.int32), num_steps=steps)


def test_decode_writes_the_pool_at_the_tokens_it_emitted_only():
    """Decode steps attend over a view of the rows' pages; at the end the tokens they
    wrote are copied to the pool: every emitted step's slot, and nothing after a row
    stopped (here at a stop id, where the host had given it slots for 4 steps)."""
    model, weights, before = _decode_setup()
    lengths = np.array([2, 1], np.int32)
    write = np.array([[p * PAGE_SIZE + s for s in range(n, n + 4)]
                      for p, n in zip((3, 2), lengths)], np.int32)

    def run(stop_ids):
        return _decode(weights, before, lengths, 4, stop_ids)[:4]

    free, tokens, _, emitted = run(np.full((2, 1), -1, np.int32))
    assert np.asarray(emitted).all()
    stopped, _, _, emitted = run(np.array([[-1], [int(tokens[1, 0])]], np.int32))
    assert np.asarray(emitted).tolist() == [[True] * 4, [True, False, False, False]]
    key = lambda pool, flat: np.asarray(pool)[flat // PAGE_SIZE, :, :, flat % PAGE_SIZE]
    value = lambda pool, flat: np.asarray(pool)[flat // PAGE_SIZE, :, flat % PAGE_SIZE]
    written = [*write[0], write[1, 0]]
    for layer in range(model.config.num_layers):
        for flat in range(PAGES * PAGE_SIZE):
            for read, pools in ((key, (before.k, free.k, stopped.k)),
                                (value, (before.v, free.v, stopped.v))):
                old, ran_on, stopped_at = (read(pool[layer], flat) for pool in pools)
                # what a stopped row wrote is what it wrote running on
                assert np.array_equal(stopped_at, ran_on if flat in written else old)
                assert np.array_equal(ran_on, old) == (flat not in write), flat


def test_a_call_continued_through_the_carry_equals_one_call_of_all_its_steps():
    """The overlap scheduler's premise: 4 steps, then 4 more whose rows take their last
    token and liveness from the first call's carry (their `last` argument is garbage),
    sample what one call of 8 steps samples and leave the same pool; a row that sampled
    a stop id in the first call stays inactive in the second."""
    _, weights, before = _decode_setup()
    no_stop = np.full((2, 1), -1, np.int32)
    lengths, positions = np.array([2, 1]), np.array([7, 3])
    whole = _decode(weights, before, lengths, 8, no_stop, positions=positions,
                    temperature=1.0)
    first = _decode(weights, before, lengths, 4, no_stop, positions=positions,
                    temperature=1.0)
    assert np.asarray(first[4].live).tolist() == [True, True, False, False]
    assert np.asarray(first[4].last)[:2].tolist() == np.asarray(first[1])[:, -1].tolist()
    second = _decode(weights, first[0], lengths + 4, 4, no_stop, last=(0, 0),
                     carry=first[4], src=(0, 1), positions=positions + 4, temperature=1.0)
    for i in (1, 2):  # tokens, log-probs
        np.testing.assert_array_equal(np.concatenate([first[i], second[i]], axis=1),
                                      whole[i])
    for a, b in zip(jax.tree.leaves(second[0]), jax.tree.leaves(whole[0])):
        np.testing.assert_array_equal(a, b)

    # Row 1 stops at its second token in the first call: the carry ends it.
    stop = np.array([[-1], [int(whole[1][1, 1])]], np.int32)
    first = _decode(weights, before, lengths, 4, stop, positions=positions, temperature=1.0)
    assert np.asarray(first[3]).tolist() == [[True] * 4, [True, True, False, False]]
    assert np.asarray(first[4].live)[:2].tolist() == [True, False]
    second = _decode(weights, first[0], lengths + 4, 4, stop, last=(0, 0), carry=first[4],
                     src=(0, 1), positions=positions + 4, temperature=1.0)
    assert np.asarray(second[3]).tolist() == [[True] * 4, [False] * 4]
    np.testing.assert_array_equal(second[1][0], whole[1][0, 4:])
