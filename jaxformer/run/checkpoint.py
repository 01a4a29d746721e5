"""Orbax checkpoints of the train state, the data iterator and the run's metadata.

Each step directory holds `state` (params, optimizer state, step, RNG), `data` (the grain
iterator's position) and `metadata` (a `CheckpointMetadata`: the experiment config, the model
config and the sentencepiece model; run/metadata.py), so a checkpoint alone can resume
training or translate. Parameters-only checkpoints (best, averaged) have no `data` and hold
`{"params": ...}` as their state.

Orbax stores arrays in zstd frames without a checksum of their content: a flipped bit in
a data file restores silently as a different number. So every save also records, in the
metadata (under "checksums"), a checksum of each array (computed where the array is, whatever
its sharding, without gathering it), of the data iterator's state and of the metadata itself,
and every restore verifies them; a mismatch is a damaged checkpoint (`ChecksumError`), which
`restore_latest` skips like any other. Checkpoints written without checksums restore with a
warning that they are unverified.
"""

from __future__ import annotations

import json
import logging
import pathlib
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from jaxformer.errors import CheckpointError, first_line
from jaxformer.files import write_text_atomically
from jaxformer.run.checkpoint_manager import checkpoint_manager
from jaxformer.run.checksums import (  # noqa: F401  (ChecksumError: re-exported)
    ChecksumError,
    saved_checksums,
    verify_arrays,
    verify_iterator,
    verify_metadata,
    with_checksums,
    with_saved_checksums,
)
from jaxformer.run.event_loops import draining_event_loops
from jaxformer.run.interrupted_saves import (
    SET_ASIDE_WARNINGS,
    finish_interrupted_saves,
    replacing_path,
    set_aside_path,
)
from jaxformer.run.metadata import CheckpointMetadata
from jaxformer.run.process_0 import on_process_0
from jaxformer.run.removal import refuse_removed
from jaxformer.run.save_barrier import (
    SaveFailedElsewhereError,
    barriers_through,
    save_barrier,
    save_errors,
    start_save,
    told_to_others,
    wait_for_save,
)

logger = logging.getLogger(__name__)


def _no_missing_metadata_warning(record: logging.LogRecord) -> bool:
    return "Metadata file does not exist" not in record.getMessage()


