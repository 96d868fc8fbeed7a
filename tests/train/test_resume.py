"""Resume never loses work: a run SIGKILLed at seeded points, again and again, ends
exactly as the uninterrupted run — metrics of every stage, evaluations, exported
weights (scripts/bench/reliability.py runs the longer campaign of tests/train/runs.py)."""
import json
import shutil

import pytest

from agentjax.config.resume import read_changes
from agentjax.train.metrics import read_metrics
from tests.train import runs

pytestmark = pytest.mark.slow  # several end-to-end runs

CONFIG = "grpo_search.py:test"


@pytest.fixture(scope="module")
def uninterrupted(finished_run):
    return finished_run(CONFIG)[0]


def test_kill_after_the_rl_checkpoint_folder_exists_resumes_from_sft(
        uninterrupted, tmp_path):
    """The workdir a kill leaves once RL has built its checkpointer (orbax made the
    folder) but committed no checkpoint: RL must start from the SFT params, not from
    the initial model."""
    workdir = tmp_path / "run"
    shutil.copytree(uninterrupted, workdir)
    for name in ("checkpoints", "hf", "metrics.jsonl", "final.json"):
        path = workdir / name
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    (workdir / "checkpoints").mkdir()
    runs.train(CONFIG, workdir)
    assert runs.differences(uninterrupted, workdir) == []


def test_a_run_killed_at_seeded_points_ends_as_the_uninterrupted_run(
        uninterrupted, tmp_path):
    # Two seeded kills here; the campaign at scale (12 kills over every stage) is
    # scripts/bench/reliability.py's `kills` suite.
    workdir = tmp_path / "run"
    counts = runs.kill_campaign(CONFIG, workdir, kills=2, seed=0)
    assert sum(v for k, v in counts.items() if k != "during a write") == 2, counts
    assert runs.differences(uninterrupted, workdir) == []
    # Every write a kill interrupted was redone; none left a temporary behind.
    assert runs.temporaries(workdir) == []


def test_a_resume_with_an_accepted_lr_change_differs_only_after_the_recorded_step(
        uninterrupted, tmp_path):
    """The workdir a kill leaves after RL step 1 was committed, rerun with another lr
    and an entropy bonus, accepted by name, and another eval cadence, safe without a
    flag: the changes are recorded at the step the run resumed from, config.json keeps
    the original, and the run equals the uninterrupted one up to that step and no
    further. (The entropy bonus makes the lr move the policy: the tiny agent's all-equal
    rewards give no policy gradient otherwise.)"""
    workdir = tmp_path / "run"
    shutil.copytree(uninterrupted, workdir)
    for name in ("checkpoints/2", "hf", "final.json"):
        path = workdir / name
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    stored = json.loads((uninterrupted / "config.json").read_text())
    lr, every = stored["optim"]["lr"], stored["eval"]["every"]
    out = runs.train(CONFIG, workdir, f"--config.optim.lr={lr * 4}",
                     "--config.algo.entropy_coef=0.01", f"--config.eval.every={every + 1}",
                     "--allow_config_change=optim.lr,algo.entropy_coef")
    assert (workdir / "config.json").read_text() == (uninterrupted / "config.json").read_text()
    assert sorted((r["stage"], r["step"], r["key"], r["old"], r["new"]) for r in
                  read_changes(str(workdir))) == [
        ("rl", 1, "algo.entropy_coef", stored["algo"]["entropy_coef"], 0.01),
        ("rl", 1, "eval.every", every, every + 1), ("rl", 1, "optim.lr", lr, lr * 4)]
    assert "config changed on resume after rl step 1:" in out
    want, got = (runs.comparable(read_metrics(run)) for run in (uninterrupted, workdir))
    assert [row["step"] for row in got] == [1, 2]
    assert got[0] == want[0]
    assert got[1].pop("config/changes") == 3  # the first row trained after the changes
    assert got[1]["update/rel_size"] != want[1]["update/rel_size"]
    assert "RL metrics" in runs.differences(uninterrupted, workdir)
