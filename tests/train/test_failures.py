"""Runs that cannot learn say so: failed episodes, non-finite updates, impossible token
budgets (in-process runs of the tiny search config)."""
import json
import math

import numpy as np
import pytest

from agentjax.agents import sources
from agentjax.agents.pool import RolloutPool
from agentjax.config import ConfigError, presets
from agentjax.train import policy as policy_lib
from agentjax.train import run as run_lib
from agentjax.train.checkpoint import Checkpointer
from agentjax.train.episodes import EpisodesFailed
from agentjax.train.fit import TrainingDiverged
from agentjax.train.metrics import read_metrics
from agentjax.train.run import run, set_up
from agentjax.train.stages.rl import init_rl_state


def _config(**overrides):
    config = presets.search_config("grpo", "test")
    config.pretrain.steps = config.sft.steps = 0
    config.eval.every = 0
    config.checkpoint.async_save = False
    config.devices = 1  # nothing here is about sharding: one device compiles and runs fastest
    for dotted, value in overrides.items():
        *section, key = dotted.split("__")
        (config[section[0]] if section else config)[key] = value
    return config


def _poison_rewards(monkeypatch, steps):
    """Rollouts of the given RL steps (0-based) get NaN rewards."""
    collect, calls = sources.collect_groups, []

    def poisoned(*args, **kwargs):
        groups, info = collect(*args, **kwargs)
        if len(calls) in steps:
            for group in groups:
                for traj in group:
                    traj.final_reward = math.nan
        calls.append(1)
        return groups, info

    monkeypatch.setattr(sources, "collect_groups", poisoned)


def test_every_episode_failing_stops_the_first_step_with_the_error(tmp_path, monkeypatch):
    build_suite = run_lib.build_suite

    def broken_reward(task, log):
        raise KeyError("chain")

    def suite_with_a_broken_reward(*args):
        suite = build_suite(*args)
        suite.reward_fn = broken_reward
        return suite

    # The SFT evaluation is off (no SFT): the first RL step is the first rollout.
    monkeypatch.setattr(run_lib, "build_suite", suite_with_a_broken_reward)
    with pytest.raises(EpisodesFailed, match=r"RL step 1: all 4 episodes failed.*KeyError"):
        run(_config(), str(tmp_path))
    [error] = [json.loads(line) for line in (tmp_path / "errors.jsonl").read_text().splitlines()]
    assert "KeyError" in error["error"] and "#### prompt" in error["episode"]
    sample = (tmp_path / "samples" / "rl_000001.md").read_text()
    assert "FAILED: reward_fn failed: KeyError" in sample and "trained" in sample


def test_a_nonfinite_step_is_skipped_and_training_goes_on(tmp_path, monkeypatch):
    _poison_rewards(monkeypatch, steps={0})
    run(_config(), str(tmp_path))
    first, second = read_metrics(tmp_path)
    assert first["nonfinite_updates"] == 1.0 and first["reward/mean"] == "nan"
    assert second["nonfinite_updates"] == 0.0 and np.isfinite(second["loss"])


def test_consecutive_nonfinite_steps_roll_back_then_stop_with_a_checkpoint(tmp_path,
                                                                          monkeypatch):
    config = _config(optim__on_nonfinite="rollback", optim__max_nonfinite_steps=2,
                     checkpoint__every=1, checkpoint__keep=5)
    config.total_steps = 4
    _poison_rewards(monkeypatch, steps={1, 2})
    with pytest.raises(TrainingDiverged,
                       match=r"RL step 3: .*2 consecutive steps.*saved at step 3"):
        run(config, str(tmp_path))
    checkpoints = Checkpointer(tmp_path / "checkpoints", every=0)
    assert checkpoints._manager.all_steps() == [1, 2, 3]
    _, _, policy, rollouts = set_up(config, str(tmp_path))
    rollouts.close()
    state = init_rl_state(config, policy.graphdef, policy.params)[0]
    after_one, _ = checkpoints.restore(state, 1)
    at_stop, _ = checkpoints.restore(state, 3)
    # Step 2 was rolled back to checkpoint 1, step 3 was refused: the saved policy is
    # checkpoint 1's, finite.
    for a, b in zip(*(jax_leaves(s.params) for s in (after_one, at_stop)), strict=True):
        np.testing.assert_array_equal(a, b)
        assert np.isfinite(a).all()


def jax_leaves(tree):
    import jax
    return [np.asarray(x) for x in jax.tree.leaves(tree)]


def test_a_prompt_longer_than_the_token_budget_is_a_setup_error(tmp_path):
    with pytest.raises(ValueError, match=r"'rollout.max_tokens' is 64 but the prompt of task"):
        set_up(_config(rollout__max_tokens=64), str(tmp_path))


def test_a_token_budget_beyond_the_model_positions_is_a_setup_error(tmp_path, monkeypatch):
    set_up(_config(), str(tmp_path))[3].close()
    model_config = tmp_path / "init_model" / "config.json"
    fields = json.loads(model_config.read_text())
    fields["max_position_embeddings"] = 256
    model_config.write_text(json.dumps(fields))

    def load_hf(*args, **kwargs):
        raise AssertionError("the weights were read before the context was checked")

    monkeypatch.setattr(policy_lib, "load_hf", load_hf)
    with pytest.raises(ConfigError, match=(
            r"^config key 'rollout.max_tokens' is 384; episodes that long exceed the model's "
            r"max_position_embeddings=256 \(.*init_model/config.json\): lower it to at "
            r"most 256$")):
        set_up(_config(), str(tmp_path))


def test_an_async_producer_failure_checkpoints_and_the_rerun_resumes(tmp_path, capsys,
                                                                    monkeypatch):
    """The producer's error (here the pool raising on the second step's first group)
    stops an asynchronous run with that error after a checkpoint of the step it stopped
    at (the learner raises it as soon as it sees it: before or after training step 1,
    depending on timing); a rerun resumes there and finishes."""
    config = _config(rollout__mode="async", total_steps=3, checkpoint__every=0)
    collect, calls = RolloutPool.collect, []

    async def failing(self, tasks, *args, **kwargs):
        calls.append(tasks)
        if len(calls) == config.rollout.prompts_per_step + 1:
            raise OSError("pool broke")
        return await collect(self, tasks, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(RolloutPool, "collect", failing)
        with pytest.raises(sources.RolloutProducerError, match="OSError: pool broke"):
            run(config, str(tmp_path))
    [stopped_at] = Checkpointer(tmp_path / "checkpoints", every=0)._manager.all_steps()
    assert stopped_at in (0, 1)
    capsys.readouterr()
    run(config, str(tmp_path))
    assert f"RL: resumed at step {stopped_at}" in capsys.readouterr().out
    assert [row["step"] for row in read_metrics(str(tmp_path))][-1] == 3
