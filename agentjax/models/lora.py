"""LoRA: low-rank adapters over the decoder's frozen projections (Hu et al., arXiv
2106.09685), parametrized as PEFT and "LoRA Without Regret" (Thinking Machines, 2025) do:

    y = x W + (alpha / r) (x A) B          A [d_in..., r], B [r, d_out...]

    lora = LoraConfig(rank=8, alpha=32)                    # all seven projections
    model = add_adapters(load_hf(path)[0], lora, seed=0)   # base kept, adapters fresh
    adapters, base = split_adapters(nnx.state(model))      # what trains / what is frozen
    merged = merged_base(model)                            # W + (alpha/r) A B, a Decoder

A target is one of the seven projections (`TARGETS`: q, k, v, o, gate, up, down); each
adapted one gets A and B stacked over layers like its weight, as `nnx.LoRAParam`s under
the decoder's `lora` attribute (state["lora"][target]["a" | "b"]). A keeps the weight's
input axes and B its output axes, so they shard by the same logical axes; the rank axis
is replicated. PEFT's init: A uniform in +-1/sqrt(d_in) (its kaiming_uniform with
a = sqrt(5)), B = 0, so a fresh adapter leaves the model unchanged. Adapters are float32
whatever the base's dtype; the forward casts them to the compute dtype with the base.

Why the trainer keeps adapters beside a frozen base and never merges them into it:
the base is read-only for the whole stage (the KL reference is the same base with the
adapters off, no second copy), a resumed run restores adapters onto the base it
started from (never applied twice), and merging and unmerging in bfloat16 every step
drifts (TRL #6688). The rollout engine instead gets merged weights (`merged_layers`,
through `Decoder.layerwise_weights`): W + (alpha/r) A B in float32, cast once to the
compute dtype per weight sync, so decoding costs what the base model costs and no
engine can sample the base by forgetting the adapters (verl #3821, #7495).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from agentjax.config.choices import LORA_TARGETS
from agentjax.core.parallel import param_shardings

# Short name -> the decoder's projection (q -> q_proj, ...).
TARGETS = {name: f"{name}_proj" for name in LORA_TARGETS}
ATTENTION_TARGETS = ("q", "k", "v", "o")
# Leading axes of each projection's weight (after the layer axis) that x contracts with:
# o_proj [H, hd, D] reads the attention output's heads and head_dim, the others one axis.
_INPUT_AXES = {"q_proj": 1, "k_proj": 1, "v_proj": 1, "o_proj": 2, "gate_proj": 1,
               "up_proj": 1, "down_proj": 1}
STATE_KEY = "lora"  # the Decoder attribute (and state key) holding the adapters


@dataclasses.dataclass(frozen=True)
class LoraConfig:
    """Adapters of one decoder (hashable: it lives in the ModelConfig, a static part of
    the graphdef).

    Attributes:
      rank: r, the adapters' inner width (>= 1, at most min(d_in, d_out) of each target).
      alpha: the update is scaled by alpha / rank.
      targets: short names of the adapted projections (keys of TARGETS).
      dropout: the probability of dropping an input of A while training (PEFT's
        lora_dropout); never during sampling or the reference forward.
    """

    rank: int
    alpha: float = 32.0
    targets: tuple[str, ...] = tuple(TARGETS)
    dropout: float = 0.0

    def __post_init__(self):
        object.__setattr__(self, "targets", tuple(self.targets))
        unknown = [t for t in self.targets if t not in TARGETS]
        if unknown or not self.targets:
            raise ValueError(f"model.lora.targets: unknown target module(s) {unknown} in "
                             f"{list(self.targets)}; choose among {list(TARGETS)}")
        if len(set(self.targets)) != len(self.targets):
            raise ValueError(f"model.lora.targets: {list(self.targets)} names a module twice")
        if not isinstance(self.rank, int) or self.rank <= 0:
            raise ValueError(f"model.lora.rank must be a positive int, got {self.rank!r}")
        if not self.alpha > 0:
            raise ValueError(f"model.lora.alpha must be > 0, got {self.alpha!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"model.lora.dropout must be in [0, 1), got {self.dropout!r}")

    @property
    def scale(self) -> float:
        """alpha / rank, what (x A) B is multiplied by."""
        return self.alpha / self.rank

    @property
    def projections(self) -> tuple[str, ...]:
        """The decoder parameter names of the targets (q_proj, ...)."""
        return tuple(TARGETS[t] for t in self.targets)

    @property
    def attention_only(self) -> bool:
        return set(self.targets) <= set(ATTENTION_TARGETS)


def adapter_specs(weight_specs: dict, lora: LoraConfig) -> dict[str, dict[str, tuple]]:
    """target projection -> {"a": (shape, logical axes), "b": ...} of its stacked adapters,
    from `decoder.layer_param_specs` (shape, axes, init) of the weights.

    Raises ValueError (naming model.lora.rank) when the rank exceeds min(d_in, d_out)
    of a target: beyond it the product A B has no more rank to give."""
    specs = {}
    for name in lora.projections:
        shape, axes, _ = weight_specs[name]
        split = 1 + _INPUT_AXES[name]  # the layer axis, then the input axes
        d_in, d_out = math.prod(shape[1:split]), math.prod(shape[split:])
        if lora.rank > min(d_in, d_out):
            raise ValueError(f"model.lora.rank={lora.rank} exceeds min(d_in, d_out) = "
                             f"{min(d_in, d_out)} of {name} ([{d_in}, {d_out}])")
        specs[name] = {"a": (shape[:split] + (lora.rank,), axes[:split] + (None,)),
                       "b": (shape[:1] + (lora.rank,) + shape[split:],
                             axes[:1] + (None,) + axes[split:])}
    return specs


def init_adapter(key: jax.Array, shape: tuple[int, ...], which: str,
                 input_axes: int) -> jax.Array:
    """PEFT's init of one stacked adapter: A uniform in +-1/sqrt(d_in), B zeros
    (float32)."""
    if which == "b":
        return jnp.zeros(shape, jnp.float32)
    bound = 1.0 / math.sqrt(math.prod(shape[1:1 + input_axes]))
    return jax.random.uniform(key, shape, jnp.float32, -bound, bound)


def make_adapters(weight_specs: dict, lora: LoraConfig, rngs: nnx.Rngs) -> nnx.Dict:
    """The decoder's `lora` attribute: per target an nnx.Dict of LoRAParams a and b."""
    return nnx.Dict({
        name: nnx.Dict({which: nnx.LoRAParam(
            init_adapter(rngs.params(), shape, which, _INPUT_AXES[name]), logical_axes=axes)
            for which, (shape, axes) in spec.items()})
        for name, spec in adapter_specs(weight_specs, lora).items()})


