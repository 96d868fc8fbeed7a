"""Configs: the schema every run starts from (schema.py: each key's default, rule and
meaning), its validation (validation.py, checks.py), the RL algorithms a config names
(algorithms.py), a run's saved config (saved.py) and what a resume may change in it
(resume.py), and what the recipes of configs/ share (presets.py).

Import-light: scripts/train.py validates a config before jax or anything heavy is
imported, so nothing here imports more than ml_collections at import time.
"""
from agentjax.config.algorithms import ALGORITHM_PRESETS, apply_algorithm
from agentjax.config.checks import sglang_logprob_distribution
from agentjax.config.errors import ConfigError, exit_on_config_error
from agentjax.config.resume import check_resume
from agentjax.config.saved import is_run_folder, load_saved
from agentjax.config.schema import RENAMED, RULES, default_config
from agentjax.config.validation import renamed_in_flags, validate

__all__ = [
    "ALGORITHM_PRESETS",
    "ConfigError",
    "RENAMED",
    "RULES",
    "apply_algorithm",
    "check_resume",
    "default_config",
    "exit_on_config_error",
    "is_run_folder",
    "load_saved",
    "renamed_in_flags",
    "sglang_logprob_distribution",
    "validate",
]
