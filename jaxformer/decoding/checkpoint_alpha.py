"""The length penalty a checkpoint is searched with. A run's final choice under beam search keeps
the alpha it was scored with in final/'s metadata: the best of training.final_alphas, or
decoding.alpha when it compared none. --checkpoint final is searched with it unless the caller
gives an alpha, and with the rest of the search the choice was made with (decoding.method,
beam_size, stop, max_extra_length, length_penalty, renormalize_after_bans) unless the caller gives
its own; another search than the one the choice was made with (decoding.method), a beam search of
a choice made with greedy search or greedy search of one made with beams, is named in a warning.
Decided here, for the commands (--alpha) and for the Python constructors
(`Translator.from_workdir`, `export_checkpoint`), so that both give the same translations of the
same checkpoint."""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable
from typing import Any

from jaxformer.decoding.generate import SEARCH_FIELDS, DecodeSettings
from jaxformer.errors import CheckpointError
from jaxformer.model.config import TransformerConfig
from jaxformer.run.loading import NEEDS_A_TRANSLATOR, load_checkpoint, require_architecture
from jaxformer.run.metadata import CheckpointMetadata

logger = logging.getLogger(__name__)

# How a Python caller gives its own alpha, in the log lines below (the commands name --alpha).
SETTINGS_ALPHA = "settings=DecodeSettings(alpha=...)"
SETTINGS_LENGTH_PENALTY = "settings=DecodeSettings(length_penalty=...)"
SETTINGS_RENORMALIZE = "settings=DecodeSettings(renormalize_after_bans=...)"
SETTINGS_SEARCH = "settings=DecodeSettings(...)"

# The settings of the search --checkpoint final takes from its final choice that `log_chosen_search`
# names; the length penalty's alpha, form and renormalisation have lines of their own.
_LOGGED_KEYS = ("method", "beam_size", "stop", "max_extra_length")

# The settings of a beam search that the chosen alpha depends on, besides the parameters: the
# search's but its method (named on its own) and the alpha itself.
_SEARCH_KEYS = tuple(key for key in SEARCH_FIELDS if key not in ("method", "alpha"))
# The DecodeSettings fields `settled_search` settles: each as the caller gives it, else --checkpoint
# final's (`chosen_defaults`), else DecodeSettings'.
SETTLED_FIELDS = ("method", *_SEARCH_KEYS)
SEARCH_NAMES = {"beam": "beam search", "greedy": "greedy search", "sample": "sampling"}  # decoding.method's
# The settings every search reads (the output length limit): a choice made with another search was
# made with them still.
EVERY_SEARCH_KEYS = ("max_extra_length",)


@dataclasses.dataclass(frozen=True)
class ChosenSearch:
    """What final/'s metadata says of the search the run's final choice was made with, read once
    for all that a command or constructor settles from it."""

    method: str  # decoding.method: "beam", or "greedy" or "sample", which read no length penalty
    alpha: float | None  # the one kept; None: a choice by greedy search or sampling, or a beam search's
    # from before final/ kept decoding.alpha where it compared none
    compared: bool  # whether the alpha was chosen among training.final_alphas; else it is decoding.alpha
    configured_alpha: float  # decoding.alpha: what a beam search that compared none scored the choice with
    length_penalty: str | None  # decoding.length_penalty; None: a run from before the key (gnmt)
    renormalize_after_bans: bool | None  # decoding.renormalize_after_bans; None: a run from before the key
    chosen_with: dict[str, Any]  # _SEARCH_KEYS' values; a key the run left to its default has DecodeSettings'


