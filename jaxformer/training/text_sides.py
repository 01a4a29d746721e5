"""Which text a run reads, by its model's architecture (model.architecture): a translator both
sides, a masked LM (encoder_only) the source's, a causal LM (decoder_only) the target's; the stack
that reads each side, the languages and config keys read or left unread, the noun the run's log
uses for its examples, and the control pieces its vocabulary needs."""

from __future__ import annotations

import ml_collections

from jaxformer.tokens import MASK_PIECE


def architecture(config: ml_collections.ConfigDict) -> str:
    """The model's architecture (model.architecture): "encoder_decoder", "encoder_only" or "decoder_only"."""
    return config.model.get("architecture", "encoder_decoder")


def text_side(config: ml_collections.ConfigDict) -> str | None:
    """The one side whose text the run reads: "source" for a masked LM, "target" for a causal LM; None: both."""
    return {"encoder_only": "source", "decoder_only": "target"}.get(architecture(config))


STACKS = {"source": "encoder", "target": "decoder"}  # the stack that reads each side's text


def unread_side(config: ml_collections.ConfigDict) -> str | None:
    """The side whose text a language model never reads, nor has the stack of (`text_side`'s other); None: both read."""
    return {"source": "target", "target": "source"}.get(text_side(config))


def language_model_unread(config: ml_collections.ConfigDict) -> tuple[str, ...]:
    """(`unread_side`'s language, the depth of the stack it lacks), which a language model never reads (() for a
    translator): its start names them unused, a resume may change them, a start from it is not held to them."""
    side = unread_side(config)
    return () if side is None else (f"data.{side}_language", f"model.num_{STACKS[side]}_layers")


def text_language_keys(config: ml_collections.ConfigDict) -> tuple[str, ...]:
    """The data keys of the languages whose text the run reads: `text_side`'s, or both."""
    return ("source_language", "target_language") if (side := text_side(config)) is None else (f"{side}_language",)


def text_languages(config: ml_collections.ConfigDict) -> tuple[str, ...]:
    """The languages whose text the run reads: `text_side`'s, or both."""
    return tuple(config.data[key] for key in text_language_keys(config))


def example_noun(config: ml_collections.ConfigDict) -> str:
    """What the run's log calls its training examples: "pairs" for a translator, "texts" for a language model."""
    return "pairs" if text_side(config) is None else "texts"


def control_symbols(config: ml_collections.ConfigDict) -> tuple[str, ...]:
    """Control pieces the run's vocabulary needs: the mask piece for a masked LM."""
    return (MASK_PIECE,) if architecture(config) == "encoder_only" else ()
