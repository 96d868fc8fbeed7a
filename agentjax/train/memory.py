"""What a run keeps in device memory, per device, before its first step.

    plan = memory_plan(config, model_config, mesh)
    print(plan.table())      # one row per resident buffer group, GiB per device
    plan.check()             # ValueError naming the knobs to lower when it cannot fit

The rows are what the trainer holds for the whole RL stage (activations, gradients,
compiled-program scratch and the logits chunks come on top and depend on batch shapes;
they are not counted):

  policy params         float32 master weights (TrainState.params)
  initial params        float32, the loaded weights the run keeps
                        (Policy.params)
  Adam moments          2 x float32 per param (TrainState.opt_state)
  KL reference          float32 copy, when algo.kl_coef > 0 (TrainState.ref_params;
                        stage "dpo": the DPO reference)
  critic + Adam         3 x float32 (trunk copy + value head), PPO's critic only
  engine weights        the compute dtype (model.dtype), one copy per engine lane
  engine weight swap    one more lane copy while update_weights builds the new one
  staged weights        float32, rollout.mode="async": the update's params copied for
                        the producer (agents/sources.py) until it swaps them in
  KV cache              engine_slots x max_tokens x layers x kv_heads x head_dim x 2
                        (keys and values) in the compute dtype (`init_layer_cache`)

Per-device bytes come from the shardings the trainer gives each buffer: params and
everything shaped like them by the config's logical-axis rules on the mesh (`embed` on
fsdp, heads / mlp / vocab on tensor; axes that do not divide stay replicated), the KV
cache by `LayerKVCache.logical_axes` under the default rules (as `JaxEngine` places it:
rows over data x fsdp, kv heads over tensor). The device's memory is
`memory_stats()["bytes_limit"]` (GPU, TPU); CPU devices report none and are not checked.
"""
from __future__ import annotations

import dataclasses
import json
import math

import jax
import ml_collections
from flax import nnx
from jax.sharding import Mesh

from agentjax.core import parallel
from agentjax.models.cache import LayerKVCache, init_layer_cache
from agentjax.models.config import ModelConfig
from agentjax.models.decoder import Decoder
from agentjax.rl.advantages import needs_critic

_GIB = 2 ** 30
_FLOAT32 = 4


@dataclasses.dataclass(frozen=True)
class MemoryRow:
    """One group of resident buffers.

    Attributes:
      name: what the buffers are.
      bytes: bytes on one device.
      knobs: the config keys that shrink it.
    """

    name: str
    bytes: int
    knobs: str


@dataclasses.dataclass(frozen=True)
class MemoryPlan:
    """Per-device bytes of a run's resident buffers (module docstring).

    Attributes:
      rows: the buffer groups, in the order of the module docstring (absent ones left
        out).
      device_bytes: memory of one device, or None when the device does not say (CPU).
      device: the device kind, for messages.
    """

    rows: tuple[MemoryRow, ...]
    device_bytes: int | None
    device: str

    @property
    def total(self) -> int:
        return sum(row.bytes for row in self.rows)

    @property
    def fits(self) -> bool:
        """True when the total fits the device (or its memory is unknown)."""
        return self.device_bytes is None or self.total <= self.device_bytes

    def table(self) -> str:
        """The rows, their total and the device's memory, in GiB per device."""
        width = max(len(row.name) for row in self.rows)
        lines = [f"  {row.name:<{width}}  {row.bytes / _GIB:8.2f} GiB" for row in self.rows]
        lines.append(f"  {'total':<{width}}  {self.total / _GIB:8.2f} GiB")
        if self.device_bytes is None:
            lines.append(f"  ({self.device} reports no memory limit: not checked)")
        else:
            lines.append(f"  {self.device + ' memory':<{width}}  "
                         f"{self.device_bytes / _GIB:8.2f} GiB")
        return "\n".join(lines)

    def check(self) -> None:
        """Raises ValueError, naming the largest rows and the knobs that shrink them,
        when the total exceeds the device's memory."""
        if self.fits:
            return
        largest = sorted(self.rows, key=lambda row: -row.bytes)[:3]
        hints = "; ".join(f"{row.name} {row.bytes / _GIB:.1f} GiB: {row.knobs}"
                          for row in largest)
        raise ValueError(
            f"the run does not fit: {self.total / _GIB:.1f} GiB per device before "
            f"activations, one {self.device} has {self.device_bytes / _GIB:.1f} GiB. "
            f"Largest: {hints}.\n{self.table()}")