def chosen_search(
    workdir: str | os.PathLike,
    checkpoint: str | int,
    chosen: ChosenSearch | None = None,
    metadata: CheckpointMetadata | None = None,
) -> ChosenSearch | None:
    """`chosen` when the caller read it already; else, for `checkpoint` "final", what final/'s
    metadata (`metadata`, when the caller read it; else only the metadata is read, not the
    parameters) says of the search its choice was made with; else None: no other checkpoint keeps
    a search."""
    if chosen is not None or checkpoint != "final":
        return chosen
    if metadata is None:
        try:
            metadata = load_checkpoint(workdir, "final", params=False)[1]
        except CheckpointError:
            # A language model's run, which never has final/, is refused for its model instead.
            require_architecture(workdir, "final", "encoder_decoder", NEEDS_A_TRANSLATOR)
            raise
    saved = metadata.config.get("decoding", {})  # None: a key left to its default (a run from before it)
    chosen_with = {**vars(DecodeSettings()), **{key: value for key, value in saved.items() if value is not None}}
    return ChosenSearch(
        method=chosen_with["method"],
        alpha=metadata.alpha,
        compared=bool(metadata.config.get("training", {}).get("final_alphas")),
        configured_alpha=float(chosen_with["alpha"]),
        length_penalty=saved.get("length_penalty"),
        renormalize_after_bans=saved.get("renormalize_after_bans"),
        chosen_with={key: chosen_with[key] for key in _SEARCH_KEYS},
    )


def chosen_defaults(chosen: ChosenSearch | None, method: str | None = None) -> dict[str, Any]:
    """The DecodeSettings fields a search of `checkpoint` "final" takes from the run's final choice
    (`chosen`) where its caller gives none: its method, unless `method` is given, and every
    setting the choice was made with (`chosen_with`: beam size, length penalty's form, stop rule,
    renormalisation, max_extra_length; a beam search of a greedy choice takes the run's); a
    `method` "greedy" or "sample" given takes max_extra_length alone (EVERY_SEARCH_KEYS). {} for
    another checkpoint (`chosen` None): DecodeSettings' defaults. Its alpha is `checkpoint_alpha`'s."""
    if chosen is None:
        return {}
    if method in ("greedy", "sample"):  # beam search's settings they would not read
        return {key: chosen.chosen_with[key] for key in EVERY_SEARCH_KEYS}
    return {"method": method or chosen.method, **chosen.chosen_with}


def log_chosen_search(chosen: ChosenSearch | None, taken: dict[str, Any], method: str, as_flags: bool = False) -> None:
    """One line naming the search settings `taken` from final/ (`chosen_defaults`, less those the
    caller gave) other than the length penalty's, which lines of their own name: those the run's
    final choice was made with, or, searched with another `method` than its, the run's `decoding`
    section's still (but EVERY_SEARCH_KEYS alone, which the choice read). With how the caller
    gives its own: DecodeSettings, or the flags (`as_flags`)."""
    keys = [key for key in _LOGGED_KEYS if key in taken]
    if not keys:
        return
    named = ", ".join(f"{key} {taken[key]}" for key in keys)
    if as_flags:
        override = ", ".join(f"--{key}" for key in keys) + (" overrides it" if len(keys) == 1 else " override them")
    else:
        override = SETTINGS_SEARCH + " overrides them"
    if chosen.method == method or set(keys) <= set(EVERY_SEARCH_KEYS):
        them = "them" if len(keys) > 1 else "it"
        logger.info("%s: the run's final choice was made with %s (%s)", named, them, override)
    else:  # a beam search of a choice made greedily: the run's beam settings, which the choice read none of
        logger.info(
            "%s: the run's decoding settings; its final choice was made with %s (%s)",
            *(named, SEARCH_NAMES[chosen.method], override),
        )


def settled_search(chosen: ChosenSearch | None, given: dict[str, Any], as_flags: bool = False) -> dict[str, Any]:
    """SETTLED_FIELDS' values, for the commands' flags and for `checkpoint_settings` alike: each as
    `given` by the caller; else, for --checkpoint final (`chosen`), the one the run's final choice
    was made with (`chosen_defaults`, under `given`'s method when it names one), logged by
    `log_chosen_search`, `checkpoint_length_penalty` (under beam search: the others read none) and
    `checkpoint_renormalization`; else DecodeSettings'. `as_flags`: the caller gives its own with
    the commands' flags (--length_penalty), else with DecodeSettings, for those log lines."""
    taken = {key: value for key, value in chosen_defaults(chosen, given.get("method")).items() if key not in given}
    settled = {**{key: getattr(DecodeSettings, key) for key in SETTLED_FIELDS}, **taken, **given}
    log_chosen_search(chosen, taken, settled["method"], as_flags)
    if "length_penalty" in taken and settled["method"] == "beam":  # the others read none
        checkpoint_length_penalty(chosen, "--length_penalty" if as_flags else SETTINGS_LENGTH_PENALTY)
    if "renormalize_after_bans" in taken:
        checkpoint_renormalization(chosen, "--renormalize_after_bans" if as_flags else SETTINGS_RENORMALIZE)
    return settled


