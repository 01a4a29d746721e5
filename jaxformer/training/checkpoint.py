"""Orbax checkpoints of the train state, the data iterator and the run's metadata.

Each step directory holds `state` (params, optimizer state, step, RNG), `data` (the grain
iterator's position) and `metadata` (the experiment config and the sentencepiece model), so
a checkpoint alone can resume training or translate.
"""

from __future__ import annotations

import base64
import logging
import pathlib
import time
from typing import Any

import grain
import jax
import numpy as np
import orbax.checkpoint as ocp

from jaxformer.errors import UserError


class CheckpointError(UserError, RuntimeError):
    """No usable checkpoint, or one that does not belong to this configuration."""


def encode_bytes(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def decode_bytes(text: str) -> bytes:
    return base64.b64decode(text.encode("ascii"))


def _no_missing_metadata_warning(record: logging.LogRecord) -> bool:
    return "Metadata file does not exist" not in record.getMessage()


class Checkpointer:
    """Saves every `save_every` steps (and on demand), keeps the last `keep`, restores the newest usable one."""

    def __init__(self, directory: str | pathlib.Path, keep: int = 3):
        self.directory = pathlib.Path(directory).absolute()
        self.manager = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True),
        )

    def steps(self) -> list[int]:
        return sorted(self.manager.all_steps())

    def set_aside(self, step: int) -> pathlib.Path:
        """Renames a damaged step directory out of orbax's way (kept for inspection, never deleted)."""
        self.manager.wait_until_finished()
        target = self.directory / f"{step}.damaged-{time.strftime('%Y%m%d-%H%M%S')}"
        (self.directory / str(step)).rename(target)
        self.manager.reload()
        logging.warning("moved the damaged checkpoint of step %d to %s", step, target)
        return target

    def save(self, step: int, state: Any, data_iterator, metadata: dict[str, Any]) -> None:
        if step in self.manager.all_steps():  # left by a run that could not restore it
            self.set_aside(step)
        self.manager.save(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardSave(state),
                data=grain.checkpoint.CheckpointSave(data_iterator),
                metadata=ocp.args.JsonSave(metadata),
            ),
            force=True,
        )

    def save_params(self, step: int, params: Any, metadata: dict[str, Any]) -> None:
        """A parameters-only checkpoint (best or averaged weights): enough to translate, not to resume."""
        if step in self.manager.all_steps():
            self.set_aside(step)
        self.manager.save(
            step,
            args=ocp.args.Composite(state=ocp.args.StandardSave({"params": params}), metadata=ocp.args.JsonSave(metadata)),
            force=True,
        )
        self.manager.wait_until_finished()

    def wait(self) -> None:
        self.manager.wait_until_finished()

    def read_metadata(self, step: int) -> dict[str, Any]:
        return self.manager.restore(step, args=ocp.args.Composite(metadata=ocp.args.JsonRestore()))["metadata"]

    def latest_metadata(self) -> dict[str, Any] | None:
        """The metadata of the newest checkpoint whose metadata reads; None without checkpoints."""
        for step in reversed(self.steps()):
            try:
                return self.read_metadata(step)
            except Exception as error:  # a damaged step: restore_latest will set it aside
                logging.warning("cannot read the metadata of checkpoint %d (%s)", step, error)
        return None

    def restore_params(self, step: int, abstract_params: Any | None = None) -> Any:
        """Only the model parameters of checkpoint `step` (the optimizer state is not read),
        as host NumPy arrays or, given `abstract_params`, with its shapes, dtypes and shardings."""
        self.manager.wait_until_finished()
        path = self.directory / str(step) / "state"
        if not path.exists():
            raise CheckpointError(f"{path} does not exist; the checkpoints in {self.directory} are {self.steps()}")
        absl_logger = logging.getLogger("absl")
        absl_logger.addFilter(_no_missing_metadata_warning)  # reading one item directly has no step metadata; harmless
        try:
            return self._restore_params(path, abstract_params)
        finally:
            absl_logger.removeFilter(_no_missing_metadata_warning)

    def _restore_params(self, path: pathlib.Path, abstract_params: Any | None) -> Any:
        try:
            metadata = ocp.PyTreeCheckpointer().metadata(path).item_metadata.tree
        except Exception as error:
            raise CheckpointError(f"cannot read the checkpoint {path}: {type(error).__name__}: {error}") from error
        if "params" not in metadata:
            raise CheckpointError(f"{path} has no 'params' entry (it holds {sorted(metadata)})")
        if abstract_params is None:
            target = jax.tree.map(lambda leaf: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype), metadata["params"])
            restore_args = jax.tree.map(lambda leaf: ocp.RestoreArgs(restore_type=np.ndarray), metadata["params"])
        else:
            target = abstract_params
            restore_args = ocp.checkpoint_utils.construct_restore_args(abstract_params)
        try:
            restored = ocp.PyTreeCheckpointer().restore(
                path,
                args=ocp.args.PyTreeRestore(
                    item={"params": target}, restore_args={"params": restore_args}, partial_restore=True
                ),
            )
        except Exception as error:
            raise CheckpointError(f"cannot restore the parameters of {path}: {type(error).__name__}: {error}") from error
        return restored["params"]

    def restore_latest(self, abstract_state: Any, data_iterator) -> tuple[int, Any, dict[str, Any]] | None:
        """(step, state, metadata) of the newest checkpoint that restores; `data_iterator` is
        moved to its position. A damaged newest checkpoint is skipped with a warning; None when
        there is no checkpoint at all; `CheckpointError` when none restores."""
        steps = self.steps()
        failures = []
        for step in reversed(steps):
            try:
                restored = self.manager.restore(
                    step,
                    args=ocp.args.Composite(
                        state=ocp.args.StandardRestore(abstract_state),
                        data=grain.checkpoint.CheckpointRestore(data_iterator),
                        metadata=ocp.args.JsonRestore(),
                    ),
                )
            except Exception as error:  # orbax/tensorstore raise many types for damaged files
                failures.append(f"step {step}: {type(error).__name__}: {error}")
                logging.warning(
                    "checkpoint %s/%d cannot be restored (%s: %s); trying the previous one",
                    self.directory, step, type(error).__name__, str(error).splitlines()[0] if str(error) else "",
                )
                continue
            for damaged in steps:
                if damaged > step:
                    self.set_aside(damaged)
            return step, restored["state"], restored["metadata"]
        if failures:
            raise CheckpointError(f"no checkpoint in {self.directory} can be restored:\n  " + "\n  ".join(failures))
        return None

    def close(self) -> None:
        self.manager.wait_until_finished()
        self.manager.close()
