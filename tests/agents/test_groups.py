"""How one RL step's groups are drawn (agents/groups.py): dynamic sampling keeps groups whose rewards
differ, draws again for the rest, and fills up with set-aside groups when the rounds run
out; each round samples with its own seed. DAPO's overlong shaping counts the exact
sampled tokens."""
import pytest

from agentjax.agents.groups import GroupRules, Overlong, collect_groups, seed_index
from agentjax.core.trajectory import Trajectory, Turn


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


def _collect(sampler, step, *, dynamic_sampling, rounds=3):
    """One step's 3 groups of 2 through `collect_groups`, and the sampling of each draw
    (a pool that records the seed index of each draw)."""
    pool = _Pool()
    rules = GroupRules("exact_match", dynamic_sampling=dynamic_sampling,
                       max_resample_rounds=rounds)
    groups, info = collect_groups(pool, sampler, rules, lambda draw: seed_index(step, draw),
                                  prompts=3, group_size=2)
    return groups, info, pool.seeds


def test_dynamic_sampling_draws_until_every_group_varies():
    sampler = _Sampler(["same-0", "varied-0", "same-1", "varied-1", "same-2", "varied-2"])
    groups, info, seeds = _collect(sampler, 5, dynamic_sampling=True)
    assert [g[0].task_id for g in groups] == ["varied-0", "varied-1", "varied-2"]
    assert [t.group_id for g in groups for t in g] == [0, 0, 1, 1, 2, 2]
    assert info == {"rollout/rounds": 3, "rollout/kept_groups": 3}
    # A seed per draw (step * 100 + round).
    assert seeds == [500, 501, 502]


def test_set_aside_groups_fill_the_batch_when_the_rounds_run_out():
    groups, info, _ = _collect(_Sampler(["same-0", "varied-0", "same-1"]), 0,
                               dynamic_sampling=True, rounds=0)
    assert [g[0].task_id for g in groups] == ["varied-0", "same-0", "same-1"]
    assert info == {"rollout/rounds": 1, "rollout/kept_groups": 1}


def test_without_dynamic_sampling_every_group_is_kept():
    groups, info, _ = _collect(_Sampler(["same-0", "varied-0", "same-1"]), 0,
                               dynamic_sampling=False)
    assert [g[0].task_id for g in groups] == ["same-0", "varied-0", "same-1"]
    assert info == {"rollout/rounds": 1, "rollout/kept_groups": 3}


def test_overlong_shaping_counts_the_sampled_tokens_only():
    # max_len 8, buffer 2, factor 0.5: free up to 6 action tokens, then -(n - 6) / 2 * 0.5,
    # and -0.5 from 8 on. Prompt and observation tokens do not count.
    episodes = [Trajectory(prompt_ids=[1] * 9, final_reward=1.0, turns=[
        Turn([5] * (n - 2), [0.0] * (n - 2), "stop", observation_ids=[3] * 4),
        Turn([6, 7], [0.0, 0.0], "stop")]) for n in (6, 7, 8, 12)]
    Overlong(max_len=8, buffer=2, factor=0.5).apply(episodes)
    assert [t.metadata["reward_components"]["overlong"] for t in episodes] == pytest.approx(
        [0.0, -0.25, -0.5, -0.5])
    assert [t.final_reward for t in episodes] == pytest.approx([1.0, 0.75, 0.5, 0.5])
