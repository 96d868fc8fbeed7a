"""The recipes (configs/*.py): every variant is valid, every sweep arm too, each recipe
builds what the builders the tests use build, and pinned values keep the recipes'
configs what they were."""
import os
import subprocess
import sys

import pytest

from agentjax import config as config_lib
from agentjax.config import ALGORITHM_PRESETS, presets
from agentjax.config.checks import dotted_get
from agentjax.sweep import plan as sweep_plan
from tests.config.test_schema import _error

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG_FILES = sorted(name for name in os.listdir(os.path.join(ROOT, "configs"))
                      if name.endswith(".py"))
VARIANTS = sorted(presets.VARIANTS)
# Recipes of a pretrained model: every variant needs --config.model.path.
NEEDS_A_MODEL = {"real_python.py"}


def recipe(name: str):
    return sweep_plan.load_config_module(os.path.join(ROOT, "configs", name))


@pytest.mark.parametrize("name", CONFIG_FILES)
def test_the_hf_variant_requires_a_model_path(name, tmp_path):
    config = recipe(name).get_config("hf")
    message = _error(config)
    assert message.startswith("config key 'model.path' is ''")
    assert "--config.model.path=" in message
    config.model.path = str(tmp_path)
    config_lib.validate(config)


@pytest.mark.parametrize("variant", ["cpu", "test"])
@pytest.mark.parametrize("name", CONFIG_FILES)
def test_every_other_variant_of_every_config_file_is_valid(name, variant, tmp_path):
    config = recipe(name).get_config(variant)
    if name in NEEDS_A_MODEL:
        assert _error(config).startswith("config key 'model.path' is ''")
        config.model.path = str(tmp_path)
    config_lib.validate(config)


@pytest.mark.parametrize("variant", sorted(presets.LONG_VARIANTS))
def test_the_long_forms_of_the_grpo_search_recipe_are_valid_and_its_alone(variant):
    config = recipe("grpo_search.py").get_config(variant)
    config_lib.validate(config)
    assert config.to_dict() == presets.search_config("grpo", variant).to_dict()
    with pytest.raises(ValueError, match=rf"unknown variant {variant!r}; choose one of "
                                         r"\['cpu', 'hf', 'test'\]"):
        recipe("dapo_search.py").get_config(variant)


@pytest.mark.parametrize("name", CONFIG_FILES)
def test_no_variant_is_the_backends_and_an_unknown_one_is_refused(name):
    module = recipe(name)
    assert module.get_config().to_dict() == module.get_config("cpu").to_dict()  # a CPU host
    with pytest.raises(ValueError, match=r"unknown variant 'gpu'; choose one of \['cpu', "):
        module.get_config("gpu")


# Sweep arms known not to make a valid config (found when this test was written; the
# arms are kept as they were until someone decides what the arm should be).
INVALID_ARMS = {
    # algorithm_overrides("ppo") sets PPO's algo.* keys over DAPO's and leaves DAPO's
    # algo.dynamic_sampling=True, which needs a group-based advantage.
    ("dapo_search.py", "algorithm", "ppo"): "algo.dynamic_sampling",
}


@pytest.mark.parametrize("name", CONFIG_FILES)
def test_every_arm_of_every_sweep_is_a_valid_config(name, tmp_path):
    module = recipe(name)
    assert module.SWEEPS
    for sweep in module.SWEEPS:
        arms = module.sweep(sweep)
        assert [arm["name"] for arm in arms] == [arm for arm, _ in module.SWEEPS[sweep]]
        for arm in arms:
            config = module.get_config("cpu")
            if name in NEEDS_A_MODEL:
                config.model.path = str(tmp_path)
            for key, value in arm["overrides"].items():
                sweep_plan.set_dotted(config, key, value)
            known = INVALID_ARMS.get((name, sweep, arm["name"]))
            if known:
                assert _error(config).startswith(f"config key {known!r}")
            else:
                config_lib.validate(config)
    with pytest.raises(ValueError, match=r"unknown sweep 'nope'; choose one of \["):
        module.sweep("nope")


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("name", ["grpo", "dapo", "ppo"])
def test_the_rl_search_recipes_are_the_search_config_of_their_algorithm(name, variant):
    """What tests and benchmarks build with presets.search_config is the recipe's."""
    config = recipe(f"{name}_search.py").get_config(variant)
    assert config.to_dict() == presets.search_config(name, variant).to_dict()


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_python_recipe_is_the_python_config_with_an_eval_sized_test_set(variant):
    config = recipe("grpo_python.py").get_config(variant)
    assert config.data.test_questions == f"1:{config.eval.num_tasks}"
    expected = presets.python_config("grpo", variant)
    expected.data.test_questions = config.data.test_questions
    assert config.to_dict() == expected.to_dict()


