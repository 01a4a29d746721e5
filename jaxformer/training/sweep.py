"""A sweep: one experiment config trained once per variant, each variant with some keys changed,
one run after another, each in its own workdir, compared on validation BLEU only.

A sweep file is a Python file whose `get_sweep()` returns {variant name: [override, ...]}, each
override written as after `--config.` on the command line ("model.dropout_rate=0.3"); a variant
with no overrides is the config as it is. Every variant is built and validated (one that changes only
what the final choice reads after training is refused: sweep_after_training.py), and every run
already in the workdir checked against what the sweep gives it now (sweep_checks.py), before the
first run starts. Each run ends with the final choice (training.final_choice must be on), whose
validation BLEU (beam search with the `decoding` settings, on the validation split) is the
variant's score; no test set is read. A variant whose workdir already holds that choice is not
trained again, so running the same sweep again resumes it where it stopped.

By default each variant trains with the config's own budget (a wall-clock one for `multi30k`), so
the rows depend on the machine's speed while each ran. With `baseline_steps` the config as it is
(with the sweep's shared overrides: the reference) gets that many steps instead, and each variant
as many more or fewer as it trains faster or slower than the reference, measured side by side
before it trains (pace.py) and kept in WORKDIR/pace/<variant>.json for its resumes (sweep_pace.py):
the same compute on a fast, a slow or a busy machine.

One hour run's final choice moves by most of a BLEU point with the seed alone (README: Results),
so a variant can be trained with several seeds (`seeds`): seed k moves training.seed and
data.shuffle_seed (the initialisation, dropout and the batches' order) by k and trains in
WORKDIR/<variant>@seed<k> (k = 0 in WORKDIR/<variant>, so a one-seed sweep's runs are reused), and
the variant's score is the mean of its seeds' final choices.

A SIGTERM or Ctrl-C stops the sweep wherever it comes: during a run's training loop the run saves
a checkpoint and stops (signals.py); anywhere else (a run setting up, a pace being measured) it
raises `Stopped` and the run's own cleanup (its lock) happens on the way out.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import pathlib
from collections.abc import Callable, Sequence
from typing import Any

import ml_collections

from jaxformer.errors import UserError
from jaxformer.model.config import ConfigError
from jaxformer.training import experiment, text_sides
from jaxformer.training.config_file import apply_overrides, load_config, refuse_repeated_keys
from jaxformer.training.signals import RaiseOnSignal, Stopped
from jaxformer.training.sweep_after_training import refuse_after_training_only, refuse_unused_only
from jaxformer.training.sweep_pace import pace_file, stored_pace, variant_pace
from jaxformer.training.sweep_rows import finished_result, result_row, seeds_row
from jaxformer.training.sweep_validation import check_seeds_share_validation, refuse_other_validation_pairs

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Variant:
    name: str
    overrides: tuple[tuple[str, str], ...]  # the variant's own (dotted key, value text), in order
    config: ml_collections.ConfigDict

    def changes(self) -> str:
        return ", ".join(f"{key}={text}" for key, text in self.overrides) or "(the config as it is)"

    def bracketed(self) -> str:  # "(the config as it is)" has its parentheses already
        return f"({self.changes()})" if self.overrides else self.changes()


def reference_config(config_name: str, shared: Sequence[tuple[str, str]] = ()) -> ml_collections.ConfigDict:
    """The config with the sweep's shared overrides only: what `baseline_steps` counts steps of."""
    config = load_config(config_name)
    apply_overrides(config, list(shared))
    experiment.validate(config)
    return config


