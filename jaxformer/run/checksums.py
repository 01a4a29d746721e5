"""Checksums of a checkpoint's arrays, data-iterator state and metadata, written at save and
verified at restore (orbax stores arrays in zstd frames without a checksum of their content:
a flipped bit restores silently as a different number).
"""

from __future__ import annotations

import hashlib
import json
import logging
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxformer.errors import CheckpointError

logger = logging.getLogger(__name__)

CHECKSUMS = "checksums"  # the metadata key of the checksums written at save
CHECKSUM_FORMAT = 1


class ChecksumError(CheckpointError):
    """A checkpoint whose arrays, data iterator state or metadata differ from what was saved."""


# Each array's checksum is two sums, modulo 2**32, of its elements' bits (as uint32 words)
# times odd weights: the weight of element (i0, i1, ...) in sum k is the product of one odd
# pseudo-random factor per axis, a_kd(i_d). uint32 arithmetic wraps, so the sums are exact
# and depend on neither the sharding nor the order of the additions; an odd weight turns
# any change of one element (a flipped bit included) into a different sum, and pseudo-random
# weights make swapped or shifted elements different too. Arrays on accelerators are summed
# where they are by a jitted elementwise form; host and CPU arrays by NumPy, one axis at a time
# (the weights factor per axis), which needs no compilation: a jitted program per shape cost
# every command that loads a checkpoint about half a second.

_SUMS = 2
_SALTS = (0x243F6A88, 0x85A308D3)  # one per sum; the axis index is mixed in too


def _mix(h: np.ndarray) -> np.ndarray:
    """murmur3's 32-bit finalizer (uint32 array arithmetic wraps)."""
    h = h ^ (h >> np.uint32(16))
    h = h * np.uint32(0x85EBCA6B)
    h = h ^ (h >> np.uint32(13))
    h = h * np.uint32(0xC2B2AE35)
    return h ^ (h >> np.uint32(16))


def _host_axis_weights(size: int, axis: int) -> np.ndarray:
    """[size, sums] odd uint32 factors of the weights along one axis."""
    index = np.arange(size, dtype=np.uint32)
    columns = [_mix(index + np.uint32((salt + 0x9E3779B9 * (axis + 1)) % 2**32)) | np.uint32(1) for salt in _SALTS]
    return np.stack(columns, axis=1)


def _axis_weights(size: int, axis: int) -> jax.Array:
    """`_host_axis_weights` as a jax array (a constant of the jitted elementwise form)."""
    return jnp.asarray(_host_axis_weights(size, axis))


def _words(x: jax.Array) -> jax.Array:
    """The bits of `x` as uint32 values (a [..., 2] view for 64-bit dtypes), under jit."""
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
        x = jax.random.key_data(x)
    dtype = np.dtype(x.dtype)
    if dtype == np.bool_:
        return x.astype(jnp.uint32)
    if dtype.itemsize in (1, 2, 4, 8) and dtype.kind in "fiuV":
        unsigned = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint32}[dtype.itemsize]
        try:
            return jax.lax.bitcast_convert_type(x, unsigned).astype(jnp.uint32)
        except (TypeError, ValueError):  # e.g. sub-byte types: their values, not their bits
            pass
    return x.astype(jnp.uint32)


def _host_words(x: np.ndarray) -> np.ndarray | None:
    """`_words` of a host array, with NumPy views (no copy for 32-bit dtypes); None if not numeric."""
    x = np.asarray(x)
    if x.dtype == np.bool_:
        return x.astype(np.uint32)
    if x.dtype.kind not in "fiuV" or x.dtype.itemsize not in (1, 2, 4, 8):
        return None
    if not x.flags.c_contiguous:
        x = x.copy()
    flat = x.reshape(-1)
    if x.dtype.itemsize == 8:
        return flat.view(np.uint32).reshape(x.shape + (2,))
    return (
        flat.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[x.dtype.itemsize])
        .astype(np.uint32, copy=False)
        .reshape(x.shape)
    )


def _sums_elementwise(words: jax.Array) -> jax.Array:
    """[sums] checksums of a uint32 array: one fused multiply-and-reduce pass per sum."""
    sums = []
    for k in range(_SUMS):
        weight = jnp.ones((1,) * words.ndim, jnp.uint32)
        for axis, size in enumerate(words.shape):
            shape = [1] * words.ndim
            shape[axis] = size
            weight = weight * _axis_weights(size, axis)[:, k].reshape(shape)
        sums.append(jnp.sum(words * weight, dtype=jnp.uint32))
    return jnp.stack(sums)


