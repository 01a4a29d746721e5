"""When R-Drop starts (training.rdrop_start): the first part of a run trains without it.

An R-Drop step (training.rdrop_alpha, step.py) runs the batch twice. It costs about two plain
steps and, early in a run, learns less per second than they do. On a fast 2-core hour the plain
steps had validation NLL 1.75 at 17 minutes, where the R-Drop steps had 1.92. R-Drop overtook
the plain run only after 35 minutes, when the plain run had stopped improving (README: Results; docs/multi30k_runs.md).
So a run can train plain until it is `rdrop_start` of the way through, then switch to R-Drop.
Measured on that fast hour, 0.4 led at equal time until about 45 minutes, then ended behind R-Drop
from the first step (README: Results; docs/multi30k_runs.md), so `multi30k` keeps 0; a machine that buys far fewer steps
in the hour is where a later start may pay.

The run's progress is the larger of two fractions: the time budget spent
(training.time_budget_minutes) and the steps done out of training.num_train_steps. The run ends
when its progress reaches 1. R-Drop starts at the first step taken at progress >= rdrop_start,
and stays on. Resumed, the run finds its phase from the checkpoint's step and training seconds.

The time it is checked at is the reading that every process takes from process 0
(budget_check.check_budget), so all processes switch at the same step.

Whether R-Drop pays depends on the machine as much as on the corpus: it buys a better step at
about twice a plain step's cost, and a slow machine's hour ends before that pays back. On Multi30k,
over three kinds of 2-core VM, R-Drop from the first step against plain steps ended +0.95
validation BLEU where the hour bought 12,500 plain steps, level at 6,850, and behind at 4,360
(docs/multi30k_runs.md). So a time-budgeted run can decide by its own pace
(training.rdrop_min_plain_steps, `RDropByPace`): it trains plain to training.rdrop_decision_step,
estimates from the pace so far how many plain steps the budget buys, and from then on trains
with R-Drop only if that reaches rdrop_min_plain_steps; otherwise it stays plain to the end. The
decision is stored in every checkpoint's metadata (CheckpointMetadata.rdrop_by_pace), so a
resumed run keeps it instead of deciding again at another moment's pace.
"""

from __future__ import annotations

import dataclasses
import logging

import ml_collections

logger = logging.getLogger(__name__)

# What a step costs once R-Drop runs, over a plain step, until it is measured. The batch runs
# twice through the same program, so the cost doubles (1.9x measured on 2 CPU cores). The budget
# schedule's end is estimated with this factor until R-Drop starts, and from its measured pace after.
RDROP_STEP_COST = 2.0


@dataclasses.dataclass(frozen=True)
class RDropStart:
    """R-Drop starts at step `step` or at `seconds` of training, whichever comes first (None: no time budget)."""

    step: float
    seconds: float | None

    @classmethod
    def from_config(cls, training: ml_collections.ConfigDict) -> RDropStart | None:
        """None when every step is the same: no R-Drop, or R-Drop from the first step."""
        if not (training.rdrop_alpha > 0 and training.rdrop_start > 0):
            return None
        budget_seconds = training.time_budget_minutes * 60
        return cls(
            step=training.rdrop_start * training.num_train_steps,
            seconds=training.rdrop_start * budget_seconds if budget_seconds else None,
        )

    def started(self, step: int, seconds: float) -> bool:
        """Whether the step after `step` completed ones, taken at `seconds` of training, uses R-Drop."""
        return step >= self.step or (self.seconds is not None and seconds >= self.seconds)

    def plain_seconds_left(self, step: int, seconds: float, seconds_per_step: float) -> float:
        """The training seconds until R-Drop starts, at `seconds_per_step` for the plain steps."""
        by_steps = max(self.step - step, 0.0) * seconds_per_step
        by_time = float("inf") if self.seconds is None else max(self.seconds - seconds, 0.0)
        return min(by_steps, by_time)


