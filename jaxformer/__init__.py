"""jaxformer: the encoder-decoder Transformer of "Attention Is All You Need" in JAX and Flax.

The names below are imported on first use, so that `import jaxformer.model` (or any other
subpackage) loads that subpackage and what it imports, nothing more (tests/test_layering.py).
"""

from __future__ import annotations

import importlib

from jaxformer.tokens import BOS_ID, EOS_ID, NUM_SPECIAL_TOKENS, PAD_ID, UNK_ID

__version__ = "0.1.0"

_LAZY = {
    "jaxformer.model.architectures": ("build_model",),
    "jaxformer.model.attention": ("MultiHeadAttention", "dot_product_attention"),
    "jaxformer.model.cache": ("DecoderCache", "EncoderContext", "init_cache"),
    "jaxformer.model.config": ("PRESETS", "ConfigError", "TransformerConfig", "preset"),
    "jaxformer.model.decoder_only": ("DecoderOnly",),
    "jaxformer.model.encoder_only": ("EncoderOnly",),
    "jaxformer.model.masking": ("causal_mask", "cross_mask", "decoder_self_mask", "encoder_self_mask"),
    "jaxformer.model.position": ("positional_encoding", "sinusoidal_table"),
    "jaxformer.model.transformer": ("Transformer", "shift_right"),
    "jaxformer.decoding.generate": ("DecodeSettings", "decoding_variant", "generate", "make_generate_fn"),
    "jaxformer.decoding.search": ("SearchSpec", "greedy_search", "sample_search"),
    "jaxformer.decoding.beam_search": ("beam_search",),
    "jaxformer.decoding.translator": ("Translator",),  # pulls in the data stack (sentencepiece, orbax)
    "jaxformer.decoding.language_model": ("LanguageModel", "continue_prompts"),  # so does this
}
_MODULE_OF = {name: module for module, names in _LAZY.items() for name in names}

__all__ = [
    "BOS_ID",
    "EOS_ID",
    "NUM_SPECIAL_TOKENS",
    "PAD_ID",
    "UNK_ID",
    "PRESETS",
    "ConfigError",
    "DecoderOnly",
    "EncoderOnly",
    "MultiHeadAttention",
    "Transformer",
    "TransformerConfig",
    "build_model",
    "causal_mask",
    "cross_mask",
    "decoder_self_mask",
    "dot_product_attention",
    "encoder_self_mask",
    "positional_encoding",
    "preset",
    "shift_right",
    "sinusoidal_table",
    "DecodeSettings",
    "DecoderCache",
    "EncoderContext",
    "LanguageModel",
    "SearchSpec",
    "Translator",
    "beam_search",
    "continue_prompts",
    "decoding_variant",
    "generate",
    "greedy_search",
    "init_cache",
    "make_generate_fn",
    "sample_search",
]


def __getattr__(name: str):
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'jaxformer' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_MODULE_OF))
