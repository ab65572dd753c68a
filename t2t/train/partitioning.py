"""Device mesh, logical-axis rules and parameter shardings.

The mesh has three named axes: ``data`` (pure data parallelism), ``fsdp`` (data parallelism
whose replicas also shard the parameters and optimizer state) and ``tensor`` (Megatron-style
model parallelism over heads / mlp / vocab), and a fourth, ``expert``, only when
``MeshConfig.expert`` is not 1: it splits the batch like ``data`` and the experts of
mixture-of-experts layers (``t2t/nn/moe.py``) between its devices. Rules that name a mesh axis
the mesh lacks (``expert`` on a three-axis mesh) drop it, so every other mesh is unchanged.
Model code only ever names *logical* axes (``batch, length, embed, mlp, heads, kv, joined_kv,
vocab, relpos_buckets, layers, expert, expert_group``); the one table :data:`DEFAULT_RULES`
maps them onto mesh axes.

Rules for the rules:

* A logical name appears at most once in a table; a second entry is an error, never a
  silent fallback (flax would otherwise treat it as a lower-priority alternative).
* A logical name that a parameter or activation uses but the table lacks is an error
  (flax would silently replicate that dimension).
* **Replicate on reuse**: one array uses each mesh axis at most once. When two dimensions of
  the same array map to the same mesh axis, the dimension whose rule comes *first in the
  table* keeps it and the other is replicated (flax's priority order). :data:`DEFAULT_RULES`
  lists ``batch`` first, so the activation ``[batch, length, embed]`` is sharded as
  ``P(("data", "fsdp"), None, None)``: batch takes ``fsdp`` and embed, which comes later in
  both the array and the table, is replicated. Parameters have no ``batch`` dimension, so
  their ``embed`` dimension is sharded over ``fsdp``.

The sharded-init pattern (as flax examples/lm1b) is :func:`init_sharded`:
the init traced once (:func:`trace_init`) → logical specs → mesh shardings → that trace
compiled with ``jax.jit(..., out_shardings)`` under ``jax.set_mesh(mesh)`` and the
logical-axis rules. Never use the old ``with mesh:``
context: it silently disables flax's logical constraints.
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import logging
import math
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence, Union

import flax.linen as nn
import jax
import numpy as np
import optax
from jax.experimental import mesh_utils
from jax.extend import core as jax_core
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

MESH_AXES = ("data", "fsdp", "tensor")
EXPERT_AXIS = "expert"      # a mesh axis only where MeshConfig.expert != 1 (after "data")
LOGICAL_AXES = ("batch", "length", "embed", "mlp", "heads", "kv", "joined_kv", "vocab",
                "relpos_buckets", "layers", "expert", "expert_group")

MeshAxes = Union[str, tuple[str, ...], None]
Rules = Sequence[tuple[str, MeshAxes]]

# Order matters (see "replicate on reuse" above): batch must come before embed.
DEFAULT_RULES: tuple[tuple[str, MeshAxes], ...] = (
    ("batch", ("data", EXPERT_AXIS, "fsdp")),
    ("expert", EXPERT_AXIS),               # experts of an MoE layer
    ("expert_group", ("data", "fsdp")),    # token groups once dispatched to their experts
    ("embed", "fsdp"),
    ("mlp", "tensor"),
    ("heads", "tensor"),
    ("joined_kv", "tensor"),
    ("vocab", "tensor"),
    ("kv", None),
    ("length", None),
    ("relpos_buckets", None),
    ("layers", None),
)


# ----------------------------------------------------------------------------- mesh


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    """Mesh shape. ``-1`` on one ICI axis means "all remaining devices".

    ``data/fsdp/tensor`` are the axis sizes inside a slice (ICI); ``dcn_*`` the number of
    slices along each axis (multi-slice over the data-centre network). The final mesh axis
    size is the product of the two.
    """

    data: int = -1
    fsdp: int = 1
    tensor: int = 1
    dcn_data: int = 1
    dcn_fsdp: int = 1
    dcn_tensor: int = 1
    allow_split_physical_axes: bool = False  # let one mesh axis span several torus axes
    expert: int = 1             # expert parallelism (MoE layers); 1 = no `expert` mesh axis
    dcn_expert: int = 1

    @property
    def axis_names(self) -> tuple[str, ...]:
        """The mesh's axes: ``MESH_AXES``, with ``expert`` after ``data`` unless it is 1."""
        if self.expert == 1 and self.dcn_expert == 1:
            return MESH_AXES
        return (MESH_AXES[0], EXPERT_AXIS) + MESH_AXES[1:]

    @property
    def ici_shape(self) -> tuple[int, ...]:
        sizes = {"data": self.data, "fsdp": self.fsdp, "tensor": self.tensor,
                 EXPERT_AXIS: self.expert}
        return tuple(sizes[a] for a in self.axis_names)

    @property
    def dcn_shape(self) -> tuple[int, ...]:
        sizes = {"data": self.dcn_data, "fsdp": self.dcn_fsdp, "tensor": self.dcn_tensor,
                 EXPERT_AXIS: self.dcn_expert}
        return tuple(sizes[a] for a in self.axis_names)


