"""Loading a run's checkpoint to translate, evaluate or fine-tune with it, without modifying the run."""

from __future__ import annotations

import logging
import os
import pathlib
from collections.abc import Callable
from typing import Any

from jaxformer.errors import CheckpointError, with_article
from jaxformer.model.config import ConfigError, TransformerConfig
from jaxformer.run.architecture_uses import ARCHITECTURE_USES
from jaxformer.run.checkpoint import Checkpointer
from jaxformer.run.directory import CHECKPOINT_KINDS, RunDirectory, parse_checkpoint_choice
from jaxformer.run.export_origin import given_instead_of_a_run
from jaxformer.run.interrupted_saves import interrupted_replacement_note, interrupted_replacements
from jaxformer.run.metadata import CheckpointMetadata
from jaxformer.run.removal import CheckpointRemoved, listing_again
from jaxformer.run.rolled_back import rolled_back_note

logger = logging.getLogger(__name__)

MetadataCheck = Callable[[CheckpointMetadata], object]  # raises to refuse a checkpoint


def load_checkpoint(
    workdir: str | os.PathLike,
    checkpoint: str | int = "latest",
    params: bool = True,
    before_params: MetadataCheck | None = None,
) -> tuple[int, CheckpointMetadata, Any]:
    """(step, metadata, params) of a workdir's checkpoint: "latest", "best", "averaged", "final" or a step
    of `workdir/checkpoints`. Parameters come back as host arrays, without optimizer state
    (None with `params=False`), verified against their checksums. `before_params` is given each
    checkpoint's metadata before its parameters are read: a caller refuses a checkpoint it cannot
    use (another architecture, a search that does not fit) from the one read of its metadata.

    "latest" skips a damaged newest checkpoint (metadata or parameters unreadable, or not
    matching their checksums) with a warning and uses the newest one that reads, as training
    does, but sets nothing aside: nothing in the workdir is modified. Any other choice that is
    damaged is a `CheckpointError` naming it; for "final", with the remedy: the run's training
    command, run again, makes the choice again (`unreadable_final_choice`). A step may be given as
    its digits in a str; other values are refused by `parse_checkpoint_choice`."""
    checkpoint = parse_checkpoint_choice(checkpoint)
    which = "latest" if isinstance(checkpoint, int) else checkpoint
    run = RunDirectory(workdir)
    directory = run.checkpoint_directory(which)
    if not directory.is_dir():
        if not any(run.checkpoint_directory(kind).is_dir() for kind in CHECKPOINT_KINDS):
            raise CheckpointError(_not_a_workdir(pathlib.Path(workdir).absolute()))
        latest = _latest_where_none_kept(workdir, which)
        if before_params is not None and _holds_a_language_model(latest):
            before_params(latest)  # a translator refuses the model before naming a checkpoint such a run never has
        raise CheckpointError(_missing(directory, which, workdir, latest))
    step = checkpoint if isinstance(checkpoint, int) else None
    if checkpoint == "final" and before_params is not None:
        before_params = _trained_past_said_first(run, before_params)
    try:
        loaded = load_from_directory(
            directory, step, params=params, newest_readable=checkpoint == "latest", before_params=before_params
        )
    except CheckpointRemoved:
        raise  # not damaged: gone while it was read
    except CheckpointError as error:
        if checkpoint != "final":
            raise
        raise CheckpointError(unreadable_final_choice(run, error)) from error
    if checkpoint == "final":
        _warn_if_trained_past(run, loaded[0])
    return loaded


def _missing(directory: pathlib.Path, which: str, workdir: str | os.PathLike, latest: CheckpointMetadata | None) -> str:
    """Why `which` cannot be read from `workdir`, whose `directory` for it does not exist; for
    "averaged", the command that makes it; for "best", the setting under which training keeps it;
    for "final", what makes it: a run stopped before its end, or before its choice, chooses when its
    training command runs again. `latest`: `workdir`'s latest metadata, as `_latest_where_none_kept` reads it."""
    missing = f"{directory} does not exist: no {which!r} checkpoint in {workdir}"
    if which in LANGUAGE_MODEL_MAKES_NONE and _holds_a_language_model(latest):
        return f"{missing}: {language_model_keeps_none(which)}"
    if which == "averaged":  # made by a command, not by the run
        return f"{missing}: jaxformer-average-checkpoints --workdir {workdir} --last N makes one"
    if which == "best":
        return (
            f"{missing}: best/ keeps the parameters with the best validation BLEU, which training scores with "
            "training.bleu_every_steps > 0 (as multi30k sets it), from its first score on"
        )
    if which != "final":
        return missing
    return (
        f"{missing}: the run has made no final choice; its training command, run again with "
        "training.final_choice=True (as multi30k sets it), makes it at the run's end"
    )


