"""How fast one experiment config trains relative to another, measured side by side.

A sweep whose variants each get an hour measures the machine as much as the variants: on a shared
VM whose speed halves in the afternoon, a variant trained then reaches half the steps of one
trained in the morning. `relative_pace` instead times both configs' train steps in turn in one
process (one step of each per round, so a slow moment falls on both alike), and a sweep gives
each variant the steps that the reference reaches in its budget times that ratio
(sweep.py: `--baseline_steps`): the comparison then holds on any machine, at any hour.

Each config's train step is built as the training loop builds it (its model, objective, optimizer,
mesh and shardings, state donated; a model fine-tuned from `training.init_from` with its start's
vocabulary sizes, as its run will have them) and runs on dense random rows of the config's batch shape,
packed as one pair per row: what a step costs depends only on shapes, not on token values.
Two configs whose train programs differ only in constants (a nonzero dropout rate, a learning
rate, a warmup) cost the same, and are not timed; a dropout rate of 0 draws no masks (another
program). A config whose R-Drop starts part way (rdrop_start.py)
has two programs: under a step budget its first `rdrop_start` of the steps are plain, the rest
R-Drop steps, and its time a step is that mix of the two. A config whose R-Drop is decided by
the run's pace (training.rdrop_min_plain_steps) needs a time budget to decide by; a sweep's runs
have step budgets, where R-Drop runs from the first step, and its R-Drop program is what is timed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import re
import statistics
import time
from collections.abc import Callable, Sequence

import flax.linen as nn
import jax
import ml_collections
import numpy as np
from jax.experimental import multihost_utils

from jaxformer.model.architectures import build_model
from jaxformer.tokens import NUM_SPECIAL_TOKENS
from jaxformer.training import experiment, sharding
from jaxformer.training.objectives import objective_for
from jaxformer.training.optimizer import make_optimizer
from jaxformer.training.rdrop_start import RDropStart
from jaxformer.training.run_vocabulary import new_run_vocabulary_sizes
from jaxformer.training.state import make_init_fn
from jaxformer.training.step import make_run_train_step

logger = logging.getLogger(__name__)

# Timed rounds of one step of each config, after WARMUP_STEPS untimed steps of each. On the noisy
# 2-core VM, 8 rounds gave 1.37x and 1.52x for the same pair in two processes, and 1.39x
# against 1.48x from the first 8 and all 16 rounds of one process: 24 rounds cost a minute
# at multi30k's size, against an hour of training that the figure apportions.
PACE_ROUNDS = 24
WARMUP_STEPS = 2
# A literal in a lowered StableHLO program: `dense<...>` (a constant's value).
_CONSTANT = re.compile(r"dense<[^>]*>")


@dataclasses.dataclass(frozen=True)
class Pace:
    """Seconds per train step of a config and of the reference it was timed against (the
    medians of the interleaved rounds; equal, and not timed, when the programs are the same)."""

    seconds_per_step: float
    reference_seconds_per_step: float
    timed: bool  # False: the two train programs differ only in constants

    @property
    def speed(self) -> float:
        """The config's steps a second over the reference's."""
        return self.reference_seconds_per_step / self.seconds_per_step

    def steps_for(self, reference_steps: int) -> int:
        """The steps that take as long as `reference_steps` steps of the reference (at least one)."""
        return max(1, round(reference_steps * self.speed))


class ConfigTrainStep:
    """One config's jitted train step (`rdrop=False`: its plain step) on its own state and random
    batch, over `devices` (default: all; benchmarks.xla_options times it on fewer):
    `lowered_text()` is the program without its constants; `compile()` makes the state and the
    executable; each call after it takes one step and returns its metrics."""

    def __init__(
        self, config: ml_collections.ConfigDict, rdrop: bool = True, devices: Sequence[jax.Device] | None = None
    ):
        data, training = config.data, config.training
        self.rdrop = rdrop and training.rdrop_alpha > 0
        # A fine-tuned model's embeddings are its start's: its vocabulary, not tokenizer.vocab_size's.
        source_size, target_size = new_run_vocabulary_sizes(config)
        shared = not config.tokenizer.separate_vocabularies
        model_config = experiment.model_config(config, target_size, None if shared else source_size)
        self.mesh = sharding.make_mesh(config.mesh.shape, devices)
        self.rules = sharding.rules_from_config(config.mesh.logical_axis_rules)
        sharding.check_batch_size(data.batch_size, self.mesh, self.rules)
        with self._context():
            model = build_model(model_config)
            # Any id stands for the mask piece: which id is masked does not change the step's cost.
            objective = objective_for(model_config, mask_id=source_size - 1, seed=training.seed)
            optimizer, learning_rate = make_optimizer(config.optimizer, model_config.d_model)
            init_fn = make_init_fn(model, optimizer, data.max_length, data.max_length, boxed=True)
            boxed_state = jax.eval_shape(init_fn, training.seed)
            state_shardings = sharding.logical_shardings(boxed_state, self.mesh, self.rules)
            # The program is lowered on the state's shapes; the state itself is made only when the
            # step is compiled to be timed (configs that differ in constants never are).
            abstract_state = sharding.abstract_with_shardings(sharding.strip_boxes(boxed_state), state_shardings)
            plain_init = make_init_fn(model, optimizer, data.max_length, data.max_length)
            self._make_state = functools.partial(jax.jit(plain_init, out_shardings=state_shardings), training.seed)
            batch_sharding = sharding.batch_sharding(self.mesh, self.rules)
            self.batch = sharding.global_batch(
                random_rows(data, (source_size, target_size), objective.features), batch_sharding
            )
            self.step = jax.jit(
                make_run_train_step(config, model, optimizer, learning_rate, objective, rdrop=rdrop),
                in_shardings=(state_shardings, batch_sharding),
                out_shardings=(state_shardings, sharding.replicated(self.mesh)),
                donate_argnums=0,
            )
            self.lowered = self.step.lower(abstract_state, self.batch)

    @contextlib.contextmanager
    def _context(self):
        with jax.set_mesh(self.mesh), nn.logical_axis_rules(self.rules):
            yield

    def lowered_text(self) -> str:
        return _CONSTANT.sub("dense<>", self.lowered.as_text())

    def compile(self, compiler_options: dict | None = None) -> None:
        """Compiles the step, with XLA `compiler_options` (as XLA_FLAGS would set them) if given."""
        with self._context():
            self.state = self._make_state()
            self.compiled = self.lowered.compile(compiler_options=compiler_options)

    def __call__(self) -> dict:
        self.state, metrics = self.compiled(self.state, self.batch)
        return jax.block_until_ready(metrics)


def random_rows(
    data: ml_collections.ConfigDict, vocab_sizes: tuple[int, int], features: tuple[str, ...]
) -> dict[str, np.ndarray]:
    """This process's rows of a training batch of the `data` section's shape, every row one pair
    of random non-special tokens as long as the row: the features the pipeline packs
    (`inputs` from the source vocabulary, `targets` from the target's), with their segment ids and positions."""
    rows, length = data.batch_size // jax.process_count(), data.max_length
    rng = np.random.default_rng(0)
    batch = {}
    for feature, vocab_size in zip(("inputs", "targets"), vocab_sizes):
        if feature in features:
            batch[feature] = rng.integers(NUM_SPECIAL_TOKENS, vocab_size, (rows, length), dtype=np.int32)
            batch[f"{feature}_segment_ids"] = np.ones((rows, length), np.int32)
            batch[f"{feature}_positions"] = np.broadcast_to(np.arange(length, dtype=np.int32), (rows, length)).copy()
    return batch


def _programs(config: ml_collections.ConfigDict) -> list[tuple[float, ConfigTrainStep]]:
    """The config's train programs, each with the share of the steps it takes under a step budget."""
    if RDropStart.from_config(config.training) is None:
        return [(1.0, ConfigTrainStep(config))]
    plain_share = config.training.rdrop_start
    return [(plain_share, ConfigTrainStep(config, rdrop=False)), (1.0 - plain_share, ConfigTrainStep(config))]


def _signature(programs: list[tuple[float, ConfigTrainStep]]) -> list[tuple[float, str]]:
    return [(share, steps.lowered_text()) for share, steps in programs]


def relative_pace(
    config: ml_collections.ConfigDict,
    reference: ml_collections.ConfigDict,
    between_steps: Callable[[], None] = lambda: None,
) -> Pace:
    """`config`'s train-step time against `reference`'s, measured in turn in this process:
    WARMUP_STEPS untimed steps of each program, then PACE_ROUNDS rounds of one step of each. A
    config's time a step is its programs' medians weighted by their shares of the steps. With
    several processes every one takes process 0's figures. `between_steps` is called after each
    compilation and step, outside JAX's code (a signal held while JAX ran is raised there: the
    steps spend nearly all their time in JAX, so one re-sent would seldom land outside it)."""
    programs = {"config": _programs(config), "reference": _programs(reference)}
    if _signature(programs["config"]) == _signature(programs["reference"]):
        logger.info("pace: the same train program as the reference up to constants; not timed")
        return Pace(1.0, 1.0, timed=False)
    timed = [(name, index, steps) for name in programs for index, (_, steps) in enumerate(programs[name])]
    for _, _, steps in timed:
        steps.compile()
        between_steps()
    times: dict[tuple[str, int], list[float]] = {(name, index): [] for name, index, _ in timed}
    for round_index in range(WARMUP_STEPS + PACE_ROUNDS):
        for name, index, run_step in timed:
            start = time.perf_counter()
            run_step()
            if round_index >= WARMUP_STEPS:
                times[name, index].append(time.perf_counter() - start)
            between_steps()
    seconds_per_step = np.asarray(
        [
            sum(share * statistics.median(times[name, index]) for index, (share, _) in enumerate(programs[name]))
            for name in ("config", "reference")
        ],
        np.float64,
    )
    if jax.process_count() > 1:
        seconds_per_step = np.asarray(multihost_utils.broadcast_one_to_all(seconds_per_step))
    pace = Pace(float(seconds_per_step[0]), float(seconds_per_step[1]), timed=True)
    logger.info(
        "pace: %.3f s a step against the reference's %.3f s (%d rounds in turn): %.3fx its speed",
        pace.seconds_per_step,
        pace.reference_seconds_per_step,
        PACE_ROUNDS,
        pace.speed,
    )
    return pace
