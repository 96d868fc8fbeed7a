"""Branch rollouts: episodes that replay a recorded episode's first turns and sample
on from there, so that they share its prefix token for token and differ from the turn
they branch at (turn-level preference pairs: AgentQ, Putta et al. 2024, arXiv
2408.07199, compares actions taken from one shared state).

    groups = branch_rollouts(pool, [(episode, turn), ...], branches, sampling=...)

`ReplayEngine` wraps the pool's engine: a request whose context is, token for token,
the context a recorded episode had before one of its replayed turns gets that turn's
recorded action back (with its log-probs) instead of a sample; any other context goes
to the engine. Nothing in the agent loop changes: the env is reset and stepped with the
replayed actions as in the recorded episode, so a deterministic env gives the same
observations and the context reaches the branch turn, which the engine samples. An env
that answers differently gives another context, which is simply sampled on: such an
episode does not share the prefix, and `shares_prefix` tells the caller.
"""
from __future__ import annotations

from typing import Sequence

from agentjax.engine.protocol import Completion, Engine, GenerateRequest, SamplingParams
from agentjax.agents.pool import RolloutPool
from agentjax.core.trajectory import Trajectory, Turn


def prefix_length(traj: Trajectory, turn: int) -> int:
    """Tokens of `traj` before the action of turn `turn` (0-based): the prompt and the
    earlier turns with their observations."""
    return len(traj.prompt_ids) + sum(len(t.action_ids) + len(t.observation_ids)
                                      for t in traj.turns[:turn])


def shares_prefix(branch: Trajectory, base: Trajectory, turn: int) -> bool:
    """Whether `branch` has `base`'s first `turn` turns token for token and a turn
    `turn` of its own."""
    length = prefix_length(base, turn)
    return (len(branch.turns) > turn
            and branch.token_ids[:length].tolist() == base.token_ids[:length].tolist())


class ReplayEngine:
    """An Engine that answers recorded contexts with their recorded actions and passes
    every other request to `engine` (module docstring)."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self._replies: dict[tuple[int, ...], Turn] = {}

    def add(self, traj: Trajectory, turns: int) -> bool:
        """Replays `traj`'s first `turns` turns for contexts equal to its own before each
        of them. False (and nothing added) when one of those contexts already replays a
        different action (two tasks with one prompt)."""
        context, replies = list(traj.prompt_ids), {}
        for turn in traj.turns[:turns]:
            key = tuple(context)
            known = self._replies.get(key)
            if known is not None and known.action_ids != turn.action_ids:
                return False
            replies[key] = turn
            context += turn.action_ids + turn.observation_ids
        self._replies.update(replies)
        return True

    async def generate(self, requests: Sequence[GenerateRequest]) -> list[list[Completion]]:
        replies = [self._replies.get(tuple(r.input_ids)) for r in requests]
        sampled = [r for r, reply in zip(requests, replies) if reply is None]
        from_engine = iter(await self.engine.generate(sampled) if sampled else [])
        return [[Completion(list(reply.action_ids), list(reply.logprobs), reply.finish_reason,
                            reply.matched_stop,
                            {"weight_version": reply.weight_version, "replayed": True,
                             "logprob_distribution": reply.logprob_distribution})]
                if reply is not None else next(from_engine) for reply in replies]

    def update_weights(self, weights, *, version=None) -> None:
        self.engine.update_weights(weights, version=version)

    def health(self) -> bool:
        return self.engine.health()

    def end_session(self, session_id: str) -> None:
        self.engine.end_session(session_id)


def branch_rollouts(pool: RolloutPool, bases: Sequence[tuple[Trajectory, int]],
                    branches: int, *, sampling: SamplingParams
                    ) -> list[list[Trajectory] | None]:
    """`branches` episodes per (episode, turn) of `bases`, each replaying the episode's
    turns before `turn` and sampling on from turn `turn` (the episodes need their
    `task`). Returns a group per base, None for a base whose prompt another base with
    other actions already replays; a branch whose env answered differently does not
    share the prefix (`shares_prefix`)."""
    engine = ReplayEngine(pool.engine)
    added = [engine.add(traj, turn) for traj, turn in bases]
    tasks = [traj.task for (traj, _), ok in zip(bases, added) if ok]
    if any(task is None for task in tasks):
        raise ValueError("branch_rollouts needs episodes that carry their task")
    with RolloutPool(engine, pool.env_factory, pool.tokenizer, limits=pool.limits,
                     concurrency=pool.concurrency, reward_fn=pool.reward_fn) as branch_pool:
        groups = iter(branch_pool.collect_sync(tasks, branches, sampling=sampling,
                                               first_group_id=0) if tasks else [])
    return [next(groups) if ok else None for ok in added]
