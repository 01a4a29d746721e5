"""README's commands for language models on your own text ("Your own data", "One language's text
for a language model"): a causal LM on German files with no English one beside them, resumed,
continued by jaxformer-generate; a masked LM on a plain English text file."""

import shlex

import numpy as np
import pytest

from jaxformer.commands import evaluate, generate
from jaxformer.data.parallel_text import DataError
from jaxformer.run.loading import load_checkpoint
from jaxformer.training import experiment
from jaxformer.training.config_file import apply_overrides, load_config, split_overrides
from jaxformer.training.loop import train_and_evaluate
from tests.data.test_monolingual_files import english, german, write_lines
from tests.training.test_language_models import TINY
from tests.training.test_loop import ROOT

CAUSAL_COMMAND = (
    "jaxformer-train --config multi30k_lm --workdir runs/de_lm --config.data.name=parallel_files "
    "--config.data.target_language=de --config.data.files.train='corpus/train.{lang}.gz' "
    "--config.data.files.validation=corpus/dev.txt"
)
GENERATE_COMMAND = "jaxformer-generate --workdir runs/de_lm --input prompts.de --output continued.de"
MASKED_COMMAND = (
    "jaxformer-train --config multi30k_mlm --workdir runs/en_mlm --config.data.name=parallel_files "
    "--config.data.source_language=en --config.data.files.train=corpus/english.txt"
)
# What the tests add: the tiny model, trained for seconds on a few hundred generated sentences.
SHORT_RUN = [
    ("tokenizer.vocab_size", "48"),
    ("tokenizer.max_sentences", "4000"),
    ("data.validation_holdout", "20"),
    ("training.num_train_steps", "4"),
    ("training.eval_every_steps", "4"),
    ("training.checkpoint_every_steps", "4"),
    ("training.log_every_steps", "2"),
]


def test_the_commands_are_the_readmes():
    readme = " ".join((ROOT / "README.md").read_text().replace("\\\n", " ").split())
    for command in (CAUSAL_COMMAND, GENERATE_COMMAND, MASKED_COMMAND):
        assert command in readme, command


def run_readme_command(command, tmp_path, *more):
    """The README's training command, shrunk by TINY and SHORT_RUN (and `more`), as train.py runs it;
    the config it would train checked to validate as given."""
    overrides, rest = split_overrides(shlex.split(command)[1:])
    prepared_in = [("data.data_dir", str(tmp_path / "tfds"))]  # not ~/tensorflow_datasets
    shipped = load_config(rest[1])
    apply_overrides(shipped, overrides + prepared_in)
    experiment.validate(shipped)
    config = load_config(rest[1])
    tiny, _ = split_overrides(TINY)
    apply_overrides(config, overrides + prepared_in + tiny + SHORT_RUN + list(more))
    return train_and_evaluate(config, rest[3])


@pytest.mark.slow  # two tiny runs and a resume, about 40 s on 2 cores
def test_a_causal_lm_trains_on_german_files_alone_resumes_and_generates(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # the commands' relative paths are taken from here
    write_lines(tmp_path / "corpus" / "train.de.gz", [german(i) for i in range(200)])  # no train.en.gz
    write_lines(tmp_path / "corpus" / "dev.txt", [german(i) for i in range(200, 210)])  # a plain text file
    last = run_readme_command(CAUSAL_COMMAND, tmp_path)
    assert last["step"] == 4 and np.isfinite(last["train"]["loss"]) and np.isfinite(last["eval"]["loss"])
    workdir = tmp_path / "runs" / "de_lm"
    _, metadata, _ = load_checkpoint(workdir, "latest", params=False)
    tokenizer = metadata.load_tokenizer()
    assert tokenizer.vocab_size == 48 and 2 not in tokenizer.encode("Der Hund läuft über die Wiese.")  # no <unk>

    write_lines(tmp_path / "prompts.de", ["Der Hund", "Eine Frau"])
    assert generate.main(shlex.split(GENERATE_COMMAND)[1:] + ["--max_new_tokens", "4"]) == 0
    continued = (tmp_path / "continued.de").read_text().splitlines()
    assert len(continued) == 2 and continued[0].startswith("Der Hund") and continued[1].startswith("Eine Frau")
    # evaluate scores translators: a language model's run is refused in one line, before any data is read.
    capsys.readouterr()
    assert evaluate.main(["--workdir", "runs/de_lm", "--split", "validation"]) == 2
    refusal = capsys.readouterr().err.strip()
    assert "runs/de_lm holds a decoder_only model" in refusal and "\n" not in refusal, refusal

    # An English file beside it, never read, changes nothing: the run resumes ...
    write_lines(tmp_path / "corpus" / "train.en.gz", [english(i) for i in range(200)])
    assert run_readme_command(CAUSAL_COMMAND, tmp_path, ("training.num_train_steps", "6"))["step"] == 6
    # ... but an edited German file is other data.
    write_lines(tmp_path / "corpus" / "train.de.gz", [german(i) for i in range(199)])
    with pytest.raises(DataError, match=r"runs/de_lm was trained on other data files .*train\.de"):
        run_readme_command(CAUSAL_COMMAND, tmp_path, ("training.num_train_steps", "8"))


@pytest.mark.slow  # a tiny run, about 15 s on 2 cores
def test_a_masked_lm_trains_on_a_plain_english_text_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_lines(tmp_path / "corpus" / "english.txt", [english(i) for i in range(210)])
    last = run_readme_command(MASKED_COMMAND, tmp_path)
    assert last["step"] == 4 and np.isfinite(last["eval"]["loss"]) and 0.0 <= last["eval"]["accuracy"] <= 1.0
    _, metadata, _ = load_checkpoint(tmp_path / "runs" / "en_mlm", "latest", params=False)
    assert metadata.model_config().architecture == "encoder_only" and metadata.load_tokenizer().mask_id is not None
