"""A built-in env's episode as a plain OpenAI-client agent: the env's own prompt, tool
schemas and tools (the search world's retriever, the python env's sandboxed `python`,
the code env's `run`), the model called through the `openai` client with `tools=`, its
tool calls run and answered as `tool` messages, written as any agent outside agentjax
would be. It trains as `env.name="openai_agent"` with `env.agent_tasks` naming the env
(configs/grpo_python_agent.py; the search env in native calls: configs/grpo_search_agent.py
says how) and compares with the built-in env in native tool-call mode (docs/agents.md).

    python scripts/train.py --config configs/grpo_python_agent.py

The runner hands an agent that takes `env` a fresh env of the task env
(envs/openai_agent/runner.py); an agent of your own needs none of it.
"""
import asyncio
import json


def _calls(message) -> list[dict]:
    """The reply's tool calls as the env's answer rule reads them (parsed arguments)."""
    calls = []
    for call in message.tool_calls or ():
        try:
            arguments = json.loads(call.function.arguments)
        except json.JSONDecodeError:
            arguments = {}
        calls.append({"id": call.id, "type": "function",
                      "function": {"name": call.function.name, "arguments": arguments}})
    return calls


async def agent(client, task, env):
    """Play `task` as the built-in env would: at most env.max_turns model calls, the
    last of which must answer; return the answer for the env's reward."""
    messages = env.initial_messages(task)
    for turn in range(env.max_turns):
        reply = await client.chat.completions.create(model="policy", messages=messages,
                                                     tools=env.template_tools)
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        calls = _calls(message)
        if not calls or any(c["function"]["name"] == env.answer_tool for c in calls):
            return {"answer": env.native_answer(message.content or "", calls) or ""}
        if turn + 1 == env.max_turns:  # calls on the last turn: no answer, as the env
            break
        for call in message.tool_calls:  # tools may block (a sandbox): off the event loop
            result = await asyncio.to_thread(env.run_tool, call.function.name,
                                             call.function.arguments)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return {"answer": ""}
