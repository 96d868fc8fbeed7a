"""What a workdir records of each start: the code it ran (a start under another commit
warns, naming both), and the config changes a resume accepted, at the stage and step
from which they apply."""
import json
import subprocess

import jax.numpy as jnp
import pytest

from agentjax.config import presets
from agentjax.config.resume import Change, read_changes
from agentjax.train import provenance
from agentjax.train.checkpoint import Checkpointer
from agentjax.train.runtime import Runtime

STATE = {"w": jnp.zeros(2)}


def _config():
    config = presets.search_config("grpo", "test")  # pretrain 2, sft 3, RL 2 steps
    assert (config.pretrain.steps, config.sft.steps, config.total_steps) == (2, 3, 2)
    return config


def _commit(folder, step):
    checkpointer = Checkpointer(str(folder / "checkpoints"), every=1, async_save=False)
    checkpointer.save(step, STATE, {"step": step})
    checkpointer.close()


def _runtime(workdir) -> Runtime:
    return Runtime(workdir=str(workdir), mesh=None, rules={}, is_main=True,
                   checkpoint=None, progress=False)


def test_the_resume_point_is_the_latest_committed_step_of_the_latest_stage(tmp_path):
    config, w = _config(), str(tmp_path)
    assert provenance.resume_point(config, w) == ("pretrain", f"{w}/pretrain", 0)
    _commit(tmp_path / "pretrain", 1)
    assert provenance.resume_point(config, w) == ("pretrain", f"{w}/pretrain", 1)
    _commit(tmp_path / "pretrain", 2)  # pretraining done: SFT starts
    assert provenance.resume_point(config, w) == ("sft", f"{w}/sft", 0)
    _commit(tmp_path / "sft", 3)
    assert provenance.resume_point(config, w) == ("rl", w, 0)
    _commit(tmp_path, 1)
    assert provenance.resume_point(config, w) == ("rl", w, 1)
    config.init_from = w  # no warm start: RL is the only stage
    assert [name for name, _, _ in provenance.stages(config, w)] == ["rl"]


def test_code_version_is_this_checkouts_commit_and_nothing_outside_one(tmp_path,
                                                                       monkeypatch):
    version = provenance.code_version()
    head = subprocess.run(["git", "-C", provenance._CHECKOUT, "rev-parse", "HEAD"],
                          capture_output=True, text=True)
    if head.returncode:
        pytest.skip(f"agentjax is not imported from a git checkout here: {head.stderr}")
    assert version["commit"] == head.stdout.strip() and isinstance(version["dirty"], bool)
    monkeypatch.setattr(provenance, "_CHECKOUT", str(tmp_path))
    assert provenance.code_version() == {**version, "commit": None, "dirty": None}


def test_a_start_records_its_code_and_the_accepted_changes_at_the_resume_point(
        tmp_path, monkeypatch, capsys):
    config = _config()
    _commit(tmp_path / "pretrain", 2)
    _commit(tmp_path / "sft", 3)
    _commit(tmp_path, 1)
    versions = iter([{"version": "0.1", "commit": "aaa", "dirty": False},
                     {"version": "0.1", "commit": "bbb", "dirty": True}])
    monkeypatch.setattr(provenance, "code_version", lambda: next(versions))
    provenance.record_start(config, _runtime(tmp_path), None)  # the first start
    assert read_changes(str(tmp_path)) == [] and "warning" not in capsys.readouterr().out
    runtime = _runtime(tmp_path)
    provenance.record_start(config, runtime, [Change("optim.lr", 1e-3, 2e-3),
                                              Change("eval.every", 2, 1)])
    out = capsys.readouterr().out
    assert ("resuming with config changes after rl step 1: optim.lr 0.001 -> 0.002; "
            "eval.every 2 -> 1") in out
    assert ("warning: this run's last start ran agentjax commit aaa; it resumes under "
            "commit bbb with uncommitted changes") in out
    assert [(r["stage"], r["step"], r["key"], r["old"], r["new"])
            for r in read_changes(str(tmp_path))] == [
        ("rl", 1, "optim.lr", 1e-3, 2e-3), ("rl", 1, "eval.every", 2, 1)]
    # The RL stage's first metrics row says how many keys changed (train/fit.py).
    assert runtime.config_changes == {str(tmp_path): 2}
    rows = [json.loads(line) for line in (tmp_path / provenance.CODE_VERSIONS).open()]
    assert [(r["stage"], r["step"], r["commit"], r["dirty"]) for r in rows] == [
        ("rl", 1, "aaa", False), ("rl", 1, "bbb", True)]
    assert provenance.changes_report(str(tmp_path)).splitlines()[0].startswith(
        "config changed on resume after rl step 1: optim.lr 0.001 -> 0.002 (")