def _param_bytes(shapes, shardings, itemsize: int) -> int:
    """Bytes on one device of every leaf of `shapes` under `shardings`."""
    return sum(math.prod(sharding.shard_shape(shape.shape)) * itemsize
               for shape, sharding in zip(jax.tree.leaves(shapes), jax.tree.leaves(shardings)))


def device_memory(device: jax.Device) -> int | None:
    """`bytes_limit` of the device's memory stats; None where it reports none (CPU)."""
    stats = device.memory_stats()
    return None if not stats else stats.get("bytes_limit")


def memory_plan(config: ml_collections.ConfigDict, model_config: ModelConfig, mesh: Mesh,
                *, device_bytes: int | None = None) -> MemoryPlan:
    """The per-device memory plan of `config` with the policy `model_config` on `mesh`.

    Args:
      config: the training config (rollout, algo, rules).
      model_config: the policy's ModelConfig (compute dtype `dtype`).
      mesh: the trainer's mesh.
      device_bytes: one device's memory; None asks a device of the mesh.
    """
    rules = parallel.resolve_rules(json.loads(config.rules) if config.rules else None)
    abstract = nnx.state(nnx.eval_shape(lambda: Decoder(model_config, rngs=nnx.Rngs(0))))
    shardings = parallel.param_shardings(abstract, mesh, rules)
    shapes = jax.tree.map(lambda p: p.get_value(), abstract,
                          is_leaf=lambda x: isinstance(x, nnx.Variable))
    shardings = jax.tree.map(lambda p: p.get_value(), shardings,
                             is_leaf=lambda x: isinstance(x, nnx.Variable))
    master = _param_bytes(shapes, shardings, _FLOAT32)
    compute = _param_bytes(shapes, shardings, jax.numpy.dtype(model_config.dtype).itemsize)

    r, algo = config.rollout, config.algo
    shard_params = "raise mesh.fsdp or mesh.tensor (shards every param)"
    rows = [MemoryRow("policy params (float32)", master, shard_params),
            MemoryRow("initial params (float32)", master, shard_params),
            MemoryRow("Adam moments (2 x float32)", 2 * master, shard_params)]
    if config.stage == "dpo":  # the frozen starting policy of the preference loss
        rows.append(MemoryRow("DPO reference (float32)", master, shard_params))
    elif algo.kl_coef > 0:
        rows.append(MemoryRow("KL reference (float32)", master,
                              f"algo.kl_coef=0 drops it, or {shard_params}"))
    if needs_critic(algo.advantage):
        head = (model_config.hidden_size + 1) * _FLOAT32
        rows.append(MemoryRow("critic + Adam (3 x float32)", 3 * (master + head),
                              shard_params))
    lane_slots = r.engine_slots // r.engine_lanes
    lane_weights = f"model.dtype='bfloat16' halves it, or {shard_params}"
    rows.append(MemoryRow(f"engine weights ({model_config.dtype}, {r.engine_lanes} lane(s))",
                          r.engine_lanes * compute,
                          f"lower rollout.engine_lanes; {lane_weights}"))
    rows.append(MemoryRow("engine weight swap (one lane)", compute, lane_weights))
    if r.mode == "async":
        rows.append(MemoryRow("staged weights (float32, async)", master,
                              f"rollout.mode='sync' drops it, or {shard_params}"))
    cache = jax.eval_shape(lambda: init_layer_cache(model_config, lane_slots, r.max_tokens))
    # JaxEngine places its cache by the default rules, whatever config.rules says.
    cache_shardings = parallel.tree_shardings(
        LayerKVCache.logical_axes(model_config.num_layers), cache, mesh)
    cache_bytes = sum(math.prod(sharding.shard_shape(leaf.shape)) * leaf.dtype.itemsize
                      for leaf, sharding in zip(jax.tree.leaves(cache),
                                                jax.tree.leaves(cache_shardings)))
    rows.append(MemoryRow(
        f"KV cache ({r.engine_slots} slots x {r.max_tokens} tokens, {model_config.dtype})",
        r.engine_lanes * cache_bytes,
        "lower rollout.engine_slots (with rollout.concurrency) or rollout.max_tokens, or "
        "spread the slots over more data-parallel devices (mesh.data, mesh.fsdp)"))
    # A device of this process: memory_stats of another host's device is not readable.
    device = next(d for d in mesh.devices.flat if d.process_index == jax.process_index())
    if device_bytes is None:
        device_bytes = device_memory(device)
    return MemoryPlan(rows=tuple(rows), device_bytes=device_bytes, device=device.device_kind)
