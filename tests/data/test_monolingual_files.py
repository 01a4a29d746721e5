"""data.name = "parallel_files" for a language model: one language's text from {lang} files, a
TSV column or a plain text file, read, checked and fingerprinted for the side the run reads."""

import logging

import pytest

from jaxformer.data import sources
from jaxformer.data.parallel_files import ParallelFiles
from jaxformer.data.parallel_text import DataError
from jaxformer.data.sources import get_builder, load_split, prepare
from jaxformer.model.config import ConfigError
from jaxformer.training import experiment, text_sides
from jaxformer.training.config_file import load_config
from tests.data.parallel_corpus import write_bytes

SUBJECTS = ["Der Hund", "Eine Frau", "Zwei Kinder", "Ein alter Mann", "Das Mädchen", "Mein Bruder"]
ACTIONS = ["läuft über", "sitzt auf", "schaut auf", "spielt an", "wartet an"]
PLACES = ["die Wiese", "der Straße", "dem Strand", "der Brücke", "dem Markt", "den Berg", "das Wasser"]


ENGLISH = (
    ["The dog", "A woman", "Two children", "An old man", "The girl", "My brother"],
    ["runs across", "sits on", "looks at", "plays by", "waits at"],
    ["the meadow", "the street", "the beach", "the bridge", "the market", "the hill", "the water"],
)


def german(index: int) -> str:
    """The index-th German sentence; distinct for indices below 210."""
    return f"{SUBJECTS[index % 6]} {ACTIONS[index // 6 % 5]} {PLACES[index // 30 % 7]}."


def english(index: int) -> str:
    """The index-th English sentence, german(index)'s translation."""
    subjects, actions, places = ENGLISH
    return f"{subjects[index % 6]} {actions[index // 6 % 5]} {places[index // 30 % 7]}."


def write_lines(path, lines):
    return str(write_bytes(path, "".join(line + "\n" for line in lines).encode()))


def section(tmp_path, architecture="decoder_only", **files):
    """The data section of an en -> de run of `architecture`, as its config validates it."""
    config = experiment.default_config()
    config.model.architecture = architecture
    data = config.data
    data.name, data.source_language, data.target_language = "parallel_files", "en", "de"
    data.data_dir, data.validation_holdout = str(tmp_path / "tfds"), 5
    for split, spec in files.items():
        data.files[split] = spec
    return config


def builder(config):
    return get_builder(config.data, side=text_sides.text_side(config))


def read(built, language):
    source = load_split(built, "train", (language,))
    return [source[i][language].decode() for i in range(len(source))]


def test_a_causal_lm_reads_its_language_alone_from_lang_files_text_files_and_tsv(tmp_path, caplog):
    sentences = [german(i) for i in range(40)]
    spec = write_lines(tmp_path / "train.de.gz", sentences[:3] + ["", "  "] + sentences[3:]).replace(".de.", ".{lang}.")
    with caplog.at_level(logging.WARNING):
        from_lang = builder(section(tmp_path, train=spec))  # no train.en.gz exists
        kept = read(from_lang, "de")
    assert isinstance(from_lang, ParallelFiles) and set(from_lang.info.features) == {"de"}
    assert sorted(from_lang.source_files) == ["train.de: train.de.gz"]  # what is read, alone
    assert sorted(kept + read_validation(from_lang)) == sorted(sentences) and len(kept) == 35
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warned == [  # once each, though both splits were read
        f"skipped 2 lines without text in {tmp_path}/train.de.gz (first at {tmp_path}/train.de.gz:4)",
        "no data.files.validation: held out 5 of 40 training sentences as the validation split (seed 0)",
    ]

    text = builder(section(tmp_path, train=write_lines(tmp_path / "corpus.txt", sentences)))
    assert sorted(read(text, "de") + read_validation(text)) == sorted(sentences)
    assert sorted(text.source_files) == ["train.de: corpus.txt"]
    tsv_lines = [f"{english(i)}\t{sentence}" for i, sentence in enumerate(sentences)]
    tsv = builder(section(tmp_path, train=write_lines(tmp_path / "train.tsv", tsv_lines)))
    assert sorted(read(tsv, "de") + read_validation(tsv)) == sorted(sentences)
    masked = builder(section(tmp_path, "encoder_only", train=str(tmp_path / "train.tsv")))  # the other column
    assert set(masked.info.features) == {"en"} and masked.fingerprint != tsv.fingerprint
    assert sorted(read(masked, "en") + read_validation(masked)) == sorted(english(i) for i in range(40))


def read_validation(built):
    language = next(iter(built.info.features))
    source = load_split(built, "validation", (language,))
    return [source[i][language].decode() for i in range(len(source))]


def test_the_log_counts_a_language_models_texts_and_a_translators_pairs(tmp_path, caplog):
    spec = write_lines(tmp_path / "train.de", [german(i) for i in range(30)]).replace(".de", ".{lang}")
    write_lines(tmp_path / "train.en", [english(i) for i in range(30)])
    with caplog.at_level(logging.INFO):
        causal = builder(section(tmp_path, train=spec))
        read(causal, "de")
        translator = builder(section(tmp_path, "encoder_decoder", train=spec))
        load_split(translator, "train", ("en", "de"))
    said = [message for message in caplog.messages if message.startswith("parallel_files")]
    assert said == [
        f"parallel_files: fingerprint {causal.fingerprint} of 1 file in data.files (train={spec}), validation: 5 "
        f"training sentences held out (seed 0); prepared data in {causal.data_dir}",
        "parallel_files[train]: 25 texts",
        f"parallel_files: fingerprint {translator.fingerprint} of 2 files in data.files (train={spec}), validation: "
        f"5 training pairs held out (seed 0); prepared data in {translator.data_dir}",
        "parallel_files[train]: 25 pairs",
    ]