def _describe(names: Sequence[str], sizes: Sequence[int]) -> str:
    return " × ".join(f"{n}={s}" for n, s in zip(names, sizes))


def _resolve_shape(shape: Sequence[int], num_devices: int, names: Sequence[str],
                   what: str) -> tuple[int, ...]:
    """Replaces one ``-1`` in ``shape`` so that the product equals ``num_devices``."""
    shape = tuple(int(s) for s in shape)
    bad = [f"{n}={s}" for n, s in zip(names, shape) if s == 0 or s < -1]
    if bad:
        raise ValueError(f"{what} sizes must be positive or -1, got {', '.join(bad)}")
    free = [i for i, s in enumerate(shape) if s == -1]
    if len(free) > 1:
        raise ValueError(f"only one {what} axis may be -1, got {_describe(names, shape)}")
    known = math.prod(s for s in shape if s != -1)
    if free:
        if num_devices % known:
            raise ValueError(
                f"{what} {_describe(names, shape)}: the fixed axes ({known} devices) do not "
                f"divide the {num_devices} devices")
        shape = tuple(num_devices // known if s == -1 else s for s in shape)
    elif known != num_devices:
        raise ValueError(f"{what} {_describe(names, shape)} needs {known} devices but "
                         f"{num_devices} are available")
    return shape


# Devices `make_mesh` uses when given none: `jax.devices()` unless `target_devices` is active.
_TARGET_DEVICES: contextvars.ContextVar[Optional[Sequence[jax.Device]]] = (
    contextvars.ContextVar("t2t_target_devices", default=None))


@contextlib.contextmanager
def target_devices(devices: Sequence[jax.Device]) -> Iterator[None]:
    """Meshes built inside (``make_mesh(devices=None)``) use ``devices``: e.g. the
    compile-only devices of a TPU topology, so that an experiment's trainer
    targets that topology (``t2t compile``)."""
    token = _TARGET_DEVICES.set(list(devices))
    try:
        yield
    finally:
        _TARGET_DEVICES.reset(token)


def make_mesh(config: Optional[MeshConfig] = None,
              devices: Optional[Sequence[jax.Device]] = None) -> Mesh:
    """A ``("data", "fsdp", "tensor")`` mesh (``("data", "expert", "fsdp", "tensor")``
    when ``config.expert != 1``) with Auto axis types, topology-aware order.

    ``config=None``: the default ``MeshConfig()`` (all devices on ``data``).
    ``devices=None``: the :func:`target_devices` in effect, else ``jax.devices()``.
    """
    config = MeshConfig() if config is None else config
    if devices is None:
        devices = _TARGET_DEVICES.get()
    devices = list(jax.devices() if devices is None else devices)
    n = len(devices)
    names = config.axis_names
    dcn = tuple(int(s) for s in config.dcn_shape)
    if any(s < 1 for s in dcn):
        raise ValueError(f"DCN axis sizes must be >= 1 (no -1), got "
                         f"{_describe([f'dcn_{a}' for a in names], dcn)}")
    num_slices = math.prod(dcn)
    if n % num_slices:
        raise ValueError(f"DCN mesh {_describe(names, dcn)} ({num_slices} slices) does "
                         f"not divide the {n} devices")
    ici = _resolve_shape(config.ici_shape, n // num_slices, names,
                         "mesh" if num_slices == 1 else "per-slice mesh")
    full = tuple(i * d for i, d in zip(ici, dcn))
    platform = devices[0].platform
    try:
        if num_slices > 1:
            array = mesh_utils.create_hybrid_device_mesh(
                ici, dcn, devices, process_is_granule=not hasattr(devices[0], "slice_index"),
                allow_split_physical_axes=config.allow_split_physical_axes)
        else:
            array = mesh_utils.create_device_mesh(
                ici, devices, allow_split_physical_axes=config.allow_split_physical_axes)
    except (ValueError, NotImplementedError, AssertionError) as e:
        if platform == "tpu":
            raise ValueError(f"cannot lay out mesh {_describe(names, full)} on this TPU "
                             f"topology ({e}); try another shape or "
                             f"allow_split_physical_axes=True") from e
        logging.info("mesh_utils refused %s on %s (%s); using device order", full, platform, e)
        array = np.asarray(devices, dtype=object).reshape(full)
    return Mesh(np.asarray(array).reshape(full), names,
                axis_types=(AxisType.Auto,) * len(names))


# ----------------------------------------------------------------------------- rules


def validate_rules(rules: Rules, mesh: Optional[Mesh] = None) -> tuple[tuple[str, MeshAxes], ...]:
    """Checks a logical→mesh table: no name twice, only mesh axes that exist (``expert``
    always may: see :func:`rules_for_mesh`). Returns a tuple."""
    seen: dict[str, MeshAxes] = {}
    out = []
    for entry in rules:
        if len(entry) != 2 or not isinstance(entry[0], str):
            raise ValueError(f"a rule is (logical_name, mesh_axes), got {entry!r}")
        name, axes = entry
        if isinstance(axes, list):
            axes = tuple(axes)
        if name in seen:
            raise ValueError(f"conflicting rules for {name!r}: {seen[name]!r} and {axes!r}")
        seen[name] = axes
        if mesh is not None:
            for a in (axes,) if isinstance(axes, str) else (axes or ()):
                if a not in mesh.axis_names and a != EXPERT_AXIS:
                    raise ValueError(f"rule ({name!r}, {axes!r}) names mesh axis {a!r}; the "
                                     f"mesh has {tuple(mesh.axis_names)}")
        out.append((name, axes))
    return tuple(out)


def rules_for_mesh(rules: Rules, mesh: Mesh) -> tuple[tuple[str, MeshAxes], ...]:
    """Validated rules as applied on ``mesh``: on a mesh without an ``expert`` axis they
    lose it (``("expert", "expert")`` becomes ``("expert", None)``; the batch keeps
    ``("data", "fsdp")``), so expert parallelism is simply off there."""
    rules = validate_rules(rules, mesh)
    if EXPERT_AXIS in mesh.axis_names:
        return rules
    return tuple((name, _without(axes, EXPERT_AXIS)) for name, axes in rules)


def _without(axes: MeshAxes, drop: str) -> MeshAxes:
    """``axes`` less the mesh axis ``drop`` (a lone name becomes None)."""
    if axes == drop:
        return None
    if isinstance(axes, tuple) and drop in axes:
        return tuple(a for a in axes if a != drop)
    return axes


def _check_known(names: Sequence[Any], rules: Rules, where: str) -> None:
    known = [r[0] for r in rules]
    for name in names:
        if isinstance(name, str) and name not in known:
            raise ValueError(f"{where} uses logical axis {name!r}, which the rules table "
                             f"lacks; known names: {known}")


class _UnknownNameGuard:
    """Last entry of the rules handed to flax: flax tests ``guard in array_dim_names`` for
    every constraint, which calls ``__eq__`` on each name, so an unknown name raises at
    trace time instead of being silently replicated."""

    def __init__(self, known: Sequence[str]):
        self.known = tuple(known)

    def __eq__(self, other: Any) -> bool:
        if isinstance(other, str) and other not in self.known:
            raise ValueError(f"an activation uses logical axis {other!r}, which the rules "
                             f"table lacks; known names: {list(self.known)}")
        return False

    __hash__ = object.__hash__

    def __repr__(self) -> str:
        return "<unknown-logical-name guard>"


def flax_rules(rules: Rules = DEFAULT_RULES) -> tuple:
    """Validated rules plus a guard that rejects unknown activation names (for flax)."""
    rules = validate_rules(rules)
    return rules + ((_UnknownNameGuard([r[0] for r in rules]), None),)


@contextlib.contextmanager
def sharding_context(mesh: Mesh, rules: Rules = DEFAULT_RULES) -> Iterator[None]:
    """``jax.set_mesh(mesh)`` + flax logical-axis rules: wrap jit calls of model code in it."""
    rules = rules_for_mesh(rules, mesh)
    with jax.set_mesh(mesh), nn.logical_axis_rules(flax_rules(rules)):
        yield


# ----------------------------------------------------------------------------- shardings




def _is_box(x: Any) -> bool:
    return isinstance(x, nn.Partitioned)


def check_divisible(path: str, shape: Sequence[int], spec: P, mesh: Mesh,
                    names: Optional[Sequence[Any]] = None) -> None:
    """Raises if a sharded dimension of ``shape`` is not a multiple of its mesh axes' size."""
    for dim, axes in enumerate(spec):
        if axes is None:
            continue
        axes_t = (axes,) if isinstance(axes, str) else tuple(axes)
        size = math.prod(mesh.shape[a] for a in axes_t)
        if shape[dim] % size:
            label = names[dim] if names is not None and names[dim] else "size"
            mesh_desc = _describe(axes_t, [mesh.shape[a] for a in axes_t])
            plural = "axis" if len(axes_t) == 1 else "axes"
            raise ValueError(f"{path} dim {dim} ({label}={shape[dim]}) is not divisible by "
                             f"mesh {plural} {mesh_desc}")


def param_shardings(abstract: Any, mesh: Mesh, rules: Rules = DEFAULT_RULES) -> Any:
    """NamedShardings for a tree whose leaves may be ``nn.LogicallyPartitioned`` boxes.

    ``abstract`` is typically ``jax.eval_shape(model.init, ...)``. The result has the
    structure of the *unboxed* tree. Unboxed leaves are replicated. Raises on unknown logical
    names and on dimensions not divisible by their mesh axes (naming the parameter path).
    """
    rules = rules_for_mesh(rules, mesh)

    def one(path, leaf):
        where = jax.tree_util.keystr(path, simple=True, separator="/")
        if _is_box(leaf):
            names, shape = tuple(leaf.names), tuple(leaf.value.shape)
            if len(names) != len(shape):
                raise ValueError(f"{where}: {len(names)} logical names {names} for a "
                                 f"{len(shape)}-d array of shape {shape}")
            _check_known(names, rules, where)
            spec = nn.logical_to_mesh_axes(names, rules)
        else:
            names, shape, spec = None, tuple(np.shape(leaf)), P()
        check_divisible(where, shape, spec, mesh, names)
        return NamedSharding(mesh, spec)

    return jax.tree_util.tree_map_with_path(one, abstract, is_leaf=_is_box)


def logical_sharding(mesh: Mesh, names: Sequence[Optional[str]],
                     rules: Rules = DEFAULT_RULES) -> NamedSharding:
    """The NamedSharding of one array with the given logical dimension names."""
    rules = rules_for_mesh(rules, mesh)
    _check_known(names, rules, f"array {tuple(names)}")
    return NamedSharding(mesh, nn.logical_to_mesh_axes(tuple(names), rules))


def batch_sharding(mesh: Mesh, rules: Rules = DEFAULT_RULES) -> NamedSharding:
    """Sharding of input batches: dimension 0 over the ``batch`` rule (data, fsdp)."""
    return logical_sharding(mesh, ("batch",), rules)


def to_global_arrays(batch: Mapping[str, np.ndarray], mesh: Mesh,
                     partition_spec: Optional[P] = None, rules: Rules = DEFAULT_RULES) -> dict:
    """Process-local numpy batch -> global ``jax.Array``s sharded over the batch axis.

    ``partition_spec`` applies to the leading dims (truncated for [batch] features); by
    default the batch is split over the mesh axes the ``batch`` rule names that this mesh
    has (or its first axis).
    """
    if partition_spec is None:
        wanted = dict(rules)["batch"]
        wanted = (wanted,) if isinstance(wanted, str) else tuple(wanted or ())
        axes = tuple(a for a in wanted if a in mesh.axis_names) or mesh.axis_names[:1]
        partition_spec = P(axes)
    spec = tuple(partition_spec)
    return {key: jax.make_array_from_process_local_data(
                NamedSharding(mesh, P(*spec[:np.ndim(value)])), np.asarray(value))
            for key, value in batch.items()}


@dataclasses.dataclass(frozen=True)
class TracedInit:
    """An init function traced once (:func:`trace_init`): what it returns as ShapeDtypeStructs
    carrying their shardings (``abstract``), the shardings, the logical names of the boxed
    leaves (``axes``, as :func:`logical_axes`), and :meth:`run`, which compiles that same
    trace to create the arrays directly in those shardings. Tracing a model's init (flax
    walks every module) is most of the time to lower it (the tiny T5: 0.29 of 0.39 s); one
    trace serves both the shapes and the arrays."""
    jaxpr: Any
    out_tree: Any
    abstract: Any
    shardings: Any
    axes: dict
    mesh: Mesh
    rules: Rules

    def run(self, *args: Any) -> Any:
        """The unboxed arrays, for the same arguments (arrays now) as the trace."""
        fun = jax_core.jaxpr_as_fun(self.jaxpr)

        def init(*leaves):
            return nn.meta.unbox(jax.tree.unflatten(self.out_tree, fun(*leaves)))

        with sharding_context(self.mesh, self.rules):
            return jax.jit(init, out_shardings=self.shardings)(*jax.tree.leaves(args))


def trace_init(init_fn: Callable[..., Any], rng: Any, *args: Any, mesh: Mesh,
               rules: Rules = DEFAULT_RULES) -> TracedInit:
    """Traces ``init_fn(rng, *args)`` (a tree with logical-partitioning boxes, e.g.
    ``model.init``) once; nothing is allocated. ``rng`` and ``args`` may be arrays or
    ShapeDtypeStructs, so this also serves meshes of compile-only devices."""
    with sharding_context(mesh, rules):
        jaxpr, boxed = jax.make_jaxpr(init_fn, return_shape=True)(rng, *args)
        shardings = param_shardings(boxed, mesh, rules)
    unboxed = jax.tree.map(lambda x: x.value if _is_box(x) else x, boxed, is_leaf=_is_box)
    return TracedInit(jaxpr, jax.tree.structure(boxed), with_shardings(unboxed, shardings),
                      shardings, logical_axes(boxed), mesh, rules)


def abstract_sharded(init_fn: Callable[..., Any], rng: Any, *args: Any, mesh: Mesh,
                     rules: Rules = DEFAULT_RULES, with_axes: bool = False) -> tuple:
    """(unboxed ShapeDtypeStructs carrying their shardings, the shardings) of what
    ``init_fn(rng, *args)`` returns (:func:`trace_init`); ``with_axes``: also {key path of
    the unboxed leaf: its logical names} of the boxed leaves (:func:`logical_axes`)."""
    traced = trace_init(init_fn, rng, *args, mesh=mesh, rules=rules)
    out = (traced.abstract, traced.shardings)
    return out + (traced.axes,) if with_axes else out


def logical_axes(boxed: Any) -> dict:
    """{key path of the unboxed leaf: its logical names} for every boxed leaf of `boxed`."""
    leaves = jax.tree_util.tree_flatten_with_path(boxed, is_leaf=_is_box)[0]
    return {path: tuple(leaf.names) for path, leaf in leaves if _is_box(leaf)}


def with_shardings(tree: Any, shardings: Any) -> Any:
    """ShapeDtypeStructs of ``tree``'s leaves (arrays or structs) with ``shardings``."""
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                        tree, shardings)


