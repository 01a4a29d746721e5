"""The processes of a multi-process run agree before any work: each was started with the same
config, and they share one workdir.

"Run the same command on every host" is a promise nothing enforced: a process started with
another learning rate trained its copy of the replicated parameters apart without a word, one
with another num_train_steps left the others waiting in a collective forever, and hosts writing
to their own local disks found out at the first checkpoint, one with a traceback and the other
hanging. Each check here gathers what every process sees, so that all of them raise the same
error at the same point, and none is left waiting.
"""

from __future__ import annotations

import collections
import pathlib
import secrets
import zlib
from collections.abc import Callable, Sequence
from typing import TypeVar

import jax
import ml_collections
import numpy as np
from jax.experimental import multihost_utils

from jaxformer.errors import UserError
from jaxformer.model.config import ConfigError
from jaxformer.training import experiment

# Where a host caches its prepared data may differ between hosts (a local disk each); what the
# run computes may not.
HOST_LOCAL_KEYS = ("data.data_dir", "data.raw_dir")
T = TypeVar("T")


class WorkdirNotSharedError(UserError):
    """The processes of a run do not see one workdir."""


class AnotherProcessError(UserError):
    """Another process of the run met a user's error where this one did not."""


_MESSAGE_BYTES = 1024  # of another process's error message, passed on whole up to this length


def summed_over_processes(counts: tuple[int, ...]) -> tuple[int, ...]:
    """Every process's `counts` (non-negative ints: what each read of its own shard) summed, for a
    log line that speaks for the run: a collective, which every process calls at the same point."""
    if jax.process_count() == 1:
        return counts
    # Gathered as int32 (jax's integers without x64): each count in two parts, so none wraps.
    parts = np.array([divmod(count, 2**30) for count in counts], np.int32)  # [N, 2]
    gathered = np.asarray(multihost_utils.process_allgather(parts)).astype(np.int64).sum(axis=0)  # [N, 2]
    return tuple(int(high) * 2**30 + int(low) for high, low in gathered)


def check_same_device_counts(devices: Sequence[jax.Device] | None = None) -> None:
    """A ConfigError in every process (each sees every process's devices: no collective needed)
    when the processes hold different numbers of devices: each host gathers the same amount from
    every other, and the batch and the mesh are laid out in equal parts per process."""
    counts = collections.Counter(device.process_index for device in (jax.devices() if devices is None else devices))
    if len(set(counts.values())) > 1:
        held = ", ".join(f"process {index} has {counts[index]}" for index in sorted(counts))
        raise ConfigError(
            f"the processes hold different numbers of devices ({held}); give every host the same number "
            "(CUDA_VISIBLE_DEVICES, or --xla_force_host_platform_device_count on CPU)"
        )


def all_or_none(step: Callable[[], T]) -> T:
    """`step()` in every process, where an error in any of them is raised in all: the process that
    met it raises its own, the others an AnotherProcessError quoting it. A check that one process
    alone fails (an invalid override given to one host, a folder it cannot create or search) would
    otherwise end that process and leave the others waiting in their next collective."""
    error = None
    try:
        result = step()
    except Exception as caught:  # noqa: BLE001  (a bug too: the others must not wait for this process)
        error = caught
    # Without jax.distributed there is one process; asking jax would start its backend for nothing.
    if jax.distributed.is_initialized() and jax.process_count() > 1:
        message = np.zeros(_MESSAGE_BYTES, np.uint8)
        if error is not None:
            described = str(error) if isinstance(error, UserError) else f"{type(error).__name__}: {error}"
            text = described.encode()[:_MESSAGE_BYTES]
            message[: len(text)] = np.frombuffer(text, np.uint8)
        failed = np.asarray(multihost_utils.process_allgather(np.int32(error is not None)))  # [P]
        messages = np.asarray(multihost_utils.process_allgather(message))  # [P, _MESSAGE_BYTES]
        if error is None and failed.any():
            first = int(np.argmax(failed))
            text = bytes(messages[first]).rstrip(b"\0").decode(errors="replace")
            raise AnotherProcessError(f"process {first} of the run stopped before any work: {text}")
    if error is not None:
        raise error
    return result


def check_same_config(config: ml_collections.ConfigDict) -> None:
    """A ConfigError on every process when their configs differ in a value (other than
    HOST_LOCAL_KEYS); each names the keys, and its own values of them. Nothing is written."""
    if jax.process_count() == 1:
        return
    values = {key: value for key, value in experiment.flatten(config.to_dict()).items() if key not in HOST_LOCAL_KEYS}
    keys = sorted(values)
    names_digest = zlib.crc32("\n".join(keys).encode())
    row = np.array([names_digest] + [zlib.crc32(repr((key, values[key])).encode()) for key in keys], np.uint32)
    lengths = multihost_utils.process_allgather(np.int32(len(row)))  # [P]
    if len(set(np.asarray(lengths).tolist())) > 1:
        raise ConfigError(
            f"the {jax.process_count()} processes were started with configs of different keys ({len(keys)} "
            "here); run the same command, with the same config file, on every host"
        )
    rows = np.asarray(multihost_utils.process_allgather(row))  # [P, 1 + K]
    if (rows[:, 0] != rows[0, 0]).any():
        raise ConfigError(
            "the processes were started with configs of different keys; run the same command, with the same "
            "config file, on every host"
        )
    differing = [key for index, key in enumerate(keys, start=1) if (rows[:, index] != rows[0, index]).any()]
    if differing:
        mine = ", ".join(f"{key}={values[key]!r}" for key in differing)
        raise ConfigError(
            f"the processes were started with different configs: {', '.join(differing)} differ between them "
            f"(process {jax.process_index()} has {mine}); run the same command on every host"
        )


def check_shared_workdir(workdir: pathlib.Path) -> None:
    """A WorkdirNotSharedError on every process unless each sees the file process 0 writes into
    `workdir` (a random name, removed again): checkpoints and the tokenizer are written once, by
    process 0 or by all together, into one folder that every process reads."""
    if jax.process_count() == 1:
        return
    probe, token = None, 0
    if jax.process_index() == 0:
        token = secrets.randbelow(2**31 - 1) + 1
        probe = workdir / f".processes-share-this-{token}"
        try:
            probe.write_text(str(token))
        except OSError as error:  # told to the others as token 0, so that none waits for process 0
            probe, token, unwritable = None, 0, error.strerror or str(error)
    # A collective: every process reads the name after process 0 has written the file.
    token = int(multihost_utils.broadcast_one_to_all(np.int32(token)))
    if token == 0:
        reason = unwritable if jax.process_index() == 0 else "see process 0's log"
        raise WorkdirNotSharedError(f"process 0 cannot write into the workdir {workdir} ({reason})")
    seen = (workdir / f".processes-share-this-{token}").is_file()
    everyone = np.asarray(multihost_utils.process_allgather(np.int32(seen)))  # [P], after every process looked
    if probe is not None:
        probe.unlink(missing_ok=True)
    blind = [index for index, saw in enumerate(everyone.tolist()) if not saw]
    if blind:
        raise WorkdirNotSharedError(
            f"the workdir {workdir} is not one folder for every process: process(es) "
            f"{', '.join(map(str, blind))} do not see the file process 0 wrote into it; give a folder on a file "
            "system every host mounts (NFS, gcsfuse, ...)"
        )
