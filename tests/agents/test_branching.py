"""Branch rollouts replay a recorded episode's first turns token for token and sample on
from the branch turn; an env that answers the replayed actions differently gives an
episode that does not share the prefix, and shares_prefix says so."""
import asyncio
import itertools

from agentjax.core.task import Task
from agentjax.agents.branching import (
    ReplayEngine,
    branch_rollouts,
    prefix_length,
    shares_prefix,
)
from agentjax.engine.protocol import GenerateRequest, SamplingParams
from agentjax.agents.pool import RolloutPool
from tests.agents.fakes import ScriptedEngine, ToyEnv

SAMPLING = SamplingParams(max_new_tokens=32, seed=0)
TASKS = [Task("t0", "question 0"), Task("t1", "question 1")]


def _three_turns(tokenizer):
    """Searches twice, then answers; which query / answer alternates with the request
    index, so episodes sampled from the same context differ."""
    information = tokenizer.convert_tokens_to_ids("<information>")

    def script(context, index):
        searches = list(context).count(information)
        if searches < 2:
            return f"<search>query {searches} {index % 2}</search>"
        return "<answer>Paris</answer>" if index % 2 else "<answer>Rome</answer>"

    return script


def _reward(task, log):
    return float(log.final_answer == "Paris"), {}


def _pool(tokenizer, env_factory=ToyEnv):
    engine = ScriptedEngine(tokenizer, _three_turns(tokenizer))
    return RolloutPool(engine, env_factory, tokenizer, concurrency=8, reward_fn=_reward)


def test_branches_share_the_prefix_token_for_token_and_sample_from_the_branch_turn(
        tokenizer):
    with _pool(tokenizer) as pool:
        [base_group, other_group] = pool.collect_sync(TASKS, 1, sampling=SAMPLING)
        base, other = base_group[0], other_group[0]
        assert len(base.turns) == 3
        sampled_before = len(pool.engine.requests)
        [branches, others] = branch_rollouts(pool, [(base, 2), (other, 1)], 4,
                                             sampling=SAMPLING)
    assert len(branches) == 4 and len(others) == 4
    shared = prefix_length(base, 2)
    assert shared == len(base.prompt_ids) + sum(
        len(t.action_ids) + len(t.observation_ids) for t in base.turns[:2])
    for branch in branches:
        assert shares_prefix(branch, base, 2)
        assert branch.token_ids[:shared].tolist() == base.token_ids[:shared].tolist()
        # The replayed turns keep their recorded behavior log-probs.
        for was, now in zip(base.turns[:2], branch.turns[:2]):
            assert now.logprobs == was.logprobs and now.action_ids == was.action_ids
    for branch in others:
        assert shares_prefix(branch, other, 1)
    # The engine saw no replayed turn: branching at turn 2 samples one action (the
    # answer) per branch, at turn 1 two (a search, then the answer).
    assert len(pool.engine.requests) - sampled_before == 4 * 1 + 4 * 2
    answers = {b.turns[2].action_ids == base.turns[2].action_ids for b in branches}
    assert answers == {True, False}  # some branches answer otherwise than the base


def test_an_env_that_answers_differently_leaves_the_prefix(tokenizer):
    counter = itertools.count()

    def drifting_env():  # every new env prefixes its observations differently
        return ToyEnv(observation_prefix=f"v{next(counter)} ")

    with _pool(tokenizer, drifting_env) as pool:
        [[base]] = pool.collect_sync(TASKS[:1], 1, sampling=SAMPLING)
        [branches] = branch_rollouts(pool, [(base, 2)], 2, sampling=SAMPLING)
    for branch in branches:
        assert not shares_prefix(branch, base, 2)
        # The first action was replayed (its context is the prompt), the observation
        # after it differs, so everything after is sampled.
        assert branch.turns[0].action_ids == base.turns[0].action_ids
        assert branch.turns[0].observation_ids != base.turns[0].observation_ids


def test_a_prompt_replayed_with_other_actions_is_not_branched_twice(tokenizer):
    with _pool(tokenizer) as pool:
        [[first], [second]] = pool.collect_sync([TASKS[0], TASKS[0]], 1, sampling=SAMPLING)
        assert first.turns[0].action_ids != second.turns[0].action_ids
        groups = branch_rollouts(pool, [(first, 1), (second, 1)], 2, sampling=SAMPLING)
    assert groups[1] is None and len(groups[0]) == 2


async def _generate(engine, contexts):
    return await engine.generate([GenerateRequest(tuple(c), SAMPLING) for c in contexts])


def test_replay_engine_answers_recorded_contexts_and_forwards_the_rest(tokenizer):
    with _pool(tokenizer) as pool:
        [[base]] = pool.collect_sync(TASKS[:1], 1, sampling=SAMPLING)
    inner = ScriptedEngine(tokenizer, lambda context, index: "<answer>x</answer>")
    engine = ReplayEngine(inner)
    assert engine.add(base, 2)
    before_turn_1 = base.token_ids[:prefix_length(base, 1)].tolist()
    [[replayed], [sampled]] = asyncio.run(_generate(engine, [before_turn_1, [1, 2, 3]]))
    assert replayed.output_ids == base.turns[1].action_ids
    assert replayed.logprobs == base.turns[1].logprobs and replayed.meta["replayed"]
    assert sampled.output_ids == tokenizer.encode("<answer>x</answer>",
                                                  add_special_tokens=False)
    assert [list(r.input_ids) for r in inner.requests] == [[1, 2, 3]]
    # The branch turn itself is never replayed.
    before_turn_2 = base.token_ids[:prefix_length(base, 2)].tolist()
    asyncio.run(_generate(engine, [before_turn_2]))
    assert len(inner.requests) == 2