@dataclasses.dataclass
class RDropByPace:
    """R-Drop only where the time budget buys at least `min_plain_steps` plain steps, decided at
    step `decision_step` (training.rdrop_min_plain_steps, training.rdrop_decision_step);
    `decision`: None until then, then whether the steps after it use R-Drop."""

    min_plain_steps: int
    decision_step: int
    decision: bool | None = None

    @classmethod
    def from_config(cls, training: ml_collections.ConfigDict, decision: bool | None) -> RDropByPace | None:
        """None unless the run has R-Drop, the rule and a time budget (under a step budget R-Drop
        runs as configured); `decision`: the one stored with the checkpoint the run resumes from."""
        if not (training.rdrop_alpha > 0 and training.rdrop_min_plain_steps > 0 and training.time_budget_minutes > 0):
            return None
        return cls(training.rdrop_min_plain_steps, training.rdrop_decision_step, decision)

    def due(self, step: int) -> bool:
        """Whether the budget check after `step` completed steps decides."""
        return self.decision is None and step >= self.decision_step

    def decide(self, plain_steps: float) -> bool:
        """Decides from `plain_steps`, the step at which the budget ends at the plain pace so far
        (the budget's end estimate, at most num_train_steps): whether R-Drop starts now."""
        self.decision = plain_steps >= self.min_plain_steps
        return self.decision


class RDropPhase:
    """Whether a run's steps use R-Drop: from the first step (or never), from a fraction of the run
    on (RDropStart), or from where the run's pace decides (RDropByPace). Made where a segment of
    the run starts, at `step` after `seconds` of training, resumed with the stored `decision`."""

    def __init__(self, training: ml_collections.ConfigDict, step: int, seconds: float, decision: bool | None):
        self.fraction = RDropStart.from_config(training)
        self.by_pace = RDropByPace.from_config(training, decision)
        if self.by_pace is not None:
            self.started = bool(self.by_pace.decision)
        else:
            self.started = self.fraction is None or self.fraction.started(step, seconds)
        if training.rdrop_min_plain_steps and training.rdrop_alpha > 0 and self.by_pace is None:
            logger.info("R-Drop from the first step: training.rdrop_min_plain_steps needs a time budget to decide by")
        elif self.by_pace is not None and self.by_pace.decision is None:
            logger.info(
                "plain steps to step %d, then R-Drop only if the time budget buys %d plain steps at their pace",
                self.by_pace.decision_step,
                self.by_pace.min_plain_steps,
            )
        elif self.to_come is not None:
            seconds = self.fraction.seconds  # None without a time budget: only the step counts
            logger.info(
                "R-Drop starts %.0f%% of the way through the run (step %.0f%s); plain steps before",
                training.rdrop_start * 100,
                self.fraction.step,
                "" if seconds is None else f" or {seconds / 60:.1f} minutes of training, whichever comes first",
            )

    @property
    def switches(self) -> bool:
        """Whether the run may take both kinds of step, plain and R-Drop."""
        return self.fraction is not None or self.by_pace is not None

    @property
    def to_come(self) -> RDropStart | None:
        """The fractional start while it is still to come (the time budget counts its R-Drop steps at their cost)."""
        return None if self.started else self.fraction

    @property
    def decision(self) -> bool | None:
        """What the checkpoints store: the pace's decision (None: not decided, or no such rule)."""
        return None if self.by_pace is None else self.by_pace.decision

    def due(self, step: int) -> bool:
        """Whether the budget check after `step` completed steps decides by the pace."""
        return self.by_pace is not None and self.by_pace.due(step)

    def starts_after(self, step: int, seconds: float, plain_end_step: float | None = None) -> bool:
        """Whether R-Drop starts with the step after `step`, at `seconds` of training (the last
        budget reading). `plain_end_step`: at the check that is `due`, where the budget ends at the
        plain pace so far (None elsewhere, and before a pace is known: the next check decides)."""
        if self.started:
            return False
        if self.by_pace is None:
            self.started = self.fraction.started(step, seconds)
            return self.started
        if plain_end_step is None or not self.by_pace.due(step):
            return False
        self.started = self.by_pace.decide(plain_end_step)
        logger.info(
            "at step %d the time budget buys about %.0f plain steps at their pace so far, %s %d "
            "(training.rdrop_min_plain_steps): %s",
            step,
            plain_end_step,
            "at least" if self.started else "fewer than",
            self.by_pace.min_plain_steps,
            "R-Drop from the next step on" if self.started else "plain steps to the end",
        )
        return self.started