@pytest.mark.parametrize("variant", ["cpu", "test"])
@pytest.mark.parametrize("name", ["grpo_search.py", "dapo_search.py", "ppo_search.py",
                                  "grpo_python.py"])
def test_a_recipes_algorithm_settings_are_its_presets(name, variant):
    algo = recipe(name).get_config(variant).algo
    assert {key: algo[key] for key in ALGORITHM_PRESETS[algo.name]} == \
        ALGORITHM_PRESETS[algo.name]


# A few values of each recipe's variants, as they were before the recipes spelled them
# out (the whole configs were compared then, key by key).
PINNED = {
    ("grpo_search.py", "cpu"): {
        "stage": "rl", "total_steps": 40, "optim.lr": 5e-4, "optim.schedule": "cosine",
        "algo.agg": "seq-mean-token-mean", "algo.minibatches": 2, "pretrain.steps": 1200,
        "sft.steps": 1000, "sft.rename_frac": 0.5, "env.topk": 1, "env.instruction": "minimal",
        "env.loss_on_observations": False, "data.num_people": 360},
    ("grpo_search.py", "hf"): {
        "total_steps": 1000, "optim.lr": 1e-6, "rollout.group_size": 5,
        "rollout.prompts_per_step": 64, "algo.kl_coef": 0.001, "tokenizer.vocab_size": 0,
        "model.dtype": "bfloat16", "sft.steps": 0, "env.instruction": "search_r1"},
    ("grpo_search.py", "test"): {
        "total_steps": 2, "model.hidden_size": 32, "rollout.group_size": 2,
        "log.tensorboard": False},
    ("grpo_search.py", "long"): {
        "rollout.max_tokens": 32768, "rollout.max_new_tokens": 512, "env.max_turns": 32,
        "env.topk": 8, "env.max_observation_words": 400, "algo.micro_tokens": 32768,
        "model.remat": "auto", "sft.steps": 0, "pretrain.steps": 0,
        "rollout.prompts_per_step": 2, "rollout.group_size": 4, "data.num_people": 360},
    ("grpo_search.py", "long_test"): {
        "rollout.max_tokens": 2048, "rollout.max_new_tokens": 128, "env.max_turns": 12,
        "env.topk": 4, "algo.micro_tokens": 2048, "model.hidden_size": 32,
        "total_steps": 2},
    ("dapo_search.py", "cpu"): {
        "algo.name": "dapo", "algo.clip_high": 0.28, "algo.dynamic_sampling": True,
        "algo.overlong_buffer": 64, "algo.agg": "token-mean", "algo.kl_coef": 0.0},
    ("dapo_search.py", "hf"): {"algo.kl_coef": 0.001, "algo.kl_kind": "k3"},
    ("ppo_search.py", "cpu"): {
        "algo.advantage": "gae", "algo.lam": 0.95, "algo.critic_warmup_steps": 5},
    ("ppo_search.py", "test"): {"algo.critic_warmup_steps": 0},
    ("grpo_python.py", "cpu"): {
        "env.name": "python", "env.max_turns": 3, "pretrain.steps": 0,
        "data.train_questions": "1:2000", "data.test_questions": "1:200",
        "rollout.max_tokens": 1024},
    ("grpo_python.py", "hf"): {"data.test_questions": "1:400"},
    ("grpo_python.py", "test"): {"data.train_questions": "1:24", "rollout.max_tokens": 768},
    ("grpo_code.py", "cpu"): {
        "env.name": "code", "env.max_turns": 4, "env.instruction": "minimal",
        "reward.outcome": "tests", "sft.guess_prob": 0.6, "sft.wrong_first_prob": 0.5,
        "data.train_questions": "1:3000", "rollout.max_tokens": 512, "data.code_depth": 1,
        "env.failures_shown": 1, "env.submit_at_limit": True, "total_steps": 60,
        "eval.every": 0, "algo.micro_tokens": 8192},
    ("grpo_code.py", "hf"): {"env.instruction": "short", "rollout.max_tokens": 8192},
    ("grpo_code.py", "test"): {"env.max_turns": 3, "data.train_questions": "1:24"},
    ("sft_search.py", "cpu"): {
        "stage": "sft", "pretrain.steps": 1200, "sft.steps": 1000, "sft.lr": 3e-3,
        "sft.batch_size": 8, "sft.guess_prob": 0.6, "sft.guess": "mode",
        "sft.rename_frac": 0.5},
    ("sft_search.py", "hf"): {"sft.steps": 200, "sft.lr": 1e-5, "sft.batch_size": 16},
    ("rft_search.py", "cpu"): {
        "stage": "rft", "rft.tasks": 160, "optim.lr": 5e-4, "algo.minibatches": 1,
        "dpo.tasks": 512, "algo.name": "grpo"},
    ("rft_search.py", "hf"): {"total_steps": 200, "optim.lr": 1e-6, "rft.tasks": 1024},
    ("rft_search.py", "test"): {
        "rft.rounds": 2, "rft.min_reward": 0.05, "sft.steps": 40, "sft.lr": 1e-2,
        "rollout.group_size": 4, "reward.format_weight": 0.1, "optim.lr": 1e-3},
    ("dpo_search.py", "cpu"): {"stage": "dpo", "optim.lr": 1e-4, "dpo.tasks": 512,
                               "rft.tasks": 160},
    ("dpo_search.py", "hf"): {"optim.lr": 5e-7, "dpo.tasks": 2048, "dpo.batch_size": 32},
    ("dpo_search.py", "test"): {"dpo.refresh_every": 1, "dpo.branches": 2,
                                "dpo.min_reward": 0.05},
}


