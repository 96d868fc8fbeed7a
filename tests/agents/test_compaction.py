"""Context compaction in the agent loop (env.compact_at_tokens): the episode goes on in a
new segment of the same rollout; sampled ids stay exact in their segment, the new
segment's prompt is a fresh chat-template render; the segments train as one rollout."""
import asyncio

import jax
import numpy as np
import pytest

from agentjax.agents.loop import (DROPPED_OBSERVATION, SUMMARY_CONTINUE, SUMMARY_REQUEST,
                                  EpisodeLimits, run_episode)
from agentjax.config import presets
from agentjax.config.choices import AGGREGATIONS
from agentjax.core.task import Task
from agentjax.core.trajectory import (Trajectory, Turn, collate, mask_rollouts,
                                      observation_token_ids, tool_turn_ids,
                                      truncated_rollouts)
from agentjax.engine.protocol import SamplingParams
from agentjax.envs.python.env import PythonEnv
from agentjax.models import chat
from agentjax.models.tokenizer import end_of_turn_id, observation_ids, prompt_ids
from agentjax.rl import segments
from agentjax.rl.aggregation import aggregate, loss_norm
from agentjax.train import diagnostics
from agentjax.train.stages.rl import episode_action_budget
from tests.agents.fakes import ScriptedEngine, ToyEnv
from tests.engine.reference import full_logits, reference_logp
from tests.envs.test_native import Lookup
from tests.models.chat_templates import chat_tokenizer
from tests.rl.test_segments import reference_weights

TASK = Task("t1", "Which city is the capital of France?", answers=("Paris",))
SAMPLING = SamplingParams(temperature=1.0, max_new_tokens=32)
SEARCH, SUMMARY, ANSWER = ("<search>capital of France</search>",
                           "Searched: Paris is the capital.", "<answer>Paris</answer>")


def _run(engine, env, limits, tokenizer, group_id=0):
    return asyncio.run(run_episode(engine, env, TASK, SAMPLING, limits, tokenizer,
                                   group_id=group_id))


def _script(*texts):
    return lambda context, index: texts[min(index, len(texts) - 1)]


def _encode(tokenizer, text):
    return tokenizer.encode(text, add_special_tokens=False)


def _sampled(engine):
    """Every id and log-prob the engine sampled, in order."""
    return ([t for c in engine.completions for t in c.output_ids],
            [p for c in engine.completions for p in c.logprobs])


def _rollout_actions(traj):
    """The action ids and log-probs of a rollout's turns, segment after segment."""
    turns = [turn for part in (*traj.segments, traj) for turn in part.turns]
    return ([t for turn in turns for t in turn.action_ids],
            [p for turn in turns for p in turn.logprobs])


def test_summary_is_an_action_turn_and_the_new_prompt_a_fresh_render(tokenizer):
    engine = ScriptedEngine(tokenizer, _script(SEARCH, SUMMARY, ANSWER))
    env = ToyEnv(observation_prefix="many documents " * 4)
    initial = ToyEnv().reset(TASK)
    prompt = prompt_ids(tokenizer, initial)
    limits = EpisodeLimits(max_turns=4, max_context_tokens=1024,
                           compact_at_tokens=len(prompt) + 8, max_compactions=1)
    traj = _run(engine, env, limits, tokenizer)

    assert traj.metadata["stop_reason"] == "answer" and not traj.metadata["failed"]
    assert traj.metadata["compactions"] == 1 and len(traj.segments) == 1
    [old] = traj.segments
    search, summary, answer = (_encode(tokenizer, t) for t in (SEARCH, SUMMARY, ANSWER))
    eot = end_of_turn_id(tokenizer)
    # The old segment: the search, its inline observation closed by the end-of-turn
    # token and followed by the summary request as a user turn, then the summary, an
    # action turn the policy sampled (trainable), closed by the template's end of turn.
    observation = _encode(tokenizer, "many documents " * 4
                          + "<information>ecnarF fo latipac</information>")
    request = [eot] + observation_ids(tokenizer, SUMMARY_REQUEST, "user")
    assert old.prompt_ids == prompt
    assert [t.action_ids for t in old.turns] == [search, summary]
    assert old.turns[0].observation_ids == observation + request
    assert old.turns[1].observation_ids == [eot] and old.turns[1].trainable
    assert old.turns[1].reward == 0.0
    # The summary was asked for on the exact context so far, without the env's stops.
    assert list(engine.requests[1].input_ids) == prompt + search + observation + request
    assert not set(ToyEnv.stop) & set(engine.requests[1].sampling.stop)
    # The new segment's prompt: system + task + the summary, rendered by the template.
    expected = prompt_ids(tokenizer, [*initial, {"role": "assistant", "content": SUMMARY},
                                      {"role": "user", "content": SUMMARY_CONTINUE}])
    assert traj.prompt_ids == expected == list(engine.requests[2].input_ids)
    assert [t.action_ids for t in traj.turns] == [answer]
    # Every sampled id and log-prob is in the rollout once, in order, never re-tokenized.
    assert _rollout_actions(traj) == _sampled(engine)
    assert env.actions == [SEARCH, ANSWER]  # the summary is not an env action
    # One engine session for the whole episode, ended with it.
    assert len({r.session_id for r in engine.requests}) == 1 == len(engine.ended_sessions)


