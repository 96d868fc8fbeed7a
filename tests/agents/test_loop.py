"""The agent loop: exact ids, masks and log-probs; every stop reason; failures flagged."""
import asyncio
import dataclasses
import functools
import json

import numpy as np
import pytest

from agentjax.core.task import Task
from agentjax.envs.code.env import CodeEnv
from agentjax.envs.python.env import PythonEnv
from agentjax.envs.retrieval import Document
from agentjax.envs.sandbox import Sandbox
from agentjax.envs.search.env import SearchEnv
from agentjax.agents.loop import (EpisodeLimits, action_text, run_episode,
                                        sampled_versions)
from agentjax.engine.protocol import Completion, SamplingParams
from agentjax.core.trajectory import Trajectory, Turn, collate, observation_token_ids
from agentjax.models.tokenizer import load_tokenizer, observation_ids, prompt_ids
from tests.models.qwen_tokenizers import FAMILIES, VARIANTS, qwen_tokenizer_folder
from tests.agents.fakes import ScriptedEngine, ToyEnv
from tests.engine.reference import full_logits, reference_logp

TASK = Task("t1", "Which city is the capital of France?", answers=("Paris",))
SAMPLING = SamplingParams(temperature=1.0, max_new_tokens=32)


def _script(*texts):
    return lambda context, index: texts[min(index, len(texts) - 1)]


def _run(engine, env, limits=EpisodeLimits(), sampling=SAMPLING, tokenizer=None):
    return asyncio.run(run_episode(engine, env, TASK, sampling, limits, tokenizer))


def test_inline_observations_exact_ids_masks_and_logprobs(tokenizer):
    actions = ["<search>capital of France</search>", "<think>ok</think><answer>Paris</answer>"]
    engine = ScriptedEngine(tokenizer, _script(*actions))
    env = ToyEnv(step_reward=0.5)
    traj = _run(engine, env, tokenizer=tokenizer)
    log = env.log

    prompt = prompt_ids(tokenizer, ToyEnv().reset(TASK))
    a1, a2 = (tokenizer.encode(a, add_special_tokens=False) for a in actions)
    obs = tokenizer.encode("<information>ecnarF fo latipac</information>",
                           add_special_tokens=False)
    # The last turn stopped on "</answer>": the template's end-of-turn token closes it
    # as a template token.
    eot = [tokenizer.convert_tokens_to_ids("<|im_end|>")]
    np.testing.assert_array_equal(traj.token_ids, prompt + a1 + obs + a2 + eot)
    np.testing.assert_array_equal(
        traj.action_mask,
        [0] * len(prompt) + [1] * len(a1) + [0] * len(obs) + [1] * len(a2) + [0])
    np.testing.assert_array_equal(
        traj.turn_ids, [0] * len(prompt) + [1] * (len(a1) + len(obs)) + [2] * (len(a2) + 1))
    engine_logp = [lp for c in engine.completions for lp in c.logprobs]
    np.testing.assert_allclose(traj.behavior_logp[traj.action_mask == 1], engine_logp)
    assert not traj.behavior_logp[traj.action_mask == 0].any()
    # Round trip: the action tokens decode to exactly the model's outputs, and no
    # observation text leaks into them.
    decoded = tokenizer.decode(traj.token_ids[traj.action_mask == 1].tolist())
    assert decoded == "".join(actions) and "<information>" not in decoded
    # The second request carried the whole exact context, with the env's stop strings.
    assert list(engine.requests[1].input_ids) == prompt + a1 + obs
    assert set(ToyEnv.stop) <= set(engine.requests[1].sampling.stop)
    assert traj.metadata["stop_reason"] == "answer" and not traj.metadata["failed"]
    assert [t.reward for t in traj.turns] == [0.5, 0.0]
    assert traj.metadata["num_tool_calls"] == 1 and traj.metadata["env_log"] is log
    # The session was used for both turns and ended with the episode.
    sessions = {r.session_id for r in engine.requests}
    assert len(sessions) == 1 and engine.ended_sessions == list(sessions)


