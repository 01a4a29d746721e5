"""The Transformer model: pure functions for the maths, Flax linen modules around them."""
