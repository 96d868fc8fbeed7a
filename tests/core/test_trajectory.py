"""Trajectory masks and collation, checked against a token-by-token reference."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentjax.core.trajectory import Trajectory, Turn, bucket_length, collate

PAD = 0


def _example() -> Trajectory:
    # prompt 3 | turn 1: action 2, observation 3 | turn 2 (not trainable): action 1,
    # observation 2 | turn 3: action 2 (ends the episode).
    return Trajectory(
        prompt_ids=[1, 2, 3],
        turns=[
            Turn([10, 11], [-0.1, -0.2], "stop", [20, 21, 22], reward=0.5),
            Turn([12], [-0.3], "stop", [23, 24], trainable=False, reward=0.25),
            Turn([13, 14], [-0.4, -0.5], "stop"),
        ],
        final_reward=2.0, task_id="t", group_id=7)


def test_derived_arrays_are_exact():
    traj = _example()
    np.testing.assert_array_equal(
        traj.token_ids, [1, 2, 3, 10, 11, 20, 21, 22, 12, 23, 24, 13, 14])
    np.testing.assert_array_equal(
        traj.action_mask, [0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 1, 1])
    np.testing.assert_array_equal(
        traj.turn_ids, [0, 0, 0, 1, 1, 1, 1, 1, 2, 2, 2, 3, 3])
    np.testing.assert_allclose(
        traj.behavior_logp, [0, 0, 0, -.1, -.2, 0, 0, 0, 0, 0, 0, -.4, -.5], atol=1e-7)
    assert traj.num_tokens == 13 and traj.num_action_tokens == 4
    # Turn 2 is not trainable: its reward lands on turn 1's last action token.
    assert traj.reward_positions() == [(4, 0.5), (4, 0.25), (12, 2.0)]
    assert traj.total_reward == pytest.approx(2.75)


def test_from_text_trains_every_token_of_the_document(tokenizer):
    text = "Varo Kessin works for Lese Co."
    traj = Trajectory.from_text(tokenizer, text)
    ids = traj.token_ids
    assert ids[-1] == tokenizer.eos_token_id
    assert tokenizer.decode(ids[:-1]) == text
    np.testing.assert_array_equal(traj.action_mask, [0] + [1] * (len(ids) - 1))
    row = collate([traj], buckets=(64,), pad_id=0)
    assert row["action_mask"][0].sum() == len(ids) - 1  # every predicted token


def test_turn_rejects_misaligned_logprobs_and_bad_finish_reason_or_distribution():
    with pytest.raises(ValueError, match="logprobs has 1 entries but action_ids has 2"):
        Turn([1, 2], [0.0], "stop")
    with pytest.raises(ValueError, match="finish_reason"):
        Turn([1], [0.0], "eos")
    with pytest.raises(ValueError, match="logprob_distribution"):
        Turn([1], [0.0], "stop", logprob_distribution="processed")


def _reference_collate(trajs, length, pad_id):
    """Token-by-token float64 reference of `collate` for rows that fit or are cut."""
    rows = {}
    for key in ("inputs", "targets", "positions", "segment_ids", "turn_ids",
                "action_mask", "behavior_logp", "rewards"):
        rows[key] = np.zeros((len(trajs), length), np.float64)
    rows["inputs"][:] = pad_id
    rows["targets"][:] = pad_id
    for b, traj in enumerate(trajs):
        tokens = []  # (id, mask, logp, turn)
        tokens += [(t, 0, 0.0, 0) for t in traj.prompt_ids]
        reward_at = {}
        pending = 0.0
        last_action = None
        for k, turn in enumerate(traj.turns, start=1):
            for i, t in enumerate(turn.action_ids):
                tokens.append((t, int(turn.trainable),
                               turn.logprobs[i] if turn.trainable else 0.0, k))
                if turn.trainable:
                    last_action = len(tokens) - 1
            pending += turn.reward
            if last_action is not None:
                reward_at[last_action] = reward_at.get(last_action, 0.0) + pending
                pending = 0.0
            tokens += [(t, 0, 0.0, k) for t in turn.observation_ids]
        if last_action is not None:
            reward_at[last_action] = reward_at.get(last_action, 0.0) + traj.final_reward
        kept_last_action = None
        for pos in range(length):
            if pos + 1 >= len(tokens):
                break
            rows["inputs"][b, pos] = tokens[pos][0]
            nxt = tokens[pos + 1]
            rows["targets"][b, pos] = nxt[0]
            rows["positions"][b, pos] = pos
            rows["segment_ids"][b, pos] = 1
            rows["action_mask"][b, pos] = nxt[1]
            rows["behavior_logp"][b, pos] = nxt[2]
            rows["turn_ids"][b, pos] = nxt[3]
            rows["rewards"][b, pos] = reward_at.get(pos + 1, 0.0)
            if nxt[1]:
                kept_last_action = pos
        lost = sum(r for i, r in reward_at.items() if i - 1 >= length)
        if lost and kept_last_action is not None:
            rows["rewards"][b, kept_last_action] += lost
    return rows


def test_collate_matches_reference_and_picks_smallest_bucket():
    trajs = [_example(), Trajectory([5, 6], [Turn([7], [-1.0], "length")], final_reward=1.0,
                                    group_id=3)]
    batch = collate(trajs, buckets=(8, 16, 32), pad_id=PAD)
    assert batch["inputs"].shape == (2, 16)  # longest row needs 12 positions
    ref = _reference_collate(trajs, 16, PAD)
    for key, value in ref.items():
        np.testing.assert_allclose(batch[key], value, atol=1e-6, err_msg=key)
    # The shift: position 2 holds the last prompt token and predicts the first action.
    assert batch["inputs"][0, 2] == 3 and batch["targets"][0, 2] == 10
    assert batch["action_mask"][0, 2] == 1 and batch["behavior_logp"][0, 2] == pytest.approx(-.1)
    np.testing.assert_array_equal(batch["group_ids"], [7, 3])
    np.testing.assert_array_equal(batch["truncated"], [False, False])
    np.testing.assert_allclose(batch["seq_rewards"], [2.75, 1.0])
    np.testing.assert_allclose(batch["rewards"].sum(-1), batch["seq_rewards"])
    assert batch["inputs"].dtype == np.int32 and batch["action_mask"].dtype == np.float32


def test_collate_truncates_at_the_largest_bucket_without_losing_reward():
    traj = _example()  # 13 tokens: 12 positions
    batch = collate([traj], buckets=(4, 8), pad_id=PAD)
    assert batch["inputs"].shape == (1, 8) and batch["truncated"][0]
    np.testing.assert_array_equal(batch["inputs"][0], traj.token_ids[:8])
    np.testing.assert_array_equal(batch["targets"][0], traj.token_ids[1:9])
    np.testing.assert_array_equal(batch["action_mask"][0], traj.action_mask[1:9])
    np.testing.assert_array_equal(batch["segment_ids"][0], np.ones(8))
    # Turn 3 (and the final reward) were cut: all reward sits on the last kept action
    # token, position 3 (it predicts token 4, turn 1's last action token).
    np.testing.assert_allclose(batch["rewards"][0], [0, 0, 0, 2.75, 0, 0, 0, 0])
    assert batch["rewards"].sum() == pytest.approx(batch["seq_rewards"][0])


def test_collate_pads_batch_rows_and_rejects_bad_arguments():
    batch = collate([_example()], buckets=(16,), pad_id=PAD, batch_size=3)
    assert batch["inputs"].shape == (3, 16)
    np.testing.assert_array_equal(batch["group_ids"], [7, -1, -1])
    assert batch["segment_ids"][1:].sum() == 0 and batch["action_mask"][1:].sum() == 0
    with pytest.raises(ValueError, match="batch_size=1"):
        collate([_example(), _example()], buckets=(16,), pad_id=PAD, batch_size=1)
    with pytest.raises(ValueError, match="buckets"):
        collate([_example()], buckets=(), pad_id=PAD)
    # A failed episode with no tokens is an all-padding row, not an error.
    empty = collate([Trajectory([], metadata={"failed": True})], buckets=(4,), pad_id=PAD)
    assert empty["segment_ids"].sum() == 0


def test_bucket_length():
    assert bucket_length(5, (16, 4, 8)) == 8
    assert bucket_length(8, (16, 4, 8)) == 8
    assert bucket_length(40, (16, 4, 8)) == 16


_ids = st.lists(st.integers(1, 50), max_size=5)


@st.composite
def _trajectories(draw):
    turns = []
    for _ in range(draw(st.integers(0, 4))):
        action = draw(_ids)
        turns.append(Turn(
            action, [-float(i + 1) / 10 for i in range(len(action))], "stop", draw(_ids),
            trainable=draw(st.booleans()), reward=draw(st.sampled_from([0.0, 0.5, -1.0]))))
    return Trajectory(draw(st.lists(st.integers(1, 50), min_size=1, max_size=4)), turns,
                      final_reward=draw(st.sampled_from([0.0, 1.0])),
                      group_id=draw(st.integers(0, 3)))


@settings(max_examples=150, deadline=None)
@given(st.lists(_trajectories(), min_size=1, max_size=4), st.sampled_from([(4, 8), (32,)]))
def test_collate_property(trajs, buckets):
    batch = collate(trajs, buckets=buckets, pad_id=PAD)
    length = batch["inputs"].shape[1]
    ref = _reference_collate(trajs, length, PAD)
    for key, value in ref.items():
        np.testing.assert_allclose(batch[key], value, atol=1e-6, err_msg=key)
    for b, traj in enumerate(trajs):
        # Padding and non-action positions never carry a mask, log-prob or reward.
        off = batch["action_mask"][b] == 0
        assert not batch["behavior_logp"][b][off].any()
        assert not batch["rewards"][b][off].any()
        assert batch["truncated"][b] == (traj.num_tokens - 1 > length)
        if batch["action_mask"][b].any():
            assert batch["rewards"][b].sum() == pytest.approx(traj.total_reward, abs=1e-5)
