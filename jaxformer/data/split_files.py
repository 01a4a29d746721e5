"""The files a `data.files.<split>` spec names, checked before anything is hashed or read, and
the examples read from them: pairs for a translator, one language's sentences for a language model.

A spec is one of:

- a TSV file, named `*.tsv` or `*.tsv.gz`: one `source<TAB>target` pair per line (a language
  model checks both columns and reads its own);
- a path with `{lang}` in it, filled in with each language code to give one line-aligned text
  file per language (gzip when named `*.gz`): `corpus/train.{lang}.gz` -> `corpus/train.fr.gz`,
  `corpus/train.ja.gz`. A language model needs, checks and reads only its own language's file;
- any other path (`corpus.txt`, `corpus.de.gz`), for a language model only: one sentence per
  line of the language it reads.

A language model reads one side (`side`): the masked LM data.source_language's text, the causal
LM data.target_language's (training/objectives.py); a translator (`side` None) reads both.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
from collections.abc import Iterable, Sequence

from jaxformer.data.parallel_text import (
    DataError,
    SkipCounter,
    first_line,
    read_parallel_lines,
    read_sentences,
    read_tsv_column,
    read_tsv_pairs,
)
from jaxformer.data.text_lines import not_utf8_text, other_compression
from jaxformer.data.unmarked_wide_text import HEAD_BYTES

SPLITS = ("train", "validation", "test")
LANGUAGE_FIELD = "{lang}"
TSV_SUFFIXES = (".tsv", ".tsv.gz")
SIDES = ("source", "target")
# Who reads each side's text, in errors: the language model whose objective uses it.
SIDE_READERS = {"source": "a masked LM reads data.source_language", "target": "a causal LM reads data.target_language"}

Example = tuple  # (1-based line number, the text of each language read)


def prepared_splits(given: Iterable[str]) -> list[str]:
    """The splits parallel_files prepares from the data.files splits `given`: theirs, and validation
    (held out of train where no file gives it)."""
    given = set(given)
    return [split for split in SPLITS if split in given or split == "validation"]


def spec_kind(spec: str) -> str:
    """ "tsv", "lang" (a path with {lang}) or "text" (one sentence per line, for one language)."""
    if spec.lower().endswith(TSV_SUFFIXES):
        return "tsv"
    return "lang" if LANGUAGE_FIELD in spec else "text"


def read_languages(languages: Sequence[str], side: str | None) -> tuple[str, ...]:
    """The languages of (source, target) `languages` whose text is read: both, or `side`'s."""
    return tuple(languages) if side is None else (languages[SIDES.index(side)],)


@dataclasses.dataclass(frozen=True)
class SplitFiles:
    """Where one split's text is: a TSV file, or one text file per language read."""

    split: str
    spec: str  # absolute, "{lang}" kept
    tsv: pathlib.Path | None  # the TSV file, or None for text files
    by_language: dict[str, pathlib.Path]  # language -> text file (empty for a TSV file)

    def named_paths(self) -> dict[str, pathlib.Path]:
        """Fingerprint name -> path: the file's role and its name, e.g. "train.fr: train.fr.gz"."""
        if self.tsv is not None:
            return {f"{self.split}: {self.tsv.name}": self.tsv}
        return {f"{self.split}.{language}: {path.name}": path for language, path in self.by_language.items()}


def split_files(
    split: str, spec: str, languages: Sequence[str], side: str | None = None, missing_allowed: bool = False
) -> SplitFiles:
    """The files of `data.files.<split>` = `spec` that a run reading `side` of (source, target)
    `languages` needs, checked to exist (unless `missing_allowed`) and to open for reading
    (nothing is read)."""
    setting = f"data.files.{split}={spec!r}"  # as given, in errors
    if "://" in spec:  # made absolute, gs://b/x would be <cwd>/gs:/b/x, "not found"
        raise DataError(f"{setting}: the files are read from a local path; copy them to one (e.g. gsutil cp)")
    spec = os.path.abspath(os.path.expanduser(spec))
    kind = spec_kind(spec)
    if kind == "tsv" and LANGUAGE_FIELD in spec:
        raise DataError(
            f"{setting}: a TSV file holds both languages; drop {LANGUAGE_FIELD} from its name "
            "(or name line-aligned text files without .tsv)"
        )
    if kind == "text" and side is None:
        raise DataError(plain_text_for_pairs(setting, split, languages))
    read = read_languages(languages, side)
    if kind == "tsv":
        files = SplitFiles(split, spec, pathlib.Path(spec), {})
    elif kind == "lang":
        files = SplitFiles(
            split, spec, None, {language: pathlib.Path(spec.replace(LANGUAGE_FIELD, language)) for language in read}
        )
    else:
        files = SplitFiles(split, spec, None, {read[0]: pathlib.Path(spec)})
    unusable = unusable_files(files, missing_allowed)
    if unusable and kind == "lang" and side is not None:
        unusable[0] += _other_side_hint(spec, languages, side)
    if unusable:
        raise DataError(f"{setting}: {'; '.join(unusable)}")
    return files


