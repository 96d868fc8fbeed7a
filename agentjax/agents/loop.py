"""The multi-turn agent loop: generate → env.step → append observation ids → … .

One episode: the env's initial messages are rendered with the chat template into
prompt ids; each turn the engine samples an action from the exact token context so far
(token-in/token-out: nothing is re-tokenized), the env parses and executes it in a
worker thread (the event loop stays free, so the engine keeps batching other episodes'
requests), and unless the env says done the observation's ids (built by
`trajectory.observation_token_ids`, the same function demonstrations use) are appended.
An env in native tool-calling mode (`template_tools` not None) gets its schemas rendered
into the prompt by the chat template, its `tool_parser` "auto" resolved from the
tokenizer, and each step's messages (`info["messages"]`: the parsed assistant turn and
the tool results answering it) appended as the template renders them
(`trajectory.tool_turn_ids`).
When the episode ends after a turn the policy did not close with the template's
end-of-turn token (it stopped on a stop string such as `</answer>`), that token is
appended as a template token, so the trajectory ends where the chat template ends the
assistant turn.

Context compaction (`limits.compact_at_tokens` > 0): when an observation takes the
context past that many tokens, the episode goes on in a new segment whose prompt is a
fresh chat-template render (never re-tokenized sampled ids) of the env's initial
messages (the system prompt and the task) and a compacted history, by
`limits.compaction`:
  "summary" — the observation is followed by a user message asking for a summary of the
    progress so far (`SUMMARY_REQUEST`); the policy samples it as an action turn of the
    old segment (trained: its tokens are the policy's), and the new segment's prompt
    holds it as the assistant's message, then `SUMMARY_CONTINUE` as the user's;
  "drop" — the old segment ends after the action (its end-of-turn token closes it); the
    new prompt holds every turn so far as chat messages, the observations of all but the
    last `limits.compaction_keep_turns` turns replaced by `DROPPED_OBSERVATION` (as
    SWE-agent's observation masking).
The earlier segments go in `Trajectory.segments`, the trajectory returned is the last
one (core/trajectory.py: one rollout, trained with per-rollout normalization); at most
`limits.max_compactions` happen, after which the context limit applies as without
compaction. `metadata["compactions"]` counts them.

Every way an episode ends is recorded in `metadata["stop_reason"]` (and in
`env.log.stop_reason` when the env did not set one):
  the env's own reason or "done" — the env returned done;
  "max_turns" — `limits.max_turns` actions were taken without done;
  "token_budget" — the context reached `limits.max_context_tokens` (the rollout is
  truncated: core.trajectory.truncated_rollouts counts it and algo.truncated_rollouts
  says what the loss does with it);
  "timeout" — the episode ran past `limits.timeout_s`;
  "env_error" / "engine_error" / "error" — env.reset/step raised, the engine aborted,
  anything else raised. These also set `metadata["failed"] = True` and
  `metadata["error"]`; the partial trajectory is kept, never dropped.
`EnginesUnavailable` alone is raised through: no engine is left to sample from.
"""
from __future__ import annotations

import asyncio
import dataclasses
import traceback
import uuid
from concurrent.futures import Executor
from typing import Any

from agentjax.config.choices import COMPACTIONS
from agentjax.core.task import Task
from agentjax.envs.base import Env
from agentjax.models import chat
from agentjax.models.tokenizer import end_of_turn_id, prompt_ids
from agentjax.engine.protocol import (Engine, EnginesUnavailable, GenerateRequest,
                                     SamplingParams, sampled_versions)
from agentjax.core.trajectory import (Trajectory, Turn, observation_token_ids,
                                     strip_control_text, tool_turn_ids)

SUMMARY_REQUEST = ("Your context is nearly full. Summarize your progress so far: the "
                   "task, what you have found, and what remains to do. Your summary "
                   "will replace the conversation so far.")
SUMMARY_CONTINUE = ("The conversation so far was replaced by your summary above. "
                    "Continue the task.")
DROPPED_OBSERVATION = "(output omitted to save context)"


