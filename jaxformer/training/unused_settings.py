"""Settings a config keeps but does not use: the options of a feature it switches off (or of
training a tokenizer when none is trained), said at the start of a run so that none is taken for
one in effect (`unused_settings`, read by run_start; config_rules holds what each key allows)."""

from __future__ import annotations

from typing import NamedTuple

from jaxformer.data.split_files import SIDE_READERS
from jaxformer.training.experiment import default_config
from jaxformer.training.text_sides import STACKS, architecture, language_model_unread, text_side, unread_side


class UnusedSetting(NamedTuple):
    """A setting the config keeps but does not use: its key, its value as said, and why unused."""

    key: str
    value: str
    why: str

    def __str__(self) -> str:
        return f"{self.key}={self.value} ({self.why})"


def unused_settings(config, resuming: bool = False) -> list[str]:
    """Settings of a feature that the config switches off (or leaves without use: the options of
    training a tokenizer when none is trained), each different from default_config's: kept, so
    that switching it back on restores them, and said, so that none is taken for one in effect.
    `resuming`: the workdir's run goes on with its own tokenizers, trained (or not) at its start
    with these very options (a change is refused), so the options are not named."""
    return [str(setting) for setting in unused_records(config, resuming)]


def unused_records(config, resuming: bool = False) -> list[UnusedSetting]:
    """`unused_settings`' settings as records: a value holding " (" or "=" is read back whole."""
    training = config.training
    unused = []
    if training.final_alphas and not training.final_choice:
        alphas = str(tuple(training.final_alphas))
        unused.append(UnusedSetting("training.final_alphas", alphas, "training.final_choice is False"))
    elif training.final_alphas and config.decoding.method != "beam":
        unused.append(
            UnusedSetting(
                "training.final_alphas",
                str(tuple(training.final_alphas)),
                f"decoding.method is {config.decoding.method!r}: a length penalty ranks beam search's hypotheses only",
            )
        )
    if training.rdrop_decision_step != 600 and not training.rdrop_min_plain_steps:
        unused.append(
            UnusedSetting(
                "training.rdrop_decision_step", str(training.rdrop_decision_step), "training.rdrop_min_plain_steps is 0"
            )
        )
    defaults = default_config()
    data = config.data
    if data.validation_holdout != defaults.data.validation_holdout:
        if data.name != "parallel_files":
            why = f"data.name is {data.name!r}, whose validation split is its own; only parallel_files holds pairs out"
            unused.append(UnusedSetting("data.validation_holdout", str(data.validation_holdout), why))
        elif data.files.get("validation"):
            why = "data.files.validation is given: no pairs are held out"
            unused.append(UnusedSetting("data.validation_holdout", str(data.validation_holdout), why))
    unread = language_model_unread(config)  # a language model reads one side's text: the other's language, nothing
    if unread:
        language = unread[0].removeprefix("data.")
        if data[language] != defaults.data[language]:
            why = f"model.architecture is {config.model.architecture!r}: {SIDE_READERS[text_side(config)]}'s text alone"
            unused.append(UnusedSetting(f"data.{language}", repr(data[language]), why))
        # Its file is still read and fingerprinted with the others, as given, so that runs started with it resume.
        if data.name == "parallel_files" and data.files.get("test"):
            why = (
                f"model.architecture is {config.model.architecture!r}: nothing scores a language model on a test "
                "split; jaxformer-evaluate scores translators"
            )
            unused.append(UnusedSetting("data.files.test", repr(data.files.test), why))
    starts = ("init_from", "init_encoder_from", "init_decoder_from")
    if training.init_checkpoint != defaults.training.init_checkpoint and not any(training[key] for key in starts):
        why = "no training.init_from, init_encoder_from or init_decoder_from: the run starts from random values"
        unused.append(UnusedSetting("training.init_checkpoint", repr(training.init_checkpoint), why))
    depth = _missing_stack_depth(config)
    if depth is not None:
        unused.append(depth)
    for key, why in _translation_settings_unused(config):
        section, name = key.split(".")
        if config[section][name] != defaults[section][name]:
            unused.append(UnusedSetting(key, repr(config[section][name]), why))
    untrained = None if resuming else _tokenizers_not_trained(config)
    if untrained:
        for key in TOKENIZER_TRAINING_KEYS:
            if config.tokenizer[key] != defaults.tokenizer[key]:
                unused.append(UnusedSetting(f"tokenizer.{key}", repr(config.tokenizer[key]), untrained))
    return unused


