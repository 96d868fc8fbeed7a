"""Each name list of agentjax.config.choices is exactly what its implementation has a table for."""
import pytest

from agentjax.config import choices
from agentjax.data import curriculum
from agentjax.envs.search.demonstrators import DemonstratorConfig
from agentjax.models import config as model_config
from agentjax.rl import offpolicy, policy_losses, preference, rollout_correction
from agentjax.data import offline_jsonl
from agentjax.train.stages import offline
from agentjax.agents import sources
from agentjax.envs import registry as suites
from agentjax.envs import tools
from agentjax.envs.python import env as python_env
from agentjax.envs.search import suite as search_suite
from agentjax.parsers import tool_calls
from agentjax.rewards import composite


def test_every_env_has_a_task_suite():
    # The envs agentjax's own folders register (a test may register more): the task envs
    # and the one that runs a user's agent on their tasks.
    assert sorted(suites.load_builtin_envs()) == sorted([*choices.OUTCOMES, choices.AGENT_ENV])
    assert set(choices.OUTCOMES) <= set(suites.SUITES.names())


def test_every_outcome_is_a_registered_outcome_component():
    for env, outcomes in choices.OUTCOMES.items():
        assert "em" in outcomes, env  # the success criterion of every env
        for name in outcomes.values():
            assert composite.REWARDS.get(name).kind == "outcome", (env, name)


def test_the_built_in_tool_is_registered():
    # No config chooses tools by name (PythonEnv's `tools` argument does): no name list.
    assert tools.TOOLS.get("python") is python_env.PythonTool


def test_every_rollout_mode_has_a_source():
    assert sources.SOURCES.names() == choices.ROLLOUT_MODES


def test_every_arch_has_an_hf_architectures_entry():
    assert tuple(model_config._ARCHS) == choices.ARCHS


def test_every_policy_loss_has_a_function():
    assert policy_losses.POLICY_LOSSES.names() == choices.POLICY_LOSSES


def test_every_is_bound_has_a_function():
    assert tuple(offpolicy._BOUND_FNS) == choices.IS_BOUNDS


def test_every_rollout_correction_mask_is_registered():
    assert rollout_correction.MASKS.names() == choices.ROLLOUT_CORRECTION_MASKS


def test_every_dpo_kind_has_a_function():
    assert tuple(preference._DPO_LOSS_FNS) == choices.DPO_KINDS


def test_every_curriculum_has_a_sampler():
    assert curriculum.SAMPLERS.names() == choices.CURRICULA


def test_every_instruction_has_a_text():
    assert tuple(search_suite.INSTRUCTIONS) == choices.INSTRUCTIONS


def test_the_demonstrator_takes_exactly_the_guess_names():
    for guess in choices.GUESSES:
        DemonstratorConfig(guess=guess)
    with pytest.raises(ValueError, match=r"one of \('sample', 'mode'\)"):
        DemonstratorConfig(guess="median")


def test_every_stage_has_a_runner():
    assert set(choices.STAGES) == {"sft", "rl"} | set(offline.STAGES)


def test_every_dpo_pairs_choice_names_pair_levels():
    assert tuple(offline.PAIR_LEVELS_OF) == choices.DPO_PAIRS
    assert {level for levels in offline.PAIR_LEVELS_OF.values() for level in levels} == set(
        offline_jsonl.PAIR_LEVELS)


def test_every_tool_parser_is_registered():
    assert tool_calls.TOOL_PARSERS.names() == choices.TOOL_PARSERS