def test_drop_keeps_the_last_turns_and_the_actions(tokenizer):
    queries = ["<search>first query</search>", "<search>second query</search>"]
    engine = ScriptedEngine(tokenizer, _script(*queries, ANSWER))
    env = ToyEnv(observation_role="user")
    initial = ToyEnv().reset(TASK)
    prompt = prompt_ids(tokenizer, initial)
    first, second = (_encode(tokenizer, q) for q in queries)
    first_obs = observation_token_ids(tokenizer, "yreuq tsrif", role="user", action_ids=first)
    # Compacts when the second observation arrives, not the first.
    limits = EpisodeLimits(max_turns=4, max_context_tokens=1024, compaction="drop",
                           compaction_keep_turns=1,
                           compact_at_tokens=len(prompt + first + first_obs + second) + 1)
    traj = _run(engine, env, limits, tokenizer)

    assert traj.metadata["stop_reason"] == "answer" and traj.metadata["compactions"] == 1
    [old] = traj.segments
    eot = end_of_turn_id(tokenizer)
    assert old.prompt_ids == prompt
    assert [t.action_ids for t in old.turns] == [first, second]
    # The old segment ends after the second action, closed as a last turn is.
    assert old.turns[0].observation_ids == first_obs and old.turns[1].observation_ids == [eot]
    expected = prompt_ids(tokenizer, [
        *initial, {"role": "assistant", "content": queries[0]},
        {"role": "user", "content": DROPPED_OBSERVATION},
        {"role": "assistant", "content": queries[1]},
        {"role": "user", "content": "yreuq dnoces"}])
    assert traj.prompt_ids == expected == list(engine.requests[2].input_ids)
    assert _rollout_actions(traj) == _sampled(engine)
    assert env.actions == [*queries, ANSWER]


def test_compactions_are_bounded_then_the_context_limit_is_an_explicit_stop(tokenizer):
    request = observation_ids(tokenizer, SUMMARY_REQUEST, "user")

    def script(context, index):  # a summary when asked for one, else a search
        return SUMMARY if list(context[-len(request):]) == request else SEARCH

    engine = ScriptedEngine(tokenizer, script)
    env = ToyEnv(observation_prefix="many documents " * 4)
    prompt = prompt_ids(tokenizer, ToyEnv().reset(TASK))
    limits = EpisodeLimits(max_turns=12, max_context_tokens=len(prompt) + 3 * len(request),
                           compact_at_tokens=len(prompt) + 8, max_compactions=2)
    traj = _run(engine, env, limits, tokenizer)
    assert traj.metadata["compactions"] == 2 and len(traj.segments) == 2
    # After its last compaction the context fills up: the episode stops, said so.
    assert traj.metadata["stop_reason"] == "token_budget" and not traj.metadata["failed"]
    assert traj.num_tokens <= limits.max_context_tokens
    assert all(part.num_tokens <= limits.max_context_tokens for part in traj.segments)
    assert _rollout_actions(traj) == _sampled(engine)


def _compacted_group(tokenizer):
    """Two rollouts of one group: one compacted (two segments), one not."""
    prompt = prompt_ids(tokenizer, ToyEnv().reset(TASK))
    compacting = EpisodeLimits(max_turns=4, max_context_tokens=1024,
                               compact_at_tokens=len(prompt) + 8, max_compactions=1)
    script = _script(SEARCH, SUMMARY, ANSWER)
    long = _run(ScriptedEngine(tokenizer, script),
                ToyEnv(observation_prefix="many documents " * 4), compacting, tokenizer)
    short = _run(ScriptedEngine(tokenizer, _script(ANSWER)), ToyEnv(),
                 EpisodeLimits(max_turns=4, max_context_tokens=1024), tokenizer)
    long.final_reward, short.final_reward = 1.0, 0.0
    return long, short


