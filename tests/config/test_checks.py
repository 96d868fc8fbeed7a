"""The checks that combine keys: each impossible combination of in-range values is a
one-line ConfigError naming a key to change; the possible ones pass."""
import math

import pytest

from agentjax import config as config_lib
from agentjax.config import presets
from agentjax.sweep import plan as sweep_plan
from tests.config.test_schema import MISSING, _error


def _overridden(config, overrides):
    for key, value in overrides.items():
        sweep_plan.set_dotted(config, key.replace("__", "."), value)
    return config


def _search(**overrides):
    return _overridden(presets.search_config("grpo", "test"), overrides)


def _python(**overrides):
    return _overridden(presets.python_config("grpo", "test"), overrides)


def _ppo(**overrides):
    return _overridden(presets.search_config("ppo", "test"), overrides)


# Combinations of in-range values that cannot work: (config, the key the error names,
# a phrase it contains). Keys are written a__b for a.b.
COMBINATIONS = [
    (_search(rollout__group_size=1), "rollout.group_size", "within a group"),
    (_search(rollout__group_size=1, algo__advantage="gigpo"), "rollout.group_size",
     "within a group"),
    (_search(algo__minibatches=3), "algo.minibatches", "rollout batch"),
    (_search(algo__loss="gspo", algo__dual_clip=3.0), "algo.dual_clip", "algo.loss='ppo'"),
    (_search(algo__microbatch_size=3), "algo.microbatch_size", "minibatch size 4"),
    (_search(algo__micro_tokens=768, algo__microbatch_size=2), "algo.micro_tokens",
     "replaces algo.microbatch_size=2"),
    (_search(algo__micro_tokens=256), "algo.micro_tokens", "rollout.max_tokens=384"),
    (_search(stage="dpo", algo__micro_tokens=768), "algo.micro_tokens", "stage='dpo'"),
    (_search(stage="sft", algo__micro_tokens=768), "algo.micro_tokens", "stage='sft'"),
    (_search(rollout__engine_lanes=3), "rollout.engine_lanes", "split evenly"),
    (_search(rollout__concurrency=9), "rollout.concurrency", "engine_slots=8"),
    (_search(rollout__max_new_tokens=384), "rollout.max_new_tokens", "max_tokens=384"),
    (_search(rollout__engine_attention="pallas_gpu", rollout__page_size=48),
     "rollout.page_size", "'pallas_gpu' needs a power of two >= 16"),
    (_search(rollout__engine_attention="pallas_tpu", rollout__page_size=8),
     "rollout.page_size", "'pallas_tpu' needs a multiple of 16"),
    (_python(reward__outcome="f1"), "reward.outcome", "env.name='python'"),
    (_python(sft__rename_frac=0.5), "sft.rename_frac", "synthetic search world"),
    (_python(pretrain__steps=2), "pretrain.steps", "synthetic search world"),
    (_python(sft__corpus_mix=0.5), "sft.corpus_mix", "synthetic search world"),
    (_search(pretrain__worlds=0), "pretrain.steps", "pretrain.worlds >= 1"),
    (_search(pretrain__steps=0, sft__corpus_mix=0.5, pretrain__worlds=0), "sft.corpus_mix",
     "pretrain.worlds >= 1"),
    (_search(stage="sft", sft__steps=0), "sft.steps", "stage='sft'"),
    (_search(stage="dpo", algo__minibatches=2), "algo.minibatches",
     "stage='dpo' makes one optimizer update per step"),
    (_search(stage="rft", algo__ppo_epochs=2), "algo.ppo_epochs",
     "stage='rft' makes one optimizer update per step"),
    (_search(stage="rft", rft__rounds=3), "rft.rounds", "divide total_steps=2"),
    (_search(stage="dpo", algo__microbatch_size=4, dpo__batch_size=6), "algo.microbatch_size",
     "divide dpo.batch_size=6"),
    (_search(stage="dpo", dpo__kind="ipo", dpo__label_smoothing=0.1), "dpo.label_smoothing",
     "only dpo.kind='sigmoid'"),
    (_search(stage="dpo", dpo__data_path=__file__, dpo__refresh_every=2), "dpo.refresh_every",
     "fixed"),
    (_search(data__num_cities=3), "data.num_cities", "data.num_countries=4"),
    (_search(data__source="files", pretrain__steps=0, sft__rename_frac=0.0),
     "data.train_path", "data.source='files'"),
    (_search(data__source="files", data__train_path=__file__, pretrain__steps=0),
     "data.corpus_path", "retrieval.kind='bm25'"),
    (_search(retrieval__kind="http"), "retrieval.url", "retrieval.kind='http'"),
    (_search(tokenizer__vocab_size=0), "model.path", "--config.model.path="),
    (_search(model__num_heads=3), "model.num_heads", "model.hidden_size=32"),
    (_search(model__num_heads=2, model__num_kv_heads=3), "model.num_kv_heads",
     "model.num_heads=2"),
    (_search(algo__advantage="gae"), "algo.advantage", "algo.name is 'grpo'"),
    (_ppo(algo__critic_lr=0.0), "algo.critic_lr", "needs a critic"),
    (_ppo(algo__dynamic_sampling=True), "algo.dynamic_sampling", "group-based"),
    (_search(algo__overlong_buffer=300), "algo.overlong_buffer", "overlong_max_len=256"),
    (_search(rollout__engine="sglang"), "rollout.engine", "exactly one of"),
    (_search(rollout__engine="sglang", rollout__sglang__launch=1,
             rollout__sglang__urls="http://h:30000"), "rollout.engine", "exactly one of"),
    (_search(rollout__sglang__launch=2), "rollout.sglang.launch",
     "only with rollout.engine='sglang'"),
    (_search(rollout__sglang__urls="http://h:30000"), "rollout.sglang.urls",
     "only with rollout.engine='sglang'"),
    (_search(rollout__sglang__router_url="http://h:30100"), "rollout.sglang.router_url",
     "only with rollout.engine='sglang'"),
    (_search(rollout__engine="sglang", rollout__sglang__launch=1,
             rollout__sglang__router_url="http://h:30100"), "rollout.sglang.router_url",
     "workers must be listed in rollout.sglang.urls"),
    (_search(rollout__engine="sglang", rollout__sglang__urls="http://h:30000,http://h:30100/",
             rollout__sglang__router_url="http://h:30100"), "rollout.sglang.router_url",
     "also listed in rollout.sglang.urls"),
    (_search(rollout__engine="sglang", rollout__sglang__launch=1, multihost__enabled=True,
             multihost__coordinator="h:1234", multihost__num_processes=2),
     "rollout.engine", "multi-host"),
    # SGLang's default log-probs are not truncated: wrong behavior log-probs under top_p.
    (_search(rollout__engine="sglang", rollout__sglang__urls="http://h:30000",
             rollout__top_p=0.9), "rollout.sglang.logprob_distribution", "not truncated"),
    (_search(rollout__engine="sglang", rollout__sglang__urls="http://h:30000",
             rollout__sglang__logprob_distribution="raw", rollout__temperature=0.7),
     "rollout.sglang.logprob_distribution", "before temperature"),
    # Masks read the behavior log-probs too.
    (_search(rollout__engine="sglang", rollout__sglang__urls="http://h:30000",
             rollout__top_p=0.9, algo__tis_cap=0.0,
             algo__rollout_correction__masks="geometric"),
     "rollout.sglang.logprob_distribution", "not truncated"),
    (_search(algo__rollout_correction__is_level="sequence", algo__tis_cap=0.0),
     "algo.rollout_correction.is_level", "algo.tis_cap > 0"),
    (_search(algo__rollout_correction__is_level="sequence", algo__old_logp="behavior"),
     "algo.rollout_correction.is_level", "algo.old_logp='recompute'"),
    (_python(reward__outcome="judge"), "reward.outcome", "env.name='python'"),
    (_search(reward__outcome="judge", reward__judge__model="m"), "reward.judge.url",
     "needs the judge's OpenAI-compatible chat server"),
    (_search(reward__outcome="judge", reward__judge__url="http://127.0.0.1:30000"),
     "reward.judge.model", "the model name the judge server serves"),
    (_search(reward__judge__url="http://127.0.0.1:30000"), "reward.judge.url",
     "only with reward.outcome='judge' (reward.outcome is 'em')"),
    (_search(reward__judge__votes=3), "reward.judge.votes", "temperature > 0"),
    (_python(data__hindsight=True), "data.hindsight", "synthetic search world"),
    (_overridden(presets.search_config("reinforce_pp", "test"), {"data.hindsight": True}),
     "data.hindsight", "group-based algo.advantage"),
    (_search(data__hindsight=True, algo__old_logp="behavior"), "data.hindsight",
     "algo.old_logp='recompute'"),
    (_search(rollout__mode="async", algo__dynamic_sampling=True), "algo.dynamic_sampling",
     "does not filter"),
    (_search(rollout__mode="async", rollout__final_temperature=0.5),
     "rollout.final_temperature", "rollout.temperature=1.0"),
    (_search(rollout__mode="async", rollout__concurrency=1), "rollout.concurrency",
     "rollout.group_size=2"),
    (_search(rollout__mode="async", rollout__queue_groups=1), "rollout.queue_groups",
     "prompts_per_step=2"),
    (_search(rollout__mode="async", multihost__enabled=True,
             multihost__coordinator="host:1", multihost__num_processes=2), "rollout.mode",
     "multi-host"),
    (_search(rollout__mode="async", data__hindsight=True), "data.hindsight",
     "does not relabel"),
    (_search(rollout__mode="async", stage="sft"), "rollout.mode", "stage='sft'"),
    (_search(mesh__data=-1, mesh__fsdp=-1), "mesh", "at most one axis"),
    (_search(multihost__enabled=True), "multihost.enabled", "multihost.coordinator"),
    (_search(multihost__process_id=1), "multihost.process_id", "num_processes=1"),
    (_search(devices=2, multihost__enabled=True, multihost__coordinator="host:1",
             multihost__num_processes=2), "devices", "every device of its hosts"),
]


