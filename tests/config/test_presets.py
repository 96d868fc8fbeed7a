"""Every variant of every config file can start: it validates and its task suite builds
with as many tasks as the config asks for."""
import os

import ml_collections
import pytest

from agentjax import config as config_lib
from agentjax.config import choices, presets
from agentjax.config.checks import dotted_get
from agentjax.envs import registry as suites
from agentjax.sweep import plan as sweep_plan
from tests.config.test_recipes import NEEDS_A_MODEL

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG_FILES = sorted(name for name in os.listdir(os.path.join(ROOT, "configs"))
                      if name.endswith(".py"))
# The python suite runs sft.num_demos sandboxed demonstrations (2000 in the cpu variant,
# most of a minute on 2 cores); how many does not decide whether it builds.
MAX_DEMOS = 8


class _Reads:
    """A read-only view of a ConfigDict that records every leaf read (dotted key ->
    value), so that configs which agree on those reads can share one suite."""

    def __init__(self, config, reads, prefix=""):
        self._config, self._reads, self._prefix = config, reads, prefix

    def __getattr__(self, name):
        value = getattr(self._config, name)
        if isinstance(value, ml_collections.ConfigDict):
            return _Reads(value, self._reads, f"{self._prefix}{name}.")
        self._reads[self._prefix + name] = value
        return value


@pytest.fixture(scope="module")
def built_suites(tmp_path_factory):
    """build(config): the config's suite, reused from an earlier build whose builder read
    the same values (a suite is a function of the keys its builder reads)."""
    built = []  # (reads, suite)

    def build(config):
        for reads, suite in built:
            if all(dotted_get(config, key) == value for key, value in reads.items()):
                return suite
        reads = {}
        suite = suites.build_suite(_Reads(config, reads), str(tmp_path_factory.mktemp("suite")))
        built.append((reads, suite))
        return suite

    return build


@pytest.mark.slow
@pytest.mark.parametrize("variant", sorted(presets.VARIANTS))
@pytest.mark.parametrize("name", CONFIG_FILES)
def test_every_variant_of_every_config_file_builds_its_task_suite(name, variant,
                                                                  built_suites, tmp_path):
    config = sweep_plan.load_config_module(os.path.join(ROOT, "configs", name)).get_config(
        variant)
    if variant == "hf" or name in NEEDS_A_MODEL:
        config.model.path = str(tmp_path)  # a stand-in HF folder: the suite never reads it
    config_lib.validate(config)
    config.sft.num_demos = min(config.sft.num_demos, MAX_DEMOS)
    suite = built_suites(config)
    test_count = sum(suites.parse_counts(config.data.test_questions).values())
    assert len(suite.test_tasks) == test_count >= config.eval.num_tasks
    train_count = sum(suites.parse_counts(config.data.train_questions).values())
    if config.data.rl_excludes_demo_tasks and choices.task_env(config) == "search":
        assert 0 < len(suite.train_tasks) < train_count
    else:
        assert len(suite.train_tasks) == train_count
    assert len(suite.train_tasks) >= config.rollout.prompts_per_step
    assert len(suite.demonstrations) > 0 or config.sft.steps == 0


@pytest.mark.parametrize("variant", sorted(presets.VARIANTS))
def test_the_search_agent_is_the_variants_size_over_the_defaults(variant):
    config = presets.search_agent(variant)
    expected = config_lib.default_config()
    presets.VARIANTS[variant](expected)
    assert config.to_dict() == expected.to_dict()
    with pytest.raises(ValueError, match="unknown variant 'big'"):
        presets.search_agent("big")


@pytest.mark.parametrize("variant", sorted(presets.VARIANTS))
def test_the_offline_search_agent_makes_one_update_per_step(variant):
    config = presets.offline_search(variant)
    assert (config.algo.ppo_epochs, config.algo.minibatches) == (1, 1)
    for stage in ("rft", "dpo"):
        config.stage = stage
        if variant == "hf":
            config.model.path = ROOT  # a stand-in for the required HF folder
        config_lib.validate(config)