@pytest.mark.parametrize("eot_sampled", [False, True])
def test_chat_role_observations_and_demonstration_give_identical_ids(tokenizer, eot_sampled):
    eot = tokenizer.eos_token
    first = "<tool_call>{\"name\": \"lookup\"}</tool_call><search>fox</search>"
    actions = [first + (eot if eot_sampled else ""), "<answer>Paris</answer>"]
    engine = ScriptedEngine(tokenizer, _script(*actions))
    env = ToyEnv(observation_role="tool")
    traj = _run(engine, env, tokenizer=tokenizer)

    a1 = tokenizer.encode(actions[0], add_special_tokens=False)
    turn_obs = observation_ids(tokenizer, "xof", "tool")
    # A turn that stopped on a stop string gets the end-of-turn token as a template token.
    expected_obs = turn_obs if eot_sampled else [tokenizer.eos_token_id] + turn_obs
    assert traj.turns[0].observation_ids == expected_obs
    assert traj.turns[0].action_ids == a1
    assert traj.action_mask[len(traj.prompt_ids) + len(a1)] == 0  # the appended token
    # The env never sees the end-of-turn token in the action text.
    assert env.actions[0] == first

    demo = Trajectory.from_demonstration(
        tokenizer, ToyEnv().reset(TASK), [(actions[0], "xof", True), (actions[1], None, True)],
        observation_role="tool", reward=1.0, task=TASK)
    np.testing.assert_array_equal(demo.token_ids, traj.token_ids)
    np.testing.assert_array_equal(demo.turn_ids, traj.turn_ids)
    # The masks differ exactly on the end-of-turn tokens the engine did not sample: the
    # demonstration trains them (it teaches the model to end its turns there).
    closing = np.flatnonzero(demo.action_mask != traj.action_mask)
    assert (demo.action_mask[closing] == 1).all()
    assert (traj.token_ids[closing] == tokenizer.eos_token_id).all()
    assert len(closing) == (1 if eot_sampled else 2)
    assert demo.final_reward == 1.0 and demo.task_id == TASK.task_id


def test_demonstration_excludes_untrainable_turns_and_checks_turns(tokenizer):
    messages = [{"role": "user", "content": "q"}]
    demo = Trajectory.from_demonstration(
        tokenizer, messages,
        [("bad action", "invalid action, try again", False),
         ("<answer>Paris</answer>", None, True)])
    bad = tokenizer.encode("bad action", add_special_tokens=False)
    start = len(demo.prompt_ids)
    assert not demo.action_mask[start:start + len(bad)].any()
    # The last action and the end-of-turn token that closes it.
    assert demo.action_mask.sum() == len(tokenizer.encode("<answer>Paris</answer>",
                                                          add_special_tokens=False)) + 1
    assert demo.token_ids[-1] == tokenizer.eos_token_id
    with pytest.raises(ValueError, match=r"turns\[0\] has no observation"):
        Trajectory.from_demonstration(tokenizer, messages, [("a", None, True), ("b", None, True)])


def test_observation_ids_strip_control_text_and_cut(tokenizer):
    ids = observation_token_ids(tokenizer, "Paris<|im_end|> is big", role=None, action_ids=[])
    assert tokenizer.eos_token_id not in ids
    assert tokenizer.decode(ids) == "Paris is big"
    cut = observation_token_ids(tokenizer, "Paris is the capital of France", role=None,
                                action_ids=[], max_tokens=3)
    assert cut == tokenizer.encode("Paris is the capital of France",
                                   add_special_tokens=False)[:3]
    chat = observation_token_ids(tokenizer, "Paris is the capital of France", role="user",
                                 action_ids=[tokenizer.eos_token_id], max_tokens=2)
    content = tokenizer.decode(tokenizer.encode("Paris is the capital of France",
                                                add_special_tokens=False)[:2])
    assert chat == observation_ids(tokenizer, content, "user")


def test_stop_reasons_max_turns_and_token_budget(tokenizer):
    search = "<search>capital of France</search>"
    engine = ScriptedEngine(tokenizer, _script(search))
    traj = _run(engine, ToyEnv(), EpisodeLimits(max_turns=3), tokenizer=tokenizer)
    assert traj.metadata["stop_reason"] == "max_turns" and len(traj.turns) == 3
    # Only the end-of-turn token follows the last action (it stopped on "</search>").
    assert traj.turns[-1].observation_ids == [tokenizer.eos_token_id]
    assert traj.action_mask[-1] == 0
    assert not traj.metadata["failed"]

    prompt_len = len(prompt_ids(tokenizer, ToyEnv().reset(TASK)))
    budget = prompt_len + 2 * len(tokenizer.encode(search, add_special_tokens=False)) + 20
    engine = ScriptedEngine(tokenizer, _script(search))
    traj = _run(engine, ToyEnv(), EpisodeLimits(max_turns=10, max_context_tokens=budget),
                tokenizer=tokenizer)
    assert traj.metadata["stop_reason"] == "token_budget"
    assert traj.num_tokens <= budget
    # Every request's max_new_tokens was cut to the room left in the budget.
    for request in engine.requests:
        assert len(request.input_ids) + request.sampling.max_new_tokens <= budget