def plain_text_for_pairs(setting: str, split: str, languages: Sequence[str]) -> str:
    """The refusal of a spec of one text file where pairs are read (a translator's run)."""
    return (
        f"{setting} is neither a TSV file (*.tsv, *.tsv.gz) nor a path with {LANGUAGE_FIELD} in it: a translator "
        f"reads pairs (e.g. corpus/{split}.{LANGUAGE_FIELD}.gz for corpus/{split}.{languages[0]}.gz and "
        f"corpus/{split}.{languages[1]}.gz); one text file serves a language model "
        "(model.architecture='decoder_only' or 'encoder_only')"
    )


def _other_side_hint(spec: str, languages: Sequence[str], side: str) -> str:
    """Where the file of the side a language model does not read is there: which side it reads."""
    other = pathlib.Path(spec.replace(LANGUAGE_FIELD, languages[1 - SIDES.index(side)]))
    if not other.is_file():
        return ""
    return f"; {other} is there, but {SIDE_READERS[side]} ({languages[SIDES.index(side)]!r}) alone"


def unusable_files(files: SplitFiles, missing_allowed: bool = False) -> list[str]:
    """One phrase per file of `files` that is not there (unless `missing_allowed`), is not a file,
    cannot be opened for reading (permissions), is compressed otherwise than gzip (xz, bzip2,
    zstd), or holds no UTF-8 text by its first bytes (gzip data not named *.gz, UTF-16 or UTF-32
    text): found before anything is hashed or prepared."""
    if files.tsv is not None:
        described = {str(files.tsv): files.tsv}
    else:
        described = {f"{path} (its {language!r} file)": path for language, path in files.by_language.items()}
    phrases = []
    for description, path in described.items():
        if not path.exists():
            if not missing_allowed:
                phrases.append(f"{description} not found")
        elif not path.is_file():
            phrases.append(f"{description} is not a file")
        else:
            try:
                with open(path, "rb") as handle:
                    head = handle.read(HEAD_BYTES)
                unread_format = other_compression(head)
                if path.suffix.lower() != ".gz":  # a .gz file's text is checked once decompressed
                    unread_format = unread_format or not_utf8_text(head)
            except OSError as error:
                phrases.append(f"{description} cannot be read ({error.strerror or error})")
            else:
                if unread_format:
                    phrases.append(f"{description} {unread_format}")
    return phrases


# Column names a TSV file's first line holds where a program wrote a header (pandas' to_csv does
# by default): read as a pair, it would be trained on, or scored in a test split.
HEADER_NAMES = (("source", "target"), ("src", "tgt"))


def refuse_a_header(path: pathlib.Path, languages: Sequence[str]) -> None:
    """DataError when line 1 of the TSV file `path` names its columns: the (source, target)
    `languages`' codes, the other way round, or one of HEADER_NAMES (any case)."""
    fields = tuple(field.strip().removeprefix("\ufeff").lower() for field in first_line(path).split("\t"))
    codes = tuple(code.lower() for code in languages)
    if fields not in {codes, codes[::-1], *HEADER_NAMES}:
        return
    order = (
        f"; its columns are {languages[1]}, {languages[0]}: the run reads source<TAB>target ({languages[0]} first)"
        if fields == codes[::-1]
        else ""
    )
    raise DataError(
        f"{path}: line 1 ({'<TAB>'.join(fields)}) names the columns, as a header does, and every line is read as "
        f"a pair: remove that line (pandas: to_csv(..., header=False)){order}"
    )


def reader_paths(files: SplitFiles, languages: Sequence[str], side: str | None) -> tuple[pathlib.Path, ...]:
    """The files `read_examples` reads `files` from, as its reader takes them: the TSV file, the
    text file of the language read, or the source's and the target's."""
    if files.tsv is not None:
        return (files.tsv,)
    if side is not None:
        return tuple(files.by_language.values())
    return tuple(files.by_language[language] for language in languages)


def read_examples(files: SplitFiles, languages: Sequence[str], side: str | None, skipped: SkipCounter) -> list[Example]:
    """(line number, text of each language read) of every example with text on each side read:
    (number, source, target) pairs, or (number, sentence) for `side`; DataError if there is none."""
    paths = reader_paths(files, languages, side)
    if side is not None and files.tsv is not None:
        examples = list(read_tsv_column(files.tsv, SIDES.index(side), skipped))
    elif side is not None:
        examples = list(read_sentences(*paths, skipped))
    elif files.tsv is not None:
        examples = list(read_tsv_pairs(files.tsv, skipped))
    else:
        examples = list(read_parallel_lines(*paths, skipped))
    if files.tsv is not None:  # once the file read: a bad byte or a damaged gzip is named as such first
        refuse_a_header(files.tsv, languages)
    if not examples:
        what = "pair with text on both sides" if side is None else f"line of {read_languages(languages, side)[0]} text"
        raise DataError(f"data.files.{files.split}={files.spec!r} holds no {what}")
    return examples
