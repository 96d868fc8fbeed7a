"""Where a run executes: the mesh and its shardings, jit, logging (messages, metrics,
the experiment trackers), checkpoints, the workdir, and whether this process is the one
that writes.

    runtime = Runtime.start(config, workdir)
    update, state = runtime.jit_update(update_fn, state)      # sharded, donated state
    state, host, checkpointer, writer = runtime.restore_or_start(folder, state, "RL")
    state, metrics = update(state, runtime.device_batch(batch))

Nothing here knows about models, rollouts or algorithms; every stage gets a Runtime.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os
from typing import Iterable

import jax
import ml_collections
from tqdm.auto import tqdm

from agentjax.config import ConfigError
from agentjax.config.errors import reject
from agentjax.core import atomic, parallel
from agentjax.train.checkpoint import Checkpointer
from agentjax.train.metrics import MetricsWriter
from agentjax.train.tracking import Tracking
from agentjax.train.update import split_frozen, with_frozen

CHECKPOINTS = "checkpoints"  # in the workdir (RL) or in <workdir>/<stage> (pretrain, sft)


@dataclasses.dataclass
class Runtime:
    """The run's devices and files (module docstring).

    Attributes:
      workdir: the run folder (absolute).
      mesh: the `data/fsdp/tensor` device mesh.
      rules: logical axis -> mesh axes (parallel.resolve_rules).
      is_main: this process logs and writes files (process 0 of a multi-host run).
      checkpoint: the config's `checkpoint` section (every, keep, async_save).
      progress: show progress bars.
      tracking: the experiment trackers every stage's metrics rows also go to (none on
        a process that does not write, nor for a tool reading a finished run).
      config_changes: stage folder -> how many config keys a resume changed, logged as
        `config/changes` on the first metrics row that stage writes (train/provenance.py).
    """

    workdir: str
    mesh: jax.sharding.Mesh
    rules: dict
    is_main: bool
    checkpoint: ml_collections.ConfigDict
    progress: bool = True
    tracking: Tracking = dataclasses.field(default_factory=Tracking)
    config_changes: dict[str, int] = dataclasses.field(default_factory=dict)

    @classmethod
    def start(cls, config: ml_collections.ConfigDict, workdir: str, *,
              record_config: bool = True, tracked: bool = True) -> "Runtime":
        """Joins the other hosts (multihost.enabled), builds the mesh, records the
        config in <workdir>/config.json (unless not `record_config`: a tool reading a
        finished run, or a resumed run, whose config.json keeps the config it started
        with), opens the run's trackers (unless not `tracked`: a tool reading a finished
        run) and checks that every batch divides over the data-parallel devices."""
        workdir = os.path.abspath(workdir)
        os.makedirs(workdir, exist_ok=True)
        if config.multihost.enabled:
            parallel.initialize_distributed({
                "coordinator_address": config.multihost.coordinator,
                "num_processes": config.multihost.num_processes,
                "process_id": None if config.multihost.process_id < 0
                else config.multihost.process_id})
        is_main = jax.process_index() == 0
        if is_main and record_config:
            atomic.write_text(os.path.join(workdir, "config.json"),
                              config.to_json_best_effort(indent=1))
        mesh = parallel.make_mesh(dict(config.mesh), devices=_run_devices(config.devices))
        _check_batch_rows(config, mesh.shape["data"] * mesh.shape["fsdp"])
        runtime = cls(workdir=workdir, mesh=mesh,
                      rules=parallel.resolve_rules(json.loads(config.rules)
                                                   if config.rules else None),
                      is_main=is_main, checkpoint=config.checkpoint,
                      progress=config.log.progress)
        runtime.tracking = Tracking.start(config, workdir, enabled=is_main and tracked,
                                          log=runtime.log)
        runtime.log(f"mesh {dict(mesh.shape)} on {mesh.size} of {jax.device_count()} "
                    f"{jax.default_backend()} device(s)")
        return runtime

    def log(self, message: str) -> None:
        if self.is_main:
            tqdm.write(f"[agentjax] {message}")

    def progress_bar(self, steps: Iterable[int], desc: str):
        return tqdm(steps, desc=desc, disable=not (self.is_main and self.progress))

    # ------------------------------------------------------------------ devices

    @functools.cached_property
    def _token_and_row_shardings(self):
        return (parallel.batch_sharding(self.mesh, self.rules),
                parallel.batch_sharding(self.mesh, self.rules, ("batch",)))

    def batch_shardings(self, batch: dict) -> dict:
        """The rules' sharding of each batch array: [B, T] arrays and [B] rows."""
        tokens, rows = self._token_and_row_shardings
        return {k: tokens if v.ndim == 2 else rows for k, v in batch.items()}

    def device_batch(self, batch: dict) -> dict:
        """A numpy batch on the devices, sharded by the rules."""
        return jax.device_put(batch, self.batch_shardings(batch))

    def jit_update(self, update_fn, state):
        """(jitted update, state placed on its shardings). The update is jitted with
        explicit shardings — the state keeps its placement (`parallel.placed_shardings`,
        donated), the batch takes the rules' batch shardings, metrics come back
        replicated — compiled at the first call for that batch's keys. A LoRA state's
        frozen base (`TrainState.split_frozen`) is an argument of its own, neither
        donated nor returned: the arrays whoever loaded it holds stay valid, unchanged."""
        trained, base = split_frozen(state)
        state_shardings = parallel.placed_shardings(trained, self.mesh)
        base_shardings = parallel.placed_shardings(base, self.mesh)
        replicated = jax.sharding.NamedSharding(self.mesh, jax.sharding.PartitionSpec())
        compiled = {}

        def without_base(trained, base, batch):
            new_state, metrics = update_fn(with_frozen(trained, base), batch)
            return split_frozen(new_state)[0], metrics

        def update(state, batch):
            keys = tuple(sorted(batch))
            if keys not in compiled:
                compiled[keys] = jax.jit(
                    without_base, in_shardings=(state_shardings, base_shardings,
                                                self.batch_shardings(batch)),
                    out_shardings=(state_shardings, replicated), donate_argnums=0)
            trained, base = split_frozen(state)
            new_trained, metrics = compiled[keys](trained, base, batch)
            return with_frozen(new_trained, base), metrics

        return update, with_frozen(jax.device_put(trained, state_shardings), base)

    # ------------------------------------------------------------------ files

    def checkpointer(self, folder: str, *, read_only: bool = False) -> Checkpointer:
        """The checkpoints of a stage logging into `folder` (<folder>/checkpoints)."""
        c = self.checkpoint
        if read_only:
            return Checkpointer(os.path.join(folder, CHECKPOINTS), every=0, read_only=True)
        return Checkpointer(os.path.join(folder, CHECKPOINTS), every=c.every, keep=c.keep,
                            async_save=c.async_save)

    def restore_or_start(self, folder: str, state, stage: str):
        """(state, host state, checkpointer, metrics writer) of a stage checkpointing
        into <folder>/checkpoints and logging into <folder>: the latest committed
        checkpoint's state and host state when there is one, else `state` and {}; the
        writer continues after the restored step. The caller closes the checkpointer."""
        checkpointer = self.checkpointer(folder)
        try:
            restored = checkpointer.restore(state)
        except BaseException:
            checkpointer.close()
            raise
        host = {}
        if restored is not None:
            state, host = restored
            self.log(f"{stage}: resumed at step {host['step']}")
        writer = MetricsWriter(folder, stage=stage.lower(), tracking=self.tracking,
                               resume_step=host.get("step", 0), enabled=self.is_main)
        return state, host, checkpointer, writer


def _run_devices(count: int) -> list:
    """The devices the run's mesh spans: all of them (count -1) or the first `count`."""
    devices = jax.devices()
    if count == -1:
        return devices
    if count > len(devices):
        reject("devices", count, f"this process has only {len(devices)} "
               f"{jax.default_backend()} device(s)")
    return devices[:count]


def _check_batch_rows(config, data_parallel: int) -> None:
    """Every batch a stage builds splits evenly over the data-parallel devices."""
    row_counts = {"rollout.prompts_per_step x rollout.group_size":
                  config.rollout.prompts_per_step * config.rollout.group_size,
                  "sft.batch_size": config.sft.batch_size}
    if config.pretrain.steps:
        row_counts["pretrain.batch_size"] = config.pretrain.batch_size
    if config.stage in ("rft", "dpo"):
        row_counts[f"{config.stage}.batch_size"] = config[config.stage].batch_size
    for key, rows in row_counts.items():
        if rows % data_parallel:
            raise ConfigError(f"{key} = {rows} rows must be divisible by the data-parallel "
                              f"mesh size data x fsdp = {data_parallel}")