def test_the_fingerprint_covers_the_files_read_and_keeps_translators_apart(tmp_path):
    spec = write_lines(tmp_path / "train.de", [german(i) for i in range(30)]).replace(".de", ".{lang}")
    causal = builder(section(tmp_path, train=spec))
    english_file = tmp_path / "train.en"
    write_lines(english_file, [english(i) for i in range(30)])
    assert builder(section(tmp_path, train=spec)).fingerprint == causal.fingerprint  # the unused side added ...
    translator = builder(section(tmp_path, "encoder_decoder", train=spec))
    assert translator.fingerprint != causal.fingerprint and translator.data_dir != causal.data_dir
    prepare(translator)
    write_lines(english_file, [english(i) for i in range(31)])  # ... edited ...
    assert builder(section(tmp_path, train=spec)).fingerprint == causal.fingerprint
    other_source = section(tmp_path, train=spec)
    other_source.data.source_language = "fr"  # ... or another: no file of it is read
    assert builder(other_source).fingerprint == causal.fingerprint
    write_lines(tmp_path / "train.de", [german(i) for i in range(31)])  # the used one edited: other data
    edited = builder(section(tmp_path, train=spec))
    assert edited.fingerprint != causal.fingerprint
    masked = builder(section(tmp_path, "encoder_only", train=spec))
    assert sorted(masked.source_files) == ["train.en: train.en"]
    english_file.unlink()  # the unused side removed: the causal LM's data as it was
    assert builder(section(tmp_path, train=spec)).fingerprint == edited.fingerprint


def test_a_language_model_run_on_pairs_prepared_before_resumes_on_them(tmp_path):
    spec = write_lines(tmp_path / "train.de", [german(i) for i in range(30)]).replace(".de", ".{lang}")
    write_lines(tmp_path / "train.en", [english(i) for i in range(30)])
    config = section(tmp_path, train=spec)
    pairs = get_builder(config.data)  # as a causal LM's run prepared its data before it read one side alone
    assert sources.builder_for_run(config.data, "target", pairs.fingerprint).fingerprint == pairs.fingerprint
    own = builder(config).fingerprint  # a new run, or one trained on other data (refused after this)
    assert sources.builder_for_run(config.data, "target", None).fingerprint == own
    assert sources.builder_for_run(config.data, "target", "sha256:" + "0" * 64).fingerprint == own


def test_errors_name_the_file_and_language_before_anything_is_read(tmp_path):
    write_lines(tmp_path / "train.en", [english(i) for i in range(30)])
    with pytest.raises(DataError) as raised:
        builder(section(tmp_path, train=str(tmp_path / "train.{lang}")))
    assert str(raised.value) == (
        f"data.files.train={str(tmp_path / 'train.{lang}')!r}: {tmp_path}/train.de (its 'de' file) not found; "
        f"{tmp_path}/train.en is there, but a causal LM reads data.target_language ('de') alone"
    )
    with pytest.raises(DataError, match=r"train\.txt \(its 'de' file\) not found$"):
        builder(section(tmp_path, train=str(tmp_path / "train.txt")))
    write_lines(tmp_path / "blank.txt", ["", " "])
    with pytest.raises(DataError, match=r"blank\.txt' holds no line of de text$"):
        read(builder(section(tmp_path, train=str(tmp_path / "blank.txt"))), "de")
    with pytest.raises(DataError, match=r"holds no line of en text$"):  # the column a masked LM reads
        read(builder(section(tmp_path, "encoder_only", train=write_lines(tmp_path / "de.tsv", ["\tEin Hund."]))), "en")
    with pytest.raises(DataError, match=r"line 1 has 0 tabs"):  # both columns checked
        builder(section(tmp_path, train=write_lines(tmp_path / "bad.tsv", ["Ein Hund."]))).download_and_prepare()

    sentences = write_lines(tmp_path / "train.de", [german(i) for i in range(30)])
    with pytest.raises(DataError, match=r"holds the same text as .*: each split needs sentences of its own; leave"):
        builder(section(tmp_path, train=sentences.replace(".de", ".{lang}"), validation=sentences))
    with pytest.raises(DataError, match=r"holds the same sentences as .*\(in another file format\)"):
        gzipped = write_lines(tmp_path / "dev.de.gz", [german(i) for i in range(30)])
        builder(section(tmp_path, train=sentences, validation=gzipped)).download_and_prepare()

    # A translator reads pairs: one text file is refused when the config is validated, in one line.
    config = section(tmp_path, "encoder_decoder", train=str(tmp_path / "train.en"), validation="dev.{lang}")
    with pytest.raises(ConfigError) as refused:
        experiment.validate(config)
    assert str(refused.value).startswith(
        f"config data.files.train={str(tmp_path / 'train.en')!r} is neither a TSV file (*.tsv, *.tsv.gz) "
        "nor a path with {lang} in it: a translator reads pairs"
    )
    assert "one text file serves a language model" in str(refused.value) and "\n" not in str(refused.value)
    with pytest.raises(DataError, match="a translator reads pairs"):
        builder(config)
    for name in ("multi30k_lm", "multi30k_mlm"):
        lm = load_config(name)
        lm.data.name, lm.data.files.train = "parallel_files", str(tmp_path / "train.en")
        experiment.validate(lm)  # one language's text file: a language model's data
