"""Export for serving: a checkpoint as a self-contained directory (safetensors parameters, the
tokenizer, a serialized `jax.export` of the beam search and a plain-JAX loader, serve.py).

`exporter.export_checkpoint` writes one (the `jaxformer-export` command); `loading.load_export`
and `Translator.from_export` read one. Nothing below `commands` imports this package, except
`Translator.from_export`, lazily.
"""

# Before its helpers: export_files and export_program import their error and names from standalone, which imports them.
from jaxformer.export import standalone  # noqa: F401, E402