# The checkpoints that a translator's validation BLEU keeps, by what keeps them: a language model's
# run is refused validation BLEU and the final choice (README, "Decoder-only"), so the advice for a
# translator's missing best/ or final/ (training.bleu_every_steps, final_choice=True) would be refused too.
LANGUAGE_MODEL_MAKES_NONE = {
    "best": "best/ holds the best checkpoint by validation BLEU",
    "final": "final/ holds the final choice, made by validation BLEU",
}


def language_model_keeps_none(which: str) -> str:
    """Why a language model's run has no `which` ("best" or "final"), and what to choose instead."""
    return (
        f"{LANGUAGE_MODEL_MAKES_NONE[which]}, which a language model's run, translating nothing, never has; "
        "choose latest, averaged or a step number"
    )


def _architecture(metadata: CheckpointMetadata | None) -> str | None:
    """The model architecture that `metadata` holds; None for None (no metadata read)."""
    return None if metadata is None else metadata.model.get("architecture", "encoder_decoder")


def _latest_metadata(workdir: str | os.PathLike) -> CheckpointMetadata | None:
    try:
        return load_checkpoint(workdir, "latest", params=False)[1]
    except CheckpointError:
        return None


def _latest_where_none_kept(workdir: str | os.PathLike, which: str) -> CheckpointMetadata | None:
    """`workdir`'s latest metadata (None: none reads) when a language model's run never keeps `which`; else None."""
    return _latest_metadata(workdir) if which in LANGUAGE_MODEL_MAKES_NONE else None


def _holds_a_language_model(metadata: CheckpointMetadata | None) -> bool:
    """Whether `metadata` (None: none read) is a language model's, whose run keeps no best/ or final/."""
    return _architecture(metadata) in ("decoder_only", "encoder_only")


def _trained_past_said_first(run: RunDirectory, check: MetadataCheck) -> MetadataCheck:
    """`check` of a final choice's metadata, after the warning that the run trained past it: said
    before a refusal, as where that metadata is read alone first (`require_architecture`)."""

    def checked(metadata: CheckpointMetadata) -> object:
        _warn_if_trained_past(run, metadata.step)
        return check(metadata)

    return checked


def unreadable_final_choice(run: RunDirectory, error: CheckpointError) -> str:
    """Why `--checkpoint final` cannot be used, in one line, and what makes it usable again: the
    run's training command, which verifies the choice it kept, sets a damaged one aside and chooses
    again (or, on a run trained past it, chooses at its end)."""
    return (
        f"the final choice in {run.final} cannot be read: {error}; running the run's training command again "
        "makes the choice again (it sets a damaged one aside)"
    )


def with_final_choice_remedy(directory: pathlib.Path, step: int | None, error: CheckpointError) -> CheckpointError:
    """`error` of step `step` (None: the newest) of `directory` read as a folder of steps
    (`locate_checkpoint`'s, for training.init_from), with `unreadable_final_choice`'s remedy where it is
    a workdir's final/ whose choice cannot be read, as load_checkpoint gives it for "final"; a step
    the folder lacks, or one removed while it was read, is no damage and keeps its own words."""
    run = RunDirectory(directory.parent)
    if directory != run.final or isinstance(error, CheckpointRemoved):
        return error
    if step is not None and directory.is_dir() and step not in _step_names(directory):
        return error
    return CheckpointError(unreadable_final_choice(run, error))


_REPORTED_TRAINED_PAST: set[tuple[str, int]] = set()  # (workdir, final step) said outdated by this process


def steps_past_final_choice(run: RunDirectory, chosen_step: int) -> list[int]:
    """The steps of `run`'s checkpoints/ after its final choice of `chosen_step`: where there are
    any, the run was continued (a longer run or budget, or training.final_choice=False) and stopped
    before it chose again, so that choice is not of its end, and `--checkpoint final` is warned of."""
    return [step for step in _step_names(run.checkpoints) if step > chosen_step] if run.checkpoints.is_dir() else []