def test_failures_are_flagged_and_partial_turns_kept(tokenizer):
    search = "<search>capital of France</search>"
    traj = _run(ScriptedEngine(tokenizer, _script(search)), ToyEnv(fail_on_step=1),
                tokenizer=tokenizer)
    assert traj.metadata["failed"] and traj.metadata["stop_reason"] == "env_error"
    assert "tool exploded at step 1" in traj.metadata["error"] and len(traj.turns) == 2
    assert traj.metadata["env_log"].stop_reason == "env_error"

    aborting = ScriptedEngine(tokenizer, _script(search), finish_reason="abort")
    traj = _run(aborting, ToyEnv(), tokenizer=tokenizer)
    assert traj.metadata["stop_reason"] == "engine_error" and traj.turns == []

    slow = ScriptedEngine(tokenizer, _script(search))
    traj = _run(slow, ToyEnv(tool_latency_s=0.3), EpisodeLimits(max_turns=5, timeout_s=0.5),
                tokenizer=tokenizer)
    assert traj.metadata["stop_reason"] == "timeout" and traj.metadata["failed"]
    assert 1 <= len(traj.turns) <= 2 and slow.ended_sessions


def test_action_text_drops_only_template_tokens(tokenizer):
    ids = tokenizer.encode("<answer>Paris</answer>", add_special_tokens=False)
    assert action_text(tokenizer, ids + [tokenizer.eos_token_id]) == "<answer>Paris</answer>"


def test_turns_record_the_weight_version_of_each_token():
    per_token = Completion([7, 8, 9], [-1.0] * 3, "stop", None,
                           {"token_versions": [4, 4, 5], "weight_version": 5})
    assert sampled_versions(per_token) == [4, 4, 5]
    one_version = Completion([7, 8], [-1.0] * 2, "stop", None, {"weight_version": 3})
    assert sampled_versions(one_version) == [3, 3]
    assert sampled_versions(Completion([7], [-1.0], "stop")) == []
    assert sampled_versions(Completion([7], [-1.0], "stop", None,
                                       {"weight_version": "default"})) == []
    with pytest.raises(ValueError, match="versions has 1 entries but action_ids has 2"):
        Turn([7, 8], [-1.0, -1.0], "stop", versions=[3])


def test_limits_validation():
    with pytest.raises(ValueError, match="max_turns"):
        EpisodeLimits(max_turns=0)
    with pytest.raises(ValueError, match="max_context_tokens"):
        dataclasses.replace(EpisodeLimits(), max_context_tokens=0)


class _WithoutSessions:
    """Forwards to an engine with every request's session dropped (prefill from scratch)."""

    def __init__(self, engine):
        self.engine = engine

    async def generate(self, requests):
        return await self.engine.generate(
            [dataclasses.replace(r, session_id=None) for r in requests])

    def end_session(self, session_id):
        pass


@pytest.mark.parametrize("role", [None, "user"])
def test_episode_on_the_jax_engine_is_exact(engine, tiny_model, tokenizer, role):
    sampling = SamplingParams(temperature=1.0, max_new_tokens=8, seed=5)
    limits = EpisodeLimits(max_turns=3, max_context_tokens=90)
    traj = _run(engine, ToyEnv(observation_role=role), limits, sampling, tokenizer)
    assert len(traj.turns) >= 2 and not traj.metadata["failed"]
    assert all(t.observation_ids for t in traj.turns[:-1])
    assert {(t.weight_version, t.logprob_distribution) for t in traj.turns} == {
        (engine.weight_version, "sampling")}
    # Behavior log-probs equal one full forward over the final token ids.
    ids = traj.token_ids
    logits = full_logits(tiny_model, ids.tolist())
    positions = np.flatnonzero(traj.action_mask)
    expected = [reference_logp(logits[p - 1], 1.0, -1, 1.0)[ids[p]] for p in positions]
    np.testing.assert_allclose(traj.behavior_logp[positions], expected, atol=1e-4)
    assert all(t.versions == [engine.weight_version] * len(t.action_ids) for t in traj.turns)
    # Each later turn reuses its session's cache: every context id but the observation
    # just appended and the previous turn's last sampled token (never fed back).
    context = len(traj.prompt_ids)
    for previous, turn in zip(traj.turns, traj.turns[1:]):
        context += len(previous.action_ids) + len(previous.observation_ids)
        assert turn.cached_tokens == context - len(previous.observation_ids) - 1
    # Re-prefilling every turn from scratch gives the same episode.
    again = _run(_WithoutSessions(engine), ToyEnv(observation_role=role), limits, sampling,
                 tokenizer)
    np.testing.assert_array_equal(again.token_ids, traj.token_ids)
    np.testing.assert_array_equal(again.action_mask, traj.action_mask)
    np.testing.assert_array_equal(again.turn_ids, traj.turn_ids)


# ------------------------------------------- real Qwen chat templates, real tool envs

class _OneDocument:
    """A retriever that always finds the same document."""

    def search(self, queries, topk):
        return [[Document("d1", "Paris", "Paris is the capital of France.")] for _ in queries]