@pytest.mark.parametrize("mode", AGGREGATIONS)
def test_segments_collate_as_one_rollout_with_its_per_rollout_weights(tokenizer, mode):
    long, short = _compacted_group(tokenizer)
    batch = collate([long, short], buckets=(512,), pad_id=0, batch_size=4, max_segments=2)
    np.testing.assert_array_equal(batch["rollout_ids"], [0, 0, 1, -1])
    np.testing.assert_array_equal(batch["group_ids"], [0, 0, 0, -1])
    # Each row holds its segment's exact tokens: the summary trains in the first row.
    for row, part in enumerate([*long.segments, long, short]):
        used = part.num_tokens - 1
        np.testing.assert_array_equal(batch["targets"][row, :used], part.token_ids[1:])
        np.testing.assert_array_equal(batch["action_mask"][row, :used], part.action_mask[1:])
    # The reward sits on the last segment, and the rollout scores it once.
    assert batch["rewards"][0].sum() == 0 and batch["rewards"][1].sum() == 1.0
    # Per-rollout weights: those of tests/rl/test_segments.py's float64 reference.
    mask = batch["action_mask"]
    tokens = segments.rollout_tokens(mask, batch["rollout_ids"])
    norm = loss_norm(mask, constant=7.0, rollout_tokens=tokens)
    weights = jax.grad(lambda x: aggregate(x, mask, mode, norm=norm))(np.zeros(mask.shape))
    np.testing.assert_allclose(weights, reference_weights(mask, batch["rollout_ids"], mode, 7.0),
                               rtol=1e-6, atol=1e-9)
    # With rollout.max_segments=1 the summary's segment is not trained, and counted.
    batch = collate([long, short], buckets=(512,), pad_id=0, max_segments=1)
    metrics = diagnostics.segment_metrics([long, short], batch["rollout_ids"])
    assert metrics["rollout/segments_dropped"] == 1.0
    assert metrics["rollout/compactions_mean"] == 0.5


def _flat(action_ids, stop_reason, reward):
    traj = Trajectory(prompt_ids=[1, 2, 3], turns=[Turn(action_ids, [-0.1] * len(action_ids),
                                                        "stop")],
                      final_reward=reward, metadata={"stop_reason": stop_reason})
    return traj


def test_every_truncation_is_recorded_counted_and_masked_when_configured():
    ended = _flat([4, 5], "answer", 1.0)
    context_cut = _flat([6, 7, 8], "token_budget", 0.0)
    long = _flat(list(range(10, 40)), "answer", 0.5)  # cut by collate at the bucket
    batch = collate([ended, context_cut, long], buckets=(16,), pad_id=0)
    np.testing.assert_array_equal(batch["truncated"], [False, False, True])
    cut = truncated_rollouts([ended, context_cut, long], batch)
    np.testing.assert_array_equal(cut, [False, True, True])
    metrics = diagnostics.rollout_metrics([[ended, context_cut, long]], batch)
    assert metrics["truncated/rollout_frac"] == pytest.approx(2 / 3)
    assert metrics["stop/token_budget"] == pytest.approx(1 / 3)
    assert metrics["truncated/collate_frac"] == pytest.approx(1 / 3)
    warnings = diagnostics.failure_warnings(metrics, max_action_tokens=1000)
    assert any("collate bucket" in w for w in warnings)
    assert any("cut short at the context limit" in w for w in warnings)
    # 'mask': the truncated rollouts leave the loss; their rewards stay in the batch
    # (their group's statistics), the finished rollout is untouched.
    rewards, kept = batch["rewards"].copy(), batch["action_mask"][0].copy()
    assert mask_rollouts(batch, cut) == 2
    assert not batch["action_mask"][1:].any()
    np.testing.assert_array_equal(batch["action_mask"][0], kept)
    np.testing.assert_array_equal(batch["rewards"], rewards)


def test_a_turn_cut_by_max_new_tokens_is_counted(tokenizer):
    engine = ScriptedEngine(tokenizer, _script(ANSWER), finish_reason="length")
    traj = _run(engine, ToyEnv(), EpisodeLimits(max_turns=1), tokenizer)
    assert traj.metadata["num_length_cut_turns"] == 1
    batch = collate([traj], buckets=(256,), pad_id=0)
    metrics = diagnostics.rollout_metrics([[traj]], batch)
    assert metrics["truncated/turn_length_frac"] == 1.0 and metrics["stop/answer"] == 1.0


