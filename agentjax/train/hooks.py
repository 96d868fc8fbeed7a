"""What runs after an RL step, each at its own interval: evaluation, logging (with the
failure warnings), checkpoints.

    hooks = [Hook(config.eval.every, evaluate), Hook(config.log.every, log), ...]
    for step in ...:
        state, metrics = rl_step(state, groups, step)
        run_hooks(hooks, step + 1, last_step, state, metrics)

Hooks run in list order, so a later one sees what an earlier one did (the log row holds
the evaluation's metrics; the checkpoint holds the last evaluation).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence


@dataclasses.dataclass(frozen=True)
class Hook:
    """`fn(step, state, metrics)` at every `every`-th step and at the last step (only at
    the last when `every` is 0)."""

    every: int
    fn: Callable[[int, Any, dict], None]

    def due(self, step: int, last_step: int) -> bool:
        return step == last_step or bool(self.every and step % self.every == 0)


def run_hooks(hooks: Sequence[Hook], step: int, last_step: int, state, metrics: dict) -> None:
    """Runs the hooks due at `step` (1-based: the number of steps done), in order."""
    for hook in hooks:
        if hook.due(step, last_step):
            hook.fn(step, state, metrics)
