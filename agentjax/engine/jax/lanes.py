"""LanedEngine: several JaxEngines ("lanes") behind one Engine, to use more CPU cores.

    engine = LanedEngine.from_model(model, lanes=2, tokenizer=tok, max_slots=32, max_len=160)

XLA:CPU runs a decode program of a few dozen rows on about one core (its time grows
with its rows), and programs dispatched from one thread run one after another; but
programs launched from different threads overlap. Each lane is a JaxEngine with its own
KV page pool (for max_slots / lanes sequences), weights copy and scheduler thread, so the lanes'
prefill and decode rounds run concurrently, one core each (scripts/bench/rollout.py
measures lanes against one engine).

Routing: a request with a session id goes to the lane that holds the session, so its
KV cache is reused; a new session or a request without one goes to the least loaded lane
(sessions held plus session-less requests in flight; ties: the lowest index). A session
holds its row until `end_session`, so balancing held sessions keeps every lane within its
rows whenever the sessions open at once fit in max_slots. Every lane has the same
settings and program shapes, so with `deterministic=True` a seeded request's output does
not depend on the lane it lands in.
"""
from __future__ import annotations

import asyncio
from typing import Any, Sequence

from flax import nnx

from agentjax.engine.protocol import Completion, GenerateRequest
from agentjax.engine.jax.engine import JaxEngine


class LanedEngine:
    """Engine protocol over `lanes` JaxEngines (module docstring).

    Args:
      engines: the lanes (same model and settings).
    """

    def __init__(self, engines: Sequence[JaxEngine]):
        if not engines:
            raise ValueError("LanedEngine needs at least one lane")
        self.lanes = list(engines)
        self._load = [0] * len(self.lanes)  # sessions held + session-less requests running
        self._session_lane: dict[str, int] = {}

    @classmethod
    def build(cls, graphdef: nnx.GraphDef, params: Any, *, lanes: int = 2, max_slots: int,
              seed: int = 0, **kwargs) -> "LanedEngine":
        """`lanes` JaxEngines of `max_slots // lanes` rows each; args as JaxEngine's.
        Lane i's stream for unseeded requests is seeded `seed * lanes + i`: the lanes of
        one engine, and of engines built with other seeds, never share a stream."""
        if lanes < 1 or max_slots % lanes:
            raise ValueError(f"max_slots={max_slots} must split evenly over lanes={lanes}")
        return cls([JaxEngine(graphdef, params, max_slots=max_slots // lanes,
                              seed=seed * lanes + i, **kwargs) for i in range(lanes)])

    @classmethod
    def from_model(cls, model: nnx.Module, **kwargs) -> "LanedEngine":
        """`build` from a Decoder (`nnx.split` is applied)."""
        return cls.build(*nnx.split(model), **kwargs)

    def _lane_of(self, request: GenerateRequest) -> int:
        """The request's lane; counts a new session or a session-less request as load."""
        if request.session_id in self._session_lane:
            return self._session_lane[request.session_id]
        lane = min(range(len(self.lanes)), key=lambda i: (self._load[i], i))
        self._load[lane] += 1
        if request.session_id is not None:
            self._session_lane[request.session_id] = lane
        return lane

    async def generate(self, requests: Sequence[GenerateRequest]) -> list[list[Completion]]:
        """Samples every request; returns its `n` completions per request, in order."""
        by_lane: dict[int, list[int]] = {}
        for index, request in enumerate(requests):
            by_lane.setdefault(self._lane_of(request), []).append(index)

        async def run(lane: int, indices: list[int]):
            try:
                return await self.lanes[lane].generate([requests[i] for i in indices])
            finally:
                self._load[lane] -= sum(requests[i].session_id is None for i in indices)

        results = await asyncio.gather(*(run(lane, idx) for lane, idx in by_lane.items()))
        out: list[list[Completion] | None] = [None] * len(requests)
        for indices, completions in zip(by_lane.values(), results):
            for i, completion in zip(indices, completions):
                out[i] = completion
        return out

    def generate_sync(self, requests: Sequence[GenerateRequest]) -> list[list[Completion]]:
        """`generate` for callers without an event loop."""
        return asyncio.run(self.generate(requests))

    def update_weights(self, weights: Any, *, version: int | None = None) -> None:
        """Swaps the weights of every lane (JaxEngine.update_weights); sessions end."""
        for lane in self.lanes:
            lane.update_weights(weights, version=version)
        for lane in self._session_lane.values():
            self._load[lane] -= 1
        self._session_lane.clear()

    def health(self) -> bool:
        return all(lane.health() for lane in self.lanes)

    def end_session(self, session_id: str) -> None:
        lane = self._session_lane.pop(session_id, None)
        if lane is not None:
            self._load[lane] -= 1
            self.lanes[lane].end_session(session_id)

    def warmup(self) -> int:
        """Compiles every lane's programs (shared by the lanes: same shapes); returns how
        many programs one lane calls."""
        return max(lane.warmup() for lane in self.lanes)

    @property
    def compile_counts(self) -> dict[str, int]:
        return self.lanes[0].compile_counts

    def close(self) -> None:
        for lane in self.lanes:
            lane.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
