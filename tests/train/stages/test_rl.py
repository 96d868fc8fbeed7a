"""The RL stage on its own, over the tiny model and a seeded scripted engine: a run
whose engines go down at step 3 checkpoints after two steps, and a fresh stage
resumed from that checkpoint continues at step 3 with the sampler state, sampling
seeds, weight versions and metrics of the uninterrupted run."""
import jax
import ml_collections
import numpy as np
import pytest
from flax import nnx

from agentjax.agents.loop import EpisodeLimits
from agentjax.agents.pool import RolloutPool
from agentjax.config import presets
from agentjax.core import parallel
from agentjax.core.task import Task
from agentjax.engine.protocol import Completion, EnginesUnavailable
from agentjax.envs.registry import TaskSuite
from agentjax.train.episodes import EpisodeRecorder
from agentjax.train.fit import fit
from agentjax.train.metrics import read_metrics, read_step_log
from agentjax.train.policy import Policy
from agentjax.train.rollouts import Rollouts
from agentjax.train.runtime import Runtime
from agentjax.train.stages.rl import RLStage, build_rl_update
from agentjax.agents.sources import GROUPS_LOG
from tests.agents.fakes import ToyEnv
from tests.train.runs import comparable

TASKS = [Task(f"t{i}", f"Which city is the capital of France? ({i})", answers=("Paris",))
         for i in range(8)]


def _reward(task, log):
    correct = float(log.final_answer in task.answers)
    return correct, {"exact_match": correct}


class _SeededEngine:
    """Answers from each request's sampling seed (so a resumed run's episodes are the
    uninterrupted run's exactly when its seeds are); records the seeds and the weight
    versions it was given; unavailable from weight version `down_at` on."""

    def __init__(self, tokenizer, down_at=None):
        self.tokenizer, self.down_at = tokenizer, down_at
        self.version, self.versions, self.seeds = None, [], []

    async def generate(self, requests):
        if self.down_at is not None and self.version >= self.down_at:
            raise EnginesUnavailable("the test's engines went down")
        out = []
        for request in requests:
            seed = request.sampling.seed
            self.seeds.append(seed)
            answer = "Paris" if seed % 3 else "Rome"
            ids = self.tokenizer.encode(f"<answer>{answer}</answer>", add_special_tokens=False)
            logprobs = [-0.1 - 0.01 * ((seed + k) % 7) for k in range(len(ids))]
            out.append([Completion(ids, logprobs, "stop", None,
                                   {"weight_version": self.version})])
        return out

    def update_weights(self, weights, *, version=None):
        self.version = version
        self.versions.append(version)

    def health(self):
        return True

    def end_session(self, session_id):
        pass


def _config() -> ml_collections.ConfigDict:
    config = presets.search_config("grpo", "test")
    config.total_steps = 4
    config.rollout.prompts_per_step, config.rollout.group_size = 2, 2
    config.rollout.max_tokens, config.rollout.max_new_tokens = 96, 16
    config.env.max_turns = 2
    config.eval.every = 0  # at the last step only
    config.checkpoint.every, config.checkpoint.async_save = 2, False
    config.log.every = 1
    return config


def _run(folder, tiny_model, tokenizer, *, down_at=None):
    """Runs the RL stage in `folder` (resuming from its checkpoint); returns the stage
    and its engine."""
    config = _config()
    graphdef, params = nnx.split(tiny_model)
    runtime = Runtime(workdir=str(folder), mesh=parallel.make_mesh(
        {"data": 1}, devices=jax.devices()[:1]), rules=parallel.resolve_rules(),
        is_main=True, checkpoint=config.checkpoint, progress=False)
    policy = Policy(graphdef, params, tiny_model.config, tokenizer, path="")
    suite = TaskSuite(train_tasks=TASKS, test_tasks=TASKS[:4], make_env=ToyEnv,
                      reward_fn=_reward, success_key="exact_match", observation_role=None,
                      demonstrations=[], texts=[], baselines={})
    engine = _SeededEngine(tokenizer, down_at)
    pool = RolloutPool(engine, suite.make_env, tokenizer,
                       limits=EpisodeLimits(max_turns=config.env.max_turns,
                                            max_context_tokens=config.rollout.max_tokens),
                       concurrency=8, reward_fn=suite.reward_fn)
    rollouts = Rollouts(config, suite=suite, engine=engine, close_engine=lambda: None,
                        pool=pool, recorder=EpisodeRecorder(str(folder), tokenizer, samples=0),
                        log=print)
    state, update, prepare = build_rl_update(config, runtime, graphdef, params)
    stage = _Probe(config, runtime, policy, rollouts, update=update, prepare=prepare)
    try:
        fit(runtime, stage, state, checkpoint_every=config.checkpoint.every)
    finally:
        rollouts.close()
    return stage, engine


class _Probe(RLStage):
    """The RL stage, keeping what it resumed from and its sampler's state after each
    step's draw."""

    def resume(self, state, host):
        super().resume(state, host)
        self.resumed = (self.start, self.sampler.state_dict())
        self.after_draws = {}

    def draw(self, state, step):
        data = super().draw(state, step)
        self.after_draws[step + 1] = self.sampler.state_dict()
        return data


def test_a_resumed_rl_stage_continues_the_uninterrupted_run(tmp_path, tiny_model, tokenizer):
    whole, whole_engine = _run(tmp_path / "whole", tiny_model, tokenizer)
    assert whole.resumed[0] == 0
    # Weight version v samples step v; the evaluation after step 4 sends version 5.
    assert whole_engine.versions == [1, 2, 3, 4, 5]

    folder = tmp_path / "resumed"
    with pytest.raises(EnginesUnavailable):
        _run(folder, tiny_model, tokenizer, down_at=3)  # down at step 3's rollout
    resumed, engine = _run(folder, tiny_model, tokenizer)
    start, sampler_state = resumed.resumed
    assert start == 2 and sampler_state == whole.after_draws[2]
    assert resumed.after_draws == {3: whole.after_draws[3], 4: whole.after_draws[4]}
    assert engine.versions == [3, 4, 5]  # the restored weights first, as version 3
    # The episodes of steps 3 and 4 (and the evaluation's) with the same seeds: the
    # first two steps asked for 2 x 2 x 2 one-turn episodes.
    assert sorted(engine.seeds) == sorted(whole_engine.seeds[8:])
    rows = read_metrics(str(folder))
    assert [row["step"] for row in rows] == [1, 2, 3, 4]
    assert comparable(rows) == comparable(read_metrics(str(tmp_path / "whole")))
    assert np.isfinite(rows[-1]["loss"]) and "eval/success_greedy" in rows[-1]
    assert read_step_log(str(folder / GROUPS_LOG)) == read_step_log(
        str(tmp_path / "whole" / GROUPS_LOG))
    assert comparable([resumed.last_eval]) == comparable([whole.last_eval])
