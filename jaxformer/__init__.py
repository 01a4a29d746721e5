"""jaxformer: the encoder-decoder Transformer of "Attention Is All You Need" in JAX and Flax."""

from jaxformer.model.attention import MultiHeadAttention, dot_product_attention
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
]
