"""The one training loop every stage runs (pretraining, SFT, RL, RFT, DPO), with hooks
at their own intervals.

    state = fit(runtime, stage, state, checkpoint_every=N)   # stage: a Stage

One step of `fit`, after restoring the stage's last committed checkpoint (or starting)
and handing the stage its host state (`stage.resume`):
    data = stage.draw(state, step)             # the step's data (rollouts, packed rows)
    state, metrics = stage.train(state, data, step)
    non-finite guard                            # optim.on_nonfinite, when stage.optim is set
    stage.after_update(state, data, step, metrics)  # hand the weights to the rollouts
    hooks due: stage.hooks (evaluation), log, checkpoint

A rollout that stops for good during `draw` (servers down, the async producer failed)
saves a checkpoint of the step it would have trained, so a rerun continues exactly there;
after `draw` the state holds an update whose log row is not written yet, and a rerun
repeats from the last checkpoint, which reproduces it.
"""
from __future__ import annotations

import abc
import dataclasses
from typing import Any, Callable, Sequence

from agentjax.agents.sources import RolloutProducerError
from agentjax.engine.protocol import EnginesUnavailable
from agentjax.train.runtime import Runtime

# The rollout stopped: checkpoint where a rerun continues, then stop the run.
ROLLOUT_STOPPED = (EnginesUnavailable, RolloutProducerError)


class TrainingDiverged(RuntimeError):
    """Optimizer updates stayed non-finite for optim.max_nonfinite_steps steps."""


@dataclasses.dataclass(frozen=True)
class Hook:
    """`fn(step, state, metrics)` at every `every`-th step and at the last step (only at
    the last when `every` is 0)."""

    every: int
    fn: Callable[[int, Any, dict], None]

    def due(self, step: int, last_step: int) -> bool:
        return step == last_step or bool(self.every and step % self.every == 0)


def run_hooks(hooks: Sequence[Hook], step: int, last_step: int, state, metrics: dict) -> None:
    """Runs the hooks due at `step` (1-based: the number of steps done), in order, so a
    later one sees what an earlier one did (the log row holds the evaluation)."""
    for hook in hooks:
        if hook.due(step, last_step):
            hook.fn(step, state, metrics)


class Stage(abc.ABC):
    """One stage's loop (pretraining, SFT, RL, RFT, DPO): its state as attributes, the
    steps `fit` calls as methods.

    Attributes:
      name: the stage's name in messages ("pretrain", "sft", "RL", "RFT", "DPO").
      desc: the progress bar's label.
      folder: where the stage checkpoints (<folder>/checkpoints) and logs
        (<folder>/metrics.jsonl).
      steps: the stage's last step.
      log_every: the log hook's interval (metrics.jsonl, TensorBoard, progress bar).
      hooks: run before the log and checkpoint hooks (evaluation).
      optim: the optim section when non-finite updates are guarded (None: not).
    """

    name: str
    desc: str
    folder: str
    steps: int
    log_every: int
    hooks: Sequence[Hook] = ()
    optim: Any = None

    def resume(self, state, host: dict) -> None:
        """Before the first step: the state and host state restored ({} at the start)."""

    @abc.abstractmethod
    def host_state(self, done: int) -> dict:
        """What a resumed run needs after `done` steps, beyond the device state."""

    @abc.abstractmethod
    def draw(self, state, step: int):
        """The step's data (rollouts, packed rows)."""

    @abc.abstractmethod
    def train(self, state, data, step: int) -> tuple[Any, dict]:
        """The update: (state, metrics)."""

    def after_update(self, state, data, step: int, metrics: dict) -> None:
        """After the non-finite guard: hands the weights on, adds metrics."""

    @abc.abstractmethod
    def postfix(self, row: dict) -> dict:
        """The progress bar's fields from a logged row."""

    def on_log(self, step: int, row: dict) -> None:
        """After a row is written (warnings)."""

    def close(self) -> None:
        """When the loop ends, however it ends."""