@pytest.mark.parametrize("compaction", ["summary", "drop"])
def test_native_tool_calls_compact_through_the_chat_template(tmp_path, compaction):
    tokenizer = chat_tokenizer("qwen2.5", tmp_path)
    eot = tokenizer.convert_ids_to_tokens(end_of_turn_id(tokenizer))
    call = '<tool_call>\n{"name": "lookup", "arguments": {"word": "six"}}\n</tool_call>'
    replies = {"call": call + eot, "summary": SUMMARY + eot,
               "answer": "<answer> a word </answer>" + eot}

    def script(context, index):
        if index == 0:
            return replies["call"]
        asked = tokenizer.decode(list(context)).endswith(
            SUMMARY_REQUEST + eot + "\n<|im_start|>assistant\n")
        return replies["summary" if asked else "answer"]

    engine = ScriptedEngine(tokenizer, script)
    env = PythonEnv(tools=[Lookup()], tool_format="native", tool_parser="auto")
    answered = []
    step = env.step
    env.step = lambda text: answered.append(step(text)) or answered[-1]
    messages = PythonEnv(tools=[Lookup()], tool_format="native").reset(TASK)
    prompt = chat.prompt_ids(tokenizer, messages, env.template_tools)
    limits = EpisodeLimits(max_turns=4, max_context_tokens=4096, compaction=compaction,
                           compaction_keep_turns=1, compact_at_tokens=len(prompt) + 1,
                           max_compactions=1)
    traj = asyncio.run(run_episode(engine, env, TASK, SamplingParams(max_new_tokens=256),
                                   limits, tokenizer))
    assert traj.metadata["stop_reason"] == "answer" and traj.metadata["compactions"] == 1
    [old] = traj.segments
    turn = answered[0].info["messages"]  # the parsed call and the tool's answer
    if compaction == "summary":
        # The tool's answer, then the request, rendered by the template after the call.
        ids, _ = tool_turn_ids(tokenizer, messages, [*turn, {"role": "user",
                                                             "content": SUMMARY_REQUEST}],
                               tools=env.template_tools, action_ids=old.turns[0].action_ids)
        assert old.turns[0].observation_ids == ids
        history = [{"role": "assistant", "content": SUMMARY},
                   {"role": "user", "content": SUMMARY_CONTINUE}]
    else:
        history = turn  # the last turn, kept verbatim
    assert traj.prompt_ids == chat.prompt_ids(tokenizer, [*messages, *history],
                                              env.template_tools)
    assert traj.prompt_ids == list(engine.requests[-1].input_ids)
    assert _rollout_actions(traj) == _sampled(engine)


def test_lengths_and_the_action_budget_count_every_segment(tokenizer):
    long, short = _compacted_group(tokenizer)
    assert long.rollout_action_tokens == sum(
        len(turn.action_ids) for part in (*long.segments, long) for turn in part.turns)
    batch = collate([long, short], buckets=(512,), pad_id=0, max_segments=2)
    metrics = diagnostics.rollout_metrics([[long, short]], batch)
    assert metrics["length/response_mean"] == (long.rollout_action_tokens
                                               + short.rollout_action_tokens) / 2
    # Each segment has a context of its own: the budget is per turn, summaries included.
    config = presets.search_config("grpo", "test")
    config.env.compact_at_tokens, config.env.max_compactions = 200, 3
    assert episode_action_budget(config) == (config.env.max_turns + 3) * 12
    config.env.compaction = "drop"
    assert episode_action_budget(config) == config.env.max_turns * 12


def test_compacted_segments_on_the_jax_engine_are_exact(engine, tiny_model, tokenizer):
    """Each segment's behavior log-probs are one forward over that segment's own ids
    (its prompt rendered fresh, positions from 0): what the engine saw, token for token."""
    prompt = prompt_ids(tokenizer, ToyEnv().reset(TASK))
    limits = EpisodeLimits(max_turns=3, max_context_tokens=90, compaction="drop",
                           compaction_keep_turns=1, compact_at_tokens=len(prompt) + 1)
    sampling = SamplingParams(temperature=1.0, max_new_tokens=8, seed=5)
    traj = asyncio.run(run_episode(engine, ToyEnv(observation_role="user"), TASK, sampling,
                                   limits, tokenizer))
    assert not traj.metadata["failed"] and traj.metadata["compactions"] >= 1
    for part in (*traj.segments, traj):
        ids = part.token_ids
        logits = full_logits(tiny_model, ids.tolist())
        positions = np.flatnonzero(part.action_mask)
        expected = [reference_logp(logits[p - 1], 1.0, -1, 1.0)[ids[p]] for p in positions]
        np.testing.assert_allclose(part.behavior_logp[positions], expected, atol=1e-4)
