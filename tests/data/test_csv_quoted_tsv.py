"""A TSV file that a CSV writer wrote, as pandas' to_csv(sep="\t") does by default (Python's csv
module, QUOTE_MINIMAL: a field holding a double quote in double quotes, its own doubled), is
refused in one line naming the file, the line and the fix, before anything is prepared: read as it
is, the model would train on the quotes the writer added. Ordinary text that merely holds double
quotes is read as it is, quotes and all, and so is the file written as the refusal says. A text
that holds a tab or a line break, which the writer puts in double quotes, breaks its TSV line:
that line's error names the quoted text, not the tab count alone."""

import csv
import io
import re

import pytest

from jaxformer.data.parallel_text import DataError, read_tsv_column, read_tsv_pairs
from jaxformer.data.sources import get_builder, prepare
from jaxformer.data.tsv_quoting import csv_quoted
from tests.data.parallel_corpus import pairs, read, section, write_bytes

QUOTED = ('He said "hi" to her.', "Il lui a dit « salut ».")
FIX = (
    "write the file unquoted (pandas: to_csv(path, sep='\\t', header=False, index=False, quoting=csv.QUOTE_NONE), "
    "quoting=3; R: write.table(..., quote=FALSE)), or read it back with csv.reader(..., delimiter='\\t') and write "
    "each pair as source<TAB>target"
)
BREAKS_FIX = (
    "replace the tabs and line breaks in the text with spaces (pandas: df.replace(r'[\\t\\r\\n]+', ' ', regex=True); "
    "R: gsub('[\\t\\r\\n]+', ' ', column)) and write the file unquoted (pandas: to_csv(path, sep='\\t', header=False, "
    "index=False, quoting=csv.QUOTE_NONE); R: write.table(..., sep='\\t', quote=FALSE))"
)
TAB_COUNT = "each line must be source<TAB>target, with one tab"
WITH_A_TAB = ("Nom :\tAlice", "名前：アリス")
OVER_TWO_LINES = ("Première ligne.\nDeuxième ligne.", "一行目。二行目。")


def written_by_csv(path, rows, **options):
    """`rows` as pandas' to_csv(path, sep="\t", header=False, index=False, **options) writes them:
    through Python's csv module, lines ended by \\n (unless `options` say otherwise)."""
    text = io.StringIO()
    csv.writer(text, **{"delimiter": "\t", "lineterminator": "\n"} | options).writerows(rows)
    return str(write_bytes(path, text.getvalue().encode()))


def refusal(tmp_path, train, **data):
    """The one-line error preparing data.files.train=`train` gives (as a run prepares it, before its
    tokenizer is trained on it), which leaves nothing prepared."""
    with pytest.raises(DataError) as caught:
        prepare(get_builder(section(tmp_path, train=train, validation_holdout=2, **data)))
    assert "\n" not in str(caught.value)
    assert not (tmp_path / "tfds" / "parallel_files").exists()  # nothing prepared, no tokenizer trained on it
    return str(caught.value)


def test_csv_quoted_fields_are_told_apart_from_text_with_quotes():
    assert csv_quoted('"He said ""hi"""') and csv_quoted('"""Hi,"" she said."') and csv_quoted('""""')
    assert not csv_quoted('"Hi," she said.')  # text opening with a quote
    assert not csv_quoted('"Yes."')  # a quotation: a writer that quotes minimally leaves it unquoted
    assert not csv_quoted('"A" and "B"')  # quotes between the outer ones not doubled
    assert not csv_quoted('"a"""b"')  # three in a row: one of them not doubled
    assert not csv_quoted('""') and not csv_quoted('"')


def test_a_file_written_with_pandas_default_quoting_is_refused_naming_the_line(tmp_path):
    rows = [*pairs(0, 20), QUOTED, *pairs(20, 5)]
    train = written_by_csv(tmp_path / "train.tsv", rows)
    assert (tmp_path / "train.tsv").read_text().split("\n")[20] == '"He said ""hi"" to her."\tIl lui a dit « salut ».'
    assert refusal(tmp_path, train) == (
        f'{train}: line 21\'s source text "He said ""hi"" to her." is CSV-quoted (in double quotes, each of its own '
        "quotes doubled, as pandas' to_csv writes by default); a TSV line is read as it is, so its quotes would be "
        f"trained on: {FIX}"
    )
    # ... the target side too, and a quote that only opens the text ("Hi," she said.) is quoted as well.
    target = written_by_csv(tmp_path / "target.tsv", [*pairs(0, 3), ("Elle a dit : « Salut ! »", '"Hi!" she said.')])
    assert refusal(tmp_path, target).startswith(f'{target}: line 4\'s target text """Hi!"" she said." is CSV-quoted')


def test_a_file_that_quotes_every_field_is_refused(tmp_path):
    train = written_by_csv(tmp_path / "all.tsv.gz", pairs(0, 20), quoting=csv.QUOTE_ALL)
    assert refusal(tmp_path, train) == (
        f'{train}: the source and target text of all its 20 lines is in double quotes (line 1: "{pairs(0, 1)[0][0]}"), '
        "as a CSV writer quoting every field writes it (pandas' quoting=csv.QUOTE_ALL, R's write.table); a TSV line "
        f"is read as it is, so its quotes would be trained on: {FIX}"
    )


