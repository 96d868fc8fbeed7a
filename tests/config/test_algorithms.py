"""The algorithm presets: each sets only algo.* keys the schema has and gives a valid
config; a sweep arm's overrides set exactly what apply_algorithm sets."""
import pytest

from agentjax import config as config_lib
from agentjax.config import ALGORITHM_PRESETS, apply_algorithm, presets
from agentjax.config.algorithms import ALGORITHMS, algorithm_overrides
from agentjax.sweep import plan as sweep_plan


def test_every_algorithm_is_a_choice_of_algo_name():
    assert config_lib.RULES["algo.name"].options == ALGORITHMS == tuple(ALGORITHM_PRESETS)


@pytest.mark.parametrize("name", ALGORITHMS)
def test_each_algorithm_sets_algo_keys_and_validates(name):
    for key in ALGORITHM_PRESETS[name]:
        assert f"algo.{key}" in config_lib.RULES
    config = presets.search_config(name, "test")
    assert config.algo.name == name
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
