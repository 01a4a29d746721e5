"""Fine-tuning and composition: the parameters (and tokenizers) a new run starts from, taken from
another run (`training.init_from`), or a translator's encoder from a masked LM and its decoder
from a causal LM (`training.init_encoder_from`, `training.init_decoder_from`). Only parameters
travel: the optimizer, the step and the data order start afresh in the new workdir."""

from __future__ import annotations

import dataclasses
import logging
import pathlib
from collections.abc import Sequence
from typing import Any

import jax
import ml_collections
import numpy as np
from flax import traverse_util

from jaxformer.errors import CheckpointError, with_article
from jaxformer.model.config import ConfigError, TransformerConfig
from jaxformer.model.transformer import stack_layers, unstack_layers
from jaxformer.run.directory import RunDirectory
from jaxformer.run.export_origin import export_description, export_origin, to_the_run_exported_from
from jaxformer.run.loading import (
    load_from_directory,
    locate_checkpoint,
    warn_if_final_trained_past,
    with_final_choice_remedy,
)
from jaxformer.run.metadata import CheckpointMetadata

logger = logging.getLogger(__name__)

# What a starting point gives a new run: every parameter, or one side of a translator with its
# embedding (the encoder from a masked LM, the decoder from a causal LM).
PARTS = {"model": "init_from", "encoder": "init_encoder_from", "decoder": "init_decoder_from"}
# The architecture each part is taken from.
_PART_ARCHITECTURE = {"encoder": "encoder_only", "decoder": "decoder_only"}


@dataclasses.dataclass(frozen=True)
class StartingPoint:
    """A checkpoint a new run starts from."""

    where: str  # "step 40 of /runs/a/checkpoints", for messages
    step: int
    metadata: CheckpointMetadata
    params: Any  # host arrays, in the layout (scanned or not) of the run that saved them; None: metadata only
    part: str = "model"  # a key of PARTS


def load_starting_points(training: ml_collections.ConfigDict, *, params: bool = True) -> tuple[StartingPoint, ...]:
    """The checkpoints that `training.init_from`, or `training.init_encoder_from` and
    `training.init_decoder_from`, name (with `training.init_checkpoint`); none without them.
    `CheckpointError` naming the path when it holds no readable checkpoint, `ConfigError` when an
    encoder does not come from an encoder_only run or a decoder from a decoder_only one. Without
    `params`, only their metadata is read (params None), quietly: enough for check_starting_points
    ahead of the run that will start from them (a sweep's variants)."""
    points = []
    for part, key in PARTS.items():
        path = training.get(key)
        if path is None:
            continue
        try:
            refuse_an_export(path, key)
            directory, step = locate_checkpoint(path, training.init_checkpoint)
            # "latest" of a run's checkpoints/ is its newest readable step, as translate and export read it.
            latest = step is None and directory == RunDirectory(directory.parent).checkpoints
            try:
                step, metadata, arrays = load_from_directory(directory, step, params=params, newest_readable=latest)
            except CheckpointError as error:  # a damaged final choice: translate's remedy
                raise with_final_choice_remedy(directory, step, error) from None
        except CheckpointError as error:  # named by the key that led there
            chosen = (
                ""
                if training.init_checkpoint == "latest"
                else f" (training.init_checkpoint={training.init_checkpoint!r})"
            )
            raise CheckpointError(f"training.{key}{chosen}: {error}") from None
        if params:  # said by the run that starts from it
            warn_if_final_trained_past(directory, step)  # as translate and export say of that final/
        where = f"step {step} of {directory}"
        found = metadata.model.get("architecture", "encoder_decoder")
        if part in _PART_ARCHITECTURE and found != _PART_ARCHITECTURE[part]:
            raise ConfigError(
                f"training.{key}: {where} holds {with_article(found)} model; a translator's {part} starts from "
                f"{with_article(_PART_ARCHITECTURE[part])} run"
            )
        if params:
            logger.info("starting the %s from the parameters of %s", "model" if part == "model" else part, where)
        points.append(StartingPoint(where=where, step=step, metadata=metadata, params=arrays, part=part))
    return tuple(points)


def started_from(points: Sequence[StartingPoint]) -> str | None:
    """Where `points` are, as a run's checkpoints record its start (CheckpointMetadata.started_from);
    None without any."""
    return "; ".join(f"training.{PARTS[point.part]}: {point.where}" for point in points) or None


def started_from_params(points: Sequence[StartingPoint]) -> dict[str, str] | None:
    """{"training.init_from": the identity of its parameters, ...} of `points`, as a run's
    checkpoints record it (CheckpointMetadata.started_from_params), read from each start's
    checksums without its parameters; a start saved without checksums is left out; None without any."""
    digests = {f"training.{PARTS[p.part]}": p.metadata.params_digest for p in points if p.metadata.params_digest}
    return digests or None