@pytest.mark.parametrize("config,key,phrase", COMBINATIONS,
                         ids=[f"{key}-{i}" for i, (_, key, _) in enumerate(COMBINATIONS)])
def test_an_impossible_combination_is_an_error_naming_a_key_to_change(config, key, phrase):
    message = _error(config)
    assert message.startswith(f"config key {key!r}"), message
    assert phrase in message


def test_micro_batches_by_tokens_fit_the_longest_episode():
    config_lib.validate(_search(algo__micro_tokens=384))


def test_each_kernel_takes_its_page_sizes():
    # 48 is a multiple of 16 (the TPU kernel), not a power of two (the GPU kernel's).
    for attention, page_size in [("pallas_gpu", 16), ("pallas_tpu", 48), ("paged", 8)]:
        config_lib.validate(_search(rollout__engine_attention=attention,
                                    rollout__page_size=page_size))


def test_a_loaded_model_may_leave_the_tiny_model_keys_inconsistent(tmp_path):
    """The tiny-model shape keys only matter when no model is loaded."""
    config = _search(model__num_heads=3, tokenizer__vocab_size=0)
    config.model.path = str(tmp_path)
    config_lib.validate(config)


# Values that used to run minutes of work, exit 0 or crash elsewhere before validation.
@pytest.mark.parametrize("key,value", [
    ("optim.lr", math.nan), ("algo.minibatches", 0), ("rollout.prompts_per_step", 0),
    ("total_steps", -3), ("rollout.max_new_tokens", 0), ("log.every", 0),
    ("init_from", MISSING), ("data.train_path", MISSING), ("model.path", MISSING)])
