"""Exact multi-turn trajectories and their collation into fixed-shape training batches.

A `Trajectory` stores the token ids exactly as the engine sampled them and as the env's
observations were appended — never re-tokenized text (re-tokenizing decoded text can
change the ids, and then the trained tokens are not the ones the policy sampled).
Layout of one episode:

    prompt_ids | turn 1: action_ids, observation_ids | turn 2: action_ids, ... | turn K

`action_mask` is 1 exactly on the sampled tokens of trainable turns; 0 on the prompt, on
observations (including their chat-template tokens and tags such as `<information>`), on
template tokens the loop inserted (an end-of-turn token appended after a stop string)
and on padding. Turn-ending tokens the policy sampled itself (`</search>`, `<|im_end|>`)
are action tokens (mask 1), and so are a demonstration's end-of-turn tokens (see
`Trajectory.from_demonstration`). Each row of a batch has its own mask pattern.

`observation_token_ids` is the single function that turns an env observation into the
ids appended after an action: the agent loop and `Trajectory.from_demonstration` both
call it, so a demonstration has exactly the ids an episode with the same actions has.

`collate` pads a list of trajectories to the smallest bucket length that fits the
longest one, with arrays aligned for next-token prediction (position t predicts
`targets[t] = token_ids[t + 1]`). Truncation rule for an episode longer than the largest
bucket T: its first T + 1 tokens are kept (inputs `token_ids[:T]`, targets
`token_ids[1:T+1]`), the row is flagged in `truncated`, masks and log-probs stay exact on
the kept part, and no reward is lost: rewards of turns whose last action token was cut
(and the final reward) land on the last kept action token, so `rewards.sum(-1) ==
seq_rewards` whenever a row keeps at least one action token.

A rollout whose context was rewritten between two model calls (an agent that trimmed
or summarized its history, a compacted context) is not one token sequence: it is a
`Trajectory` holding its earlier `segments`, each a Trajectory of its own tokens.
`collate` gives every segment a row of its own and every row of a rollout the same
`rollout_ids` entry; the segments share the rollout's group and reward (on its last
segment), and `rl.segments` makes advantages and the loss count the rollout once.

No rollout is cut silently. A rollout is truncated when the agent loop stopped it at the
context limit (`TRUNCATION_STOPS`) or `collate` cut one of its rows at the largest
bucket; `truncated_rollouts` finds them, the RL step counts them and, with
algo.truncated_rollouts = "mask", `mask_rollouts` takes them out of the loss.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

import numpy as np

from agentjax.core.task import Task
from agentjax.models import chat
from agentjax.models.tokenizer import end_of_turn_id, observation_ids, prompt_ids
from agentjax.config.choices import LOGPROB_DISTRIBUTIONS

FINISH_REASONS = ("stop", "length", "abort")
# The agent loop's stop reasons that cut a rollout short (agents/loop.py).
TRUNCATION_STOPS = ("token_budget",)


@dataclasses.dataclass
class Turn:
    """One policy turn and what the loop appended after it.

    Attributes:
      action_ids: the token ids the policy sampled this turn (stop string/id included).
      logprobs: behavior log-prob of each action token, aligned with `action_ids`,
        under `logprob_distribution`.
      finish_reason: the engine's finish reason ("stop", "length" or "abort").
      observation_ids: ids appended after the action before the next turn (template
        tokens, the observation, the next assistant header); after the last turn, the
        template's end-of-turn token when the policy did not sample it (else empty).
      trainable: False excludes this turn's action tokens from the loss (action_mask 0),
        e.g. an invalid action in an SFT demonstration.
      reward: the env's step reward for this turn.
      matched_stop: the stop id or string that ended the turn, if any.
      weight_version: the engine's version of the weights that sampled the turn.
      logprob_distribution: which distribution `logprobs` are under
        (`config.choices.LOGPROB_DISTRIBUTIONS`; an engine that does not say reports "sampling",
        the Engine protocol's original contract).
      versions: the weight version that sampled each action token (an asynchronous run
        may swap weights mid-turn); empty when the engine reports none.
      cached_tokens: how many of the turn's context ids the engine took from its cache
        (a session's pages, a shared context) rather than computing them; None when the
        engine does not say.
    """

    action_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    observation_ids: list[int] = dataclasses.field(default_factory=list)
    trainable: bool = True
    reward: float = 0.0
    matched_stop: int | str | None = None
    weight_version: int | str | None = None
    logprob_distribution: str = "sampling"
    versions: list[int] = dataclasses.field(default_factory=list)
    cached_tokens: int | None = None

    def __post_init__(self):
        for name in ("logprobs",) + (("versions",) if self.versions else ()):
            if len(getattr(self, name)) != len(self.action_ids):
                raise ValueError(
                    f"Turn.{name} has {len(getattr(self, name))} entries but action_ids "
                    f"has {len(self.action_ids)}")
        if self.finish_reason not in FINISH_REASONS:
            raise ValueError(
                f"Turn.finish_reason must be one of {FINISH_REASONS}, got "
                f"{self.finish_reason!r}")
        if self.logprob_distribution not in LOGPROB_DISTRIBUTIONS:
            raise ValueError(
                f"Turn.logprob_distribution must be one of {LOGPROB_DISTRIBUTIONS}, got "
                f"{self.logprob_distribution!r}")


@dataclasses.dataclass
class Trajectory:
    """One episode as exact token ids plus rewards and bookkeeping.

    Attributes:
      prompt_ids: the rendered prompt (chat template with the generation prompt).
      turns: the policy turns in order.
      final_reward: the episode's outcome reward (reward_fn(task, log) total).
      task_id: the task's id.
      group_id: the GRPO group this episode belongs to (same task, same group).
      task: the Task itself, when known.
      metadata: stop_reason, failed, error, reward_components, num_tool_calls, the
        env's EpisodeLog under "env_log", ...
      segments: the rollout's earlier segments, in order, when its context was
        rewritten between calls (module docstring): this trajectory is its last segment
        and carries its reward and metadata; each earlier one is a Trajectory of its
        own tokens (no reward, no segments of its own).
    """

    prompt_ids: list[int]
    turns: list[Turn] = dataclasses.field(default_factory=list)
    final_reward: float = 0.0
    task_id: str = ""
    group_id: int = 0
    task: Task | None = None
    metadata: dict[str, Any] = dataclasses.field(default_factory=dict)
    segments: list["Trajectory"] = dataclasses.field(default_factory=list)

    def _segments(self):
        """Yields (ids, logprobs or None, mask value, turn id) in token order."""
        yield self.prompt_ids, None, 0, 0
        for index, turn in enumerate(self.turns, start=1):
            yield turn.action_ids, turn.logprobs, int(turn.trainable), index
            yield turn.observation_ids, None, 0, index

    @property
    def token_ids(self) -> np.ndarray:
        """All ids in order, int32 [L]."""
        return np.asarray(
            [t for ids, _, _, _ in self._segments() for t in ids], dtype=np.int32)

    @property
    def action_mask(self) -> np.ndarray:
        """1 on sampled tokens of trainable turns, else 0; int32 [L]."""
        return np.asarray(
            [m for ids, _, m, _ in self._segments() for _ in ids], dtype=np.int32)

    @property
    def behavior_logp(self) -> np.ndarray:
        """The engine's log-prob on sampled tokens of trainable turns, else 0; f32 [L]."""
        out = []
        for ids, logprobs, mask, _ in self._segments():
            out.extend(logprobs if (logprobs is not None and mask) else [0.0] * len(ids))
        return np.asarray(out, dtype=np.float32)

    @property
    def turn_ids(self) -> np.ndarray:
        """0 on the prompt; k on turn k's action and the observation after it; int32 [L]."""
        return np.asarray(
            [k for ids, _, _, k in self._segments() for _ in ids], dtype=np.int32)

    @property
    def num_action_tokens(self) -> int:
        """Number of tokens with action_mask 1."""
        return sum(len(t.action_ids) for t in self.turns if t.trainable)

    @property
    def total_reward(self) -> float:
        """final_reward plus every turn's reward (what `collate` puts in seq_rewards)."""
        return float(self.final_reward) + sum(float(t.reward) for t in self.turns)

    @property
    def rollout_action_tokens(self) -> int:
        """Action tokens of the whole rollout: this segment's and its earlier ones'."""
        return self.num_action_tokens + sum(s.num_action_tokens for s in self.segments)

    @property
    def num_tokens(self) -> int:
        """Length of `token_ids`."""
        return len(self.prompt_ids) + sum(
            len(t.action_ids) + len(t.observation_ids) for t in self.turns)

    def reward_positions(self) -> list[tuple[int, float]]:
        """(token index, reward) pairs placing every nonzero reward on an action token.

        A turn's reward goes on the last trainable action token at or before the end of
        that turn (its own last action token when it is trainable); rewards that come
        before any trainable action token wait for the first one. The final reward goes
        on the last trainable action token. Without trainable action tokens the list is
        empty.
        """
        positions, pending, cursor, last_action = [], [], len(self.prompt_ids), None
        for turn in self.turns:
            if turn.trainable and turn.action_ids:
                last_action = cursor + len(turn.action_ids) - 1
            if turn.reward:
                pending.append(float(turn.reward))
            if last_action is not None:
                positions.extend((last_action, r) for r in pending)
                pending = []
            cursor += len(turn.action_ids) + len(turn.observation_ids)
        if last_action is not None and self.final_reward:
            positions.append((last_action, float(self.final_reward)))
        return positions

    @classmethod
    def from_demonstration(
        cls,
        tokenizer,
        messages: Sequence[Mapping[str, str]],
        turns: Sequence[tuple[str, str | None, bool]],
        *,
        observation_role: str | None = None,
        reward: float = 0.0,
        max_observation_tokens: int | None = None,
        task: Task | None = None,
        group_id: int = 0,
        tools: Sequence[Mapping] | None = None,
    ) -> "Trajectory":
        """Builds the trajectory the agent loop would record for the given actions.

        The token ids are those of an episode whose policy sampled these actions, with
        one difference in the mask: every assistant turn the chat template closes (one
        followed by a chat-role observation, and the last turn) ends with the template's
        end-of-turn token as a trainable action token, appended when the action text
        does not end with it. An episode whose turn stopped on a stop string (`</answer>`,
        `</tool_call>`) gets the same token as a template token instead (the engine never
        sampled it, so it has no behavior log-prob); only demonstrations can teach the
        model to end its turn where the template ends it, so that a trained model stops
        there without stop strings.

        Args:
          tokenizer: the policy's tokenizer (agentjax.models.tokenizer).
          messages: the initial chat messages (what `env.reset` returns).
          turns: per policy turn `(action_text, observation_text, trainable)`;
            observation_text None means the episode ended after that action. The action
            text is encoded as the model would have produced it: special tokens written
            in it (e.g. `<|im_end|>`) become their ids; a stop string is simply part of
            the text. Log-probs are 0 (demonstrations have no behavior policy).
          observation_role: as `Env.observation_role` (None: inline observations).
            Native tool-calling turns (`tools` given) have an assistant message as the
            action and the list of messages that answered it (tool results, or a user
            message) as the observation: the action is written as the template writes
            that message (`models.chat.assistant_text`: the model's own call format) and
            the observation is the rendered delta (`tool_turn_ids`), as in an episode.
          tools: the function schemas of a native episode (None: text actions).
          reward: the final reward.
          max_observation_tokens: as `EpisodeLimits.max_observation_tokens`.
          task: the task (its id becomes task_id).
          group_id: the group id.
        """
        eot = end_of_turn_id(tokenizer)
        built, history = [], list(messages)
        for index, (action_text, observation, trainable) in enumerate(turns):
            if observation is None and index != len(turns) - 1:
                raise ValueError(
                    f"turns[{index}] has no observation but is not the last turn")
            if tools is not None:
                text = chat.assistant_text(tokenizer, history, action_text, tools)
                action_ids = list(tokenizer.encode(text, add_special_tokens=False))
                obs_ids = [] if observation is None else tool_turn_ids(
                    tokenizer, history, [action_text, *observation], tools=tools,
                    action_ids=action_ids, max_tokens=max_observation_tokens)[0]
                history += [action_text, *(observation or [])]
                built.append(Turn(action_ids, [0.0] * len(action_ids), "stop", obs_ids,
                                  trainable=bool(trainable)))
                continue
            action_ids = list(tokenizer.encode(action_text, add_special_tokens=False))
            turn_closed = observation is None or observation_role is not None
            if turn_closed and action_ids[-1:] != [eot]:
                action_ids.append(eot)
            obs_ids = [] if observation is None else observation_token_ids(
                tokenizer, observation, role=observation_role, action_ids=action_ids,
                max_tokens=max_observation_tokens)
            built.append(Turn(action_ids, [0.0] * len(action_ids), "stop", obs_ids,
                              trainable=bool(trainable)))
        prompt = (chat.prompt_ids(tokenizer, list(messages), tools) if tools is not None
                  else prompt_ids(tokenizer, list(messages)))
        return cls(
            prompt_ids=list(prompt), turns=built,
            final_reward=float(reward), task_id=task.task_id if task else "",
            group_id=group_id, task=task, metadata={"demonstration": True})

    @classmethod
    def from_text(cls, tokenizer, text: str) -> "Trajectory":
        """A plain document, eos-terminated, with every token but the first trainable
        (language-model pretraining through the same packing and loss as SFT)."""
        ids = list(tokenizer.encode(text, add_special_tokens=False)) + [tokenizer.eos_token_id]
        return cls(prompt_ids=ids[:1], turns=[Turn(ids[1:], [0.0] * (len(ids) - 1), "stop")],
                   metadata={"text": True})


def strip_control_text(tokenizer, text: str) -> str:
    """Removes the text of the tokenizer's special (control) tokens from `text`.

    Env output is untrusted: a document containing "<|im_end|>" must not become a
    control token that closes the turn. Agent tags such as `<information>` are not
    control tokens and stay.
    """
    for token in tokenizer.added_tokens_decoder.values():
        if token.special and token.content in text:
            text = text.replace(token.content, "")
    return text


def observation_token_ids(
    tokenizer,
    observation: str,
    *,
    role: str | None,
    action_ids: Sequence[int],
    max_tokens: int | None = None,
    then: Sequence[Mapping[str, str]] = (),
) -> list[int]:
    """The ids appended after an action whose env returned `observation`.

    Args:
      tokenizer: the policy's tokenizer (agentjax.models.tokenizer).
      observation: the env's observation text; control-token text is stripped from it
        (`strip_control_text`).
      role: None for an inline observation (encoded on its own, appended inside the
        assistant turn, Search-R1 style); a chat role ("tool", "user") for a new chat
        turn, whose ids come from the chat template (`models.tokenizer.observation_ids`:
        the turn plus the next assistant header). If the action did not end with the
        template's end-of-turn token (it stopped on a stop string or ran out of tokens),
        that token is prepended here as a template token. An inline observation stays
        inline only while the assistant turn is open (the action stopped on a stop
        string or was cut); after an action that ended its turn (its last id is the
        end-of-turn token or the eos), text would otherwise follow the turn's end
        outside any message, so it opens a `user` message instead: every chat template
        renders `user` (a `tool` message needs a tool call to answer, and some templates
        refuse one without its call id).
      action_ids: the action the observation follows.
      max_tokens: cut the observation's content to this many tokens (None: no cut).
        A cut chat observation is re-encoded from its decoded prefix, which is fine
        because the trajectory records the ids actually fed to the policy.
      then: messages that follow the observation before the next assistant header (the
        loop's own request, e.g. the summary request of a context compaction); an
        inline observation's assistant turn is then closed with the end-of-turn token
        (a template token) before them.
    """
    observation = strip_control_text(tokenizer, observation)
    content_ids = list(tokenizer.encode(observation, add_special_tokens=False))
    cut = max_tokens is not None and len(content_ids) > max_tokens
    ended = len(action_ids) and action_ids[-1] in (end_of_turn_id(tokenizer),
                                                   tokenizer.eos_token_id)
    eot = end_of_turn_id(tokenizer)
    if role is None and not ended:
        inline = content_ids[:max_tokens] if cut else content_ids
        if not then:
            return inline
        first, *rest = then
        return inline + [eot] + list(observation_ids(tokenizer, first["content"],
                                                     first["role"], then=rest))
    role = role or "user"
    if cut:
        observation = tokenizer.decode(content_ids[:max_tokens])
    prefix = [] if (len(action_ids) and action_ids[-1] == eot) else [eot]
    return prefix + list(observation_ids(tokenizer, observation, role, then=then))


def tool_turn_ids(
    tokenizer,
    history: Sequence[Mapping],
    turn: Sequence[Mapping],
    *,
    tools: Sequence[Mapping] | None,
    action_ids: Sequence[int],
    max_tokens: int | None = None,
) -> tuple[list[int], bool]:
    """The ids appended after a native tool-calling action: what the chat template
    renders after the assistant turn `turn[0]` for the messages `turn[1:]` (each tool
    result its own message) and the next generation prompt (`models.chat.turn_ids`).

    Args:
      tokenizer: the policy's tokenizer.
      history: the conversation before the action (initial messages, earlier turns).
      turn: the assistant message as parsed (content and tool_calls with ids) and the
        messages that answer it.
      tools: the function schemas the prompt was rendered with.
      action_ids: the sampled action; when it does not end with the end-of-turn token
        (cut by max_tokens) that token is prepended as a template token.
      max_tokens: cut each answering message's content to this many tokens.

    Returns:
      (ids, prefix_kept) as `models.chat.turn_ids`.
    """
    answers = []
    for message in turn[1:]:
        content = strip_control_text(tokenizer, str(message.get("content", "")))
        content_ids = tokenizer.encode(content, add_special_tokens=False)
        if max_tokens is not None and len(content_ids) > max_tokens:
            content = tokenizer.decode(content_ids[:max_tokens])
        answers.append({**message, "content": content})
    ids, kept = chat.turn_ids(tokenizer, history, [turn[0], *answers], tools)
    eot = end_of_turn_id(tokenizer)
    prefix = [] if (len(action_ids) and action_ids[-1] == eot) else [eot]
    return prefix + ids, kept


def bucket_length(needed: int, buckets: Sequence[int]) -> int:
    """The smallest bucket >= needed, else the largest bucket (the row is truncated)."""
    if not buckets or any(int(b) <= 0 for b in buckets):
        raise ValueError(f"buckets must be positive lengths, got {buckets!r}")
    ordered = sorted(int(b) for b in buckets)
    for length in ordered:
        if length >= needed:
            return length
    return ordered[-1]


def rollout_rows(trajectories: Sequence[Trajectory],
                 max_segments: int | None = None) -> tuple[list[Trajectory], list[int], int]:
    """The rows of rollouts: each rollout's earlier segments, then itself.

    Args:
      trajectories: the rollouts.
      max_segments: most rows per rollout; a rollout of more segments keeps its last
        `max_segments` (the earlier ones are dropped and counted). None: all.

    Returns:
      (rows, rollout index of each row, segments dropped).
    """
    if max_segments is not None and max_segments < 1:
        raise ValueError(f"max_segments must be >= 1, got {max_segments}")
    rows, owners, dropped = [], [], 0
    for index, traj in enumerate(trajectories):
        parts = [*traj.segments, traj]
        if max_segments is not None and len(parts) > max_segments:
            dropped += len(parts) - max_segments
            parts = parts[-max_segments:]
        rows += parts
        owners += [index] * len(parts)
    return rows, owners, dropped


def collate(
    trajectories: Sequence[Trajectory],
    *,
    buckets: Sequence[int],
    pad_id: int,
    batch_size: int | None = None,
    max_segments: int | None = None,
) -> dict[str, np.ndarray]:
    """Pads trajectories into fixed-shape arrays aligned for next-token prediction.

    Position t of a row holds input `token_ids[t]` and predicts `targets[t] =
    token_ids[t + 1]`; every per-token quantity (action_mask, behavior_logp, rewards,
    turn_ids) is aligned with `targets`. A trajectory of L tokens uses L - 1 positions.
    See the module docstring for the truncation rule.

    Args:
      trajectories: the episodes (rollouts), one row each, or one row per segment of a
        segmented rollout (`rollout_rows`), all its rows with its group id.
      buckets: allowed lengths T; the smallest that fits the longest row is used, so
        jit sees only len(buckets) shapes.
      pad_id: token id written on padding.
      batch_size: pad the batch with empty rows (segment_ids 0, group_ids -1) up to this
        many rows; None: exactly one row per trajectory segment.
      max_segments: most rows per rollout (`rollout_rows`); None: every segment.

    Returns:
      inputs, targets, positions, segment_ids (1 on real positions, 0 on padding),
      turn_ids: int32 [B, T]; action_mask, behavior_logp, rewards: float32 [B, T];
      seq_rewards: float32 [B] (final + turn rewards of the whole episode);
      group_ids: int32 [B]; rollout_ids: int32 [B] (the index of the row's rollout in
      `trajectories`, -1 on padding); truncated: bool [B].
    """
    original = trajectories
    trajectories, owners, _ = rollout_rows(trajectories, max_segments)
    rows = len(trajectories)
    if batch_size is None:
        batch_size = rows
    if rows > batch_size:
        raise ValueError(f"got {rows} trajectories for batch_size={batch_size}")
    if batch_size == 0:
        raise ValueError("collate needs at least one row")
    length = bucket_length(max([t.num_tokens - 1 for t in trajectories] + [1]), buckets)

    out = {
        "inputs": np.full((batch_size, length), pad_id, np.int32),
        "targets": np.full((batch_size, length), pad_id, np.int32),
        "positions": np.zeros((batch_size, length), np.int32),
        "segment_ids": np.zeros((batch_size, length), np.int32),
        "turn_ids": np.zeros((batch_size, length), np.int32),
        "action_mask": np.zeros((batch_size, length), np.float32),
        "behavior_logp": np.zeros((batch_size, length), np.float32),
        "rewards": np.zeros((batch_size, length), np.float32),
        "seq_rewards": np.zeros((batch_size,), np.float32),
        "group_ids": np.full((batch_size,), -1, np.int32),
        "rollout_ids": np.full((batch_size,), -1, np.int32),
        "truncated": np.zeros((batch_size,), bool),
    }
    for row, (traj, owner) in enumerate(zip(trajectories, owners)):
        ids = traj.token_ids
        used = max(min(len(ids) - 1, length), 0)
        # Per-token arrays are indexed by the token they describe; shifting by one
        # aligns them with the position that predicts that token.
        out["inputs"][row, :used] = ids[:used]
        out["targets"][row, :used] = ids[1:used + 1]
        out["positions"][row, :used] = np.arange(used)
        out["segment_ids"][row, :used] = 1
        out["turn_ids"][row, :used] = traj.turn_ids[1:used + 1]
        out["action_mask"][row, :used] = traj.action_mask[1:used + 1]
        out["behavior_logp"][row, :used] = traj.behavior_logp[1:used + 1]
        kept_actions = np.flatnonzero(out["action_mask"][row, :used])
        for token_index, reward in traj.reward_positions():
            position = token_index - 1
            if position >= used:
                if not len(kept_actions):
                    continue
                position = kept_actions[-1]
            out["rewards"][row, position] += reward
        out["seq_rewards"][row] = traj.total_reward
        out["group_ids"][row] = original[owner].group_id
        out["rollout_ids"][row] = owner
        out["truncated"][row] = len(ids) - 1 > length
    return out


def truncated_rollouts(trajectories: Sequence[Trajectory], batch: Mapping[str, np.ndarray]
                       ) -> np.ndarray:
    """bool [R]: rollout r was cut short, its stop reason one of TRUNCATION_STOPS or a row
    of it cut by `collate` (`batch`: the collated `trajectories`, its `truncated` and
    `rollout_ids`)."""
    cut = np.array([t.metadata.get("stop_reason") in TRUNCATION_STOPS
                    for t in trajectories], bool)
    rows = np.asarray(batch["rollout_ids"]) >= 0
    cut[np.asarray(batch["rollout_ids"])[rows & np.asarray(batch["truncated"])]] = True
    return cut


def mask_rollouts(batch: dict[str, np.ndarray], rollouts: np.ndarray) -> int:
    """Zeroes the action mask of every row of the rollouts flagged in `rollouts` (bool
    [R]): out of the loss, their rewards still in their groups' statistics. Returns the
    rows masked."""
    ids = batch["rollout_ids"]
    rows = (ids >= 0) & np.asarray(rollouts, bool)[np.clip(ids, 0, None)]
    batch["action_mask"][rows] = 0
    return int(rows.sum())
