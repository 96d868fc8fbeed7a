"""RFT sets and preference pairs as JSONL: what is written reads back as the same ids and
masks, and every kind of invalid row stops reading naming its line."""
import json

import pytest

from agentjax.data.offline_jsonl import (
    OfflineDataError,
    PreferencePair,
    read_episodes,
    read_pairs,
    trajectory_from_tokens,
    write_episodes,
    write_pairs,
)
from agentjax.core.trajectory import Trajectory, Turn


class DigitTokenizer:
    """Decodes ids as their digits: enough for the `text` field."""

    def decode(self, ids, skip_special_tokens=False):
        return " ".join(map(str, ids))


def _episode(actions, observations, *, prompt=(1, 2), trainable=None, reward=0.0,
             task_id="t0"):
    trainable = trainable or [True] * len(actions)
    turns = [Turn(list(a), [-0.5] * len(a), "stop", list(o), trainable=t, reward=0.25)
             for a, o, t in zip(actions, observations, trainable)]
    return Trajectory(prompt_ids=list(prompt), turns=turns, final_reward=reward,
                      task_id=task_id)


def test_ids_and_mask_split_into_prompt_actions_and_observations():
    traj = trajectory_from_tokens([5, 6, 7, 8, 9, 10], [0, 0, 1, 1, 0, 1], task_id="q",
                                  reward=0.5)
    assert traj.prompt_ids == [5, 6]
    assert [(t.action_ids, t.observation_ids) for t in traj.turns] == [([7, 8], [9]),
                                                                        ([10], [])]
    assert traj.task_id == "q" and traj.final_reward == 0.5
    assert traj.token_ids.tolist() == [5, 6, 7, 8, 9, 10]
    assert traj.action_mask.tolist() == [0, 0, 1, 1, 0, 1]


def test_episodes_round_trip_with_their_ids_masks_and_total_reward(tmp_path):
    # The second turn is not trained: its tokens read back as part of an observation.
    episodes = [_episode([[3, 4], [5], [6, 7]], [[8], [9, 10], []],
                         trainable=[True, False, True], reward=1.0),
                _episode([[11]], [[2]], task_id="t1")]
    path = str(tmp_path / "rft.jsonl")
    write_episodes(path, episodes, DigitTokenizer())
    back = read_episodes(path, vocab_size=12, max_tokens=12)
    for was, now in zip(episodes, back, strict=True):
        assert now.token_ids.tolist() == was.token_ids.tolist()
        assert now.action_mask.tolist() == was.action_mask.tolist()
        assert now.total_reward == was.total_reward and now.task_id == was.task_id
    # reward = final 1.0 + three turns' 0.25
    first = json.loads(open(path).readline())
    assert first["reward"] == 1.75 and first["text"] == "1 2 3 4 8 5 9 10 6 7"


def test_pairs_round_trip(tmp_path):
    chosen = _episode([[3], [4, 5]], [[6], []], trainable=[False, True], reward=1.0)
    rejected = _episode([[3], [7]], [[6], []], trainable=[False, True])
    path = str(tmp_path / "pairs.jsonl")
    write_pairs(path, [PreferencePair(chosen, rejected, task_id="t0", level="turn",
                                      shared_tokens=4)], DigitTokenizer())
    [pair] = read_pairs(path)
    assert (pair.task_id, pair.level, pair.shared_tokens) == ("t0", "turn", 4)
    assert pair.chosen.token_ids.tolist() == [1, 2, 3, 6, 4, 5]
    assert pair.chosen.action_mask.tolist() == [0, 0, 0, 0, 1, 1]
    assert pair.rejected.token_ids.tolist() == [1, 2, 3, 6, 7]
    assert pair.chosen.total_reward == 1.0 + 0.5 and pair.rejected.total_reward == 0.5


GOOD = {"token_ids": [1, 2, 3], "action_mask": [0, 1, 1]}
OTHER = {"token_ids": [1, 2, 4], "action_mask": [0, 1, 1]}


@pytest.mark.parametrize("line,problem", [
    ("{not json", "not JSON"),
    ("[1, 2]", "must be a JSON object"),
    (json.dumps({**GOOD, "mask": [0, 1, 1]}), "unknown keys ['mask']"),
    (json.dumps({"action_mask": [0, 1]}), "lacks ['token_ids']"),
    (json.dumps({**GOOD, "token_ids": [1]}), "at least 2 token ids"),
    (json.dumps({**GOOD, "token_ids": [1, -2, 3]}), "ints >= 0"),
    (json.dumps({**GOOD, "token_ids": [1, 2, 99]}), "id 99, outside the vocabulary of 50"),
    (json.dumps({"token_ids": list(range(9)), "action_mask": [0] + [1] * 8}),
     "9 tokens, more than rollout.max_tokens=8"),
    (json.dumps({**GOOD, "action_mask": [0, 1]}), "a list of 3 zeros and ones"),
    (json.dumps({**GOOD, "action_mask": [0, 2, 1]}), "a list of 3 zeros and ones"),
    (json.dumps({**GOOD, "action_mask": [1, 1, 1]}), "action_mask[0] is 1"),
    (json.dumps({**GOOD, "action_mask": [0, 0, 0]}), "no 1: nothing to train on"),
    ('{"token_ids": [1, 2, 3], "action_mask": [0, 1, 1], "reward": NaN}',
     "reward must be a finite number"),
    (json.dumps({**GOOD, "task_id": 3}), "task_id must be a string"),
])
def test_an_invalid_episode_row_is_an_error_naming_its_line(tmp_path, line, problem):
    path = tmp_path / "rft.jsonl"
    path.write_text(json.dumps(GOOD) + "\n\n" + line + "\n")
    with pytest.raises(OfflineDataError) as info:
        read_episodes(str(path), vocab_size=50, max_tokens=8)
    assert str(info.value).startswith(f"{path}: line 3: ")
    assert problem in str(info.value)


@pytest.mark.parametrize("row,problem", [
    ({"chosen": GOOD}, "lacks ['rejected']"),
    ({"chosen": GOOD, "rejected": {**OTHER, "action_mask": [0, 0, 0]}},
     "rejected.action_mask has no 1"),
    ({"chosen": GOOD, "rejected": GOOD}, "the same episode: no preference"),
    ({"chosen": GOOD, "rejected": OTHER, "level": "step"}, "level must be one of"),
    ({"chosen": GOOD, "rejected": OTHER, "shared_tokens": 3}, "shared_tokens must be"),
    ({"chosen": GOOD, "rejected": OTHER, "shared_tokens": True}, "shared_tokens must be"),
    ({"chosen": {"token_ids": [1, 5, 3], "action_mask": [0, 1, 1]}, "rejected": OTHER,
      "shared_tokens": 2}, "shared_tokens is 2 but the sides differ at token 1"),
])
def test_an_invalid_pair_row_is_an_error_naming_its_line(tmp_path, row, problem):
    path = tmp_path / "pairs.jsonl"
    path.write_text(json.dumps({"chosen": GOOD, "rejected": OTHER}) + "\n"
                    + json.dumps(row) + "\n")
    with pytest.raises(OfflineDataError) as info:
        read_pairs(str(path))
    assert str(info.value).startswith(f"{path}: line 2: ")
    assert problem in str(info.value)


def test_an_empty_file_is_an_error(tmp_path):
    path = tmp_path / "pairs.jsonl"
    path.write_text("\n")
    with pytest.raises(OfflineDataError, match="no rows"):
        read_pairs(str(path))
