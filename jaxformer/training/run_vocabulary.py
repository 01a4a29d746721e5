"""The vocabulary sizes a run's model will have, known before any data is read: a resumed run's
from its checkpoint, a fine-tuned model's from its start, a new run's from its config. The start
of a run checks its mesh with them (run_start.py), and a sweep times each variant's train step
on them (pace.py): a fine-tuned model's embeddings are its start's, whatever tokenizer.vocab_size
says."""

from __future__ import annotations

from collections.abc import Sequence

import ml_collections

from jaxformer.run.metadata import CheckpointMetadata
from jaxformer.training import experiment
from jaxformer.training.init_from import StartingPoint, load_starting_points


def new_run_vocabulary_sizes(config: ml_collections.ConfigDict) -> tuple[int, int]:
    """(source, target) vocabulary sizes of the model a new run of `config` trains: its starts'
    (training.init_from, or init_encoder_from and init_decoder_from: their metadata read, not their
    parameters), else its config's; the config's too where a start does not say (a shared
    vocabulary of a composed translator, made from the data)."""
    sizes = vocabulary_sizes_before_the_data(config, None, load_starting_points(config.training, params=False))
    return experiment.vocabulary_sizes(config) if sizes is None else sizes


def vocabulary_sizes_before_the_data(
    config, saved: CheckpointMetadata | None, starting_points: Sequence[StartingPoint]
) -> tuple[int, int] | None:
    """(source, target) vocabulary sizes of the run's model, known before any data is read: a
    resumed run's from its newest checkpoint, a model fine-tuned from `training.init_from` its
    start's, a new run's from its config (tokenizer.vocab_size or the given tokenizers), and a
    translator composed from an encoder's and a decoder's runs each side's from its start, or from
    the config where it trains that side's own. None where a checkpoint does not say (a shared
    vocabulary of a composed translator: checked once its tokenizers are made)."""
    if saved is None and not starting_points:
        return experiment.vocabulary_sizes(config)
    if saved is None and starting_points[0].part != "model":
        return _composed_vocabulary_sizes(config, starting_points)
    model = saved.model if saved is not None else starting_points[0].metadata.model
    target = model.get("vocab_size")
    return None if target is None else (model.get("source_vocab_size") or target, target)


def _composed_vocabulary_sizes(config, starting_points: Sequence[StartingPoint]) -> tuple[int, int] | None:
    """A composed translator's separate vocabularies: the encoder start's source side (its run's
    tokenizer), the decoder start's target side, the config's size for a side trained here."""
    if not config.tokenizer.separate_vocabularies:
        return None
    models = {point.part: point.metadata.model for point in starting_points}
    trained_here = experiment.vocabulary_sizes(config)
    encoder, decoder = models.get("encoder"), models.get("decoder")
    source = trained_here[0] if encoder is None else encoder.get("source_vocab_size") or encoder.get("vocab_size")
    target = trained_here[1] if decoder is None else decoder.get("vocab_size")
    return None if source is None or target is None else (source, target)