def delta(name: str, x: jax.Array, a: jax.Array, b: jax.Array, scale: float) -> jax.Array:
    """(alpha / r) (x A) B of projection `name` for one layer's adapters: x [B, T,
    d_in...] contracts its trailing input axes with A [d_in..., r]."""
    xa = jnp.tensordot(x, a, axes=_INPUT_AXES[name]) * jnp.asarray(scale, x.dtype)
    return jnp.tensordot(xa, b, axes=1)


def merged_weight(w: jax.Array, a: jax.Array, b: jax.Array, scale: float,
                  dtype: Any) -> jax.Array:
    """One layer's W + (alpha / r) A B, computed in float32 and cast once to `dtype`
    (jax.vmap it over a layer stack)."""
    ab = jnp.tensordot(a.astype(jnp.float32), b.astype(jnp.float32), axes=1)
    return (w.astype(jnp.float32) + scale * ab).astype(dtype)


def split_adapters(state: Any) -> tuple[nnx.State, nnx.State]:
    """(adapters, the rest) of a model's state: its LoRAParams (a Decoder's
    state["lora"], a critic's state["trunk"]["lora"]) and every other variable.
    `join_adapters` is the inverse."""
    return nnx.split_state(state, nnx.LoRAParam, ...)


def join_adapters(adapters: Any, base: Any) -> nnx.State:
    """The state split_adapters split (same tree structure)."""
    return nnx.merge_state(base, adapters)


def has_adapters(state: Any) -> bool:
    """True for the state of a model with LoRA adapters."""
    return any(isinstance(v, nnx.LoRAParam) for v in jax.tree.leaves(
        state, is_leaf=lambda x: isinstance(x, nnx.Variable)))


def _adapter_shardings(abstract_adapters: Any, model: Any):
    """Where a model's adapters go: by their logical axes on the model's mesh, else on
    the device of its embedding."""
    if model.activation_sharding is not None:
        shard = model.activation_sharding
        return param_shardings(abstract_adapters, shard.mesh, shard.rules)
    device = jax.sharding.SingleDeviceSharding(next(iter(model.embed[...].devices())))
    return jax.tree.map(lambda _: device, abstract_adapters)


