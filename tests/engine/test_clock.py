"""EngineClock counts the seconds no generate call is outstanding (a fake clock)."""
import asyncio

from agentjax.engine.protocol import Completion, GenerateRequest
from agentjax.engine.clock import EngineClock


class _Now:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


class _GatedEngine:
    """Each generate call waits for its own gate; records what it was asked."""

    def __init__(self):
        self.gates, self.weights, self.ended = [], [], []

    async def generate(self, requests):
        gate = asyncio.Event()
        self.gates.append(gate)
        await gate.wait()
        return [[Completion([1], [-0.5], "stop")] for _ in requests]

    def update_weights(self, weights, *, version=None):
        self.weights.append((weights, version))

    def health(self):
        return True

    def end_session(self, session_id):
        self.ended.append(session_id)


def test_idle_time_is_the_time_without_an_outstanding_call():
    now, engine = _Now(), _GatedEngine()
    clock = EngineClock(engine, clock=now)
    request = [GenerateRequest([1, 2])]

    async def scenario():
        now.t = 2.0                                   # idle 0 -> 2
        first = asyncio.ensure_future(clock.generate(request))
        await asyncio.sleep(0)
        now.t = 3.0
        second = asyncio.ensure_future(clock.generate(request))  # overlaps the first
        await asyncio.sleep(0)
        assert clock.idle_s() == 2.0
        now.t = 5.0
        engine.gates[0].set()
        await first
        assert clock.idle_s() == 2.0                  # the second is still out
        now.t = 6.0
        engine.gates[1].set()
        [[completion]] = await second
        assert completion.output_ids == [1]
        now.t = 10.0                                  # idle 6 -> 10

    asyncio.run(scenario())
    assert clock.idle_s() == 6.0
    clock.update_weights("w", version=3)
    clock.end_session("s")
    assert engine.weights == [("w", 3)] and engine.ended == ["s"] and clock.health()
