"""Conversions between jaxformer runs and other libraries' model formats (Hugging Face MarianMT:
marian.py). Their third-party imports (torch, transformers) happen only inside the functions
that read or write those formats: the `interop` extra is optional."""