def _warn_if_trained_past(run: RunDirectory, chosen_step: int) -> None:
    """A warning when the run has checkpoints after its newest final choice (`steps_past_final_choice`)."""
    later = steps_past_final_choice(run, chosen_step)
    if later and (str(run.path), chosen_step) not in _REPORTED_TRAINED_PAST:  # a command loads it more than once
        _REPORTED_TRAINED_PAST.add((str(run.path), chosen_step))
        logger.warning(
            "the final choice of %s was made at step %d, and the run trained past it, to step %d; running its "
            "training command again makes the choice at the run's end (until then, final is step %d's)",
            run.path,
            chosen_step,
            max(later),
            chosen_step,
        )


def warn_if_final_trained_past(directory: pathlib.Path, step: int) -> None:
    """`load_checkpoint`'s warning for "final", for step `step` of `directory` read as a folder of
    steps (`locate_checkpoint`'s, for training.init_from): where it is a workdir's final/ and that
    run trained past its choice."""
    run = RunDirectory(directory.parent)
    if directory == run.final:
        _warn_if_trained_past(run, step)


NEEDS_A_TRANSLATOR = "a Translator needs an encoder_decoder one"


def require_architecture(
    workdir: str | os.PathLike,
    checkpoint: str | int,
    architecture: str,
    needs: str,
    error: type[Exception] = ConfigError,
    metadata: CheckpointMetadata | None = None,
) -> TransformerConfig:
    """The model config of `workdir`'s `checkpoint`, read from its metadata alone (before any data
    or parameter is); `error` naming `workdir` when its model is not of `architecture`. `needs`
    says who needs it, e.g. "a Translator needs an encoder_decoder one". `metadata`: the
    checkpoint's, when the caller read it already (then nothing is read)."""
    if metadata is None:
        try:
            metadata = load_checkpoint(workdir, checkpoint, params=False)[1]
        except CheckpointError:
            # A language model's run has no best/ or final/: its model, not that, is what refuses it.
            found = _architecture(_latest_where_none_kept(workdir, checkpoint))
            if found not in (None, architecture):
                raise error(_refusal(workdir, found, needs)) from None
            raise
    model_config = metadata.model_config()
    found = model_config.architecture
    if found != architecture:
        raise error(_refusal(workdir, found, needs))
    return model_config


def _refusal(workdir: str | os.PathLike, found: str, needs: str) -> str:
    return f"{workdir} holds {with_article(found)} model; {needs} ({ARCHITECTURE_USES.get(found, '')})"


_REPORTED_DAMAGED: set[tuple[str, int]] = set()  # (directory, step) said damaged by this process


def load_from_directory(
    directory: pathlib.Path,
    step: int | None = None,
    *,
    params: bool = True,
    newest_readable: bool = False,
    before_params: MetadataCheck | None = None,
) -> tuple[int, CheckpointMetadata, Any]:
    """(step, metadata, params) of checkpoint `step` (None: the newest) of a directory of step
    directories (`checkpoints/`, `best/` or `averaged/`). With `newest_readable`, a damaged
    newest checkpoint is skipped with a warning, as `load_checkpoint` does for "latest". The
    newest that a run training beside the reader removes while it is read is looked up again.
    `before_params`: as `load_checkpoint`'s."""
    if step is not None:  # that step, or an error saying it is gone
        return _load_once(directory, step, params, newest_readable, before_params)
    return listing_again(lambda: _load_once(directory, step, params, newest_readable, before_params))


def _load_once(
    directory: pathlib.Path,
    step: int | None,
    params: bool,
    newest_readable: bool,
    before_params: MetadataCheck | None,
) -> tuple[int, CheckpointMetadata, Any]:
    checkpointer = Checkpointer(directory, keep=None, read_only=True)

    def read(step: int) -> tuple[CheckpointMetadata, Any]:  # CheckpointError if damaged
        if params:
            return checkpointer.read_params(step, before_params)
        return checkpointer.read_metadata(step), None

    try:
        steps = checkpointer.steps()
        if not steps:
            notes = interrupted_replacement_note(directory) + rolled_back_note(directory)
            raise CheckpointError(f"{directory} holds no checkpoint{notes}")
        if step is None:
            _warn_if_newer_interrupted(directory, steps[-1])
        if not newest_readable or step is not None:
            step = steps[-1] if step is None else step
            if step not in steps:
                raise CheckpointError(
                    f"{directory} has no checkpoint for step {step}; it has {steps}"
                    + interrupted_replacement_note(directory)
                )
            return (step, *read(step))
        damaged = []
        for step in reversed(steps):
            try:
                metadata, restored = read(step)
            except CheckpointRemoved:
                raise  # not damaged: the newest are looked up again
            except CheckpointError as error:
                damaged.append((step, error))
                continue
            for bad_step, error in damaged:
                if (str(directory), bad_step) not in _REPORTED_DAMAGED:  # a command reads the metadata, then all
                    _REPORTED_DAMAGED.add((str(directory), bad_step))
                    logger.warning(
                        "checkpoint %d of %s is damaged (%s); using step %d", bad_step, directory, error, step
                    )
            return step, metadata, restored
        raise CheckpointError(
            f"no checkpoint in {directory} can be read: " + "; ".join(f"step {s}: {error}" for s, error in damaged)
        )
    finally:
        checkpointer.close()


