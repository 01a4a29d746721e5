"""The experiment configs shipped with jaxformer, each a Python file whose `get_config()` returns
an ml_collections.ConfigDict built on `jaxformer.training.experiment.default_config()`.

`jaxformer-train --config NAME` takes one by its file name without `.py`, and
`jaxformer-train --list_configs` names the folder they are in, then lists them with their summaries:

    multi30k        the default real run: Multi30k English->German (vendored, offline)
    multi30k_lm     a causal language model (decoder-only) on Multi30k's German side
    multi30k_mlm    a masked language model (encoder-only) on Multi30k's English side
    parallel_files  your own parallel text files (data.files), a small model
    tiny            a tiny model on a slice of Multi30k: seconds on a CPU; used by the tests
    wmt14_base      the paper's base model on WMT14 English->German
    wmt14_big       the paper's big model on WMT14 English->German

For an experiment of your own, copy one of these files anywhere and pass its path:
`jaxformer-train --config path/to/my_config.py`. The files are not imported by the package: only
`jaxformer.training.config_file` loads them, by path (multi30k_lm takes multi30k's model section,
multi30k_mlm builds on multi30k_lm).
"""
