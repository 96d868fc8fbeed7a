import pytest

from agentjax.core.task import Task
from agentjax.core.trajectory import Trajectory
from agentjax.agents.evaluation import group_of, solved, success_table


def _episode(success, failed=False):
    return Trajectory(prompt_ids=[1], metadata={
        "reward_components": {"exact_match": float(success)}, "failed": failed})


def test_success_table_by_task_group_with_hand_computed_values():
    tasks = [Task("a", "q", metadata={"hops": 1, "taught": True}),
             Task("b", "q", metadata={"hops": 1, "taught": False}),
             Task("c", "q", metadata={"hops": 2, "taught": False}),
             Task("d", "q", metadata={})]
    groups = [[_episode(1), _episode(1)], [_episode(1), _episode(0)],
              [_episode(0), _episode(0)], [_episode(1, failed=True), _episode(0)]]
    table = success_table(tasks, groups, "exact_match", "eval")
    # Per task: 1, 0.5, 0, 0 (a failed episode never solves its task).
    assert table == pytest.approx({
        "eval": 0.375, "eval/pass@2": 0.5,
        "eval/hops=1": 0.75, "eval/hops=2": 0.0,
        "eval/taught=yes": 1.0, "eval/taught=no": 0.25})
    assert not solved(groups[3][0], "exact_match")


def test_group_of_names_the_task_group_of_a_metric():
    assert group_of("eval/success_sampled/hops=2") == "hops=2"
    assert group_of("sft/success_greedy/taught=no") == "taught=no"
    assert group_of("eval/success_sampled/pass@4") is None
    assert group_of("eval/success_sampled") is None