def _warn_if_newer_interrupted(directory: pathlib.Path, newest: int) -> None:
    """The newest readable step is not the folder's newest when a save replacing a later one was
    interrupted (its whole previous version waits as `<step>.replacing`): said once per folder,
    rather than an older average or choice read without a word."""
    newer = [step for step in interrupted_replacements(directory) if step > newest]
    if newer and str(directory) not in _REPORTED_INTERRUPTED:
        _REPORTED_INTERRUPTED.add(str(directory))
        logger.warning("reading step %d of %s%s", newest, directory, interrupted_replacement_note(directory))


_REPORTED_INTERRUPTED: set[str] = set()


def locate_checkpoint(path: str | os.PathLike, checkpoint: str | int = "latest") -> tuple[pathlib.Path, int | None]:
    """(directory of step directories, step or None for the newest) that `path` and `checkpoint`
    name: a workdir (then `checkpoint` picks "latest", "best", "averaged", "final" or a step), one
    of a workdir's `checkpoints/`, `best/`, `averaged/` or `final/` directories (then `checkpoint`
    picks "latest", its newest step, or a step), or a step directory in one of them (`checkpoint`
    "latest" only). `CheckpointError` naming `path` when it is none of these, or naming `path` and
    `checkpoint` when they contradict each other."""
    checkpoint = parse_checkpoint_choice(checkpoint)
    path = pathlib.Path(path).absolute()
    if not path.exists():
        raise CheckpointError(f"{path} does not exist")
    step = checkpoint if isinstance(checkpoint, int) else None
    run = RunDirectory(path)
    if any(run.checkpoint_directory(kind).is_dir() for kind in CHECKPOINT_KINDS):
        if step is not None:
            return run.checkpoints, step
        directory = run.checkpoint_directory(checkpoint)
        if not directory.is_dir():
            raise CheckpointError(_missing(directory, checkpoint, path, _latest_where_none_kept(path, checkpoint)))
        return directory, None
    kind_names = {RunDirectory(path.parent).checkpoint_directory(kind).name for kind in CHECKPOINT_KINDS}
    if path.name in kind_names:
        if step is None and checkpoint != "latest":
            # A kind names one of a workdir's folders; this folder is already one, maybe another.
            raise CheckpointError(
                f"{path} is a folder of steps, not a workdir, so checkpoint {checkpoint!r} names nothing in it: "
                f"choose 'latest' or one of its steps {_step_names(path)}, or give the workdir {path.parent} "
                f"to choose {checkpoint!r}"
            )
        return path, step
    if path.name.isdigit() and path.parent.name in kind_names:
        if checkpoint != "latest":
            # Even the same step: one step's directory leaves nothing to choose, so a choice is a mistake.
            raise CheckpointError(
                f"{path} is the directory of step {path.name}, so checkpoint {checkpoint!r} has nothing to choose "
                f"from: keep 'latest', or give its folder {path.parent} to choose among {_step_names(path.parent)}"
            )
        return path.parent, int(path.name)
    raise CheckpointError(
        f"{path} is not a jaxformer workdir (no {'/, '.join(sorted(kind_names))}/ in it), nor one of those "
        "directories, nor a step directory in one"
    )


def _not_a_workdir(path: pathlib.Path) -> str:
    """Why `path` holds no checkpoint to load: it is an export (then the run it was exported from),
    one of a workdir's folders, or a step in one (then which workdir and choice to give instead),
    or no run at all."""
    if not path.exists():
        return f"{path} does not exist"
    instead = given_instead_of_a_run(path)
    if instead is not None:
        return instead
    names = "/, ".join(sorted(RunDirectory(path).checkpoint_directory(kind).name for kind in CHECKPOINT_KINDS))
    return f"{path} is not a jaxformer workdir (no {names}/ in it): give a training run's --workdir"


def _step_names(directory: pathlib.Path) -> list[int]:
    """The steps of a folder of step directories, for messages."""
    return sorted(int(entry.name) for entry in directory.iterdir() if entry.name.isdigit() and entry.is_dir())
