"""How the training loop checkpoints the run: on the schedule (and at its end), between scheduled
steps to stop (an interim checkpoint), and one saved before its run's end made the run's last in place."""

from __future__ import annotations

from jaxformer.training.kept_checkpoints import remove_interim_before
from jaxformer.training.step_exchange import raise_held_write


class RunSaver:
    """Saves the loop's state with the run's `metadata` (the step's training seconds from `clock`,
    R-Drop's decision, the budget's work seconds, the train window an interim checkpoint keeps)."""

    def __init__(self, checkpointer, train_metrics, metadata, clock, rdrop, budget, train_iterator, every_steps: int):
        self.checkpointer, self.train_metrics, self.metadata = checkpointer, train_metrics, metadata
        self.clock, self.rdrop, self.budget = clock, rdrop, budget
        self.train_iterator, self.every_steps = train_iterator, every_steps

    def save(self, step: int, state, interim: bool = False, in_place: bool = False, last: bool = False) -> None:
        """Checkpoint `step`. On the schedule, and at the run's end (`last`: after that step's work, its
        metadata marked saved as the run's last, which a resume reads: resumed_end.py); `interim` (a
        stop between scheduled steps: a signal, unreadable data): kept without pushing out an older
        one, and deleted by the next checkpoint, so a resumed run ends with the checkpoints (and their
        average) of a run never stopped. `in_place`: step's checkpoint, this state's, saved to stop or
        before the end its run was heading for, made the run's last by its metadata alone (deleted
        and saved again, a kill in between lost it)."""
        raise_held_write(self.train_metrics.writer)  # none saved after a record process 0 failed to write
        window = self.train_metrics.for_checkpoint(interim)  # an interim one keeps its log interval's steps, unwritten
        metadata = self.metadata.replace(
            step=step,
            train_seconds=self.clock.seconds(),
            rdrop_by_pace=self.rdrop.decision,
            interim=interim,
            train_window=window,
            saved_as_last=last or in_place,
        )
        metadata = metadata.replace(work_seconds=None if self.budget is None else self.budget.saved_work_seconds())
        remove_interim_before(self.checkpointer, step)
        if in_place:
            self.checkpointer.replace_metadata(step, metadata)
        else:
            self.checkpointer.save(step, state, self.train_iterator, metadata, evict=not interim)
        self.train_metrics.restart_interval()

    def save_steps_done(self, step: int, state) -> None:
        """A stop between scheduled checkpoints: the steps since the last one, written (not queued)."""
        if step not in self.checkpointer.steps():
            self.save(step, state, interim=step % self.every_steps != 0)
        self.checkpointer.wait()
