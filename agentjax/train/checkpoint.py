"""Orbax checkpoints: the device state (a pytree) plus the host state (json).

The host state holds everything outside the jitted state that decides what happens
next — the step, the curriculum sampler's state, numpy RNG states — so a run killed at
any point and restarted with the same `--workdir` continues exactly as an
uninterrupted run would.

A LoRA TrainState is saved without its frozen base (`TrainState.split_frozen`): the
adapters, their optimizer state and the rest, plus the base's fingerprint in the host
state; a restore puts them back onto the base of the state it is given, after checking
that base is the one they were trained over (`lora.check_same_base`). The base is never
written into, so nothing is applied twice.

A checkpoint is written under a temporary name and renamed to its step once complete
(orbax's commit), and only committed checkpoints are listed or restored: whether a step
(or a stage) is done is read from them, never from the existence of the folder, which
orbax creates before the first save.
"""
from __future__ import annotations

import os
from typing import Any

import jax
import orbax.checkpoint as ocp

from agentjax.models.lora import base_fingerprint, check_same_base
from agentjax.train.update import split_frozen, with_frozen

BASE_KEY = "lora_base"  # the host state's fingerprint of a LoRA state's frozen base


class Checkpointer:
    """Saves every `every` steps, keeps the newest `keep`, optionally asynchronously.

    Args:
      directory: checkpoint folder (created if missing), usually `<workdir>/checkpoints`.
      every: save interval in steps (0 disables periodic saves; `force=True` still saves).
      keep: how many checkpoints to keep.
      async_save: write in a background thread while training continues.
      read_only: only list and restore: creates nothing, and leaves alone the
        temporary folders of a save in progress (a writer removes those a killed run
        left behind).
    """

    def __init__(self, directory: str, *, every: int, keep: int = 2, async_save: bool = True,
                 read_only: bool = False):
        self.every = every
        self.directory = os.path.abspath(directory)
        options = ocp.CheckpointManagerOptions(
            max_to_keep=None if read_only else keep, save_interval_steps=0 if read_only else 1,
            enable_async_checkpointing=async_save, read_only=read_only,
            create=not read_only, cleanup_tmp_directories=not read_only)
        self._manager = ocp.CheckpointManager(
            os.path.abspath(directory), options=options,
            item_names=("state", "host"))

    @property
    def latest_step(self) -> int | None:
        """The newest committed step (None if there is none)."""
        return self._manager.latest_step()

    def save(self, step: int, state: Any, host: dict, *, force: bool = False) -> bool:
        """Saves `(state, host)` at `step` when due (or when forced); True if saved."""
        if not force and (not self.every or step % self.every):
            return False
        if step in self._manager.all_steps():
            return False
        state, base = split_frozen(state)
        if base is not None:
            host = {**host, BASE_KEY: base_fingerprint(base)}
        return self._manager.save(step, args=ocp.args.Composite(
            state=ocp.args.StandardSave(state), host=ocp.args.JsonSave(host)), force=True)

    def restore(self, abstract_state: Any, step: int | None = None):
        """Returns `(state, host)` of `step` (default: latest), or None if none exists.

        `abstract_state` is a pytree of `jax.ShapeDtypeStruct` (with shardings) or of
        arrays, e.g. `jax.eval_shape(init_fn)`; restored arrays take its shardings. A
        LoRA TrainState's frozen base must be arrays: the restored state holds them.
        """
        step = self.latest_step if step is None else step
        if step is None:
            return None
        abstract_state, base = split_frozen(abstract_state)
        abstract_state = jax.tree.map(ocp.utils.to_shape_dtype_struct, abstract_state)
        # The host state first: it says whether the state has adapters, and over what.
        host = dict(self._manager.restore(step, args=ocp.args.Composite(
            host=ocp.args.JsonRestore())).host)
        saved_base = host.pop(BASE_KEY, None)
        if (saved_base is None) != (base is None):
            raise ValueError(f"{self.directory}: checkpoint {step} was saved "
                             f"{'without' if saved_base is None else 'with'} LoRA adapters; "
                             f"this run is {'with' if saved_base is None else 'without'} "
                             "them (model.lora.rank)")
        if base is not None:
            check_same_base(saved_base, base_fingerprint(base),
                            f"{self.directory}: checkpoint {step}")
        restored = self._manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract_state)))
        return with_frozen(restored.state, base), host

    def wait(self):
        """Blocks until pending asynchronous saves are on disk."""
        self._manager.wait_until_finished()

    def close(self):
        self._manager.close()


def latest_committed_step(directory: str) -> int | None:
    """The newest committed checkpoint step in `directory` (None if there is none, or
    no folder): a save in progress, or one a kill interrupted, is not listed. Reads
    only."""
    if not os.path.isdir(directory):
        return None
    metadata = ocp.path.step.latest_step_metadata(directory,
                                                  ocp.path.step.standard_name_format())
    return None if metadata is None else metadata.step
