"""A fine-tuning sweep's starts (`training.init_from`, or a translator's encoder and decoder
starts), checked for every variant before the first trains: the start is there and readable,
each variant's model section fits it, and the runs already there started from the checkpoint it
names now, holding the parameters it held then. A run makes the same checks before it reads any
data, but in a sweep that is when its variant's turn comes, after the variants before it have trained (and
with --baseline_steps, after its pace was measured and written)."""

from __future__ import annotations

import json
import pathlib
from collections.abc import Callable, Sequence

from jaxformer.errors import UserError
from jaxformer.run.metadata import CheckpointMetadata
from jaxformer.training.init_from import (
    PARTS,
    StartingPoint,
    check_starting_points,
    load_starting_points,
    started_from,
    started_from_params,
)
from jaxformer.training.sweep import Variant, seed_run_name


def start_problems(
    variants: Sequence[Variant],
    workdir: pathlib.Path,
    seeds: int,
    saved_state: Callable[[pathlib.Path], tuple[str | None, CheckpointMetadata | None]],
) -> list[str]:
    """One line per variant whose runs would start from a checkpoint (none yet in their folders:
    `saved_state(run_dir)` (state, metadata) is (None, None)) that is missing, unreadable or of
    another model section than the variant's; and one per run of a variant, finished or stopped,
    that started from another checkpoint than its start names now (a run trained on since, a
    new best/), or from the one it names while it held other parameters (its run trained again in
    its workdir, a step saved again), which its variant's other runs would not compare with. A run
    recorded without that identity (before it was kept), or a start saved without checksums, is
    compared by path and step alone, as before. Each start's metadata is read once (no parameters)."""
    loaded: dict[str, tuple[StartingPoint, ...] | UserError] = {}

    def points(training) -> tuple[StartingPoint, ...] | UserError:
        which = json.dumps([training.get(key) for key in PARTS.values()] + [str(training.init_checkpoint)])
        if which not in loaded:
            try:
                loaded[which] = load_starting_points(training, params=False)
            except UserError as error:
                loaded[which] = error
        return loaded[which]

    problems = []
    for variant in variants:
        training = variant.config.training
        if all(training.get(key) is None for key in PARTS.values()):
            continue
        runs = [workdir / seed_run_name(variant, offset) for offset in range(seeds)]
        states = [(run_dir, *saved_state(run_dir)) for run_dir in runs]
        if any(state is None for _, state, _ in states):  # a run that starts now: its start must fit
            try:
                now = points(training)
                if isinstance(now, UserError):
                    raise now
                check_starting_points(now, variant.config)
            except UserError as error:
                problems.append(f"variant {variant.name!r}: {error}")
                continue
        for run_dir, state, metadata in states:
            if state is None or metadata.started_from is None:  # none recorded: from before the record
                continue
            now = points(training)
            named = None if isinstance(now, UserError) else started_from(now)
            if named is None:  # a start gone since needs no check
                continue
            remedy = f"restore that start, sweep in a new --workdir, or remove {run_dir} to train it again"
            if named != metadata.started_from:
                problems.append(
                    f"variant {variant.name!r} {state} in {run_dir} started from {metadata.started_from}, and the "
                    f"sweep's runs would start from {named} now: they would not compare; {remedy}"
                )
            elif replaced := other_parameters(metadata.started_from_params, started_from_params(now)):
                problems.append(
                    f"variant {variant.name!r} {state} in {run_dir} started from {metadata.started_from}, which "
                    f"holds other parameters now ({replaced}): another run was saved there since; they would not "
                    f"compare; {remedy}"
                )
    return problems


def other_parameters(recorded: dict[str, str] | None, now: dict[str, str] | None) -> str:
    """ "training.init_from: parameters 1a2b... then, 3c4d... now" for each start whose identity
    `recorded` (a run's started_from_params) differs from the one its checkpoint holds `now`; ""
    where they agree, or where either is unknown (a run recorded before the identity was, a
    start saved without checksums): only its path and step are compared then, as before."""
    recorded, now = recorded or {}, now or {}
    return "; ".join(
        f"{key}: parameters {recorded[key]} then, {now[key]} now"
        for key in recorded
        if key in now and recorded[key] != now[key]
    )