@dataclasses.dataclass(frozen=True)
class EpisodeLimits:
    """Bounds on one episode.

    Attributes:
      max_turns: most policy turns.
      max_context_tokens: token budget for the whole episode (prompt, actions,
        observations); each turn's max_new_tokens is cut to the room left.
      max_observation_tokens: cut each observation's content to this many tokens
        (Search-R1 uses 500); None keeps it whole.
      timeout_s: wall-clock limit of the episode; None: no limit.
      compact_at_tokens: compact the context when an observation takes it past this
        many tokens (module docstring); 0: never.
      compaction: how, one of COMPACTIONS.
      compaction_keep_turns: "drop": the last this many turns keep their observations.
      max_compactions: most compactions an episode makes.
    """

    max_turns: int = 4
    max_context_tokens: int = 2048
    max_observation_tokens: int | None = None
    timeout_s: float | None = None
    compact_at_tokens: int = 0
    compaction: str = "summary"
    compaction_keep_turns: int = 2
    max_compactions: int = 4

    def __post_init__(self):
        if self.max_turns < 1:
            raise ValueError(f"EpisodeLimits.max_turns must be >= 1, got {self.max_turns}")
        if self.max_context_tokens < 1:
            raise ValueError(
                f"EpisodeLimits.max_context_tokens must be >= 1, got "
                f"{self.max_context_tokens}")
        if not 0 <= self.compact_at_tokens < self.max_context_tokens:
            raise ValueError(
                f"EpisodeLimits.compact_at_tokens must be in [0, max_context_tokens="
                f"{self.max_context_tokens}), got {self.compact_at_tokens}")
        if self.compaction not in COMPACTIONS:
            raise ValueError(f"EpisodeLimits.compaction must be one of {COMPACTIONS}, got "
                             f"{self.compaction!r}")
        for name in ("compaction_keep_turns", "max_compactions"):
            if getattr(self, name) < 1:
                raise ValueError(f"EpisodeLimits.{name} must be >= 1, got "
                                 f"{getattr(self, name)}")


class _EpisodeFailure(Exception):
    """Ends an episode as failed with a given stop reason."""

    def __init__(self, stop_reason: str, message: str):
        super().__init__(message)
        self.stop_reason = stop_reason


def action_text(tokenizer, action_ids) -> str:
    """The text the env parses: the action decoded without end-of-turn/eos/pad tokens.

    Other special tokens (`<search>`, `</answer>`, ...) stay: they are the action.
    """
    template = {end_of_turn_id(tokenizer), tokenizer.eos_token_id, tokenizer.pad_token_id}
    return tokenizer.decode([t for t in action_ids if t not in template],
                            skip_special_tokens=False)


async def run_episode(
    engine: Engine,
    env: Env,
    task: Task,
    sampling: SamplingParams,
    limits: EpisodeLimits,
    tokenizer,
    *,
    group_id: int = 0,
    executor: Executor | None = None,
    session_id: str | None = None,
) -> Trajectory:
    """Plays one episode; always returns a Trajectory (failures are flagged in metadata).

    Args:
      engine: the rollout engine (token ids in, token ids + log-probs out).
      env: a fresh env; `reset` and `step` run in `executor`.
      task: the task to reset the env with.
      sampling: sampling parameters; `n` is forced to 1, the env's stop strings are
        added, and max_new_tokens is cut to the token budget left.
      limits: turn/token/time bounds.
      tokenizer: the policy's tokenizer (agentjax.models.tokenizer).
      group_id: recorded in the trajectory.
      executor: where env calls run (None: the loop's default thread pool).
      session_id: engine session key for KV-cache reuse across turns (None: a fresh
        unique id); the session is ended when the episode ends.
    """
    session_id = session_id or f"episode-{uuid.uuid4().hex}"
    traj = Trajectory(prompt_ids=[], task_id=task.task_id, group_id=group_id, task=task,
                      metadata={"stop_reason": None, "failed": False, "error": None})
    timer = asyncio.timeout(limits.timeout_s)
    try:
        async with timer:
            traj.metadata["stop_reason"] = await _play(
                traj, engine, env, task, sampling, limits, tokenizer, executor, session_id)
    except TimeoutError as error:
        if timer.expired():
            _flag_failure(traj, "timeout", f"episode exceeded timeout_s={limits.timeout_s}")
        else:
            _flag_failure(traj, "error", describe_error(error))
    except _EpisodeFailure as failure:
        _flag_failure(traj, failure.stop_reason, str(failure))
    except EnginesUnavailable:
        raise  # not this episode's failure: nothing can be sampled (engine module docstring)
    except Exception as error:  # noqa: BLE001 - any failure becomes a flagged trajectory
        _flag_failure(traj, "error", describe_error(error))
    finally:
        engine.end_session(session_id)
    log = getattr(env, "log", None)
    if log is not None and getattr(log, "stop_reason", None) is None:
        log.stop_reason = traj.metadata["stop_reason"]
    turns = [turn for part in (*traj.segments, traj) for turn in part.turns]
    traj.metadata.update(
        num_turns=len(turns), compactions=len(traj.segments),
        num_length_cut_turns=sum(t.finish_reason == "length" for t in turns),
        num_tool_calls=getattr(log, "num_tool_calls", 0) if log is not None else 0,
        num_invalid=getattr(log, "num_invalid", 0) if log is not None else 0,
        env_log=log)
    return traj


