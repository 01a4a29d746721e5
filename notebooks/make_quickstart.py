"""Writes notebooks/quickstart.ipynb (without outputs) from the cells below: edit here, then run
`python notebooks/make_quickstart.py`. tests/test_notebook.py checks the two agree.

The repository's address comes from pyproject.toml ([project.urls] Repository), the one place
it is written; README.md's Colab badge is COLAB_URL (tests/test_notebook.py checks it)."""

import pathlib
import tomllib

import nbformat

ROOT = pathlib.Path(__file__).parents[1]
REPOSITORY = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["urls"]["Repository"]
COLAB_URL = (
    REPOSITORY.replace("https://github.com/", "https://colab.research.google.com/github/")
    + "/blob/main/notebooks/quickstart.ipynb"
)


def markdown(text):
    return nbformat.v4.new_markdown_cell(text.strip())


def code(text, *tags):
    cell = nbformat.v4.new_code_cell(text.strip())
    if tags:
        cell.metadata["tags"] = list(tags)
    return cell


CELLS = [
    markdown(f"""
# jaxformer quickstart

The encoder-decoder Transformer of *Attention Is All You Need* (Vaswani et al., 2017) in JAX and
Flax: look at its pieces, train a small English-German model on Multi30k, translate with greedy
and beam search, score with sacreBLEU, and look at what the decoder attends to.

`QUICK = True` shrinks everything so the notebook runs in a few minutes on two CPU cores (the
tests run it that way); with `QUICK = False` the model trains long enough to translate simple
sentences: a few minutes on a GPU or TPU runtime, longer on a CPU one.

Source: [{REPOSITORY}]({REPOSITORY}).
"""),
    code("""
import os

QUICK = os.environ.get("JAXFORMER_QUICK", "0") == "1"  # set QUICK = True for a fast run
"""),
    markdown(f"""
## 1. Install and find the accelerators

The next cell installs jaxformer when it is not installed yet, from `JAXFORMER_PACKAGE`: by
default [the repository]({REPOSITORY}). Without access to it (offline, or to try local
changes), install from a clone instead: `pip install -e /path/to/clone` before starting the
notebook, or set `JAXFORMER_PACKAGE` (in the cell, or as an environment variable) to the clone's
folder or to a wheel built in it with `rm -rf build dist && pip wheel --no-deps -w dist .` (setuptools
builds from `build/lib`, where a module a later version removed would still be). It installs matplotlib
too, for the plots, where it is missing.
"""),
    code(f"""
import importlib

REPOSITORY_URL = "{REPOSITORY}"
# What `pip install` gets: the repository, or a clone's folder, or the path of a wheel.
JAXFORMER_PACKAGE = os.environ.get("JAXFORMER_PACKAGE", f"jaxformer @ git+{{REPOSITORY_URL}}")
try:
    import jaxformer
except ImportError:  # on Colab: install it (JAX comes with the runtime)
    from importlib.metadata import PackageNotFoundError, version

    try:  # sentencepiece 0.2.3's model proto needs protobuf >= 7.36.1 (README: Installing)
        protobuf = tuple(int(part) for part in version("protobuf").split(".")[:3])
    except (PackageNotFoundError, ValueError):
        protobuf = None  # pip installs a protobuf new enough
    # A runtime whose protobuf is pinned older (for tensorflow) keeps it, with a sentencepiece for it.
    older = protobuf is not None and protobuf < (7, 36, 1)
    SENTENCEPIECE = "sentencepiece>=0.2,<0.2.3" if older else "sentencepiece>=0.2"
    %pip install -q "{{JAXFORMER_PACKAGE}}" "{{SENTENCEPIECE}}"
    importlib.invalidate_caches()  # see the newly installed package
    import jaxformer
else:
    if "JAXFORMER_PACKAGE" in os.environ:
        print(
            f"jaxformer is installed already (in {{os.path.dirname(jaxformer.__file__)}}), so "
            f"JAXFORMER_PACKAGE={{JAXFORMER_PACKAGE}} was not installed again (to install it anew: "
            "pip uninstall -y jaxformer, restart the runtime, run this cell again)"
        )
try:
    import matplotlib  # the plots below (Colab has it; the `notebook` extra installs it elsewhere)
except ImportError:
    %pip install -q matplotlib
    importlib.invalidate_caches()

import jax

print("jaxformer", jaxformer.__version__, "from", os.path.dirname(jaxformer.__file__), "| jax", jax.__version__)
print("backend:", jax.default_backend(), "| devices:", jax.devices())
"""),
    markdown("""
## 2. The pieces

Pure functions do the maths. The sinusoidal positional encoding (section 3.5) gives every
position a pattern of sines and cosines of geometrically spaced wavelengths:
"""),
    code(
        """
%matplotlib inline
import matplotlib.pyplot as plt
import numpy as np

from jaxformer import causal_mask, decoder_self_mask, sinusoidal_table

table = sinusoidal_table(100, 256)  # [positions, d_model]
plt.figure(figsize=(10, 3))
plt.imshow(table, aspect="auto", cmap="RdBu")
plt.xlabel("dimension"); plt.ylabel("position"); plt.colorbar(); plt.title("PE(pos, i)")
plt.show()
""",
        "plot",
    ),
    markdown("""
Masks are boolean arrays, True where a query may attend to a key: the decoder's causal mask,
and the same mask combined with padding for a target of 5 real tokens padded to 8:
"""),
    code(
        """
import jax.numpy as jnp

target = jnp.array([[3, 17, 25, 9, 1, 0, 0, 0]])  # BOS, three tokens, EOS, padding
fig, axes = plt.subplots(1, 2, figsize=(8, 4))
axes[0].imshow(causal_mask(8)[0, 0], cmap="Greys"); axes[0].set_title("causal")
axes[1].imshow(decoder_self_mask(target)[0, 0], cmap="Greys"); axes[1].set_title("causal + padding")
for axis in axes:
    axis.set_xlabel("key position"); axis.set_ylabel("query position")
plt.show()
""",
        "plot",
    ),
    markdown("""
The learning rate rises linearly for `warmup_steps`, then decays with the inverse square root of
the step (section 5.3): `lr = d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)`.
"""),
    code(
        """
from jaxformer.training.optimizer import rsqrt_schedule

steps = np.arange(1, 20_000)
for d_model, warmup in [(512, 4000), (512, 8000), (256, 4000)]:
    plt.plot(steps, rsqrt_schedule(d_model, warmup)(steps - 1), label=f"d_model={d_model}, warmup={warmup}")
plt.xlabel("step"); plt.ylabel("learning rate"); plt.legend()
plt.show()
""",
        "plot",
    ),
    markdown("""
## 3. Train on Multi30k

Multi30k (Elliott et al., 2016) ships inside the package: 29,000 English image descriptions with
German translations. The model is the one `jaxformer/configs/multi30k.py` trains, read from it;
the rest of that config is shortened here for a notebook. Every key is documented in
`jaxformer.training.experiment.default_config()`.
"""),
    code("""
import logging

from jaxformer.commands.common import configure_logging
from jaxformer.configs import multi30k
from jaxformer.training.experiment import default_config, model_section
from jaxformer.training.loop import train_and_evaluate

accelerator = jax.default_backend() != "cpu"
default = multi30k.get_config()
config = default_config()
config.model = default.model  # the default's model, whole: widths, layers, dropout
config.data.max_length = default.data.max_length
config.data.batch_size = default.data.batch_size
config.tokenizer = default.tokenizer  # the default's vocabularies, whole: one per language, their size
config.training.num_train_steps = 3000 if accelerator else 400
# The default's optimizer, whole (AdamW with weight decay, warmup, then a linear decay that ends with
# the run). 400 steps on a CPU warm up for a quarter of them to the default's peak rate.
warmup = default.optimizer.warmup_steps if accelerator else 100
config.optimizer = default.optimizer
config.optimizer.learning_rate_scale *= (warmup / config.optimizer.warmup_steps) ** 0.5  # the same peak
config.optimizer.warmup_steps = warmup
config.training.eval_every_steps = config.training.checkpoint_every_steps = 200
config.training.log_every_steps = 50
config.data.max_eval_examples = 500
if QUICK:  # a toy model for a smoke run: its translations are not meant to be good
    config.model = model_section("tiny")
    config.model.share_embeddings = False  # separate vocabularies, as the default's
    config.tokenizer.vocab_size = 1000
    config.tokenizer.max_sentences = 6000
    config.data.max_length, config.data.batch_size = 48, 8
    config.data.max_eval_examples = 64
    config.optimizer.warmup_steps, config.optimizer.learning_rate_scale = 50, 2.0
    config.training.num_train_steps = 60
    config.training.eval_every_steps = config.training.checkpoint_every_steps = 30
    config.training.log_every_steps = 10

workdir = "runs/quickstart"
configure_logging(logging.INFO)  # the training log below the cell, as jaxformer-train prints it
last = train_and_evaluate(config, workdir)  # run the cell again to resume from the last checkpoint
print(last)
"""),
    code(
        """
import json

from jaxformer.run.directory import RunDirectory  # where a run keeps its checkpoints, tokenizer and metrics

records = [json.loads(line) for line in open(RunDirectory(workdir).metrics_file)]
train = [(r["step"], r["train/loss"]) for r in records if "train/loss" in r]
valid = [(r["step"], r["eval/loss"]) for r in records if "eval/loss" in r]
plt.plot(*zip(*train), label="training loss (label-smoothed)")
plt.plot(*zip(*valid), "o-", label="validation loss")
plt.xlabel("step"); plt.ylabel("loss"); plt.legend()
plt.show()
""",
        "plot",
    ),
    markdown("""
## 4. Translate and score

`Translator.from_workdir` loads the config, the tokenizer and the newest checkpoint. Greedy search
takes the most likely token at each step; beam search (beam 4, length penalty 0.6, as in the
paper) keeps the four best prefixes.
"""),
    code("""
from jaxformer import DecodeSettings, Translator

sentences = ["A man is riding a bicycle.", "Two dogs are playing in the snow.", "A little girl is eating an apple."]
greedy = Translator.from_workdir(workdir, settings=DecodeSettings(method="greedy"))
beam = Translator.from_workdir(workdir, settings=DecodeSettings(method="beam", beam_size=4, alpha=0.6))
for sentence, greedy_output, beam_output in zip(sentences, greedy.translate(sentences), beam.translate(sentences)):
    print(f"{sentence}\\n  greedy: {greedy_output}\\n  beam 4: {beam_output}")
"""),
    code("""
import sacrebleu

from jaxformer.data.pipeline import record_text
from jaxformer.data.sources import get_builder, load_split

test = load_split(get_builder(config.data), "test_2016_flickr", ("en", "de"))  # the run's data section
rows = test.__getitems__(list(range(40 if QUICK else 300)))
sources = [record_text(row, "en") for row in rows]
references = [record_text(row, "de") for row in rows]
hypotheses = beam.translate(sources)
bleu = sacrebleu.corpus_bleu(hypotheses, [references])
print(f"sacreBLEU on {len(rows)} sentences of test_2016_flickr: {bleu.score:.1f}  ({bleu})")
"""),
    markdown("""
## 5. Where the decoder looks

Every attention layer can hand back its weights: `apply(..., mutable=["intermediates"])`
collects them. Here, the last decoder layer's cross-attention, averaged over heads, for the beam
translation of one sentence: each row is a target token, each column a source token.
"""),
    code(
        """
from jaxformer import BOS_ID, Transformer

model = Transformer(beam.config)
source_ids = beam.tokenizer.encode(sentences[0])  # ends with EOS
output_ids = beam.target_tokenizer.encode(beam.translate(sentences[:1])[0])  # German: the target's vocabulary
decoder_input = np.concatenate([[BOS_ID], output_ids[:-1]])  # teacher forcing: BOS + shifted output
_, state = model.apply({"params": beam.params}, source_ids[None], decoder_input[None], mutable=["intermediates"])
last_layer = f"layer_{beam.config.num_decoder_layers - 1}"
(weights,) = state["intermediates"]["decoder"][last_layer]["cross_attention"]["attention_weights"]  # [1, N, T, S]
plt.figure(figsize=(7, 6))
plt.imshow(np.asarray(weights[0].mean(axis=0)), cmap="viridis", aspect="auto")
plt.xticks(range(len(source_ids)), beam.tokenizer.pieces(source_ids), rotation=90)
plt.yticks(range(len(output_ids)), beam.target_tokenizer.pieces(output_ids))
plt.xlabel("source"); plt.ylabel("target"); plt.colorbar()
plt.show()
""",
        "plot",
    ),
    markdown("""
## 6. From your own JAX code

The model is a Flax module and decoding a pure function of arrays: jit them and call them on
token ids, as any other JAX program would.
"""),
    code("""
from jaxformer import make_generate_fn

@jax.jit
def logits_fn(params, source, target):
    return model.apply({"params": params}, source, target)  # [B, T, V] float32

source = jnp.asarray(np.stack([np.pad(ids, (0, 24 - len(ids))) for ids in beam.tokenizer.encode(sentences)]))  # [B, S]
target = jnp.full((len(sentences), 1), BOS_ID)
print("next-token logits:", logits_fn(beam.params, source, target).shape)

generate = make_generate_fn(beam.config, DecodeSettings(beam_size=4))  # jitted beam search with the KV cache
tokens, scores = generate(beam.params, source)  # [B, 4, S + 50], [B, 4]
print("beam output:", tokens.shape, "scores:", np.round(np.asarray(scores), 2))
best = [beam.target_tokenizer.decode(row[0]) for row in np.asarray(tokens)]  # ids of the target's vocabulary
print(best)
print("the same as beam.translate:", best == beam.translate(sentences))
"""),
]


def build() -> nbformat.NotebookNode:
    notebook = nbformat.v4.new_notebook(cells=CELLS)
    for index, cell in enumerate(notebook.cells):
        cell.id = f"cell-{index:02d}"  # stable ids: regenerating gives the same file
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    notebook.metadata["language_info"] = {"name": "python"}
    notebook.metadata["colab"] = {"provenance": []}
    notebook.metadata["accelerator"] = "GPU"
    return notebook


if __name__ == "__main__":
    path = pathlib.Path(__file__).with_name("quickstart.ipynb")
    nbformat.write(build(), path)
    print(f"wrote {path}")
