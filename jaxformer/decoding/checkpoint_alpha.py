"""The length penalty a checkpoint is searched with. A run's final choice compares
training.final_alphas and keeps the best one in final/'s metadata: --checkpoint final is searched
with it unless the caller gives an alpha. Decided here, for the commands (--alpha) and for the
Python constructors (`Translator.from_workdir`, `export_checkpoint`), so that both give the same
translations of the same checkpoint."""

from __future__ import annotations

import dataclasses
import logging
import os

from jaxformer.decoding.generate import DecodeSettings
from jaxformer.run.loading import load_checkpoint

logger = logging.getLogger(__name__)

# How a Python caller gives its own alpha, in the log lines below (the commands name --alpha).
SETTINGS_ALPHA = "settings=DecodeSettings(alpha=...)"
SETTINGS_LENGTH_PENALTY = "settings=DecodeSettings(length_penalty=...)"

# The settings of a beam search that the chosen alpha depends on, besides the parameters.
_SEARCH_KEYS = ("beam_size", "length_penalty", "max_extra_length", "stop")


def checkpoint_alpha(
    workdir: str | os.PathLike,
    checkpoint: str | int,
    search: DecodeSettings,
    given: float | None = None,
    override: str = SETTINGS_ALPHA,
) -> float:
    """`given` when not None; else, for `checkpoint` "final", the length penalty the run's final
    choice kept with those parameters (training.final_alphas), logged, with a warning naming each
    setting of `search` (its beam_size, length_penalty, max_extra_length, stop; its alpha is not
    read) that differs from the search the choice was made with; else DecodeSettings' default
    (0.6). `override`: how the caller gives its own alpha, for those log lines. Only final/'s
    metadata is read, not its parameters."""
    if given is not None:
        return given
    if checkpoint == "final":
        metadata = load_checkpoint(workdir, "final", params=False)[1]
        alpha = metadata.alpha
        if alpha is not None:
            logger.info("length penalty alpha %g: chosen on validation by the run (%s overrides it)", alpha, override)
            saved = metadata.config.get("decoding", {})  # None: a key left to its default (a run from before it)
            chosen_with = {
                **vars(DecodeSettings()),
                **{key: value for key, value in saved.items() if value is not None},
            }
            differences = [
                f"{key} {chosen_with[key]} -> {getattr(search, key)}"
                for key in _SEARCH_KEYS
                if chosen_with[key] != getattr(search, key)
            ]
            if differences:
                logger.warning(
                    "alpha %g was chosen for another search than this one (%s): give %s to choose it yourself",
                    *(alpha, ", ".join(differences), override),
                )
            return alpha
    return DecodeSettings.alpha


def checkpoint_length_penalty(
    workdir: str | os.PathLike, checkpoint: str | int, override: str = SETTINGS_LENGTH_PENALTY
) -> str | None:
    """For `checkpoint` "final", the length penalty's form the run's final choice compared its
    alphas with (decoding.length_penalty in final/'s config), logged; else None (the caller's
    default, gnmt). `override`: how the caller gives its own form, for the log line. Only
    final/'s metadata is read."""
    if checkpoint != "final":
        return None
    form = load_checkpoint(workdir, "final", params=False)[1].config.get("decoding", {}).get("length_penalty")
    if form is not None:
        logger.info("length penalty %s: the run's final choice was made with it (%s overrides it)", form, override)
    return form


def checkpoint_settings(
    workdir: str | os.PathLike, checkpoint: str | int, settings: DecodeSettings | None
) -> DecodeSettings:
    """`settings` when given: their alpha is the caller's choice, even on "final" (logged when the
    run chose another there); else DecodeSettings() with `checkpoint_alpha`'s alpha: on "final",
    the one the run chose, with the length penalty's form it chose it with, as the commands
    search without --alpha and --length_penalty."""
    if settings is None:
        form = checkpoint_length_penalty(workdir, checkpoint)
        search = DecodeSettings() if form is None else DecodeSettings(length_penalty=form)
        return dataclasses.replace(search, alpha=checkpoint_alpha(workdir, checkpoint, search))
    if checkpoint == "final" and settings.method == "beam":  # the other searches read no length penalty
        chosen = load_checkpoint(workdir, "final", params=False)[1].alpha
        if chosen is not None and chosen != settings.alpha:
            logger.info("length penalty alpha %g as given (the run chose %g on validation)", settings.alpha, chosen)
    return settings