def fit(runtime: Runtime, stage: Stage, state, *, checkpoint_every: int):
    """Runs `stage` from its last committed checkpoint in stage.folder (or from `state`)
    to stage.steps; returns the final state (module docstring)."""
    state, host, checkpointer, writer = runtime.restore_or_start(stage.folder, state, stage.name)
    start = host.get("step", 0)
    bad_steps = 0

    def log(step, state, metrics):
        changed = runtime.config_changes.pop(stage.folder, None)
        row = writer.write(step, metrics if changed is None
                           else {**metrics, "config/changes": changed})
        bar.set_postfix(**stage.postfix(row))
        stage.on_log(step, row)

    def save(step, state, metrics):
        checkpointer.save(step, state, stage.host_state(step), force=True)

    # In this order: the log row holds the evaluation, the checkpoint its result.
    hooks = [*stage.hooks, Hook(stage.log_every, log), Hook(checkpoint_every, save)]
    try:
        stage.resume(state, host)
        bar = runtime.progress_bar(range(start, stage.steps), stage.desc)
        for step in bar:
            resume = (step, stage.host_state(step))
            try:
                data = stage.draw(state, step)
                resume = None
                state, metrics = stage.train(state, data, step)
                if stage.optim is not None:
                    state, bad_steps = guard_nonfinite(
                        runtime, stage.optim, state, metrics, stage=stage.name, step=step + 1,
                        bad_steps=bad_steps, checkpointer=checkpointer,
                        host=stage.host_state(step + 1))
                stage.after_update(state, data, step, metrics)
                run_hooks(hooks, step + 1, stage.steps, state, metrics)
            except ROLLOUT_STOPPED:
                if resume is not None:
                    checkpointer.save(resume[0], state, resume[1], force=True)
                raise
    finally:
        stage.close()
        # However the loop ends (an error, KeyboardInterrupt, SIGTERM's SystemExit):
        # pending asynchronous saves commit, orbax's threads end.
        checkpointer.close()
    return state


def guard_nonfinite(runtime: Runtime, optim, state, metrics: dict, *, stage: str, step: int,
                    bad_steps: int, checkpointer, host: dict):
    """Reacts to optimizer updates the jitted update refused (non-finite loss, gradient
    or params; `update.epoch_minibatch_steps`): warns, rolls the policy back to the
    last checkpoint when optim.on_nonfinite='rollback', and after
    optim.max_nonfinite_steps consecutive such steps saves a checkpoint and stops.
    Returns (state, consecutive bad steps)."""
    refused = metrics.get("nonfinite_updates", 0.0) + metrics.get(
        "critic/nonfinite_updates", 0.0)
    if not refused:
        return state, 0
    bad_steps += 1
    where = (f"{stage} step {step}: {metrics.get('nonfinite_updates', 0.0):.0%} of the policy's "
             f"optimizer updates had a non-finite loss, gradient or result (loss "
             f"{metrics.get('loss')}, grad_norm {metrics.get('grad_norm')}) and were "
             "not applied")
    if bad_steps >= optim.max_nonfinite_steps:
        checkpointer.save(step, state, host, force=True)
        checkpointer.wait()
        raise TrainingDiverged(
            f"{where}; {bad_steps} consecutive steps like it (optim.max_nonfinite_steps="
            f"{optim.max_nonfinite_steps}): stopping. The last finite state is saved at "
            f"step {step}; lower optim.lr, check the rewards (reward/* metrics) or set "
            "optim.on_nonfinite='rollback'")
    if optim.on_nonfinite == "rollback" and checkpointer.latest_step is not None:
        checkpointer.wait()
        restored, _ = checkpointer.restore(state)
        runtime.log(f"warning: {where}; rolled the policy back to checkpoint "
                    f"{checkpointer.latest_step}")
        return restored, bad_steps
    runtime.log(f"warning: {where}; skipped")
    return state, bad_steps


def micro_batches(rows: int, microbatch_size: int) -> int:
    """Micro-batches a minibatch of `rows` is split into (0: none)."""
    return rows // microbatch_size if microbatch_size else 1
