"""core.anchors: anchor ids of turns, by hand and against a reference that keys each turn
by the exact tuple of ids before it (no hashing)."""
import numpy as np
import pytest

from agentjax.core.anchors import anchor_ids
from agentjax.core.trajectory import Trajectory, Turn, collate

PAD = 0


def episode(prompt, turns, group):
    """turns: (action ids, observation ids) pairs."""
    return Trajectory(prompt_ids=list(prompt), group_id=group, turns=[
        Turn(list(a), [0.0] * len(a), "stop", list(o)) for a, o in turns])


# Group 0 shares the prompt; A and B take the same first action, C another; all three see
# observation [20] after it. D has the same prompt in another group.
A = episode([1, 2, 3], [([10, 11], [20]), ([12], [21]), ([13], [])], 0)
B = episode([1, 2, 3], [([10, 11], [20]), ([14], [21]), ([15], [])], 0)
C = episode([1, 2, 3], [([16], [20]), ([12], [22])], 0)
D = episode([1, 2, 3], [([10, 11], [20])], 1)


def per_turn(ids, batch, row):
    """{turn: its tokens' anchor id} of a row; asserts one id per turn."""
    out = {}
    for turn in np.unique(batch["turn_ids"][row]):
        on = batch["turn_ids"][row] == turn
        if not batch["segment_ids"][row][on].any():
            continue
        values = set(ids[row][on & (batch["segment_ids"][row] > 0)].tolist())
        assert len(values) == 1, (row, turn, values)
        out[int(turn)] = values.pop()
    return out


def test_hand_built_anchors():
    episodes = [A, B, C, D]
    batch = collate(episodes, buckets=(16,), pad_id=PAD, batch_size=5)
    context = anchor_ids(episodes, batch["targets"].shape)
    assert context.shape == (5, 16) and context.dtype == np.int32
    # Turn 1: the prompt, shared in group 0 (id 0), D's own in group 1. Turn 2: A and B
    # saw the same context, C not. Turn 3: A and B differ (actions 12 and 14).
    assert [per_turn(context, batch, r) for r in range(4)] == [
        {0: -1, 1: 0, 2: 1, 3: 2}, {0: -1, 1: 0, 2: 1, 3: 3}, {0: -1, 1: 0, 2: 4},
        {0: -1, 1: 5}]
    assert (context[4] == -1).all()  # padding row
    observation = anchor_ids(episodes, batch["targets"].shape, key="observation")
    # Turn 2 of A, B, C follows the same observation [20]; turn 3 of A and B [21].
    assert [per_turn(observation, batch, r) for r in range(4)] == [
        {0: -1, 1: 0, 2: 1, 3: 2}, {0: -1, 1: 0, 2: 1, 3: 2}, {0: -1, 1: 0, 2: 1},
        {0: -1, 1: 3}]


def reference_anchor_ids(episodes, shape):
    """Each turn keyed by (group, the tuple of every id before its action), numbered in
    the order met; tokens aligned as collate aligns them (position t = token t + 1)."""
    out = np.full(shape, -1, np.int32)
    dense = {}
    for row, traj in enumerate(episodes):
        ids, turns = traj.token_ids, traj.turn_ids
        kept = turns[1:shape[1] + 1]
        for t, turn in enumerate(kept):
            if turn == 0:
                continue
            start = int(np.flatnonzero(turns == turn)[0])
            out[row, t] = dense.setdefault((traj.group_id, tuple(ids[:start].tolist())),
                                           len(dense))
    return out


def test_context_anchors_match_the_exact_id_tuples_on_random_episodes():
    """Tiny vocabularies make many shared contexts; rows cut by the bucket lose their
    later turns, which get no id (ids stay dense: at most one per turn in the batch)."""
    rng = np.random.default_rng(0)
    episodes = []
    for i in range(12):
        turns = [([int(rng.integers(5, 7))] * int(rng.integers(1, 3)),
                  [int(rng.integers(8, 10))] * int(rng.integers(0, 2)))
                 for _ in range(int(rng.integers(1, 5)))]
        episodes.append(episode([1, 2], turns, i // 4))
    batch = collate(episodes, buckets=(8,), pad_id=PAD, batch_size=13)
    assert batch["truncated"].any()
    got = anchor_ids(episodes, batch["targets"].shape)
    np.testing.assert_array_equal(got, reference_anchor_ids(episodes, got.shape))
    assert set(np.unique(got[got >= 0])) == set(range(got.max() + 1))
    shared = np.unique(got[got >= 0], return_counts=True)[1]
    assert (shared > 1).any()


def test_bad_input_is_an_error():
    with pytest.raises(ValueError, match="anchor key"):
        anchor_ids([A], (1, 8), key="state")
    with pytest.raises(ValueError, match="2 trajectories for 1 rows"):
        anchor_ids([A, B], (1, 8))