def _host_sums(words: np.ndarray) -> np.ndarray:
    """The same sums as `_sums_elementwise`, in NumPy: the last axis weighted and summed, then
    each earlier axis in turn."""
    if words.ndim == 0:
        return np.full(_SUMS, words, np.uint32)
    weights = _host_axis_weights(words.shape[-1], words.ndim - 1)  # [n, sums]
    partial = np.stack([np.sum(words * weights[:, k], axis=-1, dtype=np.uint32) for k in range(_SUMS)], axis=-1)
    for axis in reversed(range(words.ndim - 1)):  # partial [..., i, sums]
        partial = np.sum(partial * _host_axis_weights(words.shape[axis], axis), axis=-2, dtype=np.uint32)
    return partial


# One compilation per shape, dtype and sharding (a model has a handful), not per tree: a
# single program summing the hundreds of arrays of a train state takes minutes to compile.
_elementwise_sums = jax.jit(lambda x: _sums_elementwise(_words(x)))


def path_name(path: tuple) -> str:
    """'opt_state/1/0/mu/decoder/layer_0/...' for a jax key path."""
    parts = []
    for key in path:
        for attribute in ("key", "name", "idx"):
            if hasattr(key, attribute):
                parts.append(str(getattr(key, attribute)))
                break
        else:
            parts.append(str(key))
    return "/".join(parts)


def array_checksums(tree: Any) -> dict[str, str]:
    """{leaf path: 16 hex digits} for every array leaf of `tree`: jax arrays (sharded over any
    mesh, across processes, without gathering them) or host arrays. Arrays on accelerators, or
    spread over processes, are summed where they are (asynchronously; one fetch at the end); host
    arrays and this process's CPU arrays by NumPy."""
    with jax.set_mesh(None):  # a training loop's mesh context would claim the one-device sums
        return _array_checksums(tree)


def _array_checksums(tree: Any) -> dict[str, str]:
    names, pending = [], []
    for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
        if isinstance(leaf, jax.Array):
            if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
                leaf = jax.random.key_data(leaf)
            if not (leaf.is_fully_addressable and all(d.platform == "cpu" for d in leaf.sharding.device_set)):
                names.append(path_name(path))
                sums = _elementwise_sums(leaf)
                if not leaf.is_fully_addressable:
                    # Each program of an array spread over processes runs collectives; CPU hosts (gloo)
                    # run programs in flight in any order, and two processes that take them in another
                    # order wait on each other for ever. One at a time, then.
                    sums.block_until_ready()
                pending.append(sums)
                continue
        words = _host_words(np.asarray(leaf))
        if words is not None:  # strings and objects are not arrays orbax writes as such
            names.append(path_name(path))
            pending.append(_host_sums(words))
    values = jax.device_get(pending)
    return {name: "".join(f"{int(v):08x}" for v in np.asarray(value)) for name, value in zip(names, values)}


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:32]


