"""Test doubles for the rollout tests: a scripted engine and a scripted toy env."""
from __future__ import annotations

import asyncio
import threading
import time
from typing import Callable, Sequence

from agentjax.core.task import EpisodeLog, Task, TurnLog
from agentjax.envs.base import StepResult
from agentjax.engine.protocol import Completion, GenerateRequest

CORPUS = [
    "You are a helpful agent. Answer the question. Use tools when needed.",
    "Which city is the capital of France? Paris is the capital of France.",
    "The quick brown fox jumps over the lazy dog. The answer is 42.",
    "<search>capital of France</search> <information>Paris</information>",
    "<tool_call>{\"name\": \"lookup\", \"arguments\": {\"q\": \"fox\"}}</tool_call>",
    "<answer>Paris</answer> <think>I should search first.</think>",
    "result: error, tool failed, invalid action, try again",
]


class ScriptedEngine:
    """An Engine whose outputs come from `script(context_ids, request_index)`.

    Each output text is encoded with the tokenizer; log-probs are -0.01 * (k + 1) for the
    k-th output token of the whole run (distinct, so misplaced log-probs are detected).
    Records requests, concurrent callers and ended sessions.
    """

    def __init__(self, tokenizer, script: Callable[[Sequence[int], int], str], *,
                 latency_s: float = 0.0, finish_reason: str = "stop"):
        self.tokenizer = tokenizer
        self.script = script
        self.latency_s = latency_s
        self.finish_reason = finish_reason
        self.requests: list[GenerateRequest] = []
        self.completions: list[Completion] = []
        self.ended_sessions: list[str] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self._lock = threading.Lock()

    async def generate(self, requests):
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if self.latency_s:
                await asyncio.sleep(self.latency_s)
            out = []
            for request in requests:
                with self._lock:
                    index = len(self.requests)
                    self.requests.append(request)
                text = self.script(request.input_ids, index)
                ids = self.tokenizer.encode(text, add_special_tokens=False)
                ids = ids[:request.sampling.max_new_tokens]
                start = sum(len(c.output_ids) for c in self.completions)
                completion = Completion(
                    ids, [-0.01 * (start + k + 1) for k in range(len(ids))],
                    self.finish_reason, None, {})
                self.completions.append(completion)
                out.append([completion])
            return out
        finally:
            self.in_flight -= 1

    def update_weights(self, weights, *, version=None):
        pass

    def health(self):
        return True

    def end_session(self, session_id):
        self.ended_sessions.append(session_id)


class ToyEnv:
    """A deterministic tool env.

    Actions: `<search>q</search>` → observation "<information>" + q reversed +
    "</information>" (inline) or q reversed as a `role` chat turn; `<answer>a</answer>`
    → done. Anything else → "invalid action" observation.

    Args:
      observation_role: None (inline) or a chat role.
      tool_latency_s: sleep in every step (a slow tool).
      fail_on_step: raise RuntimeError at this step index.
      hang: an Event; step blocks until it is set (a hung tool).
      step_reward: reward of every non-final step.
      observation_prefix: text prepended to every observation.
    """

    stop = ("</search>", "</answer>", "</tool_call>")

    def __init__(self, *, observation_role=None, tool_latency_s=0.0, fail_on_step=None,
                 hang: threading.Event | None = None, step_reward=0.0, observation_prefix=""):
        self.observation_role = observation_role
        self.tool_latency_s = tool_latency_s
        self.fail_on_step = fail_on_step
        self.hang = hang
        self.step_reward = step_reward
        self.observation_prefix = observation_prefix
        self.log = EpisodeLog(task=Task("none", ""))
        self.actions: list[str] = []
        self.concurrent = 0

    def reset(self, task: Task):
        self.log = EpisodeLog(task=task)
        self.actions = []
        return [{"role": "system", "content": "You are a helpful agent."},
                {"role": "user", "content": task.question}]

    def step(self, action_text: str) -> StepResult:
        index = len(self.actions)
        self.actions.append(action_text)
        if self.hang is not None:
            self.hang.wait(timeout=60)
        if self.tool_latency_s:
            time.sleep(self.tool_latency_s)
        if self.fail_on_step == index:
            raise RuntimeError(f"tool exploded at step {index}")
        if "<answer>" in action_text and "</answer>" in action_text:
            answer = action_text.split("<answer>")[1].split("</answer>")[0]
            self.log.final_answer = answer
            self.log.turns.append(TurnLog(action_text, "answer"))
            self.log.done, self.log.stop_reason = True, "answer"
            return StepResult("", True, 0.0, {})
        if "<search>" in action_text and "</search>" in action_text:
            query = action_text.split("<search>")[1].split("</search>")[0]
            result = query[::-1]
            observation = (result if self.observation_role else
                           f"<information>{result}</information>")
            self.log.turns.append(TurnLog(action_text, "search", tool_name="search",
                                          tool_args={"q": query}, observation=observation))
        else:
            observation = "invalid action, try again"
            self.log.turns.append(TurnLog(action_text, "invalid", valid=False,
                                          observation=observation))
        return StepResult(self.observation_prefix + observation, False, self.step_reward, {})
