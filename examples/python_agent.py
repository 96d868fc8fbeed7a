"""The python tool env (agentjax/envs/python) as a plain OpenAI-client agent: the same
prompt, the same sandboxed python tool (the env's own `PythonTool`, under bubblewrap),
the same answer rule and reward, written as any agent outside agentjax would be, so it
trains as `env.name="openai_agent"` (configs/grpo_python_agent.py) and compares with
the built-in env (configs/grpo_python.py, configs/grpo_tools.py).

    python scripts/train.py --config configs/grpo_python_agent.py
"""
import asyncio
import json

from agentjax.envs.python.env import PythonEnv
from agentjax.envs.tools import ToolError

# As configs/grpo_python.py's env.max_turns: model calls, the answering one included.
MAX_TURNS = 3


def run_tool(env: PythonEnv, name: str, arguments: str) -> str:
    """A tool call's result as the built-in env shows it: the output, or the error."""
    try:
        return env.tools[name](json.loads(arguments))
    except ToolError as error:
        return str(error)
    except Exception as error:  # noqa: BLE001 - a bad call is the model's, shown to it
        return f"Tool {name!r} failed: {type(error).__name__}: {error}"


async def agent(client, task):
    """Solve `task` with the python tool; return the answer for the env's reward."""
    env = PythonEnv(tool_format="native")  # the built-in env's prompt, tool and answer rule
    messages = env.initial_messages(task)
    for _ in range(MAX_TURNS):
        reply = await client.chat.completions.create(model="policy", messages=messages,
                                                     tools=env.tool_schemas)
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            return {"answer": env.native_answer(message.content or "", []) or ""}
        for call in message.tool_calls:  # the sandbox blocks: off the event loop
            result = await asyncio.to_thread(run_tool, env, call.function.name,
                                             call.function.arguments)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return {"answer": ""}
