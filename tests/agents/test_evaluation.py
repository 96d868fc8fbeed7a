import pytest

from agentjax.core.task import Task
from agentjax.core.trajectory import Trajectory
from agentjax.agents.evaluation import evaluate, group_of, solved, success_table
from agentjax.agents.pool import RolloutPool
from agentjax.engine.protocol import SamplingParams
from tests.agents.fakes import ScriptedEngine, ToyEnv


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


def test_a_tasks_greedy_and_sampled_episodes_run_together_with_their_own_seeds(tokenizer):
    """One group per task: its samples (members 0..k-1, the seeds a sampled pass alone
    gives) and its greedy episode start side by side, so an engine prefills the prompt
    they share once."""
    tasks = [Task(f"t{i}", f"question {i}") for i in range(6)]
    answer = "<answer>Paris</answer>"
    engine = ScriptedEngine(tokenizer, lambda context, index: answer)
    sampling = SamplingParams(max_new_tokens=16, temperature=1.0, seed=3)

    def reward(task, log):
        correct = float(log.final_answer == "Paris")
        return correct, {"exact_match": correct}

    with RolloutPool(engine, ToyEnv, tokenizer, concurrency=5, reward_fn=reward) as pool:
        metrics = evaluate(pool, tasks, success_key="exact_match", sampling=sampling,
                           samples=4)
        together = [(r.input_ids, r.sampling.temperature, r.sampling.seed)
                    for r in engine.requests]
        pool.collect_sync(tasks, 4, sampling=sampling, first_group_id=0)
        sampled_alone = {(r.input_ids, r.sampling.temperature, r.sampling.seed)
                         for r in engine.requests[len(together):]}
    assert metrics["eval/success_greedy"] == metrics["eval/success_sampled"] == 1.0
    assert metrics["eval/success_sampled/pass@4"] == 1.0
    assert {request for request in together if request[1] == 1.0} == sampled_alone
    greedy = [request for request in together if request[1] == 0.0]
    assert len(greedy) == len(tasks) and len(together) == 5 * len(tasks)
    # The first five requests are the first task's whole group, greedy included.
    assert len({ids for ids, _, _ in together[:5]}) == 1 and together[4] == greedy[0]
