"""A training batch that cannot be read (a prepared file damaged while the run trains): the run
stops as on a signal, with the steps done since the last checkpoint saved, and then with the
data's one-line error, which says from which step the same command resumes once the data is
prepared again. The data iterator's state is that of the batches before the failed one
(`ShardedBatches`), so the resumed run reads the failed batch first, as a run never stopped."""

from __future__ import annotations

import logging
from collections.abc import Callable

import jax

from jaxformer.data.parallel_text import DataError
from jaxformer.errors import first_line

logger = logging.getLogger(__name__)


def saved_before_stopping(error: DataError, step: int, first_step: int, save: Callable[[int], None]) -> DataError:
    """The error that stops the run whose batch after `step` raised `error`, once `save(step)`
    has written the checkpoint of the steps done (`first_step`: where this run started or
    resumed; no step since, nothing to save). A save that fails is said in the error and the log,
    not raised: it would hide the data's error, the one to act on."""
    if step == first_step:
        return error
    if jax.process_count() > 1:  # the others are in their next step's collectives: they cannot save with it
        return DataError(
            f"{error}; training stopped after step {step}, not saved (the processes of a run save together); "
            "the same command then resumes from the last checkpoint"
        )
    try:
        save(step)
    except Exception as save_error:
        logger.warning("the checkpoint of step %d could not be saved: %s", step, first_line(save_error))
        logger.debug("the failed save of step %d", step, exc_info=save_error)
        return DataError(
            f"{error}; training stopped after step {step}, whose checkpoint could not be saved "
            f"({first_line(save_error)}); the same command then resumes from the last checkpoint"
        )
    return DataError(
        f"{error}; training stopped after step {step}, which is saved: the same command then resumes there"
    )