def make_variants(
    config_name: str, sweep: dict[str, Sequence[str]], shared: Sequence[tuple[str, str]] = ()
) -> list[Variant]:
    """Each variant's config: the base config with the `shared` (key, text) overrides, then the
    variant's own, applied and every value validated."""
    variants = []
    reference_settings = reference_config(config_name, shared)
    reference = reference_settings.to_dict()
    for name, overrides in sweep.items():
        pairs = []
        for item in overrides:
            key, equals, text = item.partition("=")
            if not equals or not key.strip():
                raise ConfigError(f"variant {name!r}: override {item!r} is not KEY=VALUE (e.g. model.dropout_rate=0.3)")
            pairs.append((key.strip().removeprefix("--config."), text))
        config = load_config(config_name)
        try:
            refuse_repeated_keys(pairs)  # a variant may override a shared flag, not itself
            # One call, so model.preset comes first whichever gives it. The shared overrides passed
            # reference_config's checks: a refusal here is of the variant's, quoted as its file writes them.
            apply_overrides(config, [*shared, *pairs], written_as="")
            experiment.validate(config)
        except ConfigError as error:
            raise ConfigError(f"variant {name!r}: {error}") from None
        if text_sides.architecture(config) != "encoder_decoder":  # final_choice=True, the hint below, is refused there
            raise ConfigError(
                f"variant {name!r}: model.architecture={text_sides.architecture(config)!r}: a sweep compares "
                "translators (model.architecture='encoder_decoder') by their validation BLEU, and a language "
                "model translates nothing"
            )
        if not config.training.final_choice:
            raise ConfigError(
                f"variant {name!r}: training.final_choice is False; a sweep compares the final choice's "
                "validation BLEU (set --config.training.final_choice=True or use a config that does)"
            )
        refuse_other_validation_pairs(name, config.to_dict(), reference)
        if pairs and config.to_dict() == reference:
            given = [f"--config.{key}={text}" for key, text in shared if key in dict(pairs)]  # not the config's own
            with_given = f" with the command's {', '.join(given)}" if given else ""
            raise ConfigError(
                f"variant {name!r}: {', '.join(overrides)} changes nothing in {config_name!r}{with_given} (its "
                "values already): training it would repeat the config as it is"
            )
        refuse_after_training_only(name, overrides, config.to_dict(), reference)
        refuse_unused_only(name, overrides, config, reference_settings)
        variant = Variant(name, tuple(pairs), config)
        same = next((other for other in variants if other.config.to_dict() == config.to_dict()), None)
        if same is not None:
            raise ConfigError(
                f"variants {same.name!r} {same.bracketed()} and {name!r} {variant.bracketed()} give the same config: "
                "the sweep would train it twice; keep one"
            )
        variants.append(variant)
    return variants


SEED_SUFFIX = "@seed"  # '@' is not in VARIANT_NAME, so no variant's folder ends like another's seed


def seed_run_name(variant: Variant, seed_offset: int) -> str:
    return variant.name if seed_offset == 0 else f"{variant.name}{SEED_SUFFIX}{seed_offset}"


def with_seed_offset(config: ml_collections.ConfigDict, seed_offset: int) -> ml_collections.ConfigDict:
    """`config` with training.seed and data.shuffle_seed moved by `seed_offset`."""
    if seed_offset == 0:
        return config
    config = copy.deepcopy(config)
    config.training.seed += seed_offset
    config.data.shuffle_seed += seed_offset
    return config


def run_config(variant: Variant, seed_offset: int, pace: dict[str, Any] | None) -> ml_collections.ConfigDict:
    """The config one seed of `variant` trains with: its seed offset, and its steps under a pace
    (a value that contradicts that step budget is a ConfigError naming the variant)."""
    config = with_seed_offset(variant.config, seed_offset)
    if pace is None:
        return config
    try:
        return with_steps(config, pace["steps"])
    except ConfigError as error:
        raise ConfigError(f"variant {variant.name!r} at {pace['steps']} steps: {error}") from None


def with_steps(config: ml_collections.ConfigDict, steps: int) -> ml_collections.ConfigDict:
    """`config` trained for `steps` steps instead of its wall-clock budget (the budget schedule,
    when used, ends there)."""
    config = copy.deepcopy(config)
    config.training.time_budget_minutes = 0.0
    config.training.num_train_steps = steps
    experiment.validate(config)
    return config


STEP_KEYS = ("training.num_train_steps", "training.time_budget_minutes")  # what --baseline_steps sets


def check_step_budget(variants: Sequence[Variant], baseline_steps: int, shared: Sequence[tuple[str, str]] = ()) -> None:
    """Each variant's config at `baseline_steps` steps, validated before the first trains (a
    ConfigError naming the variant): a variant's own steps are that times its measured speed,
    known only when its turn comes, and a value that contradicts a step budget (a warmup as long
    as the run) would otherwise stop the sweep after the variants before it had trained. A step
    count or time budget given by a variant or by the command line (`shared`) is refused: the
    step budget would replace it unseen."""
    replaced = "--baseline_steps sets each variant's steps (its speed relative to the config's, times"
    for key, text in shared:
        if key in STEP_KEYS:
            raise ConfigError(
                f"--config.{key}={text} with --baseline_steps {baseline_steps}: {replaced} {baseline_steps}); "
                "drop one of the two"
            )
    for variant in variants:
        for key, text in variant.overrides:
            if key in STEP_KEYS:
                raise ConfigError(
                    f"variant {variant.name!r}: {key}={text} with --baseline_steps {baseline_steps}: {replaced} "
                    f"{baseline_steps}); drop it from the sweep file, or run without --baseline_steps"
                )
        run_config(variant, 0, {"steps": baseline_steps})


