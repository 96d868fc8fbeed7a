"""Hindsight groups: a group that solved nothing trains as a group for the shorter
question its episodes answered, with every token after the prompt exactly as sampled."""
import functools
import types

import numpy as np
import pytest

from agentjax.envs.search.hindsight import relabel
from agentjax.core.task import EpisodeLog, TurnLog
from agentjax.models.tokenizer import build_tokenizer, prompt_ids
from agentjax.rewards.composite import make_reward_fn
from agentjax.core.trajectory import Trajectory, Turn
from agentjax.config import presets
from agentjax.agents.evaluation import solved
from agentjax.agents.groups import collect_groups
from agentjax.agents.hindsight import hindsight_group
from agentjax.train.stages.rl import group_rules
from tests.envs.search.worlds import env, world

REWARD = make_reward_fn({"components": {"exact_match": 1.0}})
RELABEL = functools.partial(relabel, world=world())
TASK = next(t for t in world().train_tasks if t.metadata["hops"] == 3)
CHAIN = TASK.metadata["chain"]
FIRST, SECOND = CHAIN[0]["object"], CHAIN[1]["object"]  # the entities after 1 and 2 hops


def episode(answer: str, member: int, task=TASK) -> Trajectory:
    """A two-turn episode answering `answer`, as the pool returns it."""
    log = EpisodeLog(task=task, turns=[TurnLog("<search> x </search>", "search"),
                                       TurnLog(f"<answer> {answer} </answer>", "answer")],
                     final_answer=answer, done=True, stop_reason="answer")
    total, components = REWARD(task, log)
    turns = [Turn([10 + member, 11], [-0.5, -0.25], "stop", observation_ids=[20, 21, 22]),
             Turn([12, 13, 14], [-1.0, -0.125, -2.0], "stop", observation_ids=[2])]
    return Trajectory(prompt_ids=[1, 2, 3, 4, 5], turns=turns, final_reward=total,
                      task_id=task.task_id, task=task,
                      metadata={"env_log": log, "reward_components": components,
                                "failed": False})


def prompt_of(task):
    return [90, task.metadata["hops"]]


def relabeled(group, max_tokens=64):
    return hindsight_group(group, RELABEL, REWARD, prompt_of, success_key="exact_match",
                           max_tokens=max_tokens)


def test_a_group_that_solved_nothing_becomes_the_group_of_the_question_most_answered():
    group = [episode(FIRST, 0), episode("Nobody Known", 1), episode(SECOND, 2),
             episode(FIRST, 3)]
    new = relabeled(group)
    # Two episodes answered the one-hop prefix; rescored against it they succeed.
    assert [t.task_id for t in new] == [f"{TASK.task_id}/hindsight1"] * 4
    assert new[0].task.answers[0] == FIRST and new[0].task.metadata["hops"] == 1
    assert [t.final_reward for t in new] == [1.0, 0.0, 0.0, 1.0]
    assert [t.metadata["reward_components"]["exact_match"] for t in new] == [1, 0, 0, 1]
    for old, t in zip(group, new):
        assert t.prompt_ids == [90, 1]
        # After the prompt: the same ids, action mask, behavior log-probs and turns.
        for field in ("token_ids", "action_mask", "behavior_logp"):
            np.testing.assert_array_equal(getattr(t, field)[2:], getattr(old, field)[5:])
        assert t.turns == old.turns and t.num_action_tokens == 5
        assert t.metadata["hindsight"] == {"task_id": TASK.task_id, "final_reward": 0.0,
                                           "reward_components": {"exact_match": 0.0}}
        # Success counts the task the episode was sampled for.
        assert not solved(t, "exact_match")
        # The sampled group is left as it was.
        assert old.task_id == TASK.task_id and old.prompt_ids == [1, 2, 3, 4, 5]
        assert old.final_reward == 0.0 and "hindsight" not in old.metadata


@pytest.mark.parametrize("answers, change", [
    ((FIRST, TASK.answers[0]), None),             # one episode solved the task
    ((FIRST, "Nobody Known"), "failed"),          # an episode failed
    ((FIRST, FIRST), None),                       # relabeled rewards all equal
    (("Nobody Known", "Nobody Else"), None),      # no answer on the chain
])
def test_groups_that_stay_as_sampled(answers, change):
    group = [episode(a, m) for m, a in enumerate(answers)]
    if change == "failed":
        group[1].metadata["failed"] = True
    assert relabeled(group) is None


def test_a_relabeled_group_must_fit_the_context():
    group = [episode(FIRST, 0), episode("Nobody Known", 1)]
    # 2 prompt tokens, then 2 + 3 + 3 + 1 as sampled.
    assert relabeled(group, max_tokens=11) is not None
    assert relabeled(group, max_tokens=10) is None


class _Pool:
    def __init__(self, groups):
        self.groups = groups

    def collect_sync(self, tasks, group_size, *, sampling, first_group_id):
        return [self.groups.pop(0) for _ in tasks]


class _Sampler:
    def __init__(self, tasks):
        self.tasks, self.seen = list(tasks), []

    def sample(self, count):
        drawn, self.tasks = self.tasks[:count], self.tasks[count:]
        return drawn

    def update(self, tasks, success):
        self.seen.append(list(success))


def _rules(reward_fn=REWARD):
    """The group rules of a hindsight run of the test world (data.hindsight on), and
    what they logged."""
    config = presets.search_config("grpo", "test")
    config.data.hindsight = True
    texts = [TASK.question] + [t.question for t in world().train_tasks]
    suite = types.SimpleNamespace(success_key="exact_match", relabel=RELABEL,
                                  reward_fn=reward_fn, make_env=env)
    tokenizer = build_tokenizer(texts, vocab_size=400)
    logged = []
    return group_rules(config, suite, tokenizer, logged.append), tokenizer, logged


def test_collect_groups_relabels_after_the_curriculum_saw_the_sampled_success():
    solved_task = next(t for t in world().train_tasks if t.metadata["hops"] == 1)
    groups = [[episode(solved_task.answers[0], 0, solved_task), episode("x", 1, solved_task)],
              [episode(FIRST, 0), episode("Nobody Known", 1)]]
    rules, tokenizer, _ = _rules()
    sampler = _Sampler(["a", "b"])
    out, info = collect_groups(_Pool(groups), sampler, rules, lambda draw: None, prompts=2,
                               group_size=2)
    assert sampler.seen == [[0.5, 0.0]]
    assert info == {"rollout/rounds": 1, "rollout/kept_groups": 2,
                    "rollout/hindsight_groups": 1}
    assert [t.task_id for t in out[0]] == [solved_task.task_id] * 2  # solved: kept
    target = out[1][0].task
    assert [t.task_id for t in out[1]] == [f"{TASK.task_id}/hindsight1"] * 2
    assert [t.final_reward for t in out[1]] == [1.0, 0.0]
    # The prompt is the env's prompt for the relabeled question, rendered as the agent
    # loop renders it.
    assert out[1][0].prompt_ids == prompt_ids(tokenizer, env().reset(target))
    assert [t.group_id for g in out for t in g] == [0, 0, 1, 1]


def test_a_group_whose_rescoring_fails_is_kept_with_a_warning():
    def broken(task, log):
        raise RuntimeError("judge down")

    group = [episode(FIRST, 0), episode("Nobody Known", 1)]
    rules, _, logged = _rules(reward_fn=broken)
    out, count = rules.finish([group])
    assert out == [group] and count == 0
    [warning] = logged
    assert TASK.task_id in warning and "RuntimeError: judge down" in warning
