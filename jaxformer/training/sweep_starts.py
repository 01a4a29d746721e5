"""A fine-tuning sweep's starts (`training.init_from`, or a translator's encoder and decoder
starts), checked for every variant before the first trains: the start is there and readable, and
each variant's model section fits it. A run makes the same checks before it reads any data, but
in a sweep that is when its variant's turn comes, after the variants before it have trained (and
with --baseline_steps, after its pace was measured and written)."""

from __future__ import annotations

import json
import pathlib
from collections.abc import Callable, Sequence

from jaxformer.errors import UserError
from jaxformer.training.init_from import PARTS, StartingPoint, check_starting_points, load_starting_points
from jaxformer.training.sweep import Variant, seed_run_name


def start_problems(
    variants: Sequence[Variant], workdir: pathlib.Path, seeds: int, trains_afresh: Callable[[pathlib.Path], bool]
) -> list[str]:
    """One line per variant whose runs would start from a checkpoint (none yet in their folders,
    `trains_afresh(run_dir)`) that is missing, unreadable or of another model section than the
    variant's. Each start's metadata is read once (no parameters)."""
    loaded: dict[str, tuple[StartingPoint, ...] | UserError] = {}
    problems = []
    for variant in variants:
        training = variant.config.training
        if all(training.get(key) is None for key in PARTS.values()):
            continue
        if not any(trains_afresh(workdir / seed_run_name(variant, offset)) for offset in range(seeds)):
            continue  # its runs resume or are finished: their starts were read when they began
        which = json.dumps([training.get(key) for key in PARTS.values()] + [str(training.init_checkpoint)])
        if which not in loaded:
            try:
                loaded[which] = load_starting_points(training, params=False)
            except UserError as error:
                loaded[which] = error
        try:
            if isinstance(loaded[which], UserError):
                raise loaded[which]
            check_starting_points(loaded[which], variant.config)
        except UserError as error:
            problems.append(f"variant {variant.name!r}: {error}")
    return problems
