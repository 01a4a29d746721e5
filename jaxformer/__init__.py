"""jaxformer: the encoder-decoder Transformer of "Attention Is All You Need" in JAX and Flax."""

from jaxformer.decoding.generate import DecodeSettings, decoding_variant, generate, make_generate_fn
from jaxformer.decoding.search import beam_search, greedy_search, sample_search
from jaxformer.model.attention import MultiHeadAttention, dot_product_attention
from jaxformer.model.cache import DecoderCache, EncoderContext, init_cache
from jaxformer.model.config import PRESETS, ConfigError, TransformerConfig, preset
from jaxformer.model.masking import causal_mask, cross_mask, decoder_self_mask, encoder_self_mask
from jaxformer.model.position import positional_encoding, sinusoidal_table
from jaxformer.model.transformer import Transformer, shift_right
from jaxformer.tokens import BOS_ID, EOS_ID, NUM_SPECIAL_TOKENS, PAD_ID, UNK_ID

__version__ = "0.1.0"

__all__ = [
    "BOS_ID", "EOS_ID", "NUM_SPECIAL_TOKENS", "PAD_ID", "UNK_ID",
    "PRESETS", "ConfigError", "MultiHeadAttention", "Transformer", "TransformerConfig",
    "causal_mask", "cross_mask", "decoder_self_mask", "dot_product_attention", "encoder_self_mask",
    "positional_encoding", "preset", "shift_right", "sinusoidal_table",
    "DecodeSettings", "DecoderCache", "EncoderContext", "Translator", "beam_search", "decoding_variant", "generate",
    "greedy_search", "init_cache", "make_generate_fn", "sample_search",
]


def __getattr__(name):
    # Translator pulls in the data stack (tensorflow-datasets, sentencepiece): imported on first use.
    if name == "Translator":
        from jaxformer.decoding.translator import Translator

        return Translator
    raise AttributeError(f"module 'jaxformer' has no attribute {name!r}")
