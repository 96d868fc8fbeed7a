"""Every variant of every config file can start: it validates and its task suite builds
with as many tasks as the config asks for."""
import os

import ml_collections
import pytest

from agentjax.sweep import plan as sweep_plan
from agentjax.config import schema as config_lib
from agentjax.config import presets
from agentjax.envs import registry as suites

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
            if all(config_lib._get(config, key) == value for key, value in reads.items()):
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
    if variant == "hf":  # a stand-in for the required HF folder; the suite never reads it
        config.model.path = str(tmp_path)
    config_lib.validate(config)
    config.sft.num_demos = min(config.sft.num_demos, MAX_DEMOS)
    suite = built_suites(config)
    test_count = sum(suites.parse_counts(config.data.test_questions).values())
    assert len(suite.test_tasks) == test_count >= config.eval.num_tasks
    train_count = sum(suites.parse_counts(config.data.train_questions).values())
    if config.data.rl_excludes_demo_tasks and config.env.name == "search":
        assert 0 < len(suite.train_tasks) < train_count
    else:
        assert len(suite.train_tasks) == train_count
    assert len(suite.train_tasks) >= config.rollout.prompts_per_step
    assert len(suite.demonstrations) > 0 or config.sft.steps == 0


@pytest.mark.parametrize("stage", sorted(presets.OFFLINE_SWEEPS))
def test_every_arm_of_the_offline_sweeps_is_a_valid_config(stage):
    for name in presets.OFFLINE_SWEEPS[stage]:
        for arm in presets.offline_sweep(stage, name):
            config = presets.offline_config(stage, "cpu")
            for key, value in arm["overrides"].items():
                sweep_plan.set_dotted(config, key, value)
            config_lib.validate(config)
