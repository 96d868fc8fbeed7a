"""The search env in its own format (Search-R1 tags) as a plain OpenAI-client agent, as a
Search-R1 agent is written against an OpenAI-compatible server: the model writes
`<search> query </search>` or `<answer> ... </answer>`, stopped at the closing tag, and
the documents are written into the model's own turn, which the next call continues
(`continue_final_message`, vLLM's and SGLang's extension, in the client's extra_body):
the tokens of configs/grpo_search.py's episodes, so it trains from that recipe's SFT
agent. The agent plays the env it is handed (`env.reset`, `env.step`), so its episode is
scored as the built-in env's, every reward term included (configs/grpo_search_agent.py;
docs/agents.md).
"""
import asyncio

import openai

TAGS = ("search", "answer")


def restore_stop(text: str, finish_reason: str) -> str:
    """The reply as the model wrote it: an OpenAI-compatible server drops the stop string
    that ended it (here a closing tag), so a tag left open is closed again."""
    if finish_reason == "stop":
        for tag in TAGS:
            if text.rfind(f"<{tag}>") > text.rfind(f"</{tag}>"):
                return text + f"</{tag}>"
    return text


async def agent(client, task, env):
    """Search until the model answers, env.max_turns replies are spent or the context is
    full (the server refuses the prompt: the built-in env's token budget)."""
    messages = env.reset(task)
    turn = ""  # the assistant's turn so far: its replies and the documents between them
    while True:
        history = messages + [{"role": "assistant", "content": turn}] if turn else messages
        try:
            reply = await client.chat.completions.create(
                model="policy", messages=history, stop=[f"</{tag}>" for tag in TAGS],
                extra_body={"continue_final_message": True} if turn else None)
        except openai.BadRequestError as error:
            if "maximum context length" in str(error):
                return {"answer": ""}
            raise
        choice = reply.choices[0]
        text = restore_stop(choice.message.content or "", choice.finish_reason)
        result = await asyncio.to_thread(env.step, text)  # a search: off the event loop
        if result.done:
            return {"answer": env.log.final_answer or ""}
        turn += text + result.observation
