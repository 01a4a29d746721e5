"""The progress bar the decoding commands draw on stderr (translate and evaluate through
`Translator`, generate through `LanguageModel`): one rule for when it shows, one look."""

from __future__ import annotations

import tqdm


def progress_bar(total: int, desc: str, unit: str, progress: bool) -> tqdm.tqdm:
    """A bar of `total` `unit`s named `desc`; with `progress`, drawn where stderr is a terminal
    (tqdm's disable=None): a redirected stderr gets the log lines, not the bar's redraws."""
    return tqdm.tqdm(total=total, desc=desc, unit=unit, disable=None if progress else True, dynamic_ncols=True)
