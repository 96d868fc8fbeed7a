"""How one RL step's groups are drawn: dynamic sampling keeps groups whose rewards
differ, draws again for the rest, and fills up with set-aside groups when the rounds run
out; each round samples with its own seed. DAPO's overlong shaping counts the exact
sampled tokens."""
import types

import pytest

from agentjax.core.trajectory import Trajectory, Turn
from agentjax.config import presets
from agentjax.train.stages.rl import collect_groups, shape_overlong


class _Pool:
    """Episodes whose rewards are scripted per task: task "varied-*" gets 0, 1, ...,
    any other task the same reward for every member."""

    def __init__(self):
        self.seeds = []

    def collect_sync(self, tasks, group_size, *, sampling, first_group_id):
        self.seeds.append(sampling)
        return [[Trajectory(prompt_ids=[1], task_id=task,
                            final_reward=float(m) if task.startswith("varied") else 1.0)
                 for m in range(group_size)] for task in tasks]


class _Sampler:
    def __init__(self, tasks):
        self.tasks = list(tasks)

    def sample(self, count):
        drawn, self.tasks = self.tasks[:count], self.tasks[count:]
        return drawn

    def update(self, tasks, success):
        pass


def _trainer(dynamic_sampling, rounds=3):
    config = presets.search_config("dapo", "test")
    config.rollout.prompts_per_step, config.rollout.group_size = 3, 2
    config.algo.dynamic_sampling, config.algo.max_resample_rounds = dynamic_sampling, rounds
    config.algo.overlong_buffer = 0
    return types.SimpleNamespace(config=config, pool=_Pool(),
                                 suite=types.SimpleNamespace(success_key="exact_match"),
                                 sampling=lambda step, seed_index=None: (step, seed_index))


def test_dynamic_sampling_draws_until_every_group_varies():
    trainer = _trainer(dynamic_sampling=True)
    sampler = _Sampler(["same-0", "varied-0", "same-1", "varied-1", "same-2", "varied-2"])
    groups, info = collect_groups(trainer, sampler, step=5)
    assert [g[0].task_id for g in groups] == ["varied-0", "varied-1", "varied-2"]
    assert [t.group_id for g in groups for t in g] == [0, 0, 1, 1, 2, 2]
    assert info == {"rollout/rounds": 3, "rollout/kept_groups": 3}
    # The temperature of step 5, a seed per draw (step * 100 + round).
    assert trainer.pool.seeds == [(5, 500), (5, 501), (5, 502)]


def test_set_aside_groups_fill_the_batch_when_the_rounds_run_out():
    trainer = _trainer(dynamic_sampling=True, rounds=0)
    groups, info = collect_groups(trainer, _Sampler(["same-0", "varied-0", "same-1"]), 0)
    assert [g[0].task_id for g in groups] == ["varied-0", "same-0", "same-1"]
    assert info == {"rollout/rounds": 1, "rollout/kept_groups": 1}


def test_without_dynamic_sampling_every_group_is_kept():
    trainer = _trainer(dynamic_sampling=False)
    groups, info = collect_groups(trainer, _Sampler(["same-0", "varied-0", "same-1"]), 0)
    assert [g[0].task_id for g in groups] == ["same-0", "varied-0", "same-1"]
    assert info == {"rollout/rounds": 1, "rollout/kept_groups": 3}


def test_overlong_shaping_counts_the_sampled_tokens_only():
    # max_len 8, buffer 2, factor 0.5: free up to 6 action tokens, then -(n - 6) / 2 * 0.5,
    # and -0.5 from 8 on. Prompt and observation tokens do not count.
    algo = presets.search_config("dapo", "test").algo
    algo.overlong_max_len, algo.overlong_buffer, algo.overlong_factor = 8, 2, 0.5
    episodes = [Trajectory(prompt_ids=[1] * 9, final_reward=1.0, turns=[
        Turn([5] * (n - 2), [0.0] * (n - 2), "stop", observation_ids=[3] * 4),
        Turn([6, 7], [0.0, 0.0], "stop")]) for n in (6, 7, 8, 12)]
    shape_overlong(episodes, algo)
    assert [t.metadata["reward_components"]["overlong"] for t in episodes] == pytest.approx(
        [0.0, -0.25, -0.5, -0.5])
    assert [t.final_reward for t in episodes] == pytest.approx([1.0, 0.75, 0.5, 0.5])