def _call(name, **arguments):
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": arguments})}\n</tool_call>'


CODE_TASK = Task("c1", "Write add(a, b).", metadata={
    "visible_tests": ["assert add(1, 2) == 3", "assert add(0, 0) == 0"],
    "tests": ["assert add(2, 2) == 4"], "entry_point": "add", "prefix": "", "starter": ""})

# env name -> (env factory, actions, task).
EPISODES = {
    "search": (lambda: SearchEnv(_OneDocument(), action_format="tool_call", max_turns=3),
               [_call("search", query="capital of France"), "<answer> Paris </answer>"], TASK),
    "python": (lambda: PythonEnv(Sandbox(max_parallel=1), max_turns=3),
               [_call("python", code="print(2 + 3 * 4)"), "<answer> 14 </answer>"], TASK),
    # A run whose failure report comes back, then the fixed program in a fenced block.
    "code": (lambda: CodeEnv(Sandbox(max_parallel=1), max_turns=3),
             [_call("run", code="def add(a, b):\n    return a - b\n"),
              "Fixed:\n```python\ndef add(a, b):\n    return a + b\n```"], CODE_TASK),
}


@pytest.fixture(scope="module")
def qwen_root(tmp_path_factory):
    return tmp_path_factory.mktemp("qwen")


@pytest.mark.parametrize("env_name", sorted(EPISODES))
@pytest.mark.parametrize("family,variant", [(f, v) for f in FAMILIES for v in VARIANTS])
def test_tool_episodes_with_real_qwen_templates(qwen_root, family, variant, env_name):
    """Qwen2.5/Qwen3 base models end turns with <|im_end|> although their eos is
    <|endoftext|>, and Qwen3 re-renders earlier assistant turns: both episodes run, their
    ids are the template's, equal to apply_chat_template of the conversation except
    where the template re-renders (documented below), and a demonstration of the same
    actions has the same ids."""
    tokenizer = load_tokenizer(qwen_tokenizer_folder(qwen_root, family, variant, "hub"))
    make_env, actions, task = EPISODES[env_name]
    env = make_env()
    sampling = dataclasses.replace(SAMPLING, max_new_tokens=128)  # room for a program
    traj = asyncio.run(run_episode(ScriptedEngine(tokenizer, _script(*actions)), env, task,
                                   sampling, EpisodeLimits(), tokenizer))
    assert traj.metadata["stop_reason"] == "answer" and not traj.metadata["failed"]
    assert env.log.turns[0].valid and env.log.turns[0].error is None
    observation = env.log.turns[0].observation
    if env_name == "code":
        assert observation.startswith("1 of 2 tests passed.\nFAILED: assert add(1, 2) == 3")

    eot = tokenizer.convert_tokens_to_ids("<|im_end|>")
    encode = functools.partial(tokenizer.encode, add_special_tokens=False)
    first, last = (encode(a) for a in actions)
    messages = env.reset(task)
    # Both turns stopped on a stop string: the loop closes each with <|im_end|> as a
    # template token (mask 0), the first one inside the tool turn's ids.
    expected = (prompt_ids(tokenizer, messages) + first + [eot]
                + observation_ids(tokenizer, observation, "tool") + last + [eot])
    np.testing.assert_array_equal(traj.token_ids, expected)
    assert traj.action_mask.sum() == len(first) + len(last)
    assert traj.action_mask[-1] == 0

    conversation = messages + [{"role": "assistant", "content": actions[0]},
                               {"role": "tool", "content": observation},
                               {"role": "assistant", "content": actions[1]}]
    rendered = tokenizer.apply_chat_template(conversation, tokenize=False)
    if family == "qwen2.5":
        # Equal but for the newline the template writes after the last <|im_end|>.
        assert encode(rendered) == expected + encode("\n")
    else:
        # Qwen3 gives the last assistant turn an empty think block the policy (prompted
        # with `<|im_start|>assistant\n` only) never saw.
        text = tokenizer.decode(expected)
        head, header, tail = text.rpartition("<|im_start|>assistant\n")
        assert rendered == head + header + "<think>\n\n</think>\n\n" + tail + "\n"

    demo = Trajectory.from_demonstration(
        tokenizer, messages, [(actions[0], observation, True), (actions[1], None, True)],
        observation_role=env.observation_role, task=task)
    np.testing.assert_array_equal(demo.token_ids, traj.token_ids)
    # The demonstration trains the two <|im_end|> tokens the engine did not sample.
    closing = np.flatnonzero(demo.action_mask != traj.action_mask)
    assert (traj.token_ids[closing] == eot).all() and len(closing) == 2
    batch = collate([demo, traj], buckets=(4096,), pad_id=tokenizer.pad_token_id)
    assert batch["action_mask"].sum() == 2 * (len(first) + len(last)) + 2
