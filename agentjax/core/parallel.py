"""Device mesh, logical-axis rules and shardings.

Every parameter carries logical axis names (`nnx.Param(..., logical_axes=("embed",
"mlp"))`) and the model constrains its activations by logical names too. A rules table,
plain data that lives in the training config, maps logical names to mesh axes:

    mesh = make_mesh({"data": -1, "fsdp": 2, "tensor": 2})     # -1 fills the devices
    rules = resolve_rules({"embed": "fsdp"})                   # overrides DEFAULT_RULES
    shard_model(model, mesh, rules)                            # params onto the mesh
    graphdef, params = nnx.split(model)                        # jit over params as usual
    tokens = jax.device_put(tokens, batch_sharding(mesh, rules))

Meshes have three axes, outer to inner: `data` (pure data parallel), `fsdp` (data
parallel with parameters sharded along `embed`), `tensor` (Megatron-style: heads, MLP
width and vocabulary split). Their axis types are `AxisType.Auto`, so XLA's GSPMD
propagates shardings through the program.

Logical names: `batch`, `seq`, `embed` (parameter D), `act_embed` (activation D; kept
whole by default so FSDP all-gathers weights rather than activations), `mlp`, `heads`,
`kv_heads`, `head_dim`, `vocab`, `layers` (the stacked-layer axis), `cache_seq` (KV
cache slots), `cache_pages` and `page` (the engine's page pool and a page's slots). A dimension whose size the mapped mesh axes do not divide (e.g. 2 KV heads
on a tensor axis of 4) is replicated along the axes that do not fit instead of failing.

Multi-host: `make_mesh({"distributed": True, ...})` calls `jax.distributed.initialize()`
(auto-detected cluster), or pass a dict of its arguments: `{"distributed":
{"coordinator_address": "10.0.0.1:1234", "num_processes": 2, "process_id": 0}}`.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Mapping, Sequence

import jax
from flax import nnx
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

MESH_AXES = ("data", "fsdp", "tensor")
DEFAULT_MESH = {"data": -1, "fsdp": 1, "tensor": 1}

# logical axis -> mesh axis, tuple of mesh axes, or None (replicated).
DEFAULT_RULES: dict[str, Any] = {
    "batch": ("data", "fsdp"),
    "seq": None,
    "embed": "fsdp",
    "act_embed": None,
    "mlp": "tensor",
    "heads": "tensor",
    "kv_heads": "tensor",
    "head_dim": None,
    "vocab": "tensor",
    "layers": None,
    "cache_seq": None,
    # Pages are shared by every sequence, whichever data shard runs it: replicated.
    "cache_pages": None,
    "page": None,
}

LogicalAxes = Sequence[str | None]
Rules = tuple[tuple[str, tuple[str, ...]], ...]


def initialize_distributed(spec: bool | Mapping[str, Any]) -> None:
    """Starts JAX's multi-host runtime once (no-op when already started or `spec` falsy).

    Must run before anything touches JAX devices. Cross-process collectives of the CPU
    backend use gloo (the setting does not affect GPU/TPU backends).

    Args:
      spec: True for auto-detection (TPU pods, SLURM, ...), or the keyword arguments of
        `jax.distributed.initialize` (coordinator_address, num_processes, process_id,
        ...).
    """
    if not spec or jax.distributed.is_initialized():
        return
    kwargs = dict(spec) if isinstance(spec, Mapping) else {}
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(**kwargs)


def make_mesh(config: Mapping[str, Any] | None = None, *,
              devices: Sequence[jax.Device] | None = None) -> Mesh:
    """Builds a ("data", "fsdp", "tensor") mesh with Auto axis types.

    Args:
      config: sizes per axis (missing axes are 1; one size may be -1 to take the
        remaining devices) and optionally "distributed" (see `initialize_distributed`).
        None means DEFAULT_MESH (pure data parallel).
      devices: the devices to use (default: all global devices).

    Raises:
      ValueError: unknown axis name, more than one -1, or sizes whose product does not
        equal the device count.
    """
    config = dict(DEFAULT_MESH if config is None else config)
    initialize_distributed(config.pop("distributed", False))
    unknown = set(config) - set(MESH_AXES)
    if unknown:
        raise ValueError(f"mesh config has unknown axes {sorted(unknown)}; axes: {MESH_AXES}")
    devices = list(jax.devices() if devices is None else devices)
    sizes = [int(config.get(axis, 1)) for axis in MESH_AXES]
    if sizes.count(-1) > 1:
        raise ValueError(f"at most one mesh axis may be -1, got {dict(zip(MESH_AXES, sizes))}")
    if any(s == 0 or s < -1 for s in sizes):
        raise ValueError(f"mesh sizes must be positive or -1, got {dict(zip(MESH_AXES, sizes))}")
    known = math.prod(s for s in sizes if s != -1)
    if -1 in sizes:
        if len(devices) % known:
            raise ValueError(
                f"{len(devices)} devices are not divisible by the fixed mesh sizes "
                f"{dict(zip(MESH_AXES, sizes))}")
        sizes[sizes.index(-1)] = len(devices) // known
    if math.prod(sizes) != len(devices):
        raise ValueError(
            f"mesh {dict(zip(MESH_AXES, sizes))} needs {math.prod(sizes)} devices, "
            f"have {len(devices)}")
    return jax.make_mesh(tuple(sizes), MESH_AXES, axis_types=(AxisType.Auto,) * 3,
                         devices=devices)


def resolve_rules(rules: Mapping[str, Any] | Rules | None = None) -> Rules:
    """DEFAULT_RULES overridden by `rules`, normalised to a hashable tuple.

    Args:
      rules: logical name -> mesh axis name, list/tuple of mesh axis names, or None;
        an already resolved tuple is returned unchanged.
    """
    if isinstance(rules, tuple):
        return rules
    merged = {**DEFAULT_RULES, **dict(rules or {})}
    resolved = []
    for name, axes in sorted(merged.items()):
        if axes is None:
            axes = ()
        elif isinstance(axes, str):
            axes = (axes,)
        axes = tuple(axes)
        bad = [a for a in axes if a not in MESH_AXES]
        if bad:
            raise ValueError(f"rule {name!r} -> {bad}: unknown mesh axes; axes: {MESH_AXES}")
        resolved.append((name, axes))
    return tuple(resolved)


def logical_to_spec(logical_axes: LogicalAxes, rules: Rules, mesh: Mesh,
                    shape: Sequence[int] | None = None) -> PartitionSpec:
    """PartitionSpec of an array whose dimensions have the given logical names.

    A mesh axis already used by an earlier dimension is not reused, and with `shape`
    given, mesh axes that do not divide a dimension are dropped (replicated).

    Args:
      logical_axes: one logical name (or None) per dimension.
      rules: resolved rules (`resolve_rules`).
      mesh: the mesh whose axis sizes decide divisibility.
      shape: the array shape, to check divisibility.

    Raises:
      ValueError: a logical name missing from the rules, or rank mismatch with shape.
    """
    table = dict(rules)
    if shape is not None and len(shape) != len(logical_axes):
        raise ValueError(f"logical axes {tuple(logical_axes)} do not match shape {tuple(shape)}")
    used: set[str] = set()
    spec = []
    for dim, name in enumerate(logical_axes):
        if name is None:
            spec.append(None)
            continue
        if name not in table:
            raise ValueError(f"logical axis {name!r} has no sharding rule; rules: {sorted(table)}")
        axes = [a for a in table[name] if a in mesh.shape and a not in used]
        if shape is not None:
            while axes and shape[dim] % math.prod(mesh.shape[a] for a in axes):
                axes.pop()
        used.update(axes)
        spec.append(tuple(axes) if len(axes) > 1 else (axes[0] if axes else None))
    return PartitionSpec(*spec)


@dataclasses.dataclass(frozen=True)
class LogicalSharding:
    """A mesh plus rules: turns logical names into shardings (hashable, so a model may
    hold one as static data).

    Attributes:
      mesh: the device mesh.
      rules: resolved rules (`resolve_rules`).
    """

    mesh: Mesh
    rules: Rules

    def spec(self, logical_axes: LogicalAxes, shape: Sequence[int] | None = None) -> PartitionSpec:
        """PartitionSpec for the logical axes (see `logical_to_spec`)."""
        return logical_to_spec(logical_axes, self.rules, self.mesh, shape)

    def named(self, logical_axes: LogicalAxes, shape: Sequence[int] | None = None) -> NamedSharding:
        """NamedSharding for the logical axes."""
        return NamedSharding(self.mesh, self.spec(logical_axes, shape))

    def constrain(self, x: jax.Array, logical_axes: LogicalAxes) -> jax.Array:
        """`with_sharding_constraint` of an activation by logical names."""
        return jax.lax.with_sharding_constraint(x, self.named(logical_axes, x.shape))


def constrain(x: jax.Array, logical_axes: LogicalAxes,
              sharding: LogicalSharding | None) -> jax.Array:
    """Constrains `x` when a sharding is given; identity otherwise (single device)."""
    return x if sharding is None else sharding.constrain(x, logical_axes)


def _is_param(x: Any) -> bool:
    return isinstance(x, nnx.Variable)


def param_shardings(params: Any, mesh: Mesh, rules: Mapping[str, Any] | Rules | None = None):
    """NamedShardings for a params tree (an `nnx.State` or abstract state) from the
    `logical_axes` metadata of each Param (unannotated leaves are replicated).

    Args:
      params: `nnx.state(model)` / `nnx.split(model)[1]`, concrete or abstract.
      mesh: the mesh.
      rules: rules (None: DEFAULT_RULES).

    Returns:
      The same tree structure with a NamedSharding in place of each array value.
    """
    sharding = LogicalSharding(mesh, resolve_rules(rules))

    def one(leaf):
        value = leaf.get_value() if _is_param(leaf) else leaf
        axes = leaf.get_metadata().get("logical_axes") if _is_param(leaf) else None
        if axes is None:
            named = NamedSharding(mesh, PartitionSpec())
        else:
            named = sharding.named(axes, value.shape)
        return leaf.replace(named) if _is_param(leaf) else named

    return jax.tree.map(one, params, is_leaf=_is_param)


def tree_shardings(logical_tree: Any, shapes: Any, mesh: Mesh,
                   rules: Mapping[str, Any] | Rules | None = None):
    """NamedShardings for any pytree given a matching tree of logical-axes tuples.

    Args:
      logical_tree: pytree whose leaves are tuples of logical names (e.g.
        `KVCache.logical_axes()`).
      shapes: pytree of arrays / ShapeDtypeStructs with the same structure.
      mesh: the mesh.
      rules: rules (None: DEFAULT_RULES).
    """
    sharding = LogicalSharding(mesh, resolve_rules(rules))
    is_axes = lambda x: isinstance(x, tuple) and all(a is None or isinstance(a, str) for a in x)
    axes_leaves, treedef = jax.tree.flatten(logical_tree, is_leaf=is_axes)
    shape_leaves = treedef.flatten_up_to(shapes)
    return treedef.unflatten(
        [sharding.named(a, s.shape) for a, s in zip(axes_leaves, shape_leaves)])


def placed_shardings(tree: Any, mesh: Mesh):
    """A NamedSharding per array of `tree`: its own when it already lies on `mesh` with
    a NamedSharding (e.g. params placed by the rules, optimizer moments initialized from
    them), else replicated (step counters, RNG keys) — the in/out shardings of a jitted
    step that keeps a train state where it is."""
    def one(x):
        sharding = getattr(x, "sharding", None)
        if isinstance(sharding, NamedSharding) and sharding.mesh == mesh:
            return sharding
        return NamedSharding(mesh, PartitionSpec())

    return jax.tree.map(one, tree)


def batch_sharding(mesh: Mesh, rules: Mapping[str, Any] | Rules | None = None,
                   logical_axes: LogicalAxes = ("batch", "seq")) -> NamedSharding:
    """Sharding of a [B, T] batch array (tokens, positions, masks ...).

    Args:
      mesh: the mesh.
      rules: rules (None: DEFAULT_RULES).
      logical_axes: logical names of the array's dimensions.
    """
    return LogicalSharding(mesh, resolve_rules(rules)).named(logical_axes)


def shard_params(params: Any, mesh: Mesh, rules: Mapping[str, Any] | Rules | None = None):
    """Moves every Param of a params tree onto its sharding (see `param_shardings`)."""
    shardings = param_shardings(params, mesh, rules)
    return jax.tree.map(lambda p, s: jax.device_put(p, s), params, shardings,
                        is_leaf=_is_param)


def _set_activation_sharding(module: nnx.Module, sharding: LogicalSharding | None) -> None:
    for _, node in nnx.iter_graph(module):
        if isinstance(node, nnx.Module) and hasattr(node, "activation_sharding"):
            node.activation_sharding = sharding


def shard_model(model: nnx.Module, mesh: Mesh,
                rules: Mapping[str, Any] | Rules | None = None) -> nnx.Module:
    """Places a model's params onto the mesh and makes it constrain its activations.

    The model is changed in place (and returned). Split it (`nnx.split`) after this
    call: the activation sharding is static data in the graphdef.

    Args:
      model: an NNX module whose Params carry `logical_axes` metadata.
      mesh: the mesh.
      rules: rules (None: DEFAULT_RULES).
    """
    rules = resolve_rules(rules)
    nnx.update(model, shard_params(nnx.state(model), mesh, rules))
    _set_activation_sharding(model, LogicalSharding(mesh, rules))
    return model


def create_sharded(make_module: Callable[[], nnx.Module], mesh: Mesh,
                   rules: Mapping[str, Any] | Rules | None = None) -> nnx.Module:
    """Initializes a module directly into its shardings (no full single-device copy).

    Args:
      make_module: zero-argument constructor, e.g. `lambda: Decoder(cfg, rngs=nnx.Rngs(0))`.
      mesh: the mesh.
      rules: rules (None: DEFAULT_RULES).
    """
    rules = resolve_rules(rules)
    abstract = nnx.eval_shape(make_module)
    graphdef, abstract_state = nnx.split(abstract)
    out_shardings = param_shardings(abstract_state, mesh, rules)
    state = jax.jit(lambda: nnx.split(make_module())[1], out_shardings=out_shardings)()
    model = nnx.merge(graphdef, state)
    _set_activation_sharding(model, LogicalSharding(mesh, rules))
    return model

