"""A rerun in a workdir holding a run resumes it only under the same experiment: a key
that defines it refuses a change (one line naming each key, both values and the ways
out) unless accepted by name; the few keys safe to change do so freely; the config in
effect is config.json with the accepted changes applied."""
import json

import pytest

from agentjax.config import ConfigError, presets
from agentjax.config import resume
from agentjax.train import provenance
from agentjax.config.rules import FIXED, FREE, Grows
from agentjax.config.schema import ON_RESUME


def _config(**overrides):
    config = presets.search_config("grpo", "test")
    for key, value in overrides.items():
        *sections, name = key.split("__")
        node = config
        for section in sections:
            node = node[section]
        node[name] = value
    return config


def _run_folder(tmp_path, config, *, started=True):
    """A workdir as a run leaves it: its config.json, and init_model/ once work began."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "config.json").write_text(config.to_json_best_effort(indent=1))
    if started:
        (tmp_path / "init_model").mkdir()
    return str(tmp_path)


def _refusal(config, workdir, allowed=()) -> str:
    with pytest.raises(ConfigError) as info:
        resume.check_resume(config, workdir, allowed)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_the_keys_safe_to_change_on_resume_are_a_short_list():
    """Everything else defines the experiment."""
    free = sorted(key for key, rule in ON_RESUME.items() if rule == FREE)
    assert free == [
        "checkpoint.async_save", "checkpoint.every", "checkpoint.keep", "eval.every",
        "log.artifacts", "log.every", "log.group", "log.mlflow.experiment",
        "log.mlflow.tracking_uri", "log.name", "log.progress", "log.samples", "log.tags",
        "log.tensorboard", "log.wandb.entity", "log.wandb.mode", "log.wandb.project",
        "multihost.coordinator", "retrieval.url", "reward.judge.url",
        "rollout.sglang.grace_s", "rollout.sglang.launch", "rollout.sglang.max_in_flight",
        "rollout.sglang.router_url", "rollout.sglang.startup_timeout_s",
        "rollout.sglang.urls"]
    assert [k for k, r in ON_RESUME.items() if isinstance(r, Grows)] == ["total_steps"]
    assert sum(rule == FIXED for rule in ON_RESUME.values()) == len(ON_RESUME) - 27


def test_a_changed_lr_is_refused_naming_both_values_and_the_ways_out(tmp_path):
    workdir = _run_folder(tmp_path, _config(optim__lr=1e-3))
    message = _refusal(_config(optim__lr=2e-3, rollout__group_size=4), workdir)
    assert message == (
        f"{workdir} holds a run whose config this rerun changes: rollout.group_size 2 -> 4; "
        "optim.lr 0.001 -> 0.002. Resuming would train one run under two experiments: "
        "start it in a new --workdir, or accept the change with "
        "--allow_config_change=rollout.group_size,optim.lr")
    # Accepting one of the two still names the other.
    assert "--allow_config_change=rollout.group_size" in _refusal(
        _config(optim__lr=2e-3, rollout__group_size=4), workdir, ["optim.lr"])


def test_accepted_and_safe_changes_are_returned_for_the_record(tmp_path):
    workdir = _run_folder(tmp_path, _config(optim__lr=1e-3))
    changes = resume.check_resume(_config(optim__lr=2e-3, eval__every=5), workdir,
                                  ["optim.lr"])
    assert changes == [resume.Change("optim.lr", 1e-3, 2e-3),
                       resume.Change("eval.every", 2, 5)]
    # A safe key needs no flag; the same config is no change at all.
    assert resume.check_resume(_config(optim__lr=1e-3, eval__every=5), workdir) == [
        resume.Change("eval.every", 2, 5)]
    assert resume.check_resume(_config(optim__lr=1e-3), workdir) == []


def test_a_folder_where_no_work_began_is_started_again_not_resumed(tmp_path):
    """A config refused during set-up (after config.json was written) is fixed and
    rerun: nothing to mix yet."""
    workdir = _run_folder(tmp_path, _config(), started=False)
    assert resume.check_resume(_config(optim__lr=0.5), workdir) is None
    assert resume.check_resume(_config(), str(tmp_path / "new")) is None


def test_total_steps_may_grow_unless_something_is_planned_over_it(tmp_path):
    workdir = _run_folder(tmp_path, _config(total_steps=10))
    assert resume.check_resume(_config(total_steps=20), workdir) == [
        resume.Change("total_steps", 10, 20)]
    assert _refusal(_config(total_steps=5), workdir).startswith(
        f"{workdir} holds a run whose config this rerun changes: total_steps 10 -> 5 (it "
        "may only grow on resume). ")
    cosine = _run_folder(tmp_path / "cosine", _config(total_steps=10, optim__schedule="cosine"))
    assert "total_steps 10 -> 20 (optim.schedule='cosine' decays the lr over total_steps)" \
        in _refusal(_config(total_steps=20, optim__schedule="cosine"), cosine)
    tempered = _run_folder(tmp_path / "t", _config(total_steps=10, rollout__final_temperature=0.5))
    assert "rollout.final_temperature over total_steps" in _refusal(
        _config(total_steps=20, rollout__final_temperature=0.5), tempered)
    # Accepted by name all the same.
    assert resume.check_resume(_config(total_steps=20, optim__schedule="cosine"), cosine,
                               ["total_steps"]) == [resume.Change("total_steps", 10, 20)]


def test_the_config_in_effect_has_the_recorded_changes(tmp_path):
    """A resumed run killed and rerun with the same command resumes without a new
    change; going back to the original value is a change again."""
    workdir = _run_folder(tmp_path, _config(optim__lr=1e-3))
    changes = resume.check_resume(_config(optim__lr=2e-3), workdir, ["optim.lr"])
    provenance.record_changes(workdir, changes, stage="rl", step=1)
    [row] = resume.read_changes(workdir)
    assert {k: row[k] for k in ("stage", "step", "key", "old", "new")} == {
        "stage": "rl", "step": 1, "key": "optim.lr", "old": 1e-3, "new": 2e-3}
    assert json.loads((tmp_path / "config.json").read_text())["optim"]["lr"] == 1e-3
    assert resume.config_in_effect(workdir).optim.lr == 2e-3
    assert resume.check_resume(_config(optim__lr=2e-3), workdir) == []
    assert "optim.lr 0.002 -> 0.001" in _refusal(_config(optim__lr=1e-3), workdir)


def test_an_unknown_key_to_accept_is_an_error_with_the_likely_one(tmp_path):
    workdir = _run_folder(tmp_path, _config())
    assert _refusal(_config(), workdir, ["algo.lr"]) == (
        "--allow_config_change names 'algo.lr', which is not a config key; did you mean "
        "'pretrain.lr' or 'sft.lr' or 'optim.lr'?")


def test_a_hand_edited_change_row_is_an_error_naming_its_line(tmp_path):
    workdir = _run_folder(tmp_path, _config())
    (tmp_path / resume.CHANGES_FILE).write_text('{"key": "optim.lr"}\n')
    message = _refusal(_config(), workdir)
    assert message.startswith(f"{tmp_path / resume.CHANGES_FILE}:1: not a config change row")