class Checkpointer:
    """Saves every `save_every` steps (and on demand), keeps the last `keep`, restores the newest usable one.

    `read_only=True` (translate, evaluate) never creates, deletes or moves anything."""

    def __init__(self, directory: str | pathlib.Path, keep: int | None = 3, read_only: bool = False):
        self.directory = pathlib.Path(directory).absolute()
        self.read_only = read_only
        if not read_only:  # before orbax lists the steps: a step put back is one
            on_process_0(
                self.directory, lambda: finish_interrupted_saves(self.directory), "finish the interrupted saves"
            )
        self.barrier = None if read_only else save_barrier(str(self.directory))
        self.manager = checkpoint_manager(self.directory, keep, read_only, self.barrier)
        self._warned: set[int] = set()  # steps whose unreadable metadata latest_step_metadata reported
        self._saving: int | None = None  # the step of self.manager's last save, which a wait may find failed

    def steps(self) -> list[int]:
        return sorted(self.manager.all_steps())

    def _writable(self) -> None:
        if self.read_only:
            raise CheckpointError(f"{self.directory} was opened read-only")

    def set_aside(self, step: int, reason: str = "damaged") -> None:
        """Renames step's directory out of orbax's way to `<step>.<reason>-<time>` (kept for
        inspection, never deleted): "damaged" when it cannot be restored, "replaced" when a new
        checkpoint of the same step takes its place (best/, averaged/ or final/ written again).
        Every process calls it; process 0 renames (each process renaming the one folder, all but
        the first found it gone) and the others return once it has, or raise at once if it could not."""
        if reason not in SET_ASIDE_WARNINGS:
            raise ValueError(f"reason must be one of {tuple(SET_ASIDE_WARNINGS)}, not {reason!r}")
        self._writable()
        self.wait()

        def move() -> None:
            target = set_aside_path(self.directory, step, reason)
            (self.directory / str(step)).rename(target)
            logger.warning(SET_ASIDE_WARNINGS[reason], step, target)

        on_process_0(self.directory, move, f"set step {step} aside")
        self.manager.reload()

    def _check_step(self, step: int, metadata: CheckpointMetadata) -> None:
        if not isinstance(metadata, CheckpointMetadata):
            raise TypeError(f"checkpoint metadata must be a CheckpointMetadata, not {type(metadata).__name__}")
        if metadata.step != step:
            raise ValueError(
                f"saving step {step} with the metadata of step {metadata.step}: use metadata.replace(step={step})"
            )

    def save(self, step: int, state: Any, data_iterator, metadata: CheckpointMetadata, evict: bool = True) -> None:
        """Saves asynchronously (`wait` or the next save waits for it), with checksums of `state`'s arrays, of
        the iterator's position and of `metadata` (whose step must be `step`). `evict=False`: the newest `keep`
        are kept all the same (an interim checkpoint that a run stopped by a signal saves to resume from)."""
        self._writable()
        self._check_step(step, metadata)
        with told_to_others(self.barrier, step, self.directory):  # else the others wait in this save's barriers
            self._save(step, state, data_iterator, metadata, evict)

    def _save(self, step: int, state: Any, data_iterator, metadata: CheckpointMetadata, evict: bool) -> None:
        target = self.directory / str(step)
        # A step left by a run that could not restore it, or what is no step to orbax (a file, a
        # folder of someone's), which its save would delete: kept, under a name that says why.
        if step in self.manager.all_steps() or target.exists() or target.is_symlink():
            with save_errors(step, self.directory):
                self.set_aside(step)
        import grain  # here, not at the top: translating reads parameters only, and grain takes a second to import

        self.wait()  # orbax's save waits for the one before: its error names that save's step
        manager, barrier = self.manager, self.barrier
        if not evict:  # its barrier hears of a failure told at the run's (this process's wait for it)
            barrier = save_barrier(str(self.directory), self.barrier)
            manager = checkpoint_manager(self.directory, None, False, barrier)
        args = ocp.args.Composite(
            state=ocp.args.StandardSave(state),
            data=grain.checkpoint.CheckpointSave(data_iterator),
            metadata=ocp.args.JsonSave(with_checksums(metadata.to_json(), state, data_iterator)),
        )
        self._saving = step if evict else self._saving  # an interim save is waited for here
        start_save(manager, barrier, step, args)
        if not evict:
            wait_for_save(manager, barrier, step)
            wait_for_save(manager, barrier, step, manager.close)  # which waits again
            self.manager.reload()

    def wait(self) -> None:
        """Returns once the last save is written; raises its error if it failed (one line: wait_for_save)."""
        with told_to_others(self.barrier, self._saving, self.directory):
            wait_for_save(self.manager, self.barrier, self._saving)

    def delete(self, step: int) -> None:
        """Deletes checkpoint `step` (an interim one a later checkpoint supersedes)."""
        self._writable()
        self.wait()
        self.manager.delete(step)

    def replace_metadata(self, step: int, metadata: CheckpointMetadata) -> None:
        """Gives checkpoint `step` the metadata `metadata` (of `step`), its arrays and data position
        kept with their checksums: an interim checkpoint made a run's last. The new file is written
        beside the old one and renamed over it, so at every instant the checkpoint is complete, with
        its old metadata or its new. Every process calls it (process 0 writes) and returns once it is."""
        self._writable()
        self._check_step(step, metadata)
        values = with_saved_checksums(metadata.to_json(), self._read_json(step))
        text = json.dumps(values)  # as orbax's JsonSave writes it
        with save_errors(step, self.directory):  # refused: one line in every process, none left waiting
            replace = lambda: write_text_atomically(self.metadata_file(step), text)  # noqa: E731
            on_process_0(self.directory, replace, f"write the metadata of checkpoint {step}")

    def save_params(self, step: int, params: Any, metadata: CheckpointMetadata) -> None:
        """A parameters-only checkpoint (best or averaged weights): enough to translate, not to resume."""
        self._writable()
        self._check_step(step, metadata)
        target = self.directory / str(step)
        # Not a step to orbax (a file, say), it would be overwritten all the same.
        replacing = step in self.manager.all_steps() or target.exists() or target.is_symlink()
        if replacing:  # kept whole, under a name the next writer puts back if this save is interrupted
            self.wait()
            with save_errors(step, self.directory):
                on_process_0(
                    self.directory,
                    lambda: target.rename(replacing_path(self.directory, step)),
                    f"move step {step} aside to replace it",
                )
            self.manager.reload()
        state = {"params": params}
        args = ocp.args.Composite(
            state=ocp.args.StandardSave(state), metadata=ocp.args.JsonSave(with_checksums(metadata.to_json(), state))
        )
        self._saving = step  # each waited for here: none is under way before it
        start_save(self.manager, self.barrier, step, args)
        self.wait()
        if replacing:
            on_process_0(
                self.directory, lambda: finish_interrupted_saves(self.directory), f"set the replaced step {step} aside"
            )

    def metadata_file(self, step: int) -> pathlib.Path:
        return self.directory / str(step) / "metadata" / "metadata"

    def _read_json(self, step: int) -> dict[str, Any]:
        """The metadata JSON of checkpoint `step`, checksums included, verified against its checksum."""
        self.wait()
        path = self.metadata_file(step)
        try:
            with draining_event_loops(), barriers_through(self.barrier):  # a failure told there is raised
                values = self.manager.restore(step, args=ocp.args.Composite(metadata=ocp.args.JsonRestore()))[
                    "metadata"
                ]
        except SaveFailedElsewhereError:  # another process's, not this step's damage
            raise
        except Exception as error:
            refuse_removed(self.directory / str(step) / "metadata")  # listed, then gone: not damaged
            if not path.exists():
                raise CheckpointError(
                    f"cannot read the metadata of checkpoint {step}: {path} does not exist"
                ) from error
            raise CheckpointError(f"cannot read {path} ({first_line(error)})") from error
        verify_metadata(values, str(path))
        return values

    def read_metadata(self, step: int) -> CheckpointMetadata:
        """The metadata of checkpoint `step`; `CheckpointError` naming its file if it cannot be
        read, does not match its checksum, or is not a jaxformer checkpoint's."""
        return CheckpointMetadata.from_json(self._read_json(step), str(self.metadata_file(step)))

    def latest_step_metadata(self, last_step: int | None = None) -> tuple[int, CheckpointMetadata] | None:
        """(step, metadata) of the newest checkpoint (up to `last_step`, when given) whose metadata
        reads; None without checkpoints."""
        for step in reversed([step for step in self.steps() if last_step is None or step <= last_step]):
            try:
                return step, self.read_metadata(step)
            except CheckpointError as error:  # a damaged step: restore_latest will set it aside
                if step not in self._warned:
                    self._warned.add(step)
                    logger.warning("cannot read the metadata of checkpoint %d (%s)", step, error)
        return None

    def latest_metadata(self) -> CheckpointMetadata | None:
        """The metadata of the newest checkpoint whose metadata reads; None without checkpoints."""
        latest = self.latest_step_metadata()
        return None if latest is None else latest[1]

    def restore_params(self, step: int, abstract_params: Any | None = None) -> Any:
        """Only the model parameters of checkpoint `step` (the optimizer state is not read),
        as host NumPy arrays or, given `abstract_params`, with its shapes, dtypes and shardings;
        verified against the checksums in the step's metadata.
        `CheckpointError` (a `ChecksumError` for a mismatch) names what is damaged."""
        return self._verified_params(step, self._read_json(step), abstract_params)

    def read_params(
        self, step: int, before_params: Callable[[CheckpointMetadata], object] | None = None
    ) -> tuple[CheckpointMetadata, Any]:
        """(metadata, host parameters) of checkpoint `step`, its metadata read once; errors as
        `read_metadata` and `restore_params`. `before_params(metadata)` runs before the parameters
        are read: what it raises, they are not."""
        values = self._read_json(step)
        metadata = CheckpointMetadata.from_json(values, str(self.metadata_file(step)))
        if before_params is not None:
            before_params(metadata)
        return metadata, self._verified_params(step, values, None)

    def _verified_params(self, step: int, metadata_values: dict[str, Any], abstract_params: Any | None) -> Any:
        path = self.directory / str(step) / "state"
        if not path.exists():
            refuse_removed(path)  # its metadata was just read: the folder was there
            raise CheckpointError(f"checkpoint {path.parent} is incomplete or damaged: it has no {path.name} folder")
        checksums = saved_checksums(metadata_values, str(path.parent))
        absl_logger = logging.getLogger("absl")
        absl_logger.addFilter(_no_missing_metadata_warning)  # reading one item directly has no step metadata; harmless
        try:
            params = self._restore_params(path, abstract_params)
        finally:
            absl_logger.removeFilter(_no_missing_metadata_warning)
        if checksums is not None:
            verify_arrays(params, checksums, str(path.parent), prefix="params/")
        return params

    def _restore_params(self, path: pathlib.Path, abstract_params: Any | None) -> Any:
        """The `params` item of the checkpoint at `path`; CheckpointError naming what is wrong."""
        checkpointer = ocp.PyTreeCheckpointer()
        try:
            with draining_event_loops():
                try:
                    item_metadata = checkpointer.metadata(path).item_metadata
                except Exception as error:
                    refuse_removed(path)
                    raise CheckpointError(f"cannot read the checkpoint {path} ({first_line(error)})") from error
                if item_metadata is None:
                    refuse_removed(path)
                    raise CheckpointError(
                        f"cannot read the checkpoint {path}: the index of its arrays (its _METADATA file, or the "
                        "array store under it that the index is read from) is missing or damaged"
                    )
                metadata = item_metadata.tree
                if "params" not in metadata:
                    raise CheckpointError(f"{path} has no 'params' entry (it holds {sorted(metadata)})")
                if abstract_params is None:
                    target = jax.tree.map(lambda leaf: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype), metadata["params"])
                    restore_args = jax.tree.map(
                        lambda leaf: ocp.RestoreArgs(restore_type=np.ndarray), metadata["params"]
                    )
                else:
                    target = abstract_params
                    restore_args = ocp.checkpoint_utils.construct_restore_args(abstract_params)
                try:
                    restored = checkpointer.restore(
                        path,
                        args=ocp.args.PyTreeRestore(
                            item={"params": target}, restore_args={"params": restore_args}, partial_restore=True
                        ),
                    )
                except Exception as error:
                    refuse_removed(path)
                    raise CheckpointError(f"cannot restore the parameters of {path} ({first_line(error)})") from error
        finally:
            checkpointer.close()
        return restored["params"]

    def check_process_count(self, step: int) -> None:
        """`CheckpointError` unless this job has as many processes as wrote checkpoint `step`: each
        process saved its own data iterator's position (`data/process_<i>-of-<n>.json`), which no
        other number of processes can take over."""
        written = {
            int(path.stem.rpartition("-of-")[2])
            for path in (self.directory / str(step) / "data").glob("process_*-of-*.json")
            if path.stem.rpartition("-of-")[2].isdigit()
        }
        if written and written != {jax.process_count()}:
            (count, *_) = sorted(written)
            processes = f"{count} process{'es' if count > 1 else ''}"
            raise CheckpointError(
                f"checkpoint {self.directory / str(step)} was written by {processes}, and this job has "
                f"{jax.process_count()}: each process's data position is its own, so resume with {processes}, "
                "or start a new run from its parameters (training.init_from)"
            )

    def restore_latest(self, abstract_state: Any, data_iterator) -> tuple[int, Any, CheckpointMetadata] | None:
        """(step, state, metadata) of the newest checkpoint that restores and matches its
        checksums; `data_iterator` is moved to its position. A damaged newest checkpoint is set
        aside with a warning and the previous one used; None when there is no checkpoint at all;
        `CheckpointError` when none restores."""
        import grain  # as in save()

        steps = self.steps()
        failures = []
        for step in reversed(steps):
            where = str(self.directory / str(step))
            self.check_process_count(step)  # not damage: no earlier checkpoint of the run would do either
            try:
                with draining_event_loops():
                    restored = self.manager.restore(
                        step,
                        args=ocp.args.Composite(
                            state=ocp.args.StandardRestore(abstract_state),
                            data=grain.checkpoint.CheckpointRestore(data_iterator),
                            metadata=ocp.args.JsonRestore(),
                        ),
                    )
                values = restored["metadata"]
                verify_metadata(values, str(self.metadata_file(step)))
                metadata = CheckpointMetadata.from_json(values, str(self.metadata_file(step)))
                checksums = saved_checksums(values, where)
                if checksums is not None:
                    verify_arrays(restored["state"], checksums, where)
                    verify_iterator(data_iterator, checksums, where)
            except Exception as error:  # orbax/tensorstore raise many types for damaged files
                failures.append(f"step {step}: {first_line(error)}")
                logger.warning(
                    "checkpoint %s cannot be restored (%s); trying the previous one", where, first_line(error)
                )
                continue
            for damaged in steps:
                if damaged > step:
                    self.set_aside(damaged)
            return step, restored["state"], metadata
        if failures:
            raise CheckpointError(f"no checkpoint in {self.directory} can be restored: " + "; ".join(failures))
        return None

    def close(self) -> None:
        self.wait()
        wait_for_save(self.manager, self.barrier, self._saving, self.manager.close)  # it waits again
