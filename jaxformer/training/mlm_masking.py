"""BERT's masking for the masked-LM objective (Devlin et al., 2019, section 3.1).

Each token that is not special (padding, EOS, BOS, UNK, the mask piece itself) is selected
with probability `rate` (15%); of the selected tokens 80% are replaced by the mask id, 10% by a
random ordinary token and 10% kept. The loss reads the selected positions only, whatever
they were replaced by. Selection is per token, so packed rows need nothing special: segments
only change which tokens attend to which.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxformer.tokens import NUM_SPECIAL_TOKENS
from jaxformer.typing import Array, Float, Int


class MaskedTokens(NamedTuple):
    """The encoder's input and what the loss reads."""

    inputs: Int[Array, "B S"]  # the tokens with the selected ones replaced
    targets: Int[Array, "B S"]  # the original tokens
    weights: Float[Array, "B S"]  # 1.0 at the selected positions, 0.0 elsewhere


def mask_tokens(
    rng: jax.Array,
    tokens: Int[Array, "B S"],
    mask_id: int,
    vocab_size: int,
    rate: float = 0.15,
    mask_fraction: float = 0.8,
    random_fraction: float = 0.1,
) -> MaskedTokens:
    """Selects and replaces tokens as the module docstring says. Ordinary tokens are the ids
    from NUM_SPECIAL_TOKENS to vocab_size - 1 other than `mask_id`; random replacements are
    drawn uniformly among them. Settings outside their ranges are a one-line ValueError
    (`check_masking`)."""
    check_masking(mask_id, vocab_size, rate, mask_fraction, random_fraction)
    select_rng, action_rng, random_rng = jax.random.split(rng, 3)
    maskable = (tokens >= NUM_SPECIAL_TOKENS) & (tokens != mask_id)  # [B, S]
    selected = maskable & jax.random.bernoulli(select_rng, rate, tokens.shape)  # [B, S]
    action = jax.random.uniform(action_rng, tokens.shape)  # [B, S]: which replacement
    # Uniform over the ordinary ids: draw among vocab_size - NUM_SPECIAL_TOKENS - 1 values and
    # skip over the mask id.
    ordinary_count = vocab_size - NUM_SPECIAL_TOKENS - (NUM_SPECIAL_TOKENS <= mask_id < vocab_size)
    random_tokens = NUM_SPECIAL_TOKENS + jax.random.randint(random_rng, tokens.shape, 0, ordinary_count)  # [B, S]
    random_tokens = jnp.where(random_tokens >= mask_id, random_tokens + (mask_id >= NUM_SPECIAL_TOKENS), random_tokens)
    replaced = jnp.where(
        action < mask_fraction,
        mask_id,
        jnp.where(action < mask_fraction + random_fraction, random_tokens, tokens),
    )  # [B, S]
    inputs = jnp.where(selected, replaced, tokens).astype(tokens.dtype)
    return MaskedTokens(inputs=inputs, targets=tokens, weights=selected.astype(jnp.float32))


def check_masking(mask_id: int, vocab_size: int, rate: float, mask_fraction: float, random_fraction: float) -> None:
    """A ValueError naming the setting for masking that is not BERT's kind: a rate outside (0, 1]
    (0, or NaN, selects nothing, and every loss reads no position; above 1 it is 1), fractions
    outside [0, 1] or summing above 1 (the kept share would be negative), or a mask id that is
    special or outside the vocabulary (the embedding has no row for it)."""
    if not 0.0 < rate <= 1.0:
        raise ValueError(f"masking rate={rate}: must be in (0, 1], the share of ordinary tokens selected")
    for name, value in (("mask_fraction", mask_fraction), ("random_fraction", random_fraction)):
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"masking {name}={value}: must be in [0, 1], a share of the selected tokens")
    if mask_fraction + random_fraction > 1.0:
        raise ValueError(
            f"masking mask_fraction={mask_fraction} + random_fraction={random_fraction} is above 1: "
            "the rest of the selected tokens are kept"
        )
    if not NUM_SPECIAL_TOKENS <= mask_id < vocab_size:
        raise ValueError(
            f"mask_id={mask_id}: must be an ordinary id of the vocabulary, "
            f"from {NUM_SPECIAL_TOKENS} to {vocab_size - 1}"
        )