async def _play(traj, engine, env, task, sampling, limits, tokenizer, executor,
                session_id) -> str:
    """Runs the turns, filling `traj` in place; returns the stop reason."""
    loop = asyncio.get_running_loop()
    tools = getattr(env, "template_tools", None)
    if tools is not None and getattr(env, "tool_parser", None) == "auto":
        env.tool_parser = chat.tool_parser_for(tokenizer)
    initial = list(await _env_call(loop, executor, env.reset, task))
    traj.prompt_ids = _render(tokenizer, initial, tools)
    history = list(initial)  # native tool calling: the conversation as messages
    turn_messages: list[list[dict]] = []  # each env turn as chat messages ("drop")
    context = list(traj.prompt_ids)
    stop = tuple(dict.fromkeys(tuple(sampling.stop) + tuple(env.stop)))
    for turn_index in range(limits.max_turns):
        room = limits.max_context_tokens - len(context)
        if room <= 0:
            return "token_budget"
        turn = await _sample(engine, context, session_id, sampling, stop, room)
        traj.turns.append(turn)
        context.extend(turn.action_ids)
        text = action_text(tokenizer, turn.action_ids)
        result = await _env_call(loop, executor, env.step, text)
        turn.reward = float(result.reward)
        if result.done or turn_index == limits.max_turns - 1:
            _close_last_turn(turn, tokenizer, room=limits.max_context_tokens - len(context))
            if result.done:
                return getattr(env.log, "stop_reason", None) or "done"
            return "max_turns"

        def observation_ids(then=()):
            if tools is None:
                return observation_token_ids(
                    tokenizer, result.observation, role=env.observation_role,
                    action_ids=turn.action_ids, max_tokens=limits.max_observation_tokens,
                    then=then), True
            return tool_turn_ids(
                tokenizer, history, [*result.info["messages"], *then], tools=tools,
                action_ids=turn.action_ids, max_tokens=limits.max_observation_tokens)

        observation, kept = observation_ids()
        if tools is not None:
            # The template re-renders earlier turns otherwise: the trajectory keeps the
            # sampled tokens, and this counts the turns where the two differ.
            traj.metadata["rerendered_turns"] = (
                traj.metadata.get("rerendered_turns", 0) + (not kept))
        if limits.compaction == "drop" and limits.compact_at_tokens:
            turn_messages.append(
                _turn_messages(tokenizer, text, result, env.observation_role,
                               limits.max_observation_tokens) if tools is None
                else [dict(m) for m in result.info["messages"]])
        if (limits.compact_at_tokens and len(traj.segments) < limits.max_compactions
                and len(context) + len(observation) >= limits.compact_at_tokens):
            if limits.compaction == "summary":
                observation, _ = observation_ids(then=[{"role": "user",
                                                        "content": SUMMARY_REQUEST}])
                if len(context) + len(observation) >= limits.max_context_tokens:
                    return "token_budget"
                turn.observation_ids = observation
                context.extend(observation)
                summary = await _sample(engine, context, session_id, sampling,
                                        tuple(sampling.stop),
                                        limits.max_context_tokens - len(context))
                traj.turns.append(summary)
                context.extend(summary.action_ids)
                _close_last_turn(summary, tokenizer,
                                 room=limits.max_context_tokens - len(context))
                compacted = [{"role": "assistant",
                              "content": action_text(tokenizer, summary.action_ids)},
                             {"role": "user", "content": SUMMARY_CONTINUE}]
            else:
                _close_last_turn(turn, tokenizer,
                                 room=limits.max_context_tokens - len(context))
                compacted = _dropped(turn_messages, limits.compaction_keep_turns)
            history = initial + compacted
            context = _new_segment(traj, _render(tokenizer, history, tools))
            continue
        if tools is not None:
            history += result.info["messages"]
        # An observation is appended only when another action can follow it.
        if len(context) + len(observation) >= limits.max_context_tokens:
            return "token_budget"
        turn.observation_ids = observation
        context.extend(observation)
    raise AssertionError("unreachable: the last turn returns max_turns")