def test_text_with_double_quotes_is_read_as_it_is(tmp_path):
    texts = [
        ('"Hi," she said.', "« Salut », dit-elle."),  # opens with a quote, ends without one
        ('"Yes."', '"Oui."'),  # one line in quotes on both sides: two quotations
        ('He said "hi".', 'Il a dit "salut".'),
        ('""', "deux guillemets"),
    ]
    rows = [*pairs(0, 10), *texts]
    train = write_bytes(tmp_path / "train.tsv", "".join(f"{s}\t{t}\n" for s, t in rows).encode())
    builder = get_builder(section(tmp_path, train=str(train), validation_holdout=2))
    assert sorted(read(builder, "train") + read(builder, "validation")) == sorted(rows)


def test_the_file_written_as_the_refusal_says_is_read_with_its_quotes(tmp_path):
    # pandas' quoting=csv.QUOTE_NONE writes with no quote character (quotechar None): text as it is.
    rows = [*pairs(0, 10), QUOTED, ('"Hi!" she said.', "« Salut ! » dit-elle.")]
    train = written_by_csv(tmp_path / "train.tsv", rows, quoting=csv.QUOTE_NONE, quotechar=None)
    builder = get_builder(section(tmp_path, train=train, validation_holdout=2))
    assert sorted(read(builder, "train") + read(builder, "validation")) == sorted(rows)


def test_a_language_model_is_refused_only_the_quoting_of_the_column_it_reads(tmp_path):
    path = tmp_path / "train.tsv"
    written_by_csv(path, [*pairs(0, 3), ("Elle a dit : « Salut ! »", '"Hi!" she said.')])
    assert [text for _, text in read_tsv_column(path, 0)][-1] == "Elle a dit : « Salut ! »"
    with pytest.raises(DataError, match=r"train\.tsv: line 4's target text .* is CSV-quoted"):
        list(read_tsv_column(path, 1))


def split_by(quoted_text: str, side: str, held: str) -> str:
    return (
        f"CSV-quoted pair whose {side} text {quoted_text} holds a {held} in double quotes (as pandas' to_csv writes "
        f"such a text); a TSV line is read as it is, and its text cannot hold a tab or line break: {BREAKS_FIX}"
    )


@pytest.mark.parametrize("quoting", [csv.QUOTE_MINIMAL, csv.QUOTE_ALL])
def test_a_quoted_text_with_a_tab_or_line_break_is_named_where_it_breaks_the_line(tmp_path, quoting):
    train = written_by_csv(tmp_path / "train.tsv", [*pairs(0, 20), WITH_A_TAB, *pairs(20, 5)], quoting=quoting)
    assert refusal(tmp_path, train) == (
        f"{train}: line 21 has 2 tabs; {TAB_COUNT}, but line 21 is one " + split_by('"Nom :\\tAlice"', "source", "tab")
    )
    # pandas 3.1.1's to_csv(sep="\t", header=False, index=False) wrote this line so: one record over two lines.
    train = written_by_csv(tmp_path / "train.tsv", [*pairs(0, 20), OVER_TWO_LINES, *pairs(20, 5)], quoting=quoting)
    if quoting == csv.QUOTE_MINIMAL:
        assert (tmp_path / "train.tsv").read_text().split("\n")[20:22] == [
            '"Première ligne.',
            'Deuxième ligne."\t一行目。二行目。',
        ]
    assert refusal(tmp_path, train) == (
        f"{train}: line 21 has 0 tabs; {TAB_COUNT}, but lines 21-22 are one "
        + split_by('"Première ligne.\\nDeuxième ligne."', "source", "line break")
    )


def test_a_target_over_lines_is_named_from_the_line_it_opens(tmp_path):
    # Line 4 (source<TAB>"first line) has its one tab; the blank line inside the quotes reads as a
    # pair without text; the record's last line, without a tab, is the one refused.
    path = written_by_csv(tmp_path / "train.tsv", [*pairs(0, 3), ("Deux lignes.", "一行目。\n\n二行目。")])
    with pytest.raises(DataError) as caught:
        list(read_tsv_pairs(path))
    assert str(caught.value) == (
        f"{path}: line 6 has 0 tabs; {TAB_COUNT}, but lines 4-6 are one "
        + split_by('"一行目。\\n\\n二行目。"', "target", "line break")
    )


@pytest.mark.parametrize(
    "lines, number, tabs",
    [
        (['He said "hi\tthere" to her.\tIl a dit.'], 1, 2),  # quotes inside the text, not around it
        (['"Hi," she\tsaid.\tElle a dit.'], 1, 2),  # a quote that opens the text, closed before its end
        (['"Hi, she said.', *map("\t".join, pairs(0, 3))], 1, 0),  # a quote left open, never closed
        (['Une\t"Salut.', *map("\t".join, pairs(0, 3)), "a\tb\tc"], 5, 2),  # likewise, the bad line later
        (["a\tb\tc"], 1, 2),  # no quote at all
    ],
)
def test_a_line_with_quotes_in_its_text_keeps_the_tab_count_error(tmp_path, lines, number, tabs):
    path = write_bytes(tmp_path / "train.tsv", ("\n".join(lines) + "\n").encode())
    with pytest.raises(DataError) as caught:
        list(read_tsv_pairs(path))
    assert str(caught.value) == f"{path}: line {number} has {tabs} tabs; {TAB_COUNT}"


def test_the_file_written_as_the_break_refusal_says_is_read(tmp_path):
    spaced = [tuple(re.sub(r"[\t\r\n]+", " ", text) for text in pair) for pair in (WITH_A_TAB, OVER_TWO_LINES)]
    path = written_by_csv(tmp_path / "train.tsv", spaced, quoting=csv.QUOTE_NONE, quotechar=None)
    assert [pair for _, *pair in read_tsv_pairs(path)] == [
        ["Nom : Alice", "名前：アリス"],
        ["Première ligne. Deuxième ligne.", "一行目。二行目。"],
    ]
