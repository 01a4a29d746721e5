"""A run's training time and its wall-clock budget (training.time_budget_minutes).

`TrainingClock` counts the seconds the training loop has spent across resumes: what the run had
spent when the checkpoint it resumes from was saved (CheckpointMetadata.train_seconds), plus this
process's time since its loop started. `TimeBudget` turns the pace measured so far into the step
at which the budget runs out: the end of the "budget" learning-rate schedule (optimizer.py),
corrected as the run goes, and the signal to stop; the loop reads it at the checks of
budget_check.py.

The periodic work (evaluations, validation BLEU, checkpoints) comes in lumps: averaged into the
pace, a 5-second evaluation due just before the estimated end was not foreseen, and the run found
its budget spent after it, well above the schedule's floor. So the pace counts the steps alone, and
the estimate adds each kind of work due before the end at its steady duration (kept in the
checkpoints, CheckpointMetadata.work_seconds, so a resumed run knows them before its first).

A kind's steady duration is the median of its last three durations measured (the lower of the
two middles while there are two), the one its checkpoint saved counted as one of them: the last
three, not all, so a duration that drifts (validation BLEU as the outputs' lengths change) is
followed within two of its kind. Its latest alone let
one evaluation slowed by a passing load stand for all to come: measured on the tiny config
(evaluation every 10 steps, a one-minute budget), the third slowed by 8 s put the end at step 90,
the fourth, as quick as ever, moved it back to 1,343, and the rate, decaying to that end, rose from
0.073 to 0.109 after its peak (0.112). Now the slowed one costs its own 8 s (the end moved from 998
to 840) and the rate rises nowhere by more than 0.2%. Load only slows work, so of two middles the
lower is taken: one slowed after a kind's first measured, or after a resume, is outvoted at once.
The first measured has nothing to outvote it (slowed, the second evaluation still put the end at
step 80, and the third moved it to 1,026).

The steps' pace is averaged since the segment's first step, and over the last seconds as many as
the budget has left (from the last check at least that long ago), and the slower of the two is
taken. After a stall or a slow stretch the average estimates the end low, and each check raises it
as the budget runs down, so the rate is lower for a while but still reaches its floor where the
budget is spent. A load that comes late the average alone does not follow: on the tiny config, a
0.5-minute budget slowed by a test run beside it, from about 80 steps a second to under 10 in its
last 10 seconds, kept an average of 0.028 s a step, estimated at step 820 that 100 steps were left
where 10 were, and ended at 10.3% of the peak (a fake clock, tests/training/test_budget_load.py:
0.02 s a step, ten times slower for the last 5 s of 30, 4.9%; the slower pace ends it at its
floor). A window alone follows a load that ends sooner too, which puts the end beyond what the
budget allows if it comes back (the decay then steepens at the end); taking the slower errs on the
side of a decay finished early. On a fake clock (a 1,800 s budget at 1 s a step,
tests/training/test_budget_load.py) the rates' sum misses that of a schedule knowing the load in
advance by 10% with the first third at half speed, 11% with the last third (13% by the average
alone, its last rate 0.5% of the peak), 11% after a 300 s stall and 3.5% with the middle third slow.

A segment's first of each kind holds its compilation, as its first step does, so it stands for
none to come: it is kept out of the pace, and the kind's steady duration is measured from the
segment's second on (until then, a resumed run keeps the one its checkpoint saved). Counted for each
one to come, it misplaced the end: measured on the tiny config (evaluation and checkpoint every 100
steps, a 30-second budget), the estimate stood at step 748 before the first evaluation, dropped to
400 once its 3.4 s (compilation included) was counted, rose to 600 after the second (about 1 s),
and the run ended at step 701. Before a steady duration is known, a kind is counted as free, which
misplaces the end less, and matters little: the rate does not depend on the schedule's end within
optimizer.warmup_steps (the defaults' first two evaluations and checkpoints, at steps 1000 and
2000, fall within a 4000-step warmup).
"""

from __future__ import annotations

import math
import statistics
import time

from jaxformer.training.rdrop_start import RDROP_STEP_COST, RDropStart


