"""A sweep's existing runs, checked against what the sweep would give them before anything trains.

A run in the sweep's workdir, finished or stopped with a checkpoint (which the sweep would
resume), counts for its variant only if it was trained with the config, the step budget and the
data files the sweep gives it now. Every run of every variant is checked before the first one
trains, and every problem is named in one error: a refusal that came when its variant's turn came
would follow hours of training of the variants before it, and fixing it would not tell whether a
later variant would be refused next.
"""

from __future__ import annotations

import json
import logging
import pathlib
from collections.abc import Sequence
from typing import Any

import jax
import ml_collections

from jaxformer.errors import CheckpointError, UserError
from jaxformer.model.config import ConfigError
from jaxformer.run.directory import RunDirectory, SweepDirectory
from jaxformer.run.lock import WorkdirLock
from jaxformer.run.metadata import CheckpointMetadata
from jaxformer.training import experiment, resume_rules
from jaxformer.training.config_paths import with_absolute_paths
from jaxformer.training.sweep import Variant, run_config, seed_run_name
from jaxformer.training.sweep_pace import pace_file, stored_pace
from jaxformer.training.sweep_rows import finished_result
from jaxformer.training.sweep_starts import start_problems
from jaxformer.training.sweep_validation import recorded_config, validation_differences

logger = logging.getLogger(__name__)


def check_seed_runs(variants: Sequence[Variant], seeds: int) -> None:
    """Every seed of every variant validated, and no two of the sweep's runs given one config,
    before the first trains: seed k moves training.seed and data.shuffle_seed by k, which may take
    them past their range (refused when that seed's turn came, after the runs before it had
    trained), or give a variant that sets the seeds another variant's seed (trained twice)."""
    runs: list[tuple[str, dict[str, Any]]] = []
    for variant in variants:
        for seed_offset in range(seeds):
            name = seed_run_name(variant, seed_offset)
            try:
                config = run_config(variant, seed_offset, None)
                experiment.validate(config)
            except ConfigError as error:
                moved = f"--seeds {seeds} moves training.seed and data.shuffle_seed by {seed_offset}"
                raise ConfigError(f"run {name!r} ({moved}): {error}") from None
            same = next((other for other, values in runs if values == config.to_dict()), None)
            if same is not None:
                raise ConfigError(
                    f"runs {same!r} and {name!r} give the same config (--seeds {seeds} moves training.seed and "
                    "data.shuffle_seed by k for seed k): the sweep would train it twice; change one variant's seeds"
                )
            runs.append((name, config.to_dict()))


def check_existing_runs(
    variants: Sequence[Variant],
    workdir: pathlib.Path,
    baseline_steps: int | None,
    seeds: int,
    kept_rows: Sequence[dict[str, Any]] = (),
) -> None:
    """A ConfigError naming every run (or pace record) in `workdir` that does not fit the sweep
    as configured now: its config, its step budget (--baseline_steps and the pace kept for it) or
    the data files it was trained on; and every row of `kept_rows` (sweep.jsonl's rows of variants
    that `variants` leave out, which the table keeps) that would not compare with the variants'.
    A kept row whose validation pairs nothing tells (`unchecked_rows`) is named in a warning."""
    fingerprints = DataFingerprints()
    problems = [
        problem for variant in variants for problem in _problems(variant, workdir, baseline_steps, seeds, fingerprints)
    ]
    problems += [problem for variant in variants for problem in _output_path_problems(variant, workdir, seeds)]
    problems += start_problems(variants, workdir, seeds, _saved_state)
    if variants:
        reference = with_absolute_paths(variants[0].config).to_dict()  # all agree on its pairs
        problems += [
            problem for row in kept_rows for problem in _kept_row_problems(row, workdir, baseline_steps, reference)
        ]
    if len(problems) == 1:
        raise ConfigError(problems[0])
    if problems:
        numbered = "; ".join(f"({number}) {problem}" for number, problem in enumerate(problems, 1))
        raise ConfigError(f"{len(problems)} problems with the runs in {workdir}, found before training any: {numbered}")
    unchecked = unchecked_rows(kept_rows, workdir) if variants else []
    if unchecked:
        logger.warning(
            "sweep: cannot check that the rows of %s, kept from an earlier invocation, were scored on this sweep's "
            "validation pairs: an older jaxformer wrote them without recording those, and their runs' checkpoints "
            "are gone or unreadable; ranked unchecked (marked so in %s)",
            ", ".join(unchecked),
            SweepDirectory(workdir).table_file.name,
        )


