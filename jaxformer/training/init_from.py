"""Fine-tuning: the parameters (and tokenizer) a new run starts from, taken from another run
(`training.init_from`). Only the parameters travel: the optimizer, the step and the data order
start afresh in the new workdir."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import jax
import ml_collections
import numpy as np
from flax import traverse_util

from jaxformer.model.config import ConfigError
from jaxformer.model.transformer import stack_layers, unstack_layers
from jaxformer.run.loading import load_from_directory, locate_checkpoint
from jaxformer.run.metadata import CheckpointMetadata


@dataclasses.dataclass(frozen=True)
class StartingPoint:
    """The checkpoint a fine-tuning run starts from."""

    where: str  # "step 40 of /runs/a/checkpoints", for messages
    step: int
    metadata: CheckpointMetadata
    params: Any  # host arrays, in the layout (scanned or not) of the run that saved them


def load_starting_point(training: ml_collections.ConfigDict) -> StartingPoint | None:
    """The checkpoint `training.init_from` / `training.init_checkpoint` name; None without
    init_from. `CheckpointError` naming the path when it holds no readable checkpoint."""
    if training.init_from is None:
        return None
    directory, step = locate_checkpoint(training.init_from, training.init_checkpoint)
    step, metadata, params = load_from_directory(directory, step)
    where = f"step {step} of {directory}"
    logging.info("fine-tuning: starting from the parameters of %s", where)
    return StartingPoint(where=where, step=step, metadata=metadata, params=params)


def _shape(leaf: Any) -> tuple[int, ...]:
    return tuple(np.shape(leaf))


def starting_params(start: StartingPoint, abstract_params: Any, scan_layers: bool) -> Any:
    """`start`'s parameters laid out as `abstract_params` (the new model's), cast to its dtypes.

    A scanned run's parameters are unstacked for a model without scan, and the other way round.
    Any difference in names or shapes is one `ConfigError` listing every parameter that differs."""
    params = start.params
    saved_scan = bool(start.metadata.model.get("scan_layers", False))
    if saved_scan and not scan_layers:
        params = unstack_layers(params)
    elif scan_layers and not saved_scan:
        params = stack_layers(params)
    saved = traverse_util.flatten_dict(params, sep="/")
    wanted = traverse_util.flatten_dict(abstract_params, sep="/")
    differences = []
    for name in sorted(set(saved) | set(wanted)):
        if name not in wanted:
            differences.append(f"{name} only in the checkpoint")
        elif name not in saved:
            differences.append(f"{name} only in this model")
        elif _shape(saved[name]) != _shape(wanted[name]):
            differences.append(f"{name}: {_shape(saved[name])} in the checkpoint, {_shape(wanted[name])} here")
    if differences:
        raise ConfigError(
            f"training.init_from: the parameters of {start.where} do not fit this model "
            f"({len(differences)} differ; set the model section as in that run): " + "; ".join(differences)
        )
    saved = {name: np.asarray(value) for name, value in saved.items()}
    casts = {
        f"{saved[name].dtype} -> {wanted[name].dtype}" for name in wanted if saved[name].dtype != wanted[name].dtype
    }
    if casts:
        logging.info("fine-tuning: parameters cast from the checkpoint's dtypes: %s", ", ".join(sorted(casts)))
    return jax.tree_util.tree_map_with_path(
        lambda path, leaf: saved[jax.tree_util.keystr(path, simple=True, separator="/")].astype(leaf.dtype),
        abstract_params,
    )