def init_sharded(init_fn: Callable[..., Any], rng: jax.Array, *args: Any, mesh: Mesh,
                 rules: Rules = DEFAULT_RULES) -> tuple[Any, Any]:
    """Initialises directly into sharded arrays; returns (unboxed params, their shardings).

    ``init_fn(rng, *args)`` returns a tree with logical-partitioning boxes, e.g.
    ``model.init``. No full copy of the parameters ever lives on one device. The
    shardings are :func:`abstract_sharded`'s; ``init_fn`` is traced once.
    """
    traced = trace_init(init_fn, rng, *args, mesh=mesh, rules=rules)
    return traced.run(rng, *args), traced.shardings


def opt_state_shardings(tx: optax.GradientTransformation, params: Any,
                        shardings: Any) -> Any:
    """Shardings for ``tx.init(params)``: a state leaf shaped like the parameter whose key
    path lies within its own (optax's moments ``[i].nu[path]``, a per-parameter state's
    ``[path].v``) inherits that parameter's sharding; anything else (step counts,
    Adafactor's factored row/column statistics) is replicated. Use as
    ``jax.jit(tx.init, out_shardings=...)`` (never ``device_put``). ``params`` may be
    ShapeDtypeStructs; call this outside ``jax.set_mesh``."""
    mesh = jax.tree.leaves(shardings)[0].mesh
    replicated = NamedSharding(mesh, P())
    by_path = {tuple(path): (tuple(np.shape(p)), s) for (path, p), s in zip(
        jax.tree_util.tree_flatten_with_path(params)[0], jax.tree.leaves(shardings))}
    longest = max((len(k) for k in by_path), default=0)

    def pick(path, leaf):
        shape = tuple(np.shape(leaf))
        for start in range(len(path)):
            for end in range(min(len(path), start + longest), start, -1):
                hit = by_path.get(tuple(path[start:end]))
                if hit is not None and hit[0] == shape:
                    return hit[1]
        return replicated

    return jax.tree_util.tree_map_with_path(pick, jax.eval_shape(tx.init, params))