def unchecked_rows(kept_rows: Sequence[dict[str, Any]], workdir: pathlib.Path) -> list[str]:
    """The variants of the `kept_rows` whose validation pairs nothing tells (`_scored_with`)."""
    return [row["variant"] for row in kept_rows if _scored_with(row, workdir) is None]


def _scored_with(row: dict[str, Any], workdir: pathlib.Path) -> dict[str, Any] | None:
    """The config (as a dict) that says which validation pairs a kept row was scored on: the
    row's own record of it, or, in a row an older jaxformer wrote without one, its run's latest
    checkpoint's config while the run is there; None when neither is there."""
    if row.get("validation") is not None:
        return recorded_config(row["validation"])
    run_dir = workdir / row["variant"]
    if not RunDirectory(run_dir).checkpoints.is_dir():
        return None
    from jaxformer.run.loading import load_checkpoint

    try:
        _, metadata, _ = load_checkpoint(run_dir, "latest", params=False)
    except CheckpointError:
        return None
    return metadata.config


def _problems(
    variant: Variant,
    workdir: pathlib.Path,
    baseline_steps: int | None,
    seeds: int,
    fingerprints: DataFingerprints,
) -> list[str]:
    """What keeps `variant`'s pace record or its runs (one a seed) from counting for it now."""
    path = pace_file(workdir, variant)
    stored = stored_pace(path)
    run_dirs = [workdir / seed_run_name(variant, seed_offset) for seed_offset in range(seeds)]
    # Else found as the variant's turn comes (its folder made, its pace written once measured), after
    # the variants before it trained.
    taken = [(run_dir, "where it trains", "a folder") for run_dir in run_dirs if _taken(run_dir, folder=True)]
    if baseline_steps is not None and _taken(path.parent, folder=True):
        taken.append((path.parent, "where the sweep keeps the paces", "a folder"))
    elif baseline_steps is not None and _taken(path, folder=False):
        taken.append((path, "where its pace is kept", "a file"))
    if taken:
        return [
            f"variant {variant.name!r}: {place}, {purpose}, is not {kind}: move it away"
            for place, purpose, kind in taken
        ]
    if baseline_steps is None and stored is not None:
        return [
            f"variant {variant.name!r} in {workdir} trains for a step budget ({path}): "
            f"run with --baseline_steps {stored['baseline_steps']}"
        ]
    if baseline_steps is not None and stored is not None and stored["baseline_steps"] != baseline_steps:
        return [
            f"variant {variant.name!r} was given its steps for --baseline_steps {stored['baseline_steps']} "
            f"({path}), not {baseline_steps}: run with {stored['baseline_steps']} or in a new --workdir"
        ]
    if (
        baseline_steps is not None
        and stored is not None
        and stored.get("changes", variant.changes()) != variant.changes()
    ):
        return [
            f"variant {variant.name!r}: its pace record, {path}, was measured for {stored['changes']}, not for "
            f"{variant.changes()} as the sweep gives it now: remove it (and the variant's runs, if any) to measure "
            "its pace again, or sweep in a new --workdir"
        ]
    # Absent from a record written before it was kept. Other --config values given to the command change
    # the reference's speed too.
    measured_for = [] if "config" not in (stored or {}) else config_differences(stored["config"], variant.config)
    if baseline_steps is not None and measured_for:
        return [
            f"variant {variant.name!r}: its pace record, {path}, was measured for another configuration than the "
            f"sweep gives it now: {'; '.join(measured_for)}; remove it (and the variant's runs, if any) to measure "
            "its pace again, or sweep in a new --workdir"
        ]
    if baseline_steps is not None and stored is None:
        # A variant's pace is kept before its first run trains: a run without one had the config's own budget.
        return [
            f"variant {variant.name!r} {state} in {run_dir} with the config's own budget, not a --baseline_steps "
            "one: run without --baseline_steps or in a new --workdir"
            for run_dir in run_dirs
            if (state := _saved_state(run_dir)[0]) is not None
        ]
    problems = []
    for seed_offset, run_dir in enumerate(run_dirs):
        config = run_config(variant, seed_offset, stored)
        problems += run_problems(run_dir, variant, config, fingerprints)
    return problems


