"""RFT sets and DPO pairs from rollouts: filtering by reward, deduplication, broken
episodes left out, and turn-level pairs (from a fake pool) that share their prefix
token for token and diverge at the branch turn."""
import collections
import threading

import numpy as np
import pytest

from agentjax.data.offline_jsonl import read_pairs, write_pairs
from agentjax.core.task import Task
from agentjax.models.tokenizer import build_tokenizer
from agentjax.engine.protocol import SamplingParams
from agentjax.agents.pool import RolloutPool
from agentjax.core.trajectory import Trajectory, Turn
from agentjax.train.stages.offline_data import (
    branch_bases,
    collection_info,
    preference_pairs,
    rft_set,
    trajectory_pairs,
)
from tests.agents.fakes import CORPUS, ScriptedEngine, ToyEnv


def _episode(action, reward, *, failed=False, turns=1, task_id="t0"):
    return Trajectory(prompt_ids=[1, 2],
                      turns=[Turn([action + i], [0.0], "stop", [9]) for i in range(turns)],
                      final_reward=reward, task_id=task_id, metadata={"failed": failed})


def test_rft_keeps_successful_episodes_once_and_never_broken_ones():
    first = _episode(3, 1.0)
    groups = [[first, _episode(4, 0.5), _episode(3, 1.0), _episode(5, 1.0, failed=True)],
              [_episode(6, 2.0, task_id="t1")]]
    seen = set()
    assert rft_set(groups, min_reward=1.0, seen=seen) == [first, groups[1][0]]
    # A later round keeps only what is new.
    again = [[_episode(3, 1.0), _episode(7, 1.0)]]
    assert [t.turns[0].action_ids for t in rft_set(again, min_reward=1.0, seen=seen)] == [[7]]
    assert rft_set(groups, min_reward=0.5) == [first, groups[0][1], groups[1][0]]


def test_trajectory_pairs_match_successes_with_failures_of_the_same_task():
    wins = [_episode(3, 1.0), _episode(4, 1.0)]
    losses = [_episode(5, 0.0), _episode(6, 0.0)]
    groups = [wins + losses + [_episode(7, 0.0, failed=True)],
              [_episode(8, 1.0, task_id="t1"), _episode(8, 1.0, task_id="t1")]]
    pairs = trajectory_pairs(groups, min_reward=1.0, per_task=3,
                             rng=np.random.default_rng(0))
    assert len(pairs) == 3  # 2 x 2 candidates, 3 wanted; the all-success task gives none
    assert len({(id(p.chosen), id(p.rejected)) for p in pairs}) == 3
    for pair in pairs:
        assert pair.chosen in wins and pair.rejected in losses
        assert (pair.level, pair.task_id, pair.shared_tokens) == ("trajectory", "t0", 0)
    everything = trajectory_pairs(groups, min_reward=1.0, per_task=10,
                                  rng=np.random.default_rng(0))
    assert len(everything) == 4


def test_branch_bases_pick_a_multi_turn_episode_and_a_turn_after_the_first():
    groups = [[_episode(3, 0.0), _episode(4, 0.0, turns=3),
               _episode(5, 0.0, turns=2, failed=True)],
              [_episode(6, 0.0)]]
    for seed in range(5):
        [(base, turn)] = branch_bases(groups, np.random.default_rng(seed))
        assert base is groups[0][1] and turn in (1, 2)


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer(CORPUS * 4, vocab_size=384)


def _policy(tokenizer):
    """Searches, then answers Paris or Rome by how many earlier requests had the same
    context: every group holds two successes and two failures, and branches answer both
    ways, whatever order the pool's concurrent episodes reach the engine in."""
    information = tokenizer.convert_tokens_to_ids("<information>")
    seen = collections.Counter()
    lock = threading.Lock()

    def script(context, index):
        if information not in context:
            return "<search>capital of France</search>"
        with lock:
            earlier = seen[tuple(context)]
            seen[tuple(context)] += 1
        return "<answer>Paris</answer>" if earlier % 2 else "<answer>Rome</answer>"

    return script


def test_pairs_from_a_pool_and_turn_pairs_that_share_the_prefix(tokenizer, tmp_path):
    def reward(task, log):
        return float(log.final_answer == "Paris"), {}

    tasks = [Task(f"t{i}", f"question {i}") for i in range(3)]
    sampling = SamplingParams(max_new_tokens=32, seed=0)
    with RolloutPool(ScriptedEngine(tokenizer, _policy(tokenizer)), ToyEnv, tokenizer,
                     concurrency=8, reward_fn=reward) as pool:
        groups = pool.collect_sync(tasks, 4, sampling=sampling, first_group_id=0)
        pairs, info = preference_pairs(pool, groups, levels=("trajectory", "turn"),
                                       branches=4, branch_sampling=sampling,
                                       min_reward=1.0, per_task=2, seed=0)
    assert collection_info(groups, 1.0) == {"data/episodes": 12, "data/successful": 0.5,
                                            "data/broken": 0.0}
    # Every task's successes are one token sequence, and so are its failures: one
    # distinct pair per task and level.
    assert info == {"data/trajectory_pairs": 3, "data/turn_pairs": 3,
                    "data/branch_episodes": 12, "data/branches_off_prefix": 0}
    turn_level = [p for p in pairs if p.level == "turn"]
    for pair in turn_level:
        chosen, rejected, shared = pair.chosen, pair.rejected, pair.shared_tokens
        assert chosen.total_reward == 1.0 and rejected.total_reward == 0.0
        # Token for token the same before the branch turn (turn 1, the answer) ...
        assert shared == len(chosen.prompt_ids) + len(chosen.turns[0].action_ids) + len(
            chosen.turns[0].observation_ids)
        assert chosen.token_ids[:shared].tolist() == rejected.token_ids[:shared].tolist()
        # ... and different from there: the answers differ, and only they are trained.
        assert chosen.turns[1].action_ids != rejected.turns[1].action_ids
        for side in (chosen, rejected):
            mask = side.action_mask
            assert not mask[:shared].any() and mask[shared:shared + 1].all()
    # The JSONL round trip keeps the pairs (the reader checks the shared prefix).
    path = str(tmp_path / "pairs.jsonl")
    write_pairs(path, pairs, tokenizer)
    back = read_pairs(path, vocab_size=len(tokenizer))
    for was, now in zip(pairs, back, strict=True):
        assert now.shared_tokens == was.shared_tokens and now.level == was.level
        for side in ("chosen", "rejected"):
            assert getattr(now, side).token_ids.tolist() == getattr(
                was, side).token_ids.tolist()
            assert getattr(now, side).action_mask.tolist() == getattr(
                was, side).action_mask.tolist()
