"""Asynchronous RL end to end (the tiny `test` variant, RL from the initial model): with
max_staleness=0 and interruption off it is the synchronous run, and a run SIGKILLed
while groups are in flight and queued resumes to train every task exactly as often as
an uninterrupted run (which tasks, and in which steps, depends on timing)."""
import collections

import pytest

from agentjax.train.metrics import read_metrics, read_step_log
from agentjax.agents.sources import GROUPS_LOG
from tests.train import runs
from tests.train.runs import RL_ONLY

pytestmark = pytest.mark.slow  # end-to-end runs

CONFIG = "grpo_search.py:test"
ASYNC = ("--config.rollout.mode=async",)
# Only the asynchronous run logs these (no key of the synchronous run is added).
ASYNC_KEYS = {"rollout/queue_groups", "rollout/dropped_groups", "rollout/staleness_mean",
              "rollout/staleness_max", "rollout/old_token_frac",
              "rollout/mixed_version_frac", "time/learner_idle_s", "time/engine_idle_s",
              "is_ratio_mean", "is_ratio_max", "is_weight_mean", "is_clipfrac"}


def test_staleness_zero_without_interruption_is_the_synchronous_run(finished_run, tmp_path):
    sync, _ = finished_run(CONFIG, *RL_ONLY)
    late = tmp_path / "async"
    runs.train(CONFIG, late, *RL_ONLY, *ASYNC, "--config.rollout.max_staleness=0",
               "--config.rollout.partial_rollouts=False")
    want, got = read_metrics(sync), read_metrics(late)
    assert [row["step"] for row in got] == [1, 2]
    for a, b in zip(want, got, strict=True):
        assert set(b) == set(a) | ASYNC_KEYS
        assert runs.comparable([{k: b[k] for k in a}]) == runs.comparable([a])
        assert b["rollout/staleness_max"] == b["rollout/dropped_groups"] == 0
        assert b["rollout/old_token_frac"] == b["rollout/mixed_version_frac"] == 0
        assert b["is_clipfrac"] == 0
    # Evaluations and exported weights too; the metrics differ only by the keys above.
    assert runs.differences(sync, late) == ["RL metrics"]
    assert read_step_log(str(sync / GROUPS_LOG)) == read_step_log(str(late / GROUPS_LOG))


def test_a_killed_async_run_trains_every_task_as_often_as_an_uninterrupted_one(tmp_path):
    overrides = (*RL_ONLY, *ASYNC, "--config.total_steps=4", "--config.eval.every=0",
                 "--config.rollout.max_staleness=6", "--config.rollout.partial_rollouts=True")
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    runs.train(CONFIG, whole, *overrides)
    outcome = runs.kill_once(CONFIG, killed, *overrides, mark="RL step 1 committed",
                             delay_s=0.3)
    assert outcome != "finished first"
    out = runs.train(CONFIG, killed, *overrides)
    assert "RL: resumed at step" in out

    def trained(workdir):
        rows = read_step_log(str(workdir / GROUPS_LOG))
        assert [row["step"] for row in rows] == [1, 2, 3, 4]
        assert not any(row["dropped"] for row in rows)
        return collections.Counter(task for row in rows for task in row["tasks"])

    assert trained(killed) == trained(whole)
    for workdir in (whole, killed):
        rows = read_metrics(workdir)
        assert [row["step"] for row in rows] == [1, 2, 3, 4]
        assert all(row["rollout/staleness_max"] <= 6 for row in rows)