def _output_path_problems(variant: Variant, workdir: pathlib.Path, seeds: int) -> list[str]:
    """What lies where a run of `variant` that trains would write (a file at its tensorboard/, a
    folder at its metrics or tokenizer files...), refused by the checks its start makes
    (run_start.check_output_paths, check_tokenizer_paths), which would meet it only as its turn came."""
    from jaxformer.training.run_start import check_output_paths, check_tokenizer_paths

    problems = []
    for seed_offset in range(seeds):
        run = RunDirectory(workdir / seed_run_name(variant, seed_offset))
        if _taken(run.path, folder=True) or finished_result(run.path) is not None:  # named; not trained again
            continue
        config = run_config(variant, seed_offset, None)  # its steps write nothing elsewhere
        try:
            check_output_paths(config, run)
            # A stopped run's folder there too, which it names only as it resumes: moved away, the
            # checkpoint restores the file.
            check_tokenizer_paths(config, run, resuming=False)
        except UserError as error:
            problems.append(f"variant {variant.name!r}: {error}")
    return problems


def _taken(place: pathlib.Path, folder: bool) -> bool:
    """Whether something lies at `place` that is not a folder (`folder`), or not a file: a link to
    nothing included."""
    if not (place.exists() or place.is_symlink()):
        return False
    return not (place.is_dir() if folder else place.is_file())


def _kept_row_problems(
    row: dict[str, Any], workdir: pathlib.Path, baseline_steps: int | None, reference: dict[str, Any]
) -> list[str]:
    """What keeps the row of a variant the sweep file leaves out from comparing with the rows of
    this sweep's: another kind of budget (its row's speed, its pace record) or another N, or other
    validation pairs (its row's record of them, or its run's checkpoint's config: `_scored_with`)."""
    name, rows_file = row["variant"], SweepDirectory(workdir).rows_file
    path = SweepDirectory(workdir).pace_dir / f"{name}.json"
    stored = stored_pace(path)
    paced = stored is not None or row.get("speed") is not None
    kept = f"variant {name!r}, whose row {rows_file} keeps from an earlier invocation,"
    remedy = f"remove its row from {rows_file.name}, or sweep in a new --workdir"
    if baseline_steps is None and paced:
        if stored is None:
            return [f"{kept} trained for a step budget (its row has a speed): run with --baseline_steps, or {remedy}"]
        return [
            f"{kept} trained for a step budget ({path}): run with --baseline_steps {stored['baseline_steps']}, "
            f"or {remedy}"
        ]
    if baseline_steps is not None and not paced:
        return [
            f"{kept} trained with the config's own budget, not a --baseline_steps one: run without "
            f"--baseline_steps, or {remedy}"
        ]
    if baseline_steps is not None and stored is None:
        return [
            f"{kept} trained for a step budget whose pace record, {path}, is gone: its N cannot be checked "
            f"against --baseline_steps {baseline_steps}; {remedy}"
        ]
    if baseline_steps is not None and stored["baseline_steps"] != baseline_steps:
        earlier = stored["baseline_steps"]
        return [f"{kept} was given its steps for --baseline_steps {earlier}, not {baseline_steps}: {remedy}"]
    scored_with = _scored_with(row, workdir)
    if scored_with is None:  # named by check_existing_runs's warning, and in the table
        return []
    differences = validation_differences(scored_with, reference, ignored=resume_rules.PLACEMENT_KEYS)
    if not differences:
        return []
    return [
        f"{kept} was scored on other validation pairs than this sweep's variants ({'; '.join(differences)}), so "
        f"its BLEU would not compare with theirs: {remedy}"
    ]