def refuse_missing_starts(training: ml_collections.ConfigDict, workdir: pathlib.Path) -> None:
    """Before a new run makes its `workdir`: a CheckpointError naming the key for a
    `training.init_*from` path that does not exist. Once the run has made its workdir, that
    workdir given as the start (a slip) would exist and be refused as a folder holding no
    checkpoint. A workdir already there may hold a run that resumes, whatever its start has become
    since: `load_starting_points` reads the start where the run is new."""
    if workdir.exists():
        return
    for key in PARTS.values():
        path = training.get(key)
        if path is None or pathlib.Path(path).exists():
            continue
        path = pathlib.Path(path).absolute()
        own = ""
        if path.is_relative_to(workdir):
            where = "this run's own --workdir" if path == workdir else f"in this run's own --workdir {workdir}"
            own = f" (it is {where}: give the workdir of the run to start from)"
        raise CheckpointError(f"training.{key}: {path} does not exist{own}")


def refuse_an_export(path: str, key: str) -> None:
    """A `CheckpointError` where `path` is an export's folder (jaxformer-export's output), which was
    said to be no workdir, or to hold no checkpoint when named final or best: no run starts from
    it; the run it was exported from, which its config.json records, does."""
    origin = export_origin(path)
    if origin is None:
        return
    start = to_the_run_exported_from(origin, "start from", f"training.{key}", "training.init_checkpoint")
    raise CheckpointError(f"{export_description(pathlib.Path(path))}; {start}")


# The model fields a part's parameters were trained for: each must be the new model's, or the
# parameters would compute another function (dropout, dtypes, remat and scan may change).
_SHAPES = ("d_model", "num_heads", "d_ff")
_FUNCTION = ("activation", "normalization", "layer_norm_epsilon", "position_base", "position_layout", "max_positions")
_PART_FIELDS = {
    "model": (
        *_SHAPES,
        "num_encoder_layers",
        "num_decoder_layers",
        *_FUNCTION,
        "share_embeddings",
        "tie_output_embedding",
        "logits_bias",
    ),
    "encoder": (*_SHAPES, "num_encoder_layers", *_FUNCTION),
    "decoder": (*_SHAPES, "num_decoder_layers", *_FUNCTION, "tie_output_embedding"),
}
# The side of the data whose language a part's run read (encoder_only: the source side, decoder_only: the target).
_PART_SIDES = {
    "encoder": ("source_language",),
    "decoder": ("target_language",),
}


def check_starting_points(points: Sequence[StartingPoint], config: ml_collections.ConfigDict) -> None:
    """Before any data is read: each starting point fits the experiment `config` (its model
    section and languages). `ConfigError` for another architecture (init_from), any model field
    its parameters were trained for that differs (one error listing them all), or a part alone
    under one shared vocabulary; a warning when its run read other languages."""
    from jaxformer.training import text_sides

    architecture = text_sides.architecture(config)
    parts = {point.part for point in points}
    if len(parts & {"encoder", "decoder"}) == 1 and not config.tokenizer.separate_vocabularies:
        (part,) = parts & {"encoder", "decoder"}
        raise ConfigError(
            f"training.{PARTS[part]} alone with one shared vocabulary: the shared tokenizer would be the {part} "
            f"start's, made for its side's text only; set tokenizer.separate_vocabularies=True and "
            "model.share_embeddings=False (the other side's tokenizer is then trained here)"
        )
    defaults = TransformerConfig()
    unread = text_sides.language_model_unread(config)  # a language model's missing stack's depth
    mismatches = []  # per starting point: its model fields that differ from this run's
    for point in points:
        key, saved = PARTS[point.part], point.metadata.model
        found = saved.get("architecture", "encoder_decoder")
        if point.part == "model" and found != architecture:
            part = {"encoder_only": "encoder", "decoder_only": "decoder"}.get(found)
            hint = (
                f"; to start a translator's {part} from it, use training.{PARTS[part]}"
                if part and architecture == "encoder_decoder"
                else ""
            )
            raise ConfigError(
                f"training.{key}: {point.where} holds {with_article(found)} model and this run has "
                f"model.architecture={architecture!r}{hint}"
            )
        differences = [
            f"model.{field}={saved.get(field, getattr(defaults, field))!r} there, {config.model[field]!r} here"
            for field in _PART_FIELDS[point.part]
            if f"model.{field}" not in unread and saved.get(field, getattr(defaults, field)) != config.model[field]
        ]
        separate = point.metadata.target_tokenizer is not None  # the tokenizers the parameters were trained with
        if point.part == "model" and separate != bool(config.tokenizer.separate_vocabularies):
            differences.append(
                f"tokenizer.separate_vocabularies={separate} there, {config.tokenizer.separate_vocabularies} here"
            )
        if differences:
            mismatches.append(
                f"training.{key}: {point.where} was trained with another model section; set it as in that run: "
                + "; ".join(differences)
            )
    if mismatches:
        raise ConfigError("; and ".join(mismatches))
    for point in points:
        key, trained_on = PARTS[point.part], point.metadata.config.get("data", {})
        # A whole model's run (of this run's architecture, as checked above) read the sides this run reads.
        for side in _PART_SIDES.get(point.part) or text_sides.text_language_keys(config):
            if trained_on.get(side) is not None and trained_on[side] != config.data[side]:
                logger.warning(
                    "training.%s: %s read %s=%r, and this run reads %r: its %s starts from another language",
                    key,
                    point.where,
                    side if point.part == "model" else "its text in " + side,
                    trained_on[side],
                    config.data[side],
                    "model" if point.part == "model" else point.part,
                )