def add_adapters(model: Any, config: LoraConfig, *, seed: int) -> Any:
    """`model` (a Decoder without adapters) with fresh adapters of `config`: its base
    arrays as they are (not copied), adapters initialized as
    `Decoder(config with lora, rngs=nnx.Rngs(seed))` would draw them.

    Raises ValueError naming the model.lora key a target does not fit."""
    if model.config.lora is not None:
        raise ValueError("the model has adapters already: fold_adapters first")
    cfg = dataclasses.replace(model.config, lora=config)

    def build():
        return type(model)(cfg, rngs=nnx.Rngs(seed))

    graphdef, abstract = nnx.split(nnx.eval_shape(build))
    shardings = _adapter_shardings(split_adapters(abstract)[0], model)
    # Only the adapters leave the program: the base's random init is dead code.
    adapters = jax.jit(lambda: split_adapters(nnx.state(build()))[0],
                       out_shardings=shardings)()
    adapted = nnx.merge(graphdef, join_adapters(adapters, nnx.state(model)))
    adapted.activation_sharding = model.activation_sharding
    return adapted


def base_graphdef(model: Any) -> nnx.GraphDef:
    """The graphdef of `model` without adapters: merged with the base part of its state
    (split_adapters) it is the base model, the very arrays."""
    cfg = dataclasses.replace(model.config, lora=None)
    return nnx.split(nnx.eval_shape(lambda: type(model)(cfg, rngs=nnx.Rngs(0))))[0]


def fold_adapters(model: Any) -> Any:
    """A Decoder without adapters whose targeted projections are W + (alpha / r) A B,
    merged in float32 and stored in the base's dtype (one rounding): a merged HF export,
    or the base the next stage's fresh adapters train over. `model` is not changed."""
    lora = model.config.lora
    graphdef = base_graphdef(model)
    _, base = split_adapters(nnx.state(model))
    merge = jax.jit(jax.vmap(merged_weight, in_axes=(0, 0, 0, None, None)),
                    static_argnums=(3, 4))
    for name in lora.projections:  # one target at a time bounds the float32 transient
        w = model.layers[name][...]
        pair = model.lora[name]
        base["layers"][name] = base["layers"][name].replace(
            merge(w, pair["a"][...], pair["b"][...], lora.scale, w.dtype))
    folded = nnx.merge(graphdef, base)
    folded.activation_sharding = model.activation_sharding
    return folded


def adapter_param_count(weight_specs: dict, config: LoraConfig) -> int:
    """Trainable parameters of `config`'s adapters over weights of `weight_specs`
    (`decoder.layer_param_specs`)."""
    return sum(math.prod(shape) for spec in adapter_specs(weight_specs, config).values()
               for shape, _ in spec.values())


def base_fingerprint(base: Any) -> dict[str, list]:
    """What identifies a frozen base for a resumed run: per parameter its shape, dtype
    and the float32 sums of its values and their squares (JSON-able)."""
    leaves = jax.tree_util.tree_leaves_with_path(base)
    sums = jax.jit(lambda xs: [(jnp.sum(x.astype(jnp.float32)),
                                jnp.sum(jnp.square(x.astype(jnp.float32)))) for x in xs])(
        [x for _, x in leaves])
    return {jax.tree_util.keystr(path): [list(x.shape), str(x.dtype), float(s), float(q)]
            for (path, x), (s, q) in zip(leaves, jax.device_get(sums))}


def check_same_base(saved: dict[str, list], current: dict[str, list], where: str) -> None:
    """ValueError naming the first parameter where the base adapters were saved over
    (`saved`, a base_fingerprint) differs from the one they would be restored onto:
    other names, shapes or dtypes, or sums beyond float32 rounding of another reduction
    order (a resume on another mesh)."""
    if saved.keys() != current.keys():
        raise ValueError(f"{where}: the adapters were trained over a base with parameters "
                         f"{sorted(saved)[:4]}..., this model has {sorted(current)[:4]}...")
    for name, (shape, dtype, total, squares) in saved.items():
        now = current[name]
        same = [shape, dtype] == now[:2] and all(
            abs(a - b) <= 1e-4 * max(abs(a), abs(b), 1.0)
            for a, b in ((total, now[2]), (squares, now[3])))
        if not same:
            raise ValueError(f"{where}: the adapters were trained over another base: "
                             f"parameter {name} was {[shape, dtype, total, squares]}, "
                             f"is {now}; resume over the base the run started from")
