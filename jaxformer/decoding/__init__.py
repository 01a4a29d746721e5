"""Decoding: search over a `tokens_to_logits(tokens, cache) -> (logits, cache)` callback."""
