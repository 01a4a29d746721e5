"""The one place that knows the device mesh: builds it from the config and turns the model's
logical axis names into `NamedSharding`s for parameters, optimizer state and batches.

The mesh has axes ("data", "fsdp", "tensor"): batches split over data x fsdp, parameters
over fsdp (ZeRO-3 style) and tensor (Megatron style), as the logical axis rules say.
"""

from __future__ import annotations

import difflib
import logging
import math
from collections.abc import Callable, Sequence
from typing import Any

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxformer.errors import UserError

logger = logging.getLogger(__name__)

AXIS_NAMES = ("data", "fsdp", "tensor")
# Logical axis -> mesh axes, tried in order; an axis already used by a dimension falls through
# to the next rule (e.g. activations' "embed" once "batch" took fsdp).
DEFAULT_RULES = (
    ("batch", ("data", "fsdp")),
    ("vocab", "tensor"),
    ("heads", "tensor"),
    ("mlp", "tensor"),
    ("embed", "fsdp"),
    ("kv", None),
    ("length", None),
    ("layers", None),
)
BATCH_AXES = ("batch", "length")
# The logical names the models put on parameters and activations (model/*.py).
LOGICAL_NAMES = tuple(name for name, _ in DEFAULT_RULES)


class MeshError(UserError, ValueError):
    """The requested mesh does not fit the devices or the batch."""