def test_reported_bad_values_are_rejected_naming_the_key(key, value):
    config = presets.search_config("grpo", "cpu")
    sweep_plan.set_dotted(config, key, value)
    assert _error(config).startswith(f"config key {key!r} is {value!r}; allowed: ")


@pytest.mark.parametrize("key,value", [
    ("algo.turn_gamma", 1.5), ("algo.gigpo_weight", -1.0), ("algo.gigpo_norm", "median"),
    ("algo.turn_anchor", "state"), ("algo.turn_baseline", "index")])
def test_turn_credit_keys_are_ranged(key, value):
    config = _search(algo__advantage="gigpo")
    config_lib.validate(config)
    sweep_plan.set_dotted(config, key, value)
    assert _error(config).startswith(f"config key {key!r} is {value!r}; allowed: ")


def test_a_router_in_front_of_the_listed_workers_is_accepted():
    config_lib.validate(_search(rollout__engine="sglang",
                                rollout__sglang__urls="http://h:30000,http://h:30001",
                                rollout__sglang__router_url="http://h:30100"))


@pytest.mark.parametrize("overrides", [
    # serve.py's log-probs are those of the sampling distribution, truncation included.
    dict(rollout__sglang__launch=1, rollout__top_p=0.9),
    # Nothing uses the behavior log-probs: recomputed old policy, no TIS weights.
    dict(rollout__sglang__urls="http://h:30000", rollout__top_p=0.9, algo__tis_cap=0.0),
    dict(rollout__sglang__urls="http://h:30000", rollout__sglang__logprob_distribution="raw",
         rollout__temperature=1.0),
])
def test_sglang_log_probs_are_accepted_where_they_are_the_sampled_ones(overrides):
    config_lib.validate(_search(rollout__engine="sglang", **overrides))


@pytest.mark.parametrize("overrides,key,phrase", [
    ({"env__compact_at_tokens": 384}, "env.compact_at_tokens", "below rollout.max_tokens"),
    ({"env__compact_at_tokens": 200, "data__hindsight": True}, "data.hindsight",
     "prompts of their own"),
    ({"env__compact_at_tokens": 200, "rollout__max_segments": 2,
      "algo__advantage": "reinforce_pp"},
     "algo.advantage", "each segment of a compacted rollout"),
    ({"env__compact_at_tokens": 200, "algo__advantage": "gigpo"}, "algo.advantage",
     "env.compact_at_tokens=0"),
    ({"env__compact_at_tokens": 200, "stage": "dpo"}, "env.compact_at_tokens",
     "earlier segments out")])
def test_compaction_combinations_name_the_key_to_change(overrides, key, phrase):
    message = _error(_search(**overrides))
    assert message.startswith(f"config key {key!r}"), message
    assert phrase in message


@pytest.mark.parametrize("key,value", [
    ("env.compact_at_tokens", -1), ("env.compaction", "truncate"),
    ("env.compaction_keep_turns", 0), ("env.max_compactions", 0),
    ("algo.truncated_rollouts", "drop")])
def test_compaction_and_truncation_keys_are_ranged(key, value):
    config = _search(env__compact_at_tokens=200, rollout__max_segments=3,
                     algo__truncated_rollouts="mask", env__compaction="drop")
    config_lib.validate(config)
    sweep_plan.set_dotted(config, key, value)
    assert _error(config).startswith(f"config key {key!r} is {value!r}; allowed: ")