def run_sweep(
    variants: Sequence[Variant],
    workdir: str | pathlib.Path,
    *,
    baseline_steps: int | None = None,
    reference: ml_collections.ConfigDict | None = None,
    seeds: int = 1,
    rows: list[dict[str, Any]] | None = None,
    kept_rows: Sequence[dict[str, Any]] = (),
    on_row: Callable[[], None] = lambda: None,
) -> tuple[list[dict[str, Any]], int | None]:
    """Trains each variant not yet finished in workdir/<name> (and, with `seeds` > 1, its other
    seeds in workdir/<name>@seed<k>), in order; (the rows of the finished variants, the signal that
    stopped the sweep, or None). Each row is appended to `rows` (when given) as its variant
    finishes, so a caller keeps them when a later variant fails, and `on_row` called then (the
    caller writes them: a sweep killed outright later loses no finished variant's row). With
    `baseline_steps`, each variant trains that many steps times its speed relative to `reference`
    (see the module's doc).
    `kept_rows`: the earlier rows of variants not in `variants` that the caller's table keeps,
    checked (with the runs) to compare with theirs before anything trains."""
    if (baseline_steps is None) != (reference is None):
        raise ValueError("baseline_steps and reference go together")
    if seeds < 1:
        raise ConfigError(f"seeds={seeds}: a sweep trains each variant with at least one seed")
    from jaxformer.training.sweep_checks import check_existing_runs  # it builds on this module

    workdir = pathlib.Path(workdir)
    if variants:
        check_seeds_share_validation(variants[0].config, seeds)
    if baseline_steps is not None:
        check_step_budget(variants, baseline_steps)
    check_existing_runs(variants, workdir, baseline_steps, seeds, kept_rows)  # before anything trains: all of them
    rows = [] if rows is None else rows
    # A run puts its own handlers in (its preparation, its steps, the final choice) and returns
    # "stopped_by_signal"; this one covers the rest (a pace measured, the sweep's own work), where
    # the default handler would end the process without a table.
    with RaiseOnSignal() as signals:
        try:
            for index, variant in enumerate(variants, 1):
                signals.check()  # one that a garbage-collection callback swallowed stops here at the latest
                seed_rows, stopped_by = _train_variant(
                    variant, index, len(variants), workdir, baseline_steps, reference, seeds, signals.check
                )
                if stopped_by is not None:
                    if len(seed_rows) == seeds:  # the signal came as its last run completed: the variant is done
                        rows.append(seeds_row(seed_rows))
                    return rows, stopped_by
                rows.append(seeds_row(seed_rows))
                on_row()
            signals.check()
        except Stopped as stop:
            logger.warning("sweep: %s received outside a training loop: stopping", stop)
            return rows, stop.signum
    return rows, None


def _train_variant(
    variant: Variant,
    index: int,
    count: int,
    workdir: pathlib.Path,
    baseline_steps: int | None,
    reference: ml_collections.ConfigDict | None,
    seeds: int,
    check_signals: Callable[[], None],
) -> tuple[list[dict[str, Any]], int | None]:
    """(the rows of the variant's seeds, each trained unless finished; the signal that stopped
    one of its runs, or came as one completed, or None). `check_signals` raises `Stopped` for a
    signal the sweep holds (one that came while JAX measured the pace), before a run starts."""
    from jaxformer.training.loop import train_and_evaluate
    from jaxformer.training.sweep_checks import release_killed_runs_lock  # it builds on this module

    pace = None
    if baseline_steps is not None:
        path = pace_file(workdir, variant)
        pace = variant_pace(variant, reference, baseline_steps, path, stored_pace(path), check_signals)
    seed_rows = []
    for seed_offset in range(seeds):
        run_dir = workdir / seed_run_name(variant, seed_offset)
        config = run_config(variant, seed_offset, pace)
        seed = f" (seed +{seed_offset})" if seeds > 1 else ""
        last = finished_result(run_dir)  # one that does not fit the sweep was refused before anything trained
        check_signals()
        if last is None:
            logger.info("sweep: variant %d of %d, %s%s: %s", index, count, variant.name, seed, variant.changes())
            if pace is not None:
                logger.info(
                    "sweep: %s trains %d steps: %.3fx the reference's speed, times --baseline_steps %d",
                    *(variant.name, pace["steps"], pace["speed"], baseline_steps),
                )
            try:
                last = train_and_evaluate(config, str(run_dir))
            except UserError as error:  # one found only now, in its data (a vocabulary the corpus cannot fill)
                raise UserError(f"variant {variant.name!r}{seed}: {error}") from error
            if last.get("stopped_by_signal"):
                return seed_rows, last["stopped_by_signal"]
            # The run is complete, and the signal (as its final choice ended) stops the sweep all the same.
            late_signal = last.get("signal_once_complete")
            last = finished_result(run_dir)
            if late_signal:
                seed_rows.append(result_row(variant, last, config, pace))
                logger.warning(
                    "sweep: stopping after %s%s, which was complete when the signal came", variant.name, seed
                )
                return seed_rows, late_signal
        else:
            logger.info("sweep: variant %s already finished in %s", variant.name, run_dir)
            release_killed_runs_lock(run_dir, f"variant {variant.name!r}{seed}")
        seed_rows.append(result_row(variant, last, config, pace))
    return seed_rows, None
