"""LoRA in the trainer (in-process runs of the tiny search config with model.lora on):
only adapters train and carry optimizer state while the base stays bitwise the loaded
one, the KL reference is the base model bitwise, the engine samples the adapted policy
(its log-probs are the trainer's, not the base's), a PPO critic trains its own adapters
over the shared base, checkpoints hold the adapters and restore onto their base only."""
import jax
import numpy as np
import pytest
from flax import nnx

from agentjax.config import ConfigError, presets, validate
from agentjax.core.trajectory import collate
from agentjax.models.hf import load_hf
from agentjax.models.lora import split_adapters
from agentjax.rl.prepare import model_logprob_fn
from agentjax.train import update as step_lib
from agentjax.train.checkpoint import Checkpointer
from agentjax.train.policy import ADAPTER_DIR, EXPORT_MARKER, export_refusal
from agentjax.train.run import set_up
from agentjax.train.stages.rl import (build_rl_update, length_buckets, prepare_inputs,
                                      reference_logprob_fn)

LOGPROB_KEYS = ("inputs", "targets", "positions", "segment_ids")


def _config(algo="grpo"):
    config = presets.search_config(algo, "test")
    config.pretrain.steps = config.sft.steps = 0
    config.checkpoint.async_save = False
    config.model.lora.rank = 2
    config.algo.kl_coef = 0.05
    # The entropy bonus moves the adapters whatever the sampled rewards: a step whose
    # groups all score alike (and a KL of 0 at the start) has no other gradient.
    config.algo.entropy_coef = 0.01
    config.rollout.prompts_per_step = 4  # 8 rows: one per device (the LoRA update runs sharded)
    return config


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """(config, runtime, policy, rollouts, one step's collated batch) of a LoRA run."""
    config = _config()
    runtime, suite, policy, rollouts = set_up(config, str(tmp_path_factory.mktemp("lora")))
    r = config.rollout
    groups = rollouts.pool.collect_sync(list(suite.train_tasks[:r.prompts_per_step]),
                                        r.group_size, sampling=rollouts.sampling(0))
    batch = collate([t for g in groups for t in g], buckets=length_buckets(r.max_tokens),
                    pad_id=policy.tokenizer.pad_token_id,
                    batch_size=r.prompts_per_step * r.group_size)
    batch["temperature"] = np.full((len(batch["inputs"]),), r.temperature, np.float32)
    del batch["truncated"]
    yield config, runtime, policy, rollouts, batch
    rollouts.close()


def _host(tree):
    return [np.asarray(x) for x in jax.tree.leaves(tree)]


def _arrays(state):
    return _host((state.params, state.opt_state, jax.random.key_data(state.rng), state.step))


def _steps(config, runtime, policy, batch, count):
    """`count` RL updates of `config` from the policy's params through the runtime's
    jitted update: (the last state, each state's trained params and critic on the
    host)."""
    state, update, prepare = build_rl_update(config, runtime, policy.graphdef, policy.params)
    states = []
    for _ in range(count):
        prepared, _ = prepare(*prepare_inputs(state), runtime.device_batch(batch))
        state, _ = update(state, prepared)
        states.append(jax.tree.map(np.asarray, (split_adapters(state.params)[0],
                                                state.critic_params)))
    return state, states


@pytest.fixture(scope="module")
def trained(run):
    """(the policy's base and adapters on the host before, the state after 2 updates)."""
    config, runtime, policy, _, batch = run
    adapters, base = split_adapters(policy.params)
    before = _host(base), _host(adapters)
    return before, _steps(config, runtime, policy, batch, count=2)[0]


def test_only_adapters_train_over_a_bitwise_unchanged_base(run, trained):
    policy = run[2]
    (base_before, adapters_before), state = trained
    _, base = split_adapters(policy.params)
    trained, frozen = split_adapters(state.params)
    # The very arrays the policy loaded, never donated, never written.
    assert all(a is b for a, b in zip(jax.tree.leaves(frozen), jax.tree.leaves(base)))
    for before, after in zip(base_before, _host(base), strict=True):
        np.testing.assert_array_equal(before, after)
    assert all(x.dtype == np.float32 for x in jax.tree.leaves(trained))
    assert any((a != b).any() for a, b in zip(adapters_before, _host(trained)))
    # Adam's moments exist for the adapters alone.
    adam = [s for s in jax.tree.leaves(state.opt_state, is_leaf=lambda s: hasattr(s, "mu"))
            if hasattr(s, "mu")]
    assert len(adam) == 1
    for moments in (adam[0].mu, adam[0].nu):
        assert jax.tree.structure(moments) == jax.tree.structure(trained)
    assert state.ref_params is None


def test_kl_reference_is_the_base_model_bitwise(run):
    config, runtime, policy, _, batch = run
    rows = {k: batch[k] for k in LOGPROB_KEYS}
    chunk = config.model.logprob_chunk
    # Adapters that matter: a trained adapter's B is not zero.
    adapters, base = split_adapters(policy.params)
    adapters = jax.tree.map(lambda x: x + 0.5, adapters)
    params = step_lib.join_adapters(adapters, base)
    reference = jax.jit(reference_logprob_fn(policy.graphdef, params, chunk_size=chunk))
    ref, _ = reference(params, rows, 1.0)
    base_model, _ = load_hf(policy.path, dtype="float32")
    base_graphdef, base_params = nnx.split(base_model)
    expected, _ = jax.jit(model_logprob_fn(base_graphdef, chunk_size=chunk))(
        base_params, rows, 1.0)
    np.testing.assert_array_equal(ref, expected)
    adapted, _ = jax.jit(model_logprob_fn(policy.graphdef, chunk_size=chunk))(params, rows, 1.0)
    real = batch["segment_ids"] > 0
    assert np.abs(np.asarray(adapted - ref))[real].max() > 0.1


