"""The algorithm presets and the rollout correction presets: each sets only algo.* keys
the schema has and gives a valid config; a sweep arm's overrides set exactly what
apply_algorithm (apply_rollout_correction) sets."""
import pytest

from agentjax import config as config_lib
from agentjax.config import ALGORITHM_PRESETS, apply_algorithm, presets
from agentjax.config.algorithms import (
    ALGORITHMS,
    ROLLOUT_CORRECTION_PRESETS,
    ROLLOUT_CORRECTIONS,
    algorithm_overrides,
    apply_rollout_correction,
    rollout_correction_overrides,
)
from agentjax.sweep import plan as sweep_plan


def test_every_algorithm_is_a_choice_of_algo_name():
    assert config_lib.RULES["algo.name"].options == ALGORITHMS == tuple(ALGORITHM_PRESETS)


@pytest.mark.parametrize("name", ALGORITHMS)
def test_each_algorithm_sets_algo_keys_and_validates(name, tmp_path):
    for key in ALGORITHM_PRESETS[name]:
        assert f"algo.{key}" in config_lib.RULES
    config = presets.search_config(name, "test")
    assert config.algo.name == name
    if name == "opd":  # distillation names its teacher (tests/train/test_teacher.py)
        config.algo.teacher = str(tmp_path)
    config_lib.validate(config)


@pytest.mark.parametrize("name", ALGORITHMS)
def test_the_overrides_of_an_algorithm_set_what_apply_algorithm_sets(name):
    applied = apply_algorithm(config_lib.default_config(), name)
    overridden = config_lib.default_config()
    for key, value in algorithm_overrides(name).items():
        sweep_plan.set_dotted(overridden, key, value)
    assert applied.to_dict() == overridden.to_dict()


def test_an_unknown_algorithm_is_refused():
    with pytest.raises(ValueError, match=r"unknown algorithm 'a2c'; choose one of \["):
        apply_algorithm(config_lib.default_config(), "a2c")


@pytest.mark.parametrize("name", ROLLOUT_CORRECTIONS)
def test_each_rollout_correction_sets_algo_keys_and_validates(name):
    for key in ROLLOUT_CORRECTION_PRESETS[name]:
        assert f"algo.{key}" in config_lib.RULES
    # Applied over another preset, a preset's name still says everything that corrects.
    for before in ("decoupled_k3_rs_seq_tis", "icepop"):
        config = apply_rollout_correction(presets.search_config("grpo", "test"), before)
        config = apply_rollout_correction(config, name)
        config_lib.validate(config)
        overridden = apply_rollout_correction(presets.search_config("grpo", "test"), name)
        for key in ("tis_cap", "tis_bound", "old_logp"):
            assert config.algo[key] == overridden.algo[key], (before, name, key)
        assert config.algo.rollout_correction.masks == overridden.algo.rollout_correction.masks
        assert (config.algo.rollout_correction.is_level
                == overridden.algo.rollout_correction.is_level)


@pytest.mark.parametrize("name", ["decoupled_geo_rs_token_tis", "opsm"])
def test_the_overrides_of_a_rollout_correction_set_what_apply_sets(name):
    applied = apply_rollout_correction(config_lib.default_config(), name)
    overridden = config_lib.default_config()
    for key, value in rollout_correction_overrides(name).items():
        sweep_plan.set_dotted(overridden, key, value)
    assert applied.to_dict() == overridden.to_dict()


def test_an_unknown_rollout_correction_is_refused():
    with pytest.raises(ValueError, match=r"unknown rollout correction 'tis'; choose one of"):
        apply_rollout_correction(config_lib.default_config(), "tis")
