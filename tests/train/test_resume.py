"""Resume never loses work: a run SIGKILLed at seeded points, again and again, ends
exactly as the uninterrupted run — metrics of every stage, evaluations, exported
weights (scripts/bench/reliability.py runs the longer campaign of tests/train/runs.py)."""
import shutil

import pytest

from tests.train import runs

pytestmark = pytest.mark.slow  # several end-to-end runs

CONFIG = "grpo_search.py:test"


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """Every run of this module shares a compilation cache."""
    return runs.cached_env(tmp_path_factory.mktemp("xla"))


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, env):
    workdir = tmp_path_factory.mktemp("uninterrupted")
    runs.train(CONFIG, workdir, env=env)
    return workdir


def test_kill_after_the_rl_checkpoint_folder_exists_resumes_from_sft(
        uninterrupted, tmp_path, env):
    """The workdir a kill leaves once RL has built its checkpointer (orbax made the
    folder) but committed no checkpoint: RL must start from the SFT params, not from
    the initial model."""
    workdir = tmp_path / "run"
    shutil.copytree(uninterrupted, workdir)
    for name in ("checkpoints", "hf", "metrics.jsonl", "final.json"):
        path = workdir / name
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    (workdir / "checkpoints").mkdir()
    runs.train(CONFIG, workdir, env=env)
    assert runs.differences(uninterrupted, workdir) == []


def test_a_run_killed_at_seeded_points_ends_as_the_uninterrupted_run(
        uninterrupted, tmp_path, env):
    workdir = tmp_path / "run"
    counts = runs.kill_campaign(CONFIG, workdir, kills=4, seed=0, env=env)
    assert sum(v for k, v in counts.items() if k != "during a write") == 4, counts
    assert runs.differences(uninterrupted, workdir) == []
    # Every write a kill interrupted was redone; none left a temporary behind.
    assert runs.temporaries(workdir) == []
