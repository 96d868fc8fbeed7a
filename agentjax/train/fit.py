"""The one training loop every stage runs (pretraining, SFT, RL, RFT, DPO), with hooks
at their own intervals.

    loop = Loop(name="RL", desc="grpo", folder=workdir, steps=total_steps,
                draw=draw, train=train, host_state=host_state, ...)
    state = fit(runtime, loop, state)

One step of `fit`, after restoring the stage's last committed checkpoint (or starting):
    data = loop.draw(state, step)              # the step's data (rollouts, packed rows)
    state, metrics = loop.train(state, data, step)
    non-finite guard                            # optim.on_nonfinite, when loop.optim is set
    loop.after_update(state, data, step, metrics)   # hand the weights to the rollouts
    hooks due: loop.hooks (evaluation), log, checkpoint

A rollout that stops for good during `draw` (servers down, the async producer failed)
saves a checkpoint of the step it would have trained, so a rerun continues exactly there;
after `draw` the state holds an update whose log row is not written yet, and a rerun
repeats from the last checkpoint, which reproduces it.
"""
from __future__ import annotations

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


def _nothing(*args) -> None:
    return None


@dataclasses.dataclass(frozen=True)
class Loop:
    """What one stage's loop does at each step.

    Attributes:
      name: the stage's name in messages ("pretrain", "sft", "RL", "RFT", "DPO").
      desc: the progress bar's label.
      folder: where the stage checkpoints (<folder>/checkpoints) and logs
        (<folder>/metrics.jsonl).
      steps: the stage's last step.
      draw: (state, step) -> the step's data.
      train: (state, data, step) -> (state, metrics): the update.
      host_state: done steps -> what a resumed run needs beyond the device state.
      resume: (state, host state) restored ({} at the start), before the first step.
      after_update: (state, data, step, metrics) after the guard: hands the weights on,
        adds metrics.
      hooks: run before the log and checkpoint hooks (evaluation).
      log_every: the log hook's interval (metrics.jsonl, TensorBoard, progress bar).
      postfix: the progress bar's fields from a logged row.
      on_log: (step, row) after a row is written (warnings).
      optim: the optim section when non-finite updates are guarded (None: not).
      close: called when the loop ends, however it ends.
    """

    name: str
    desc: str
    folder: str
    steps: int
    draw: Callable[[Any, int], Any]
    train: Callable[[Any, Any, int], tuple[Any, dict]]
    host_state: Callable[[int], dict]
    log_every: int
    postfix: Callable[[dict], dict]
    resume: Callable[[Any, dict], None] = _nothing
    after_update: Callable[[Any, Any, int, dict], None] = _nothing
    hooks: Sequence[Hook] = ()
    on_log: Callable[[int, dict], None] = _nothing
    optim: Any = None
    close: Callable[[], None] = _nothing


def fit(runtime: Runtime, loop: Loop, state, *, checkpoint_every: int):
    """Runs `loop` from its last committed checkpoint in loop.folder (or from `state`)
    to loop.steps; returns the final state (module docstring)."""
    state, host, checkpointer, writer = runtime.restore_or_start(loop.folder, state, loop.name)
    start = host.get("step", 0)
    bad_steps = 0

    def log(step, state, metrics):
        changed = runtime.config_changes.pop(loop.folder, None)
        row = writer.write(step, metrics if changed is None
                           else {**metrics, "config/changes": changed})
        bar.set_postfix(**loop.postfix(row))
        loop.on_log(step, row)

    def save(step, state, metrics):
        checkpointer.save(step, state, loop.host_state(step), force=True)

    # In this order: the log row holds the evaluation, the checkpoint its result.
    hooks = [*loop.hooks, Hook(loop.log_every, log), Hook(checkpoint_every, save)]
    try:
        loop.resume(state, host)
        bar = runtime.progress_bar(range(start, loop.steps), loop.desc)
        for step in bar:
            resume = (step, loop.host_state(step))
            try:
                data = loop.draw(state, step)
                resume = None
                state, metrics = loop.train(state, data, step)
                if loop.optim is not None:
                    state, bad_steps = guard_nonfinite(
                        runtime, loop.optim, state, metrics, stage=loop.name, step=step + 1,
                        bad_steps=bad_steps, checkpointer=checkpointer,
                        host=loop.host_state(step + 1))
                loop.after_update(state, data, step, metrics)
                run_hooks(hooks, step + 1, loop.steps, state, metrics)
            except ROLLOUT_STOPPED:
                if resume is not None:
                    checkpointer.save(resume[0], state, resume[1], force=True)
                raise
    finally:
        loop.close()
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