def _saved_state(run_dir: pathlib.Path) -> tuple[str | None, CheckpointMetadata | None]:
    """("finished" or "stopped at step N", its latest checkpoint's metadata), or (None, None) for
    a run that is not there or that training starts afresh (one stopped before its first readable
    checkpoint: only a checkpoint tells how a stopped run was configured; a damaged one is training's
    to name). A finished run's checkpoint must be readable."""
    from jaxformer.run.loading import load_checkpoint

    finished = finished_result(run_dir) is not None
    if not finished and not RunDirectory(run_dir).checkpoints.is_dir():
        return None, None
    try:
        step, metadata, _ = load_checkpoint(run_dir, "latest", params=False)
    except CheckpointError:
        if finished:
            raise
        return None, None
    return ("finished" if finished else f"stopped at step {step}"), metadata


def run_problems(
    run_dir: pathlib.Path,
    variant: Variant,
    config: ml_collections.ConfigDict,
    fingerprints: DataFingerprints | None = None,
) -> list[str]:
    """What keeps the run in `run_dir` from counting for `variant`, which the sweep would train
    with `config` now: every key that differs but resume_rules.PLACEMENT_KEYS (where the data is
    and how the work is spread), and the data files when they are other files than it was trained
    on. An edited sweep file or other command-line values would otherwise be reported with an
    earlier config's results, or with steps trained under it."""
    state, metadata = _saved_state(run_dir)
    if state is None:
        return []
    differences = config_differences(metadata.config, config)
    remedy = f"sweep in a new --workdir, or remove {run_dir} to train it again"
    problems = []
    if differences:
        problems.append(
            f"variant {variant.name!r} {state} in {run_dir} with another configuration than the sweep gives it "
            f"now: {'; '.join(differences)}; {remedy}"
        )
    fingerprints = DataFingerprints() if fingerprints is None else fingerprints
    now = fingerprints.of(config.data) if metadata.data_fingerprint is not None else None
    if now is not None and now != metadata.data_fingerprint:
        raw_dir = config.data.get("raw_dir")
        reads = f"data.raw_dir={raw_dir!r}" if raw_dir else f"data.name={config.data.name!r}"
        problems.append(
            f"variant {variant.name!r} {state} in {run_dir} was trained on other data files (fingerprint "
            f"{metadata.data_fingerprint}) than the sweep gives it now ({now}, {reads}); restore those files, "
            f"or {remedy}"
        )
    return problems


class DataFingerprints:
    """The fingerprint of the data files a `data` section reads, as training records it in each
    checkpoint: local files are hashed when their builder is made (a few MB, no data prepared),
    once per distinct section; None where it is known only once fetched (a download) or not kept
    (the tfds catalogue's datasets)."""

    def __init__(self):
        self._known: dict[str, str | None] = {}

    def of(self, data: ml_collections.ConfigDict) -> str | None:
        from jaxformer.data.sources import data_fingerprint, get_builder

        key = json.dumps(data.to_dict(), sort_keys=True, default=str)
        if key not in self._known:
            self._known[key] = data_fingerprint(get_builder(data))
        return self._known[key]


def config_differences(saved: dict[str, Any], config: ml_collections.ConfigDict) -> list[str]:
    """'key: saved -> now' for every key of `config` (paths made absolute) that differs from the
    `saved` config's but resume_rules.PLACEMENT_KEYS (where the data is and how the work is spread)."""
    config = with_absolute_paths(config)
    # A resumed run may change the learning rate's schedule or the evaluation's subset; a sweep's
    # run may not: its numbers come from the saved values, or its first steps did.
    return resume_rules.resume_differences(saved, config, sections=None) + [
        difference
        for difference in resume_rules.resume_differences(saved, config, free=True)
        if difference.split(":")[0] not in resume_rules.PLACEMENT_KEYS
    ]


def release_killed_runs_lock(run_dir: pathlib.Path, named: str) -> None:
    """A finished run's workdir lock left by a process killed outright as its run completed (kill -9
    after the last metrics were written) is taken over and released, with the lock's warning, not
    left behind for good; one a live process holds (a run training there now) is an error naming
    `named`, since that run is changing what the sweep would report."""
    if jax.process_index() != 0 or not RunDirectory(run_dir).lock_file.exists():
        return
    try:
        with WorkdirLock(run_dir):
            pass
    except UserError as error:
        raise UserError(f"{named}: {error}") from None