class TrainingClock:
    """Seconds spent by the run's training loop: `seconds_before` (earlier segments, up to the
    checkpoint this one resumed from) plus the time since `start()`."""

    def __init__(self, seconds_before: float = 0.0):
        self.seconds_before = seconds_before
        self._started: float | None = None

    def start(self) -> None:
        self._started = time.monotonic()

    def seconds(self) -> float:
        return self.seconds_before + (0.0 if self._started is None else time.monotonic() - self._started)


WORK_SAMPLES = 3  # a kind's steady duration is the lower median of its last this many
# work_seconds' key (in the checkpoints) for a segment's first step, its compilation included: what a
# start costs, which a resume with less of its budget left than that spends in full (budget_resume.py).
FIRST_STEP = "first_step"


def _multiples(every: int, start: int, end: int) -> int:
    """How many multiples of `every` lie in [start, end) (start >= 1)."""
    return max((end - 1) // every - (start - 1) // every, 0)


class TimeBudget:
    """A wall-clock budget of `seconds` for the training loop. The pace of the steps is measured
    from this segment's first completed step, so the first step's compilation is spent but not
    extrapolated, and without the periodic work (`work_done`): `work_every` (a kind of work's
    name: every how many steps it is due) and its steady seconds, `work_seconds` (carried over a
    resume), foresee that work where it falls.

    `rdrop_start`: R-Drop is still to start (rdrop_start.py). Its steps are counted at
    RDROP_STEP_COST times the plain pace until `rdrop_started()`, which measures the pace afresh."""

    def __init__(
        self,
        seconds: float,
        clock: TrainingClock,
        rdrop_start: RDropStart | None = None,
        work_every: dict[str, int] | None = None,
        work_seconds: dict[str, float] | None = None,
    ):
        self.seconds, self.clock, self.rdrop_start = seconds, clock, rdrop_start
        self.work_every = {name: every for name, every in (work_every or {}).items() if every > 0}
        carried = dict(work_seconds or {})
        # The seconds of the latest segment's first step (compilation included), its work before it left out.
        self.first_step_seconds: float | None = carried.pop(FIRST_STEP, None)
        self.work_seconds = carried  # the steady durations: what the checkpoints keep, with first_step_seconds
        # Each kind's last steady durations measured, the carried one (a checkpoint keeps only the median) first.
        self._work_samples = {name: [seconds] for name, seconds in self.work_seconds.items()}
        self._work_compiled: set[str] = set()  # the kinds run in this segment: their next ones run compiled
        self._pace_from: tuple[int, float] | None = None  # (step, clock seconds) where the pace is measured from
        self._work_since = 0.0  # the seconds of periodic work since then
        self._work_before_steps = 0.0  # the seconds of this segment's work before its first step (its start's)
        self._first_step: tuple[int, float] | None = None  # this segment's first step done, and the clock then
        # (step, clock seconds, periodic work's seconds since _pace_from) at each check: the recent pace's starts.
        self._marks: list[tuple[int, float, float]] = []

    def step_done(self, step: int) -> None:
        if self._pace_from is None:
            self._pace_from = (step, self.clock.seconds())
        if self._first_step is None:
            self._first_step = self._pace_from
            start = self._first_step[1] - self.clock.seconds_before - self._work_before_steps
            self.first_step_seconds = max(start, 0.0)

    def saved_work_seconds(self) -> dict[str, float]:
        """What a checkpoint keeps: the steady durations, and the latest segment's first step."""
        first = {} if self.first_step_seconds is None else {FIRST_STEP: self.first_step_seconds}
        return {**self.work_seconds, **first}

    def spent_unmeasured(self) -> tuple[int, float] | None:
        """(this segment's first step, the training seconds when it was done) where the budget was
        spent by then (that step holds the compilation), before any step's duration was measured."""
        if self._first_step is None or self._first_step[1] < self.seconds:
            return None
        return self._first_step

    def work_done(self, name: str, seconds: float) -> None:
        """Periodic work `name` took `seconds`: not the steps' pace, and, from this segment's second
        of its kind on, one of its kind's steady durations (the first's holds its compilation),
        the lower median of whose last WORK_SAMPLES is what is foreseen: one slowed by a passing
        load is outvoted once another is known (the carried one included)."""
        if name in self._work_compiled:
            samples = [*self._work_samples.get(name, []), seconds][-WORK_SAMPLES:]
            self._work_samples[name] = samples
            self.work_seconds[name] = statistics.median_low(samples)
        self._work_compiled.add(name)
        if self._pace_from is not None:
            self._work_since += seconds
        elif self._first_step is None:
            self._work_before_steps += seconds

    def rdrop_started(self) -> None:
        """The steps from now on are R-Drop steps: their pace is measured from the first one
        completed (its compilation spent, not extrapolated)."""
        self.rdrop_start, self._pace_from, self._work_since, self._marks = None, None, 0.0, []

    def spent(self) -> bool:
        return self.clock.seconds() >= self.seconds

    def seconds_per_step(self, step: int) -> float | None:
        """The steps' pace, without the periodic work among them."""
        if self._pace_from is None or step <= self._pace_from[0]:
            return None
        first_step, first_seconds = self._pace_from
        return max(self.clock.seconds() - first_seconds - self._work_since, 0.0) / (step - first_step)

    def _recent_seconds_per_step(self, step: int) -> float | None:
        """The steps' pace over the last seconds as many as the budget has left (from the last check
        at least that long ago; the average where none is): the pace of what remains, as far as the
        recent past says. Each call, a check's, is recorded as a start for the later ones."""
        average = self.seconds_per_step(step)
        if average is None:
            return None
        now = self.clock.seconds()
        horizon_start = now - max(self.seconds - now, 0.0)
        starts = [mark for mark in self._marks if mark[1] <= horizon_start and mark[0] < step]
        if starts:  # the horizon's start only moves on: the marks before the latest are not read again
            self._marks = self._marks[self._marks.index(starts[-1]) :]
        self._marks.append((step, now, self._work_since))
        if not starts:
            return average
        mark_step, mark_seconds, mark_work = starts[-1]
        return max(now - mark_seconds - (self._work_since - mark_work), 0.0) / (step - mark_step)

    def end_step(self, step: int, max_steps: int, work_done: bool = False) -> float | None:
        """The step at which the budget runs out at the pace so far, with the periodic work due
        from `step` on (this step's is still to run; `work_done`: from the next step on, this
        step's evaluation and BLEU done, its checkpoint left out) at its steady durations, within
        [step + 1, max_steps]; None before a pace is known."""
        pace, recent = self.seconds_per_step(step), self._recent_seconds_per_step(step)
        if pace is None:
            return None
        # The slower of the two: a load that came late, unforeseen by the average, put the end too
        # late and left the rate above its floor where the budget ran out; one that went is followed
        # by the average alone, erring on the side of a decay finished early.
        pace, now = max(pace, recent, 1e-9), self.clock.seconds()
        remaining = max(self.seconds - now, 0.0)
        plain_steps = math.inf  # the steps to come at the plain pace; the rest are R-Drop's
        if self.rdrop_start is not None:
            plain_steps = min(self.rdrop_start.plain_seconds_left(step, now, pace), remaining) / pace

        def steps_seconds(end: int) -> float:
            plain = min(end - step, plain_steps)
            return plain * pace + (end - step - plain) * pace * RDROP_STEP_COST

        def work_seconds(end: int) -> float:  # the work due at steps [step, end)
            return sum(
                self.work_seconds.get(name, 0.0) * _multiples(every, step + 1 if work_done else step, end)
                for name, every in self.work_every.items()
            )

        if steps_seconds(max_steps) + work_seconds(max_steps) <= remaining:
            return float(max_steps)
        reached, beyond = step, max_steps  # the last step reached within the budget lies in [reached, beyond)
        while beyond - reached > 1:
            middle = (reached + beyond) // 2
            if steps_seconds(middle) + work_seconds(middle) <= remaining:
                reached = middle
            else:
                beyond = middle
        # The budget runs out during step `reached`'s work, or during the step after it.
        after_work = steps_seconds(reached) + work_seconds(reached + 1)
        fraction = (remaining - after_work) / (steps_seconds(reached + 1) - steps_seconds(reached))
        return float(min(max(reached + min(max(fraction, 0.0), 1.0), step + 1), max_steps))