async def _sample(engine, context, session_id, sampling, stop, room) -> Turn:
    """One action sampled from the exact `context`, at most `room` tokens."""
    request = GenerateRequest(
        input_ids=tuple(context), session_id=session_id,
        sampling=dataclasses.replace(
            sampling, stop=stop, n=1, max_new_tokens=min(sampling.max_new_tokens, room)))
    completion = (await engine.generate([request]))[0][0]
    if completion.finish_reason == "abort":
        raise _EpisodeFailure(
            "engine_error", f"engine aborted: {completion.meta.get('error', 'no reason')}")
    return Turn(list(completion.output_ids), list(completion.logprobs),
                completion.finish_reason, matched_stop=completion.matched_stop,
                weight_version=completion.meta.get("weight_version"),
                logprob_distribution=completion.meta.get("logprob_distribution",
                                                         "sampling"),
                versions=sampled_versions(completion),
                cached_tokens=completion.meta.get("cached_tokens"))


def _render(tokenizer, messages, tools) -> list[int]:
    """A prompt's ids: `messages` through the chat template, with the generation prompt."""
    return list(prompt_ids(tokenizer, messages) if tools is None
                else chat.prompt_ids(tokenizer, messages, tools))


def _turn_messages(tokenizer, action: str, result, role, max_tokens) -> list[dict]:
    """A text-action turn as chat messages: the action, then the observation as it was
    shown (control text stripped, cut to `max_tokens`) as a `role` message (an inline
    observation as a user message, as `observation_token_ids` opens one after a closed
    turn)."""
    shown = strip_control_text(tokenizer, result.observation)
    if max_tokens is not None:
        ids = tokenizer.encode(shown, add_special_tokens=False)
        if len(ids) > max_tokens:
            shown = tokenizer.decode(ids[:max_tokens])
    return [{"role": "assistant", "content": action},
            {"role": role or "user", "content": shown}]


def _dropped(turns: list[list[dict]], keep: int) -> list[dict]:
    """The turns' messages with the observations of all but the last `keep` turns
    replaced by DROPPED_OBSERVATION (the actions stay)."""
    out = []
    for index, messages in enumerate(turns):
        old = index < len(turns) - keep
        out += [{**m, "content": DROPPED_OBSERVATION}
                if old and m.get("role") != "assistant" else m for m in messages]
    return out


def _new_segment(traj: Trajectory, prompt: list[int]) -> list[int]:
    """Moves `traj`'s tokens so far into a segment of its own (`traj.segments`) and
    starts it again from `prompt`; returns the new context."""
    traj.segments.append(Trajectory(prompt_ids=traj.prompt_ids, turns=traj.turns,
                                    task_id=traj.task_id, group_id=traj.group_id,
                                    task=traj.task))
    traj.prompt_ids, traj.turns = list(prompt), []
    return list(prompt)


def _close_last_turn(turn: Turn, tokenizer, room: int) -> None:
    """Appends the template's end-of-turn token (a template token) after the episode's
    last action unless the policy sampled it or the context is full."""
    eot = end_of_turn_id(tokenizer)
    if turn.action_ids[-1:] != [eot] and room > 0:
        turn.observation_ids = [eot]


async def _env_call(loop, executor, fn, *args) -> Any:
    """Runs an env method in the executor; its exceptions end the episode as env_error."""
    try:
        return await loop.run_in_executor(executor, fn, *args)
    except Exception as error:  # noqa: BLE001
        raise _EpisodeFailure("env_error", describe_error(error)) from error


def _flag_failure(traj: Trajectory, stop_reason: str, message: str) -> None:
    traj.metadata.update(stop_reason=stop_reason, failed=True, error=message)


def describe_error(error: BaseException) -> str:
    """`ExceptionType: message`, as recorded in trajectory metadata."""
    return "".join(traceback.format_exception_only(type(error), error)).strip()