def test_the_engine_samples_the_adapted_policy(run):
    """A non-zero adapter: the episodes' engine log-probs are the trainer's under the
    adapters within today's parity tolerance, and far from the base model's: an engine
    that sampled the base would fail here."""
    config, _, policy, rollouts, _ = run
    r = config.rollout
    adapters, base = split_adapters(policy.params)
    rng = np.random.default_rng(0)
    adapters = jax.tree.map(lambda x: x + rng.normal(0, 0.3, x.shape).astype(np.float32),
                            adapters)
    params = step_lib.join_adapters(adapters, base)
    rollouts.sync_weights(params)
    try:
        groups = rollouts.pool.collect_sync(list(rollouts.suite.train_tasks[:2]), r.group_size,
                                            sampling=rollouts.sampling(1))
    finally:
        rollouts.sync_weights(policy.params)
    batch = collate([t for g in groups for t in g], buckets=length_buckets(r.max_tokens),
                    pad_id=policy.tokenizer.pad_token_id)
    rows = {k: batch[k] for k in LOGPROB_KEYS}
    chunk = config.model.logprob_chunk
    temperature = r.temperature
    adapted, _ = jax.jit(model_logprob_fn(policy.graphdef, chunk_size=chunk))(
        params, rows, temperature)
    unadapted, _ = jax.jit(reference_logprob_fn(policy.graphdef, params, chunk_size=chunk))(
        params, rows, temperature)
    actions = batch["action_mask"] == 1
    np.testing.assert_allclose(np.asarray(adapted)[actions], batch["behavior_logp"][actions],
                               atol=2e-4)
    assert np.abs(np.asarray(unadapted)[actions] - batch["behavior_logp"][actions]).max() > 0.1


def test_ppo_critic_trains_its_own_adapters_over_the_shared_base(run):
    _, runtime, policy, _, batch = run
    config = _config("ppo")
    _, base = split_adapters(policy.params)
    base_before = _host(base)
    state, states = _steps(config, runtime, policy, batch, count=2)
    critic = state.critic_params
    # No second trunk: the critic's state is its adapters and value head.
    assert set(critic.keys()) == {"trunk", "value_head", "value_bias"}
    assert set(critic["trunk"].keys()) == {"lora"}
    assert any((a != b).any() for a, b in zip(_host(states[0][1]), _host(states[1][1])))
    for before, after in zip(base_before, _host(base), strict=True):
        np.testing.assert_array_equal(before, after)


def test_checkpoints_hold_adapters_and_restore_only_onto_their_base(trained, tmp_path):
    state = trained[1]
    checkpoints = Checkpointer(tmp_path, every=1, async_save=False)
    checkpoints.save(1, state, {"step": 1})
    # What was written: the state without the base.
    saved = checkpoints._manager.item_metadata(1)["state"]
    assert "embed" not in str(saved) and "lora" in str(saved)
    restored, host = checkpoints.restore(state)
    assert host == {"step": 1}
    for a, b in zip(_arrays(state), _arrays(restored), strict=True):
        np.testing.assert_array_equal(a, b)
    # Restored twice over the same base: the same policy (adapters are never merged in).
    again, _ = checkpoints.restore(restored)
    for a, b in zip(_arrays(restored), _arrays(again), strict=True):
        np.testing.assert_array_equal(a, b)
    adapters, base = split_adapters(state.params)
    other = jax.tree.map(lambda x: x * 1.01, base)
    with pytest.raises(ValueError, match="trained over another base"):
        checkpoints.restore(state.replace(params=step_lib.join_adapters(adapters, other)))
    with pytest.raises(ValueError, match="saved with LoRA adapters; this run is without"):
        checkpoints.restore(state.replace(params=base))


def test_an_export_writes_its_extra_files_into_the_hf_and_adapter_folders(run, tmp_path):
    policy = run[2]
    policy.export(policy.params, f"{tmp_path / 'policy'}/", extra_files={EXPORT_MARKER: "x"})
    for folder in ("policy", ADAPTER_DIR):
        assert (tmp_path / folder / EXPORT_MARKER).read_text() == "x"
    assert export_refusal(str(tmp_path / "policy"), lora=True) is None  # may export again


def test_bad_lora_config_is_named_before_any_work(tmp_path):
    config = _config()
    config.model.lora.rank = 17  # k and v of the test model are [32 -> 16]
    with pytest.raises(ConfigError, match=r"'model.lora.rank' is 17.* 16 of the k projection"):
        validate(config)
    config.model.lora.rank, config.model.lora.targets = 2, "q,qkv"
    with pytest.raises(ConfigError, match=r"'model.lora.targets' is 'q,qkv'"):
        validate(config)
