"""Data: the Multi30k tfds builder, sentencepiece tokenizer and the grain input pipeline."""