def resolve_mesh_shape(shape: Sequence[int], num_devices: int) -> tuple[int, ...]:
    """Replaces one -1 by whatever makes the product equal `num_devices`."""
    shape = tuple(int(size) for size in shape)
    if len(shape) != len(AXIS_NAMES):
        raise MeshError(f"mesh.shape={shape} needs one size per axis {AXIS_NAMES}")
    if shape.count(-1) > 1 or any(size == 0 or size < -1 for size in shape):
        raise MeshError(f"mesh.shape={shape}: sizes must be positive, with at most one -1")
    known = math.prod(size for size in shape if size != -1)
    if -1 in shape:
        if num_devices % known:
            raise MeshError(f"mesh.shape={shape}: {num_devices} devices are not divisible by {known}")
        shape = tuple(num_devices // known if size == -1 else size for size in shape)
    if math.prod(shape) != num_devices:
        raise MeshError(f"mesh.shape={shape} has {math.prod(shape)} devices but {num_devices} are available")
    return shape


def make_mesh(shape: Sequence[int], devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A (data, fsdp, tensor) mesh over `devices` (default: all, every process's)."""
    devices = list(jax.devices() if devices is None else devices)
    resolved = resolve_mesh_shape(shape, len(devices))
    # Auto axes: shardings are hints that XLA propagates (explicit axes would make every
    # sharding constraint an assertion).
    axis_types = (jax.sharding.AxisType.Auto,) * len(AXIS_NAMES)
    if devices == list(jax.devices()):
        return jax.make_mesh(resolved, AXIS_NAMES, axis_types=axis_types, devices=devices)
    return Mesh(np.asarray(devices).reshape(resolved), AXIS_NAMES, axis_types=axis_types)


def rules_from_config(rules: Sequence[Sequence[Any]]) -> tuple[tuple[str, Any], ...]:
    """Normalises rules read from an ml_collections config (lists become tuples)."""
    return tuple((str(name), tuple(axes) if isinstance(axes, (list, tuple)) else axes) for name, axes in rules)


def check_rules(rules: Sequence[Sequence[Any]]) -> None:
    """MeshError for a rule whose logical name no model uses (a typo would leave that axis
    replicated without a word), whose mesh axes are not the mesh's or hold None among them, or
    that names one mesh axis twice (jax cannot split a dimension twice over one axis). Two rules
    whose arrays would share a mesh axis need no check: flax gives an axis to the first, the next
    rule for the other."""
    for name, axes in rules_from_config(rules):
        if name not in LOGICAL_NAMES:
            near = difflib.get_close_matches(name, LOGICAL_NAMES, n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            raise MeshError(
                f"mesh.logical_axis_rules: {name!r} is no logical axis name{hint}; the models use "
                + ", ".join(LOGICAL_NAMES)
            )
        for axis in axes if isinstance(axes, tuple) else (axes,):
            if axis is not None and axis not in AXIS_NAMES:
                raise MeshError(
                    f"mesh.logical_axis_rules: {name!r} -> {axis!r} is no mesh axis; the mesh has "
                    + ", ".join(AXIS_NAMES)
                )
        named = axes if isinstance(axes, tuple) else ()
        if None in named:  # jax would fail inside the first sharding with "Resource axis: None"
            raise MeshError(
                f"mesh.logical_axis_rules: {name!r} -> {axes!r} puts None among mesh axes; name only mesh axes "
                f"in a tuple, or give None alone to leave {name!r} unsplit"
            )
        repeated = sorted({axis for axis in named if named.count(axis) > 1})
        if repeated:
            raise MeshError(
                f"mesh.logical_axis_rules: {name!r} -> {axes!r} names the mesh axis {repeated[0]!r} twice; "
                "name each mesh axis once in a rule"
            )


def logical_shardings(boxed_tree: Any, mesh: Mesh, rules) -> Any:
    """NamedShardings for a tree whose leaves are boxed with logical names (others: replicated).

    The result has the structure of the tree once unboxed (`nn.meta.unbox`).
    """
    return nn.logical_to_mesh_sharding(nn.get_partition_spec(boxed_tree), mesh, rules)


def batch_sharding(mesh: Mesh, rules) -> NamedSharding:
    """Token arrays [B, L]: rows split over the data-parallel axes."""
    return NamedSharding(mesh, nn.logical_to_mesh_axes(BATCH_AXES, rules))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())


def _batch_axes(rules) -> tuple[str, ...]:
    """The mesh axes that the rows of a batch are split over (data, fsdp by default)."""
    spec = nn.logical_to_mesh_axes(BATCH_AXES, rules)[0]
    return spec if isinstance(spec, tuple) else (spec,) if spec else ()


def check_batch_size(batch_size: int, mesh: Mesh, rules, key: str = "data.batch_size") -> None:
    """MeshError naming the config `key` of a batch size that the data-parallel shards or the
    processes do not divide."""
    ways = math.prod(mesh.shape[axis] for axis in _batch_axes(rules))
    processes = jax.process_count()
    if batch_size % ways or batch_size % processes:
        raise MeshError(
            f"{key}={batch_size} must be divisible by the {ways} data-parallel shards "
            f"and by the {processes} process{'es' if processes > 1 else ''}"
        )
    check_rows_within_processes(mesh, rules)


def warn_unsplit_batch(mesh: Mesh, rules) -> None:
    """Warns (one line) when the rules leave the batch unsplit over a data-parallel mesh axis
    (data or fsdp) of more than one device: no 'batch' rule, or one without that axis. Every
    device along it then computes the same rows, which trains correctly but wastes those devices."""
    unsplit = [axis for axis in ("data", "fsdp") if mesh.shape[axis] > 1 and axis not in _batch_axes(rules)]
    if unsplit:
        axes, sizes = " and ".join(unsplit), " and ".join(str(mesh.shape[axis]) for axis in unsplit)
        logger.warning(
            "mesh.logical_axis_rules do not split the batch over the mesh ax%s %s (size%s %s in mesh.shape=%s): "
            "the devices along %s compute the same rows; add %s to the 'batch' rule, as in ('batch', ('data', 'fsdp'))",
            "es" if len(unsplit) > 1 else "is",
            axes,
            "s" if len(unsplit) > 1 else "",
            sizes,
            tuple(mesh.devices.shape),
            "them" if len(unsplit) > 1 else "it",
            " and ".join(repr(axis) for axis in unsplit),
        )


def check_rows_within_processes(mesh: Mesh, rules, process_of: Callable[[jax.Device], int] | None = None) -> None:
    """MeshError when a data-parallel shard of the batch lies on devices of more than one process:
    each process builds its own rows of every batch (`global_batch`), so two processes would give
    one shard different rows, and the 'replicated' parameters would drift apart between them.
    `process_of`: a device's process (its `process_index`)."""
    process_of = process_of or (lambda device: device.process_index)
    shard_of = np.zeros(mesh.devices.shape, int)  # the batch shard each device holds, by its batch axes' indices
    for axis in _batch_axes(rules):
        index = mesh.axis_names.index(axis)
        shape = [1] * mesh.devices.ndim
        shape[index] = mesh.shape[axis]
        shard_of = shard_of * mesh.shape[axis] + np.arange(mesh.shape[axis]).reshape(shape)
    holders: dict[int, set[int]] = {}
    for shard, device in zip(shard_of.ravel(), mesh.devices.ravel()):
        holders.setdefault(int(shard), set()).add(process_of(device))
    shared = [shard for shard, processes in holders.items() if len(processes) > 1]
    if shared:
        ways = len(holders)
        raise MeshError(
            f"mesh.shape={tuple(mesh.devices.shape)}: {len(shared)} of its {ways} data-parallel shard"
            f"{'s' if ways > 1 else ''} (data x fsdp) span devices of several processes, which each read their "
            "own rows of the batch; use a mesh whose data x fsdp is a multiple of the process count (tensor "
            "parallelism within one host)"
        )


# The config key behind each logical name a parameter's dimension may carry (for the refusal).
_SIZE_KEYS = {
    "heads": "model.num_heads",
    "mlp": "model.d_ff",
    "embed": "model.d_model",
    "vocab": "the vocabulary's size (tokenizer.vocab_size, or tokenizer.model_path's pieces)",
    "kv": "the head size (model.d_model / model.num_heads)",
}


def _size_key(logical_name: str | None, array_name: str) -> str | None:
    """The config key behind a dimension's size; a scanned stack's depth is its own side's."""
    if logical_name == "layers":
        return "model.num_decoder_layers" if "decoder" in array_name.split("/") else "model.num_encoder_layers"
    return _SIZE_KEYS.get(logical_name)


def check_divisible(boxed_tree: Any, shardings: Any, mesh: Mesh) -> None:
    """MeshError naming the config key (model.num_heads=4) and the first array (a parameter or
    optimizer state: its path) of a dimension that its mesh axes do not divide (4 heads over
    tensor=8), before anything is compiled; jax would fail inside the compilation with
    IndivisibleError. `boxed_tree`: abstract arrays boxed with their logical names."""
    leaves = jax.tree_util.tree_flatten_with_path(strip_boxes(boxed_tree))[0]
    logical = jax.tree.leaves(nn.get_partition_spec(boxed_tree), is_leaf=lambda x: isinstance(x, PartitionSpec))
    for (path, leaf), spec, sharding in zip(leaves, logical, jax.tree.leaves(shardings), strict=True):
        for dim, (size, axes) in enumerate(zip(leaf.shape, sharding.spec)):
            axes = axes if isinstance(axes, tuple) else (axes,) if axes else ()
            ways = math.prod(mesh.shape[axis] for axis in axes)
            if size % ways:
                name = jax.tree_util.keystr(path, simple=True, separator="/")
                key = _size_key(spec[dim] if dim < len(spec) else None, name)
                what = f"{key}={size}" if key and key.startswith("model.") else f"{key}, {size}," if key else str(size)
                raise MeshError(
                    f"mesh.shape={tuple(mesh.devices.shape)}: {what} is not divisible by its mesh axes "
                    f"{', '.join(axes)} ({ways} ways), which split {name} {tuple(leaf.shape)} along dimension {dim}; "
                    "use a mesh whose axes divide the model's sizes (heads, d_ff, d_model, vocabulary, head size, "
                    "layers)"
                )


def global_batch(local_batch: dict[str, np.ndarray], sharding: NamedSharding) -> dict[str, jax.Array]:
    """One global array per feature from this process's rows (all rows on a single process)."""
    return {key: jax.make_array_from_process_local_data(sharding, value) for key, value in local_batch.items()}


def local_rows(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """This process's slice of a batch every process holds whole: the rows it gives `global_batch`."""
    rows = next(iter(batch.values())).shape[0] // jax.process_count()
    start = jax.process_index() * rows
    return {key: value[start : start + rows] for key, value in batch.items()}


def strip_boxes(tree: Any) -> Any:
    """The values inside logical-axis boxes, with no sharding constraint applied (unlike
    `nn.meta.unbox` under active rules), for abstract trees outside jit."""
    return jax.tree.map(
        lambda leaf: leaf.value if isinstance(leaf, nn.LogicallyPartitioned) else leaf,
        tree,
        is_leaf=lambda leaf: isinstance(leaf, nn.LogicallyPartitioned),
    )


def abstract_with_shardings(abstract_tree: Any, shardings: Any) -> Any:
    """ShapeDtypeStructs carrying their target sharding (what orbax restores into)."""
    return jax.tree.map(
        lambda leaf, sharding: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding), abstract_tree, shardings
    )
