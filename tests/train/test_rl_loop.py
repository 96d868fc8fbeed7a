"""How one RL step's groups are drawn: dynamic sampling keeps groups whose rewards
differ, draws again for the rest, and fills up with set-aside groups when the rounds run
out; each round samples with its own seed."""
import types

from agentjax.rollout.trajectory import Trajectory
from agentjax.train import presets
from agentjax.train.rl_loop import collect_groups


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
                                 sampling=lambda step: step)


def test_dynamic_sampling_draws_until_every_group_varies():
    trainer = _trainer(dynamic_sampling=True)
    sampler = _Sampler(["same-0", "varied-0", "same-1", "varied-1", "same-2", "varied-2"])
    groups, info = collect_groups(trainer, sampler, step=5)
    assert [g[0].task_id for g in groups] == ["varied-0", "varied-1", "varied-2"]
    assert [t.group_id for g in groups for t in g] == [0, 0, 1, 1, 2, 2]
    assert info == {"rollout/rounds": 3, "rollout/kept_groups": 3}
    assert trainer.pool.seeds == [500, 501, 502]  # Trainer.sampling(step * 100 + round)


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