@pytest.mark.parametrize("name,variant", sorted(PINNED))
def test_pinned_values_of_each_recipe(name, variant):
    config = recipe(name).get_config(variant)
    assert {key: dotted_get(config, key) for key in PINNED[name, variant]} == \
        PINNED[name, variant]


def test_the_obs_mask_sweep_trains_on_observations_in_its_no_mask_arm():
    arms = {arm["name"]: arm["overrides"] for arm in recipe("grpo_search.py").sweep("obs_mask")}
    assert arms == {"mask_observations": {"env.loss_on_observations": False},
                    "no_mask": {"env.loss_on_observations": True}}


def test_the_package_and_a_recipe_load_without_jax():
    """scripts/train.py validates a config before jax is imported."""
    code = ("import sys; import agentjax.config; from agentjax.sweep import plan; "
            "plan.load_config_module('configs/dapo_search.py').get_config('hf'); "
            "print(sorted(m for m in ('jax', 'numpy', 'flax') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout
    assert out.strip() == "[]"


RL_RECIPES = ("grpo_search.py", "dapo_search.py", "ppo_search.py", "grpo_python.py",
              "grpo_code.py", "grpo_tools.py")


@pytest.mark.parametrize("name", RL_RECIPES)
def test_the_mismatch_is_corrected_where_the_engine_samples_in_bfloat16(name):
    """hf (a bfloat16 engine): token TIS and SkyRL's geometric mask; cpu and test keep
    today's token TIS alone (their numbers unchanged)."""
    hf = recipe(name).get_config("hf")
    assert hf.model.dtype == "bfloat16"
    assert (hf.algo.tis_cap, hf.algo.rollout_correction.masks) == (2.0, "geometric")
    assert (hf.algo.rollout_correction.geo_low, hf.algo.rollout_correction.geo_high) == (
        0.99, 1.01)
    for variant in ("cpu", "test"):
        config = recipe(name).get_config(variant)
        assert config.algo.rollout_correction.to_dict() == (
            config_lib.default_config().algo.rollout_correction.to_dict()), variant
        assert (config.algo.tis_cap, config.algo.tis_bound) == (2.0, "truncate"), variant
