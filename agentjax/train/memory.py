"""What a run needs in device memory, per device, known before its first step.

    plan = memory_plan(config, model_config, mesh)
    print(plan.table())      # one row per resident buffer group, GiB per device
    plan.check()             # ValueError naming the knobs to lower when it cannot fit

The rows are what the trainer holds for the whole RL stage, then what one micro-batch
of the RL update adds, or an SFT or pretraining batch (sft.batch_size rows of
rollout.max_tokens, trained whole) where that is larger (compiled-program scratch beyond
it is not counted; the offline stages' batches are not planned):

  policy params         float32 master weights (TrainState.params)
  initial params        float32, the loaded weights the run keeps
                        (Policy.params)
  Adam moments          2 x float32 per param (TrainState.opt_state)
  KL reference          float32 copy, when algo.kl_coef > 0 (TrainState.ref_params;
                        stage "dpo": the DPO reference)
  critic + Adam         3 x float32 (trunk copy + value head), PPO's critic only
  distillation teacher  its params in the compute dtype, when algo.distill_coef > 0
                        (train/teacher.py: frozen, any shape of the policy's vocabulary);
                        its forward runs in `prepare`, without a backward, chunked as the
                        reference's
  engine weights        the compute dtype (model.dtype), one copy per engine lane
  engine weight swap    one more lane copy while update_weights builds the new one
  staged weights        float32, rollout.mode="async": the update's params copied for
                        the producer (agents/sources.py) until it swaps them in
  KV pages              the JaxEngine's page pool: rollout.kv_tokens (default
                        engine_slots x max_tokens) x layers x kv_heads x head_dim x 2
                        (keys and values) in the compute dtype (`init_paged_cache`)
  decode page view      with the pure-JAX attention (rollout.engine_attention "paged";
                        "auto" off GPUs), the copy of the pages a decode call reads
                        (`paged.gather_view`): the largest decode item bucket
                        (engine/jax/shapes.py), at most every slot at max_tokens and at
                        most the pool's pages (the engine splits a round to stay within)
  activations           one micro-batch's forward kept for its backward (below)
  gradients             float32 like the params; twice when micro-batches are summed
                        (the running sum and the current micro-batch's, update.py:
                        accumulate_grads)

Activations of one micro-batch of N tokens (algo.micro_tokens, else micro-batch rows x
rollout.max_tokens, the rows algo.microbatch_size or the whole minibatch) in rows of
T = rollout.max_tokens, D hidden, F intermediate, H / K query / kv heads of width hd, V
vocab, c bytes of the compute dtype, L layers:

  activations = L x kept + max(layer backward, log-prob backward)

  kept, one layer's forward its backward reads, under the remat policy of T tokens
  (model.remat; "auto" is "none" below models.decoder.AUTO_REMAT_TOKENS, "full_save_attention" from it):
    none            N x c x (4D + 2H hd + 2K hd + 4F) + attention
                    (layer input, attention-norm output, residual, MLP-norm output; q and
                    the attention output; k, v; gate, up, silu(gate), their product)
    dots            N x c x (3D + 2H hd + 2K hd + 2F) + attention scores (matmul outputs)
    dots_no_batch   N x c x (3D + H hd + 2K hd + 2F)  (weight-matmul outputs)
    full            N x c x D                         (the layer input alone)
    full_save_attention  N x c x D + N x c x H hd + attention, not dense (the layer
                    input, the blockwise attention's output and logsumexp)
    attention: N x 4 x H float32 (the logsumexp of each head), or where the attention is
    dense (model.attention="dense", or "auto" up to models.attention.DENSE_MAX_TOKENS)
    N x 4 x H x T x 2 (the T x T scores and probabilities)
  layer backward: the "none" set of one layer once (its gradients), twice when the policy
    recomputes it (the recomputed forward and its gradients)
  log-prob backward: 2 x N / T x min(model.logprob_chunk, T) x V x 4 (a chunk's float32
    logits and their gradient, rl/logprobs.py) + D x V x 4 (the lm-head gradient it
    accumulates)

With LoRA (model_config.lora) the trainer holds a frozen base and adapters instead:

  frozen base           the base in the compute dtype, one copy: TrainState.params,
                        Policy.params, the KL reference and the critic's trunk all read
                        these arrays (train/update.py: split_frozen)
  adapters              float32 (TrainState.params); initial adapters, Policy.params';
                        Adam moments 2 x float32 of the adapters
  KL reference          0 bytes: the base with the adapters off
  critic + Adam         3 x float32 of its adapters and value head (its trunk is the
                        base)
  engine weights        the merged weights in the compute dtype, as without LoRA
  staged weights        float32 adapters (the base is shared)
  gradients             float32 adapters
  activations           also x A [N, r] of each adapted projection, where matmul outputs
                        are kept ("none", "dots", "dots_no_batch")

The counts are what the backward reads, not what a compiler may keep besides, so `check`
stops only runs that cannot fit. Against the scratch XLA:CPU assigns to a compiled
float32 step (tests/train/test_memory.py): 1.4x this under "none" (it keeps every
elementwise result unfused: six [N, F] buffers a layer where the plan counts four), 1.0x
under "full", 1.2x with the dense attention ("dots" policies not measured). A bfloat16
step on CPU keeps more (XLA:CPU computes bfloat16 elementwise work in float32). On an
H200 (Qwen2.5-0.5B, 8 x 2,048-token micro-batches, bfloat16; docs/results/engine.md) the
device's peak was 0.76x the rows a train step holds under "full", 0.74x under
"dots_no_batch" and 1.14x under "none".

On CPU the devices are the host: `host_plan` adds what a CPU process holds besides
(measured on SmolLM2-135M and on the 2-layer model tests/train/test_real_recipe.py cuts
from it, docs/results/real_model.md):

  this process so far   the resident set when the plan is made (interpreter, JAX,
                        transformers, the task suite, the tokenizer): read, not planned
  XLA:CPU runtime       CPU_RUNTIME_BYTES: the compiler's and runtime's own memory and the
                        run's compiled programs (the engine's, SFT's, the update's); the
                        2-layer run's peak less its rows
  XLA:CPU scratch       CPU_SCRATCH x the activations: what a compiled CPU step assigns
                        beyond the counted activations (unfused elementwise results,
                        above): 1.18x at SmolLM2-135M's 30 layers, 1,024 tokens, float32,
                        no remat

and checks the total against the host's physical memory (os.sysconf), so a run that
cannot fit stops before anything is loaded, naming the knobs, instead of the kernel
killing it.

Per-device bytes come from the shardings the trainer gives each buffer: params and
everything shaped like them by the config's logical-axis rules on the mesh (`embed` on
fsdp, heads / mlp / vocab on tensor; axes that do not divide stay replicated), the KV
pages by `PagedKVCache.logical_axes` under the default rules (as `JaxEngine` places them:
whole on every data x fsdp device, kv heads over tensor), activations by their logical axes
("batch", "seq", "act_embed" / "heads" / "mlp" / "vocab"). The device's memory is
`memory_stats()["bytes_limit"]` (GPU, TPU); CPU devices report none (`host_plan`
checks the host's memory instead).
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import resource

import jax
import jax.numpy as jnp
import ml_collections
from flax import nnx
from jax.sharding import Mesh, NamedSharding

from agentjax.core import parallel
from agentjax.models.paged import PagedKVCache, init_paged_cache
from agentjax.models.config import ModelConfig
from agentjax.models.attention import choose_impl
from agentjax.models.decoder import Decoder, resolve_remat
from agentjax.models.lora import split_adapters
from agentjax.train.engines import kv_pages
from agentjax.engine.jax.attention import resolve_attention
from agentjax.engine.jax.shapes import item_sizes
from agentjax.rl.advantages import needs_critic

_GIB = 2 ** 30
_FLOAT32 = 4
_SHARD_PARAMS = "raise mesh.fsdp or mesh.tensor (shards every param)"


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
            f"the run does not fit: {self.total / _GIB:.1f} GiB per device with one "
            f"micro-batch's activations, one {self.device} has "
            f"{self.device_bytes / _GIB:.1f} GiB. Largest: {hints}.\n{self.table()}")


def _param_bytes(shapes, shardings, itemsize: int) -> int:
    """Bytes on one device of every leaf of `shapes` under `shardings`."""
    return sum(math.prod(sharding.shard_shape(shape.shape)) * itemsize
               for shape, sharding in zip(jax.tree.leaves(shapes), jax.tree.leaves(shardings)))


@dataclasses.dataclass(frozen=True)
class MicroBatch:
    """The shape of one forward-backward of the RL update.

    Attributes:
      tokens: tokens of one micro-batch (algo.micro_tokens, else its rows x seq).
      seq: the longest sequence, rollout.max_tokens: the remat policy and the log-prob
        chunks follow it.
      count: micro-batches of a minibatch (at most, with algo.micro_tokens: episodes
        shorter than seq pack tighter); their gradients are summed when > 1.
    """

    tokens: int
    seq: int
    count: int

    @classmethod
    def of(cls, config: ml_collections.ConfigDict) -> "MicroBatch":
        r, algo = config.rollout, config.algo
        rows = r.prompts_per_step * r.group_size // algo.minibatches
        if algo.micro_tokens:
            return cls(algo.micro_tokens, r.max_tokens,
                       -(-rows * r.max_tokens // algo.micro_tokens))
        micro_rows = algo.microbatch_size or rows
        return cls(micro_rows * r.max_tokens, r.max_tokens, rows // micro_rows)


class _Activations:
    """Per-device bytes of [tokens, ...] activations of a micro-batch laid out in rows of
    `seq` tokens, sharded by their logical axes (module docstring)."""

    def __init__(self, micro: MicroBatch, mesh: Mesh, rules):
        self.micro, self.mesh, self.rules = micro, mesh, rules

    def bytes(self, tokens: float, seq: int, inner: tuple[int, ...], axes: tuple,
              itemsize: int) -> int:
        """`tokens` tokens (in rows of `seq`) of an activation of per-token shape
        `inner` with logical axes ("batch", "seq", *axes)."""
        shape = (max(1, round(tokens) // seq), seq, *inner)
        spec = parallel.logical_to_spec(("batch", "seq", *axes), self.rules, self.mesh, shape)
        kept = math.prod(NamedSharding(self.mesh, spec).shard_shape(shape)) / math.prod(shape)
        return round(tokens * math.prod(inner) * itemsize * kept)

    def layer(self, cfg: ModelConfig, policy: str) -> int:
        """What one layer keeps for its backward under `policy` (module docstring)."""
        n, t, c = self.micro.tokens, self.micro.seq, jnp.dtype(cfg.dtype).itemsize
        adapters = 0 if cfg.lora is None else self.bytes(
            n, t, (cfg.lora.rank * len(cfg.lora.targets),), (None,), c)
        hidden, heads, kv_heads, mlp = (
            self.bytes(n, t, shape, axes, c) for shape, axes in (
                ((cfg.hidden_size,), ("act_embed",)),
                ((cfg.num_heads, cfg.head_dim), ("heads", "head_dim")),
                ((cfg.num_kv_heads, cfg.head_dim), ("kv_heads", "head_dim")),
                ((cfg.intermediate_size,), ("mlp",))))
        dense = choose_impl(cfg.attention, seq_len=t, dtype=cfg.dtype, head_dim=cfg.head_dim,
                            backend=self.mesh.devices.flat[0].platform) == "dense"
        if dense:  # the T x T scores (and probabilities), float32
            attention = self.bytes(n, t, (cfg.num_heads, t), ("heads", None), _FLOAT32)
        else:  # blockwise / kernels: one float32 logsumexp per head and token
            attention = self.bytes(n, t, (cfg.num_heads,), ("heads",), _FLOAT32)
        return {
            "none": 4 * hidden + 2 * heads + 2 * kv_heads + 4 * mlp
            + attention * (2 if dense else 1) + adapters,
            "dots": 3 * hidden + 2 * heads + 2 * kv_heads + 2 * mlp + attention + adapters,
            "dots_no_batch": 3 * hidden + heads + 2 * kv_heads + 2 * mlp + adapters,
            "full": hidden,
            # and the blockwise attention's output and logsumexp (remat_policy names them)
            "full_save_attention": hidden + (0 if dense else heads + attention),
        }[policy]

    def logprobs(self, cfg: ModelConfig, chunk: int) -> int:
        """The log-prob backward: a chunk's float32 logits and their gradient, and the
        float32 [D, V] lm-head gradient accumulated over the chunks."""
        chunk = min(chunk, self.micro.seq)
        logits = self.bytes(self.micro.tokens * chunk / self.micro.seq, chunk,
                            (cfg.vocab_size,), ("vocab",), _FLOAT32)
        head = (cfg.hidden_size, cfg.vocab_size)
        head_spec = parallel.logical_to_spec(("embed", "vocab"), self.rules, self.mesh, head)
        return 2 * logits + math.prod(
            NamedSharding(self.mesh, head_spec).shard_shape(head)) * _FLOAT32


def _activation_rows(config: ml_collections.ConfigDict, model_config: ModelConfig,
                    mesh: Mesh, rules: parallel.Rules, params_bytes: int) -> list[MemoryRow]:
    """The rows of one micro-batch of the RL update (or of a larger SFT or pretraining
    batch): its activations and the float32 gradients, `params_bytes` a copy of the
    trained params (module docstring)."""
    rl = micro = MicroBatch.of(config)
    # SFT and pretraining steps train whole batches of packed rows (no micro-batches):
    # the larger of theirs and the RL micro-batch is the peak.
    warm_start = max([s.batch_size * micro.seq for s in (config.pretrain, config.sft)
                      if s.steps] + [0])
    if warm_start > micro.tokens or (config.stage == "sft" and warm_start):
        micro = MicroBatch(warm_start, micro.seq, 1)  # stage "sft": no RL update
    activations = _Activations(micro, mesh, rules)
    policy = resolve_remat(model_config.remat, micro.seq)
    layer_backward = activations.layer(model_config, "none") * (1 if policy == "none" else 2)
    logprob_backward = activations.logprobs(model_config, config.model.logprob_chunk)
    total = (model_config.num_layers * activations.layer(model_config, policy)
             + max(layer_backward, logprob_backward))
    knobs = (["lower sft.batch_size and pretrain.batch_size"] if micro is not rl
             else ["lower algo.micro_tokens" if config.algo.micro_tokens
                   else "lower algo.microbatch_size (or set algo.micro_tokens)"])
    if policy not in ("full", "full_save_attention"):
        knobs.append("model.remat='full'")
    if logprob_backward > layer_backward:
        knobs.append("lower model.logprob_chunk")
    shown = policy if policy == model_config.remat else f"{model_config.remat}: {policy}"
    summed = rl.count > 1 and config.stage != "sft"
    what = "one micro-batch" if micro is rl else "an SFT / pretraining batch"
    return [
        MemoryRow(f"activations ({what}: {micro.tokens} tokens, remat {shown})",
                  total, ", ".join(knobs)),
        MemoryRow(f"gradients (float32{', summed over micro-batches' if summed else ''})",
                  (2 if summed else 1) * params_bytes, _SHARD_PARAMS)]


def device_memory(device: jax.Device) -> int | None:
    """`bytes_limit` of the device's memory stats; None where it reports none (CPU)."""
    stats = device.memory_stats()
    return None if not stats else stats.get("bytes_limit")


