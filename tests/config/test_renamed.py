"""A renamed key (env.mask_observations, now env.loss_on_observations) is refused wherever
it is given, with one line naming the key to use instead."""
import json
import sys

import ml_collections
import pytest
from absl import flags
from ml_collections import config_flags

from agentjax import config as config_lib
from agentjax.config import presets

MESSAGE = ("config key 'env.mask_observations' was renamed: use env.loss_on_observations "
           "(inverted: loss_on_observations=True is mask_observations=False)")


def test_every_renamed_key_names_a_key_of_the_schema():
    for old, instead in config_lib.RENAMED.items():
        assert old not in config_lib.RULES
        new = instead.split()[1]  # "use <key> ..."
        assert new in config_lib.RULES, new


@pytest.mark.parametrize("value", [True, False])
def test_validate_refuses_the_old_key_naming_the_new_one(value):
    values = presets.search_config("grpo", "test").to_dict()
    values["env"]["mask_observations"] = value
    with pytest.raises(config_lib.ConfigError) as info:
        config_lib.validate(ml_collections.ConfigDict(values))
    assert str(info.value) == MESSAGE


def test_a_saved_config_with_the_old_key_is_refused_naming_the_new_one(tmp_path, capsys):
    saved = presets.search_config("grpo", "test").to_dict()
    del saved["env"]["loss_on_observations"]
    saved["env"]["mask_observations"] = True
    path = tmp_path / "config.json"
    path.write_text(json.dumps(saved))
    with pytest.raises(config_lib.ConfigError) as info:
        config_lib.load_saved(str(path))
    message = str(info.value)
    assert message == MESSAGE.replace("'env.mask_observations'",
                                      f"'env.mask_observations' in {path}")
    assert "\n" not in message
    assert "warning" not in capsys.readouterr().out  # refused, not dropped


def test_a_saved_config_with_the_new_key_loads(tmp_path):
    config = presets.search_config("grpo", "test")
    config.env.loss_on_observations = True
    path = tmp_path / "config.json"
    path.write_text(config.to_json())
    assert config_lib.load_saved(str(path)).env.loss_on_observations is True


def _parse(argv, monkeypatch):
    """What scripts/train.py's flag parsing raises for `argv` (a --config flag; the
    override flags are read from sys.argv)."""
    monkeypatch.setattr(sys, "argv", ["train.py", *argv])
    values = flags.FlagValues()
    config_flags.DEFINE_config_file("config", None, "config file[:variant]",
                                    lock_config=True, flag_values=values)
    with pytest.raises((AttributeError, KeyError)) as info:
        values(["train.py", *argv])
    return info.value


@pytest.fixture
def recipe_setting_the_old_key(tmp_path):
    path = tmp_path / "old_recipe.py"
    path.write_text("from agentjax.config import presets\n\n\n"
                    "def get_config(arg=None):\n"
                    "    config = presets.search_agent('test')\n"
                    "    config.env.mask_observations = False\n"
                    "    return config\n")
    return str(path)


def test_an_override_of_the_old_key_is_explained_where_flags_fail(monkeypatch):
    argv = ["--config=configs/grpo_search.py:test", "--config.env.mask_observations=False"]
    error = _parse(argv, monkeypatch)
    assert str(config_lib.renamed_in_flags(argv, error)) == MESSAGE


def test_a_config_file_setting_the_old_key_is_explained_where_flags_fail(
        recipe_setting_the_old_key, monkeypatch):
    argv = [f"--config={recipe_setting_the_old_key}"]
    error = _parse(argv, monkeypatch)
    assert str(config_lib.renamed_in_flags(argv, error)) == MESSAGE


def test_other_unknown_keys_are_left_to_the_unknown_key_message(monkeypatch):
    argv = ["--config=configs/grpo_search.py:test", "--config.env.mask_observation=False"]
    assert config_lib.renamed_in_flags(argv, _parse(argv, monkeypatch)) is None