def checkpoint_alpha(
    chosen: ChosenSearch | None,
    search: DecodeSettings,
    given: float | None = None,
    override: str = SETTINGS_ALPHA,
) -> float:
    """`given` when not None; else the length penalty the run's final choice, made with beam search,
    kept with its parameters (`chosen`, for --checkpoint final: the best of training.final_alphas,
    or decoding.alpha when it compared none), logged, with a warning naming each setting of
    `search` (its beam_size, length_penalty, max_extra_length, stop, renormalize_after_bans; its
    alpha is not read) that differs from the search the choice was made with; else DecodeSettings'
    default (0.6): after a choice by greedy search or sampling, which read none
    (`checkpoint_settings` warns of that search), and on a final/ saved before it kept decoding.alpha
    (with a warning when the choice was scored with another). `override`: how the caller gives its
    own alpha, for those log lines."""
    if given is not None:
        return given
    if chosen is None or chosen.method != "beam":
        return DecodeSettings.alpha
    if chosen.alpha is None:  # as such a final/ was searched before: the default, said where it is not the choice's
        if chosen.configured_alpha != DecodeSettings.alpha:
            logger.warning(
                "length penalty alpha %g (final/ was saved before it kept the alpha of a choice that compared none): "
                "the run's final choice was scored with decoding.alpha %g, which %s gives",
                *(DecodeSettings.alpha, chosen.configured_alpha, override),
            )
        return DecodeSettings.alpha
    alpha = chosen.alpha
    if chosen.compared:
        logger.info("length penalty alpha %g: chosen on validation by the run (%s overrides it)", alpha, override)
    else:
        logger.info(
            "length penalty alpha %g: decoding.alpha, which the run's final choice was scored with (%s overrides it)",
            *(alpha, override),
        )
    differences = [
        f"{key} {chosen.chosen_with[key]} -> {getattr(search, key)}"
        for key in _SEARCH_KEYS
        if chosen.chosen_with[key] != getattr(search, key)
    ]
    if differences:
        kept = "alpha %g was chosen for" if chosen.compared else "the run's final choice was scored with alpha %g under"
        logger.warning(
            kept + " another search than this one (%s): give %s to choose it yourself",
            *(alpha, ", ".join(differences), override),
        )
    return alpha


def checkpoint_length_penalty(chosen: ChosenSearch | None, override: str = SETTINGS_LENGTH_PENALTY) -> str | None:
    """The length penalty's form the run's final choice compared its alphas with (`chosen`, for
    --checkpoint final: decoding.length_penalty in final/'s config; for a choice by greedy search
    or sampling, which read none, the run's form still), logged; else None (the caller's default,
    gnmt). `override`: how the caller gives its own form, for the log line."""
    form = None if chosen is None else chosen.length_penalty
    if form is not None and chosen.method == "beam":
        logger.info("length penalty %s: the run's final choice was made with it (%s overrides it)", form, override)
    elif form is not None:  # the run's form still, though its choice read none
        logger.info(
            "length penalty %s: the run's decoding.length_penalty; its final choice, made with %s, read none "
            "(%s overrides it)",
            *(form, SEARCH_NAMES[chosen.method], override),
        )
    return form


def checkpoint_renormalization(chosen: ChosenSearch | None, override: str = SETTINGS_RENORMALIZE) -> bool | None:
    """Whether the run's final choice was made with renormalised scores (`chosen`, for --checkpoint
    final: decoding.renormalize_after_bans in final/'s config), logged when it was; else None (the
    caller's default, False). `override`: how the caller gives its own, for the log line."""
    renormalized = None if chosen is None else chosen.renormalize_after_bans
    if renormalized:
        logger.info(
            "scores renormalized over the allowed tokens: the run's final choice was made so (%s overrides it)",
            override,
        )
    return renormalized