def _pages_bytes(model_config: ModelConfig, pages: int, page_size: int, mesh: Mesh) -> int:
    """Bytes per device of `pages` KV pages placed as JaxEngine places its pool (by the
    default rules, whatever config.rules says)."""
    cache = jax.eval_shape(lambda: init_paged_cache(model_config, pages, page_size))
    shardings = parallel.tree_shardings(
        PagedKVCache.logical_axes(model_config.num_layers), cache, mesh)
    return sum(math.prod(sharding.shard_shape(leaf.shape)) * leaf.dtype.itemsize
               for leaf, sharding in zip(jax.tree.leaves(cache), jax.tree.leaves(shardings)))


def memory_plan(config: ml_collections.ConfigDict, model_config: ModelConfig, mesh: Mesh,
                *, device_bytes: int | None = None,
                teacher: ModelConfig | None = None) -> MemoryPlan:
    """The per-device memory plan of `config` with the policy `model_config` on `mesh`.

    Args:
      config: the training config (rollout, algo, rules).
      model_config: the policy's ModelConfig (compute dtype `dtype`).
      mesh: the trainer's mesh.
      device_bytes: one device's memory; None asks a device of the mesh.
      teacher: on-policy distillation's teacher (`policy.teacher_config`), or None.
    """
    rules = parallel.resolve_rules(json.loads(config.rules) if config.rules else None)
    abstract = nnx.state(nnx.eval_shape(lambda: Decoder(model_config, rngs=nnx.Rngs(0))))
    adapters, base = split_adapters(abstract)

    def bytes_of(tree, itemsize: int) -> int:
        shapes = jax.tree.map(lambda p: p.get_value(), tree,
                              is_leaf=lambda x: isinstance(x, nnx.Variable))
        shardings = jax.tree.map(lambda p: p.get_value(),
                                 parallel.param_shardings(tree, mesh, rules),
                                 is_leaf=lambda x: isinstance(x, nnx.Variable))
        return _param_bytes(shapes, shardings, itemsize)

    compute = bytes_of(base, jnp.dtype(model_config.dtype).itemsize)
    r, algo = config.rollout, config.algo
    head = (model_config.hidden_size + 1) * _FLOAT32
    lora = model_config.lora
    if lora is None:
        master = bytes_of(base, _FLOAT32)
        rows = [MemoryRow("policy params (float32)", master, _SHARD_PARAMS),
                MemoryRow("initial params (float32)", master, _SHARD_PARAMS),
                MemoryRow("Adam moments (2 x float32)", 2 * master, _SHARD_PARAMS)]
        reference = master
    else:
        master = bytes_of(adapters, _FLOAT32)
        rank = f"lower model.lora.rank or model.lora.targets, or {_SHARD_PARAMS}"
        rows = [MemoryRow(f"frozen base ({model_config.dtype})", compute,
                          f"model.dtype='bfloat16' halves it, or {_SHARD_PARAMS}"),
                MemoryRow(f"adapters (float32, rank {lora.rank})", master, rank),
                MemoryRow("initial adapters (float32)", master, rank),
                MemoryRow("Adam moments (2 x float32)", 2 * master, rank)]
        reference = 0  # the base with the adapters off
    what = "the base, adapters off" if lora is not None else "float32"
    if config.stage == "dpo":  # the frozen starting policy of the preference loss
        rows.append(MemoryRow(f"DPO reference ({what})", reference, _SHARD_PARAMS))
    elif algo.kl_coef > 0:
        rows.append(MemoryRow(f"KL reference ({what})", reference,
                              f"algo.kl_coef=0 drops it, or {_SHARD_PARAMS}"))
    if needs_critic(algo.advantage):
        rows.append(MemoryRow("critic + Adam (3 x float32)", 3 * (master + head),
                              _SHARD_PARAMS))
    if teacher is not None:
        teacher_params = nnx.state(nnx.eval_shape(lambda: Decoder(teacher, rngs=nnx.Rngs(0))))
        rows.append(MemoryRow(
            f"distillation teacher ({teacher.dtype})",
            bytes_of(teacher_params, jnp.dtype(teacher.dtype).itemsize),
            f"a smaller algo.teacher, model.dtype='bfloat16', or {_SHARD_PARAMS}"))
    lane_weights = f"model.dtype='bfloat16' halves it, or {_SHARD_PARAMS}"
    rows.append(MemoryRow(f"engine weights ({model_config.dtype}, {r.engine_lanes} lane(s))",
                          r.engine_lanes * compute,
                          f"lower rollout.engine_lanes; {lane_weights}"))
    rows.append(MemoryRow("engine weight swap (one lane)", compute, lane_weights))
    if r.mode == "async":
        staged = "adapters, float32" if lora is not None else "float32"
        rows.append(MemoryRow(f"staged weights ({staged}, async)", master,
                              f"rollout.mode='sync' drops it, or {_SHARD_PARAMS}"))
    lane_pages = kv_pages(r) // r.engine_lanes
    pool_split = "split the kv heads over mesh.tensor (data and fsdp devices each hold the pool)"
    rows.append(MemoryRow(
        f"KV pages ({r.engine_lanes * lane_pages} x {r.page_size} tokens, "
        f"{model_config.dtype})",
        r.engine_lanes * _pages_bytes(model_config, lane_pages, r.page_size, mesh),
        "set rollout.kv_tokens to the tokens the episodes hold at once (default: "
        f"engine_slots x max_tokens), lower rollout.engine_slots or rollout.max_tokens, or "
        f"{pool_split}"))
    # A device of this process: memory_stats of another host's device is not readable.
    device = next(d for d in mesh.devices.flat if d.process_index == jax.process_index())
    if resolve_attention(r.engine_attention, device.platform, r.page_size) == "paged":
        view_pages = item_sizes(r.engine_slots // r.engine_lanes,
                                -(-r.max_tokens // r.page_size), "decode", lane_pages)[-1]
        rows.append(MemoryRow(
            f"decode page view ({r.engine_lanes} x {view_pages} pages)",
            r.engine_lanes * _pages_bytes(model_config, view_pages, r.page_size, mesh),
            "the pure-JAX attention copies the pages a decode call reads (at most every "
            "slot at max_tokens, at most the pool): lower rollout.kv_tokens, "
            f"rollout.engine_slots or rollout.max_tokens, or {pool_split}"))
    rows += _activation_rows(config, model_config, mesh, rules, master)
    if device_bytes is None:
        device_bytes = device_memory(device)
    return MemoryPlan(rows=tuple(rows), device_bytes=device_bytes, device=device.device_kind)


# What a CPU process holds beyond its plan's buffers (module docstring), measured on
# this repository's CPU runs (docs/results/real_model.md): the compiler, runtime and
# compiled programs, and the scratch of a compiled step beyond its counted activations.
CPU_RUNTIME_BYTES = 3 * _GIB // 4
CPU_SCRATCH = 0.2


def host_memory() -> int:
    """This host's physical memory in bytes (os.sysconf: no psutil)."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def resident_bytes() -> int:
    """This process's resident set now (/proc/self/statm), or its peak so far where
    there is no /proc (getrusage: kilobytes on Linux, bytes on macOS)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if os.uname().sysname == "Darwin" else peak * 1024


def host_plan(plan: MemoryPlan, *, devices: int = 1, host_bytes: int | None = None
              ) -> MemoryPlan:
    """A CPU run's plan with what the host process holds besides its buffers (module
    docstring), checked against the host's memory (`host_bytes`; None: this host's).
    `devices`: the CPU devices of this process the plan's per-device rows are held on
    (xla_force_host_platform_device_count), all in the same memory."""
    activations = next(row for row in plan.rows if row.name.startswith("activations"))
    per_device = tuple(plan.rows) if devices == 1 else tuple(
        dataclasses.replace(row, name=f"{row.name} x {devices} devices",
                            bytes=devices * row.bytes) for row in plan.rows)
    rows = per_device + (
        MemoryRow("this process so far (interpreter, libraries, tasks, tokenizer)",
                  resident_bytes(), "nothing: measured when the plan is made"),
        MemoryRow("XLA:CPU runtime and compiled programs", CPU_RUNTIME_BYTES,
                  "nothing: measured, about the same for every model"),
        MemoryRow(f"XLA:CPU scratch ({CPU_SCRATCH:g} x the activations)",
                  round(devices * CPU_SCRATCH * activations.bytes), activations.knobs))
    return MemoryPlan(rows=rows, device_bytes=host_memory() if host_bytes is None
                      else host_bytes, device="host (CPU)")
