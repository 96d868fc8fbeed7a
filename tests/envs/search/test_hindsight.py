import pytest

from agentjax.envs.search.hindsight import relabel
from agentjax.core.task import EpisodeLog, Task, TurnLog
from tests.envs.search.worlds import world


def _answered(task, answer):
    return EpisodeLog(task=task, turns=[TurnLog(f"<answer> {answer} </answer>", "answer")],
                      final_answer=answer, done=True, stop_reason="answer")


def test_relabels_every_strict_prefix_answer():
    w = world()
    task = next(t for t in w.train_tasks if t.metadata["hops"] == 4)
    chain = task.metadata["chain"]
    for k in (1, 2, 3):
        bridge = chain[k - 1]["object"]
        new = relabel(task, _answered(task, bridge), w)
        assert new.task_id == f"{task.task_id}/hindsight{k}"
        assert new.metadata["hops"] == k and new.metadata["chain"] == chain[:k]
        assert new.answers[0] == bridge
        assert new.question.endswith(f"of {chain[0]['subject']}?")
    # Aliases count as the same answer (companies and countries have them).
    entity = w.entity(chain[0]["object_id"])
    for alias in entity.aliases:
        assert relabel(task, _answered(task, alias), w).metadata["hops"] == 1


def test_nothing_to_relabel():
    w = world()
    task = next(t for t in w.train_tasks if t.metadata["hops"] == 3)
    assert relabel(task, _answered(task, task.answers[0]), w) is None      # already correct
    assert relabel(task, EpisodeLog(task=task), w) is None                 # never answered
    assert relabel(task, _answered(task, "Nobody Known"), w) is None       # not on the chain
    assert relabel(task, _answered(task, task.metadata["chain"][0]["subject"]), w) is None
    prefix = relabel(task, _answered(task, task.metadata["bridge_entities"][0]), w)
    assert relabel(task, _answered(task, task.metadata["bridge_entities"][0]), w,
                   exclude_questions={prefix.question}) is None           # a held-out question
    with pytest.raises(ValueError, match="chain"):
        relabel(Task("x", "q", ("a",)), _answered(task, "a"), w)