def _shape(leaf: Any) -> tuple[int, ...]:
    return tuple(np.shape(leaf))


def _named_params(point: StartingPoint, config: TransformerConfig) -> dict[str, Any]:
    """`point`'s parameters by "/"-joined name, in the layout (scanned or not) and, for a part,
    under the names, of the new model `config`. A masked LM's head has no place in a translator:
    the names left out are logged, so that nothing of the checkpoint is dropped unsaid."""
    params = point.params
    saved_scan = bool(point.metadata.model.get("scan_layers", False))
    if saved_scan and not config.scan_layers:
        params = unstack_layers(params)
    elif config.scan_layers and not saved_scan:
        params = stack_layers(params)
    named = traverse_util.flatten_dict(params, sep="/")
    if point.part == "model":
        return named
    if config.share_embeddings:
        embedding = "shared_embedding"
    else:
        embedding = "source_embedding" if point.part == "encoder" else "target_embedding"
    renamed, left_out = {}, []
    for name, value in named.items():
        top, rest = name.split("/", 1)
        if top == "embedding":
            renamed[f"{embedding}/{rest}"] = value
        elif top == point.part:
            renamed[name] = value
        else:
            left_out.append(name)
    if left_out:
        logger.info(
            "%d of %d parameter arrays of %s have no place in a translator's %s and are left out: %s",
            len(left_out),
            len(named),
            point.where,
            point.part,
            ", ".join(left_out),
        )
    return renamed


def starting_overrides(
    points: Sequence[StartingPoint], abstract_params: Any, config: TransformerConfig
) -> dict[str, np.ndarray]:
    """{parameter name: host array} that the starting points give the new model `config`
    (`abstract_params` its parameters), cast to its dtypes: every parameter for `init_from`, the
    encoder or decoder with its embedding for a part (the rest, such as the cross-attention,
    keeps its random initialisation). Any difference in names or shapes is one `ConfigError`
    listing every parameter that differs."""
    wanted = traverse_util.flatten_dict(abstract_params, sep="/")
    parts = {point.part for point in points}
    if {"encoder", "decoder"} <= parts and config.share_embeddings:
        raise ConfigError(
            "training.init_encoder_from and training.init_decoder_from each give an embedding, but the model "
            "shares one: set model.share_embeddings=False and tokenizer.separate_vocabularies=True"
        )
    overrides: dict[str, np.ndarray] = {}
    for point in points:
        saved = _named_params(point, config)
        differences = []
        for name in sorted(set(saved) | (set(wanted) if point.part == "model" else set())):
            if name not in wanted:
                differences.append(f"{name} only in the checkpoint")
            elif name not in saved:
                differences.append(f"{name} only in this model")
            elif _shape(saved[name]) != _shape(wanted[name]):
                differences.append(f"{name}: {_shape(saved[name])} in the checkpoint, {_shape(wanted[name])} here")
        if differences:
            raise ConfigError(
                f"training.{PARTS[point.part]}: the parameters of {point.where} do not fit this model "
                f"({len(differences)} differ; set the model section as in that run): " + "; ".join(differences)
            )
        casts = {
            f"{saved[name].dtype} -> {wanted[name].dtype}" for name in saved if saved[name].dtype != wanted[name].dtype
        }
        if casts:
            logger.info("parameters cast from the dtypes of %s: %s", point.where, ", ".join(sorted(casts)))
        overrides.update({name: np.asarray(value).astype(wanted[name].dtype) for name, value in saved.items()})
    fresh = [name for name in wanted if name not in overrides]
    if points and fresh:
        logger.info("%d of %d parameter arrays start from random values: %s", len(fresh), len(wanted), ", ".join(fresh))
    return overrides


def with_overrides(params: Any, overrides: dict[str, np.ndarray]) -> Any:
    """`params` (device arrays) with the leaves named in `overrides` replaced, each placed as the
    leaf it replaces."""

    def replace(path, leaf):
        name = jax.tree_util.keystr(path, simple=True, separator="/")
        return jax.device_put(overrides[name], leaf.sharding) if name in overrides else leaf

    return jax.tree_util.tree_map_with_path(replace, params)


def side_tokenizers(points: Sequence[StartingPoint]) -> tuple[tuple[bytes, str] | None, tuple[bytes, str] | None]:
    """(source, target) tokenizers, (model, where) each, of a translator composed from an encoder's
    and a decoder's runs: each part brings its run's; None for a side no part gives."""
    sides: dict[str, tuple[bytes, str]] = {
        point.part: (point.metadata.tokenizer, f"the {point.part} start, {point.where}")
        for point in points
        if point.part != "model"
    }
    return sides.get("encoder"), sides.get("decoder")
