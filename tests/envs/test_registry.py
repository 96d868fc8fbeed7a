"""The env registry: a suite registered with @register_env is what build_suite builds for
its env.name; the built-in envs' folders register themselves when a suite is built."""
import os
import subprocess
import sys

import ml_collections
import pytest

from agentjax.config import choices
from agentjax.core.task import Task
from agentjax.envs import registry as suites

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOY_TASKS = [Task("toy-0", "What is one plus one?", ("2",))]


@suites.register_env("test_registry_toy")
def build_toy_suite(config, data_dir):
    """A world of one question, no env, no demonstrations: what a new env registers."""
    return suites.TaskSuite(TOY_TASKS * config.data.copies, [], lambda: None,
                            lambda task, log: (0.0, {}), "exact_match", None, [],
                            [data_dir], {})


def test_a_registered_env_is_the_suite_of_its_name(tmp_path):
    # Validation restricts env.name to choices.OUTCOMES: build_suite takes any config.
    config = ml_collections.ConfigDict({"env": {"name": "test_registry_toy"},
                                        "data": {"copies": 3}})
    data_dir = str(tmp_path / "data")
    suite = suites.build_suite(config, data_dir)
    assert suite.train_tasks == TOY_TASKS * 3 and suite.texts == [data_dir]
    assert os.path.isdir(data_dir)  # build_suite makes the data folder
    assert suites.SUITES.get("test_registry_toy") is build_toy_suite


def test_an_env_name_registers_once():
    with pytest.raises(ValueError, match="env 'test_registry_toy' is already registered"):
        suites.register_env("test_registry_toy")(build_toy_suite)


def test_an_unknown_env_name_lists_the_registered_ones(tmp_path):
    config = ml_collections.ConfigDict({"env": {"name": "nope"}})
    with pytest.raises(ValueError, match=r"config.env.name='nope': unknown env 'nope'; "
                                         r"registered: \[.*'python', 'search'"):
        suites.build_suite(config, str(tmp_path / "data"))
    assert not os.path.exists(tmp_path / "data")


def test_the_built_in_envs_are_the_folders_with_a_suite():
    builtin = suites.load_builtin_envs()
    assert set(builtin) == {*choices.OUTCOMES, choices.AGENT_ENV} == {
        "search", "python", "code", "openai_agent"}
    assert "test_registry_toy" not in builtin  # registered here, not by an env folder
    for name in builtin:
        assert suites.SUITES.get(name).__module__ == f"agentjax.envs.{name}.suite"


def test_build_suite_registers_the_built_in_envs_without_their_import():
    """A fresh interpreter that imports only the registry finds the envs (the error of an
    unknown name lists them), without importing the env packages beforehand."""
    script = (
        "import sys, ml_collections\n"
        "from agentjax.envs import registry\n"
        "assert not registry.SUITES.names(), registry.SUITES.names()\n"
        "assert 'agentjax.envs.search.suite' not in sys.modules\n"
        "try:\n"
        "    registry.build_suite(ml_collections.ConfigDict({'env': {'name': 'x'}}), '.')\n"
        "except ValueError as error:\n"
        "    print(error)\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT}, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "registered: ['code', 'openai_agent', 'python', 'search']" in result.stdout