def _canonical_json(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def _metadata_digest(metadata: dict[str, Any]) -> str:
    """The digest of the metadata as it reads back from JSON, checksums left out."""
    return _digest(_canonical_json(json.loads(json.dumps({k: v for k, v in metadata.items() if k != CHECKSUMS}))))


def params_digest(metadata: dict[str, Any]) -> str | None:
    """An identity of the parameters of the checkpoint whose metadata JSON is `metadata`: a
    digest of the checksums its save recorded of each `params/...` array, read without reading
    an array; None without checksums (an older jaxformer's checkpoint). A run's start records it
    (CheckpointMetadata.started_from_params) rather than a save time or a digest of the files: a
    time, and orbax's files, change when the same parameters are saved again, and reading every
    file costs what reading the parameters does; the run's config stays the same where a run
    trained again with it saves other parameters (a resume from an earlier step, another machine).
    These checksums are in the metadata a start's reader reads anyway, change with any
    parameter's bits (each restore verifies the arrays against them) and with nothing else."""
    checksums = metadata.get(CHECKSUMS)
    arrays = checksums.get("arrays") if isinstance(checksums, dict) else None
    if not isinstance(arrays, dict):
        return None
    params = {name: value for name, value in arrays.items() if name.startswith("params/")}
    return _digest(_canonical_json(params)) if params else None


def iterator_checksums(data_iterator) -> list[str]:
    """A digest of each process's data-iterator state (the same list on every process)."""
    state = data_iterator.get_state()
    raw = bytes(state) if isinstance(state, (bytes, bytearray)) else _canonical_json(state)
    try:
        raw = _canonical_json(json.loads(raw))
    except ValueError:
        pass
    digest = _digest(raw)
    if jax.process_count() == 1:
        return [digest]
    from jax.experimental import multihost_utils

    gathered = multihost_utils.process_allgather(np.frombuffer(bytes.fromhex(digest), np.uint8))
    return [bytes(row).hex() for row in np.asarray(gathered).reshape(jax.process_count(), -1)]


def with_checksums(metadata: dict[str, Any], tree: Any, data_iterator=None) -> dict[str, Any]:
    """A copy of `metadata` holding the checksums of `tree`'s arrays, of the iterator's state
    and of the metadata itself (any checksums already in `metadata` are replaced)."""
    checksums: dict[str, Any] = {"format": CHECKSUM_FORMAT, "arrays": array_checksums(tree)}
    if data_iterator is not None:
        checksums["data_iterator"] = iterator_checksums(data_iterator)
    checksums["metadata"] = _metadata_digest(metadata)
    return {**{k: v for k, v in metadata.items() if k != CHECKSUMS}, CHECKSUMS: checksums}


def with_saved_checksums(metadata: dict[str, Any], saved: dict[str, Any]) -> dict[str, Any]:
    """A copy of `metadata` holding the checksums of the arrays and the iterator's state from the
    metadata `saved` (a checkpoint's, whose metadata `metadata` replaces: its arrays are kept) and
    a checksum of itself; without checksums in `saved` (an older jaxformer's), none."""
    checksums = saved.get(CHECKSUMS)
    plain = {k: v for k, v in metadata.items() if k != CHECKSUMS}
    if not isinstance(checksums, dict):
        return plain
    return {**plain, CHECKSUMS: {**checksums, "metadata": _metadata_digest(plain)}}


def saved_checksums(metadata: dict[str, Any], where: str) -> dict[str, Any] | None:
    checksums = metadata.get(CHECKSUMS)
    if checksums is None:
        logger.warning(
            "checkpoint %s has no checksums (written by an older jaxformer): its arrays are restored unverified", where
        )
        return None
    if not isinstance(checksums, dict) or not isinstance(checksums.get("arrays"), dict):
        raise ChecksumError(f"checkpoint {where} is damaged: its metadata's checksums are unreadable")
    return checksums


def verify_metadata(metadata: Any, where: str) -> None:
    """Raises ChecksumError if the metadata at `where` differs from what was saved there."""
    if not isinstance(metadata, dict):
        raise ChecksumError(f"{where} is damaged: it holds a JSON {type(metadata).__name__}, not an object")
    checksums = metadata.get(CHECKSUMS)
    if isinstance(checksums, dict) and "metadata" in checksums and checksums["metadata"] != _metadata_digest(metadata):
        raise ChecksumError(f"{where} is damaged: its contents do not match their checksum")


def verify_arrays(tree: Any, checksums: dict[str, Any], where: str, prefix: str = "") -> None:
    """Raises ChecksumError naming the first array of `tree` (named `prefix` + its path) whose
    checksum differs from the saved one."""
    expected = checksums["arrays"]
    actual = array_checksums(tree)
    differing = [name for name, value in actual.items() if expected.get(prefix + name) != value]
    if differing:
        first = prefix + differing[0]
        reason = "has no saved checksum" if first not in expected else "does not match its checksum"
        raise ChecksumError(
            f"checkpoint {where} is damaged: array {first} {reason}"
            + (f" ({len(differing)} of {len(actual)} arrays differ)" if len(differing) > 1 else "")
        )


def verify_iterator(data_iterator, checksums: dict[str, Any], where: str) -> None:
    expected = checksums.get("data_iterator")
    if expected is None:
        return
    actual = iterator_checksums(data_iterator)
    if len(actual) == len(expected) and actual != expected:
        processes = [i for i, (a, b) in enumerate(zip(actual, expected)) if a != b]
        raise ChecksumError(
            f"checkpoint {where} is damaged: "
            f"the data iterator state of process {processes[0]} does not match its checksum"
        )
