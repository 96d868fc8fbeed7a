"""The agent loop with real chat templates: native tool calls (schemas in the prompt,
results as the template's tool messages, exact delta ids), and text after the model's
end-of-turn token opening a proper message in the tags format."""
import asyncio
import json

import numpy as np
import pytest

from agentjax.agents.loop import EpisodeLimits, run_episode
from agentjax.core.task import Task
from agentjax.core.trajectory import Trajectory
from agentjax.engine.protocol import SamplingParams
from agentjax.envs.python.env import PythonEnv
from agentjax.envs.retrieval import Document
from agentjax.envs.search.env import SearchEnv
from agentjax.models import chat
from agentjax.models.tokenizer import end_of_turn_id
from tests.agents.fakes import ScriptedEngine
from tests.envs.test_native import Lookup
from tests.models.chat_templates import chat_tokenizer

TASK = Task("t1", "What does six mean?", ("a word",))
SAMPLING = SamplingParams(temperature=1.0, max_new_tokens=256)



def _run(engine, env, tokenizer):
    return asyncio.run(run_episode(engine, env, TASK, SAMPLING, EpisodeLimits(), tokenizer))


def _hermes(name, **arguments):
    return ("<tool_call>\n" + json.dumps({"name": name, "arguments": arguments})
            + "\n</tool_call>")


# family -> (the parser "auto" picks, the first reply in the model's own call format
# (two calls; Llama 3.1's parser reads calls joined by ";"), the call ids results carry).
REPLIES = {
    "qwen2.5": ("hermes", _hermes("lookup", word="six") + _hermes("lookup", word="seven"),
                ["call00000", "call00001"]),
    "qwen3": ("hermes", _hermes("lookup", word="six") + _hermes("lookup", word="seven"),
              ["call00000", "call00001"]),
    "smollm2": ("hermes", _hermes("lookup", word="six") + _hermes("lookup", word="seven"),
                ["call00000", "call00001"]),
    "gemma": ("hermes", _hermes("lookup", word="six") + _hermes("lookup", word="seven"),
              ["call00000", "call00001"]),
    "llama3.1": ("llama3_json", '{"name": "lookup", "parameters": {"word": "six"}}; '
                                '{"name": "lookup", "parameters": {"word": "seven"}}',
                 ["call00000", "call00001"]),
    "mistral": ("mistral", '[TOOL_CALLS][{"name": "lookup", "arguments": {"word": "six"}, '
                           '"id": "Ab3dE6gH9"}, {"name": "lookup", "arguments": '
                           '{"word": "seven"}, "id": "Zy8xW7vU6"}]',
                ["Ab3dE6gH9", "Zy8xW7vU6"]),
}


@pytest.mark.parametrize("family", sorted(REPLIES))
def test_native_episode_ids_are_prompt_actions_and_rendered_deltas(tmp_path, family):
    tokenizer = chat_tokenizer(family, tmp_path)
    parser, reply, ids = REPLIES[family]
    eot = tokenizer.convert_ids_to_tokens(end_of_turn_id(tokenizer))
    actions = [reply + eot, "<answer> a word </answer>" + eot]
    engine = ScriptedEngine(tokenizer, lambda context, index: actions[index])
    env = PythonEnv(tools=[Lookup()], tool_format="native", tool_parser="auto")
    traj = _run(engine, env, tokenizer)
    assert env.tool_parser == parser  # "auto": named after the template (or its fallback)
    assert traj.metadata["stop_reason"] == "answer" and not traj.metadata["failed"]
    assert env.log.final_answer == "a word"
    assert engine.requests[0].sampling.stop == ()  # the end-of-turn token ends the turn
    messages = PythonEnv(tools=[Lookup()], tool_format="native").reset(TASK)
    prompt = chat.prompt_ids(tokenizer, messages, env.template_tools)
    assert traj.prompt_ids == prompt and "Looks a word up." in tokenizer.decode(prompt)
    # The observation: both results, each its own tool message with its call's id, as
    # the template renders them after the assistant turn.
    observation = tokenizer.decode(traj.turns[0].observation_ids)
    assert observation.index("six: a word") < observation.index("seven: a word")
    assistant = {"role": "assistant", "content": "", "tool_calls": [
        {"id": i, "type": "function", "function": {"name": "lookup", "arguments": {"word": w}}}
        for i, w in zip(ids, ["six", "seven"])]}
    results = [{"role": "tool", "tool_call_id": i, "name": "lookup", "content": f"{w}: a word"}
               for i, w in zip(ids, ["six", "seven"])]
    expected, kept = chat.turn_ids(tokenizer, messages, [assistant, *results],
                                   env.template_tools)
    assert traj.turns[0].observation_ids == expected
    assert traj.metadata["rerendered_turns"] == (not kept) == (family == "qwen3")
    assert list(engine.requests[1].input_ids) == (
        prompt + traj.turns[0].action_ids + expected)


def test_native_demonstration_trains_the_models_own_call_format(tmp_path):
    """SFT data in native mode goes through the same renderer: Llama 3.1 learns its
    `{"name": ..., "parameters": ...}` calls, not hermes tags."""
    tokenizer = chat_tokenizer("llama3.1", tmp_path)
    env = PythonEnv(tools=[Lookup()], tool_format="native", tool_parser="hermes")
    messages = env.reset(TASK)
    first = env.step(_hermes("lookup", word="six"))
    env.step("a word")
    assistant, *results = first.info["messages"]
    demo = Trajectory.from_demonstration(
        tokenizer, messages, [(assistant, results, True),
                              ({"role": "assistant", "content": "a word"}, None, True)],
        tools=env.template_tools)
    text = tokenizer.decode(demo.token_ids[demo.action_mask == 1].tolist())
    assert text == ('{"name": "lookup", "parameters": {"word": "six"}}<|eot_id|>'
                    "a word<|eot_id|>")
    observation = tokenizer.decode(demo.turns[0].observation_ids)
    assert observation == ('<|start_header_id|>ipython<|end_header_id|>\n\n"six: a word"'
                           "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n")


class _OneDoc:
    def search(self, queries, topk):
        return [[Document("d1", "Paris", "Paris is the capital of France.")]]


@pytest.mark.parametrize("closed", [True, False])
def test_tags_observation_after_the_end_of_turn_opens_a_user_message(tmp_path, closed):
    """SmolLM2 ends its turn with <|im_end|> where Search-R1 expects </search>: the
    observation must not follow <|im_end|> outside any message."""
    tokenizer = chat_tokenizer("smollm2", tmp_path)
    first = "<search> France </search>" + ("<|im_end|>" if closed else "")
    engine = ScriptedEngine(tokenizer, lambda c, i: [first, "<answer> Paris </answer>"][i])
    env = SearchEnv(_OneDoc(), max_turns=3)
    traj = _run(engine, env, tokenizer)
    observation = tokenizer.decode(traj.turns[0].observation_ids)
    if closed:
        assert observation.startswith("\n<|im_start|>user\n\n\n<information>")
        assert observation.endswith("</information>\n\n<|im_end|>\n<|im_start|>assistant\n")
    else:  # stopped on </search>: the turn is open, the observation continues it
        assert observation.startswith("\n\n<information>Doc 1")
        assert "<|im_start|>" not in observation
    np.testing.assert_array_equal(traj.action_mask[len(traj.prompt_ids):][:3], [1, 1, 1])