def _warn_if_chosen_with_another_method(chosen: ChosenSearch | None, search: DecodeSettings) -> None:
    """A warning when `search`, of --checkpoint final (`chosen`), is not the search the run's final
    choice was made with (decoding.method): its parameters were chosen with the other one, and
    nothing in final/ says how they fare with this one."""
    if chosen is not None and chosen.method != search.method:
        beam = f" (beam {search.beam_size})" if search.method == "beam" else ""
        logger.warning(
            "the run's final choice was made with %s, and this is %s%s: give --method %s "
            "(DecodeSettings(method=%r) from Python) to decode as it was chosen",
            *(SEARCH_NAMES[chosen.method], SEARCH_NAMES[search.method], beam, chosen.method, chosen.method),
        )


def checkpoint_search(
    workdir: str | os.PathLike,
    checkpoint: str | int,
    metadata: CheckpointMetadata,
    model_config: TransformerConfig,
    settings: DecodeSettings | None,
    chosen: ChosenSearch | None = None,
    settle_search: Callable[[ChosenSearch | None], DecodeSettings] | None = None,
    method: str | None = None,
) -> DecodeSettings:
    """The search `checkpoint` is translated with, settled from the one read of its `metadata`
    (`Translator.from_workdir`'s and `export_checkpoint`'s): `settings`, or with `settle_search`
    the search it makes of final/'s `chosen_search` (None on another checkpoint), as
    `checkpoint_settings` completes it (`method`: the caller's); a ConfigError where it does not
    fit `model_config` (a beam or top_k wider than the vocabulary)."""
    search, choice = settings, chosen
    if settle_search is not None:
        choice = chosen_search(workdir, checkpoint, chosen, metadata)
        search = settle_search(choice)
    search = checkpoint_settings(workdir, checkpoint, search, choice, metadata, method)
    search.check_fits(model_config)
    return search


def checkpoint_settings(
    workdir: str | os.PathLike,
    checkpoint: str | int,
    settings: DecodeSettings | None,
    chosen: ChosenSearch | None = None,
    metadata: CheckpointMetadata | None = None,
    method: str | None = None,
) -> DecodeSettings:
    """`settings` when given: their alpha is the caller's choice, even on "final" (logged when the
    run chose another there); else, on "final", the search the run's final choice was made with
    (`chosen_defaults`: its method, beam size, stop rule, max_extra_length, length penalty's form
    and renormalisation) with `checkpoint_alpha`'s alpha, as the commands search without --method,
    --beam_size, --stop, --max_extra_length, --alpha, --length_penalty and
    --renormalize_after_bans; on another checkpoint DecodeSettings(). `method`: the search the
    caller runs whatever final/ says (an export's beam search). Another search than the one the
    final choice was made with (a beam search of a choice made with greedy search, greedy search of
    one made with beams) is named in a warning. `chosen`: final/'s `chosen_search` when the caller
    read it already (the commands, for their flags), or `metadata` the checkpoint's (evaluate's):
    final/ is then not read again."""
    if settings is None:
        chosen = chosen_search(workdir, checkpoint, chosen, metadata)
        search = DecodeSettings(**settled_search(chosen, {"method": method} if method else {}))
        _warn_if_chosen_with_another_method(chosen, search)  # after the settled lines, as the commands warn
        return dataclasses.replace(search, alpha=checkpoint_alpha(chosen, search))
    if checkpoint == "final":  # the commands' greedy search and sampling read final/'s search here
        chosen = chosen_search(workdir, checkpoint, chosen, metadata)
        _warn_if_chosen_with_another_method(chosen, settings)
    # The other searches read no length penalty, and choose the same tokens renormalized or not.
    if checkpoint == "final" and settings.method == "beam":
        if chosen.alpha is not None and chosen.alpha != settings.alpha:
            kept = "the run chose %g on validation" if chosen.compared else "the run's final choice was scored with %g"
            logger.info("length penalty alpha %g as given (" + kept + ")", settings.alpha, chosen.alpha)
        if bool(chosen.renormalize_after_bans) != settings.renormalize_after_bans:
            logger.info(
                "renormalize_after_bans=%s as given (the run's final choice was made with %s)",
                settings.renormalize_after_bans,
                bool(chosen.renormalize_after_bans),
            )
    return settings
