"""The long-episode form of the search agent (configs/grpo_search.py:long_test): its
episodes are exact trajectories up to the end of its context, and it runs end to end."""
import json

import jax
import numpy as np
import pytest

from agentjax.config import presets
from agentjax.core.trajectory import collate
from agentjax.rl.objectives import policy_logprobs
from agentjax.train.metrics import read_metrics
from agentjax.train.run import set_up
from agentjax.train.stages.rl import length_buckets
from tests.train.runs import train


class _Recording:
    """The rollout engine, recording every request with the completion it got."""

    def __init__(self, engine):
        self._engine = engine
        self.calls = []  # (request, completion)

    async def generate(self, requests):
        outputs = await self._engine.generate(requests)
        self.calls += [(request, out[0]) for request, out in zip(requests, outputs)]
        return outputs

    def __getattr__(self, name):  # update_weights, health, end_session
        return getattr(self._engine, name)


def _sessions(calls) -> list[tuple[list[int], list[int]]]:
    """Per engine session, (its tokens in order, 1 where the engine produced them):
    each request is checked to continue the previous request and its completion, with
    what the loop appended in between (token-in exact)."""
    sessions = {}
    for request, completion in calls:
        tokens, produced = sessions.setdefault(request.session_id, ([], []))
        context = list(request.input_ids)
        assert context[:len(tokens)] == tokens
        produced += [0] * (len(context) - len(tokens)) + [1] * len(completion.output_ids)
        tokens[:] = context + list(completion.output_ids)
    return list(sessions.values())


def test_long_episodes_are_exact_trajectories(tmp_path):
    config = presets.search_config("grpo", "long_test")
    config.devices = 1  # nothing here is about sharding: one device compiles and runs fastest
    r = config.rollout
    _, suite, policy, rollouts = set_up(config, str(tmp_path))
    try:
        # The tiny model built for the run holds the context (Policy.load checks it).
        assert policy.model_config.max_position_embeddings >= r.max_tokens
        recording = _Recording(rollouts.pool.engine)
        groups = rollouts.pool.with_engine(recording).collect_sync(
            suite.train_tasks[:r.prompts_per_step], r.group_size,
            sampling=rollouts.sampling(0))
    finally:
        rollouts.close()
    episodes = [t for group in groups for t in group]
    sessions = _sessions(recording.calls)
    assert len(sessions) == len(episodes)
    for traj in episodes:
        assert not traj.metadata["failed"], traj.metadata["error"]
        ids, mask = traj.token_ids.tolist(), traj.action_mask.tolist()
        assert len(ids) <= r.max_tokens and len(traj.turns) <= config.env.max_turns
        # Token-out exact: the trajectory is its session's tokens, plus at most the
        # end-of-turn token the loop closes a last turn with.
        [(tokens, produced)] = [(tokens, produced) for tokens, produced in sessions
                                if ids[:len(tokens)] == tokens and len(ids) - len(tokens) <= 1]
        # The action mask is on exactly the tokens the engine produced (every turn of
        # a rollout trains): never on the prompt, an observation or a template token.
        assert mask == produced + [0] * (len(ids) - len(tokens))
    assert "token_budget" in {t.metadata["stop_reason"] for t in episodes}
    assert max(len(t.turns) for t in episodes) > 4  # more turns than the test variant
    # A search shows up to env.topk documents (fewer match some queries), each whole:
    # env.max_observation_words cuts none (the demonstrator's episodes replay the env).
    searches = [turn.observation for demo in suite.demonstrations for turn in demo.turns
                if turn.observation and "<information>Doc 1(" in turn.observation]
    assert any(f"Doc {config.env.topk}(Title:" in o for o in searches)
    assert all(o.endswith(".</information>\n\n") for o in searches)

    # The trainer's log-probs of the collated batch are the engine's on every action
    # token: positions, attention over the whole episode and targets agree.
    batch = collate(episodes, buckets=length_buckets(r.max_tokens),
                    pad_id=policy.tokenizer.pad_token_id)
    assert not batch["truncated"].any()
    logp, _ = jax.jit(lambda params, batch: policy_logprobs(
        policy.graphdef, params, batch, chunk_size=config.model.logprob_chunk))(
        policy.params, {key: batch[key] for key in ("inputs", "targets", "positions",
                                                    "segment_ids")})
    actions = batch["action_mask"] == 1
    np.testing.assert_allclose(np.asarray(logp)[actions], batch["behavior_logp"][actions],
                               atol=2e-4)


@pytest.mark.slow
def test_the_long_test_form_runs_end_to_end(tmp_path):
    # One RL step (its 2,048-token episodes are the point) and the evaluation after it.
    train("grpo_search.py:long_test", tmp_path, "--config.total_steps=1",
          "--config.eval.every=1")
    rows = read_metrics(tmp_path)
    assert [row["step"] for row in rows] == [1]
    config = presets.search_config("grpo", "long_test")
    for row in rows:
        assert row["mask/leak"] == 0
        assert row["length/episode_tokens_mean"] <= config.rollout.max_tokens
    assert "eval/success_sampled" in json.loads((tmp_path / "final.json").read_text())