def _missing_stack_depth(config) -> UnusedSetting | None:
    """The depth of the stack a language model does not have (model.num_encoder_layers of a
    decoder_only model, num_decoder_layers of an encoder_only one), where it differs from its own
    stack's: a config made from a translator's keeps both depths (multi30k_lm.py), and one set
    apart from the other was meant for a stack that is not built."""
    model, unread = config.model, unread_side(config)
    if unread is None:
        return None
    missing, built = STACKS[unread], STACKS[text_side(config)]
    value, depth = model.get(f"num_{missing}_layers"), model.get(f"num_{built}_layers")
    if value == depth:
        return None
    return UnusedSetting(
        f"model.num_{missing}_layers",
        repr(value),
        f"model.architecture is {architecture(config)!r}: no {missing} is built; "
        f"the {built}'s depth is model.num_{built}_layers={depth!r}",
    )


def _translation_settings_unused(config) -> list[tuple[str, str]]:
    """(key, why) for each setting of translating during training (validation BLEU, the final
    choice) that this config never reads."""
    training = config.training
    architecture = config.model.get("architecture", "encoder_decoder")
    if architecture != "encoder_decoder":
        why = f"model.architecture is {architecture!r}: nothing is translated during training"
        keys = [f"decoding.{key}" for key in config.decoding] + [
            "training.bleu_examples",
            "training.bleu_method",
            "training.bleu_tokenize",
            "training.average_last",
        ]
        return [(key, why) for key in keys]
    unused = []
    if not training.bleu_every_steps:
        why = "training.bleu_every_steps is 0"
        unused += [("training.bleu_examples", why), ("training.bleu_method", why)]
    if not training.final_choice:
        unused.append(("training.average_last", "training.final_choice is False"))
        if not training.bleu_every_steps:
            why = "training.bleu_every_steps is 0 and training.final_choice is False: nothing is translated"
            unused += [(f"decoding.{key}", why) for key in config.decoding]
    return unused


def unused_keys(config) -> dict[str, str]:
    """{key: why} for every key whose value `config`'s new run does not use, whatever the value:
    unused_settings' keys (named there only when not the default), and where no tokenizer is
    trained, the options of training one and tokenizer.vocab_size (the given or started-from
    tokenizers' sizes replace it, or must agree with it)."""
    unused = {setting.key: setting.why for setting in unused_records(config)}
    untrained = _tokenizers_not_trained(config)
    if untrained:
        for key in ("vocab_size", *TOKENIZER_TRAINING_KEYS):
            unused[f"tokenizer.{key}"] = untrained
    return unused


# What only training a sentencepiece model reads; tokenizer.vocab_size is not here: a given model
# or a start's tokenizer that contradicts it is an error or replaces it with a note of its own.
TOKENIZER_TRAINING_KEYS = ("model_type", "character_coverage", "max_sentences")


def _tokenizers_not_trained(config) -> str | None:
    """Why no tokenizer of the run is trained (each vocabulary comes from a given model or from a
    start's checkpoint), for a message; None when one is."""

    def giver(*keys: str) -> str | None:  # the first of the keys that is set
        return next((key for key in keys if config[key.split(".")[0]].get(key.split(".")[1]) is not None), None)

    # A start's tokenizer comes with its embeddings: it is the one used, a given model only checked against it.
    starts = ("training.init_from", "training.init_encoder_from", "training.init_decoder_from")
    if not config.tokenizer.separate_vocabularies:
        shared = giver(*starts, "tokenizer.model_path")
        return None if shared is None else f"no tokenizer is trained: {shared} gives the vocabulary"
    source = giver("training.init_from", "training.init_encoder_from", "tokenizer.model_path")
    target = giver("training.init_from", "training.init_decoder_from", "tokenizer.target_model_path")
    if source is None or target is None:
        return None
    if source == target:
        return f"no tokenizer is trained: {source} gives both vocabularies"
    return f"no tokenizer is trained: {source} gives the source vocabulary, {target} the target's"
