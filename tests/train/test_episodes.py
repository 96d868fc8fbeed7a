"""Sampled episodes and first-seen errors written for the user; failure checks."""
import json

import pytest

from agentjax.models.tokenizer import build_tokenizer
from agentjax.core.trajectory import Trajectory, Turn
from agentjax.train.episodes import (EpisodeRecorder, EpisodesFailed, check_failures,
                                     error_key, render_episode)


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer(["who founded the company? search the answer"] * 4, vocab_size=300)


def _episode(tokenizer, group_id, error=None):
    ids = tokenizer.encode("who founded", add_special_tokens=False)
    traj = Trajectory(prompt_ids=ids, turns=[
        Turn(ids, [0.0] * len(ids), "stop", observation_ids=ids),
        Turn(ids, [0.0] * len(ids), "stop", trainable=False)],
        final_reward=0.5, task_id=f"t{group_id}", group_id=group_id,
        metadata={"stop_reason": "answer", "reward_components": {"exact_match": 0.5}})
    if error:
        traj.metadata.update(failed=True, error=error, stop_reason="env_error")
    return traj


def test_error_key_merges_messages_that_differ_in_ids_and_values():
    assert error_key("KeyError: 'person_17' at 0x7f3a") == error_key("KeyError: 'city_3' at 0x1")
    assert error_key("TimeoutError: 10 s") != error_key("ValueError: 10 s")


def test_render_shows_every_segment_with_its_mask(tokenizer):
    text = render_episode(_episode(tokenizer, 0, error="ValueError: bad"), tokenizer)
    assert "FAILED: ValueError: bad" in text and "exact_match 0.500" in text
    assert text.count("#### action") == 2 and "not trained" in text
    assert "#### observation 1" in text and "#### observation 2" not in text


def test_recorder_saves_each_distinct_error_once_and_samples_per_step(tmp_path, tokenizer):
    recorder = EpisodeRecorder(str(tmp_path), tokenizer, samples=2)
    step_one = [_episode(tokenizer, g, error=f"KeyError: 'task_{g}'") for g in range(3)]
    assert recorder.record(1, "rl", step_one) == ["KeyError: 'task_0'"]
    step_two = [_episode(tokenizer, 0, error="KeyError: 'task_9'"),
                _episode(tokenizer, 1, error="TimeoutError: retrieval")]
    assert recorder.record(2, "rl", step_two) == ["TimeoutError: retrieval"]
    errors = [json.loads(line) for line in (tmp_path / "errors.jsonl").read_text().splitlines()]
    assert [e["step"] for e in errors] == [1, 2] and "#### prompt" in errors[0]["episode"]
    assert sorted(p.name for p in (tmp_path / "samples").iterdir()) == [
        "rl_000001.md", "rl_000002.md"]
    assert (tmp_path / "samples" / "rl_000001.md").read_text().count("## episode of") == 2
    # A resumed run (a new recorder on the same folder) reports only new errors.
    assert EpisodeRecorder(str(tmp_path), tokenizer, samples=0).record(
        3, "rl", step_one) == []


def test_check_failures_raises_only_when_all_failed_and_fatal(tokenizer):
    failed = [_episode(tokenizer, g, error="KeyError: 'x'") for g in range(4)]
    with pytest.raises(EpisodesFailed, match="all 4 episodes failed.*4 x KeyError"):
        check_failures(failed, where="RL step 1", fatal=True)
    assert "4 of 4 episodes failed" in check_failures(failed, where="RL step 7", fatal=False)
    mixed = failed[:1] + [_episode(tokenizer, g) for g in range(9)]
    assert check_failures(mixed, where="s", fatal=True) is None  # 10% is not > 10%
    assert "2 of 10" in check_failures(failed[:2] + mixed[2:], where="s", fatal=True)


def test_the_trackers_get_each_training_steps_samples_and_every_error(tmp_path, tokenizer):
    """Samples of a training step as a table (segments with their masks), none of an
    evaluation (step 0); the error table with every row so far, the earlier run's too."""
    from agentjax.train.episodes import SAMPLE_COLUMNS
    from agentjax.train.tracking import Tracking
    from tests.train.tracker_files import FakeTracker

    fake = FakeTracker()
    recorder = EpisodeRecorder(str(tmp_path), tokenizer, samples=1,
                               tracking=Tracking({"fake": fake}, workdir=str(tmp_path)))
    recorder.record(1, "rl", [_episode(tokenizer, 0)])
    recorder.record(0, "eval", [_episode(tokenizer, 1, error="KeyError: 'x'")])
    recorder.tracking.close()
    tables = [c for c in fake.calls if c[0] == "table"]
    assert [(key, step, len(rows)) for _, key, step, rows in tables] == [
        ("rl/samples", 1, 1), ("errors", None, 1)]
    row = dict(zip(SAMPLE_COLUMNS, tables[0][3][0]))
    assert row["reward"] == 0.5 and json.loads(row["reward_components"]) == {"exact_match": 0.5}
    ids = len(tokenizer.encode("who founded", add_special_tokens=False))
    assert row["trained_tokens"] == ids and row["masked_tokens"] == 3 * ids  # prompt, obs, action 2
    assert [(s["kind"], s["turn"], s["trained"]) for s in json.loads(row["segments"])] == [
        ("prompt", 0, False), ("action", 1, True), ("observation", 1, False),
        ("action", 2, False)]
    assert row["text"] == render_episode(_episode(tokenizer, 0), tokenizer)
    assert tables[1][3][0][:4] == [error_key("KeyError: 'x'"), "KeyError: 'x'", "eval", 0]
    # A rerun passes the earlier rows again (taken: skipped), then all of them with a new one.
    again = FakeTracker()
    recorder = EpisodeRecorder(str(tmp_path), tokenizer, samples=0,
                               tracking=Tracking({"fake": again}, workdir=str(tmp_path)))
    recorder.record(2, "rl", [_episode(tokenizer, 0, error="TimeoutError: retrieval")])
    recorder.tracking.close()
    assert [len(c[3]) for c in again.calls if c[0] == "table"] == [2]
