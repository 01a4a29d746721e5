"""A TSV file that a CSV writer wrote, as pandas' to_csv(sep="\t") does by default (Python's csv
module, QUOTE_MINIMAL: a field holding a double quote in double quotes, its own doubled), is
refused in one line naming the file, the line and the fix, before anything is prepared: read as it
is, the model would train on the quotes the writer added. Ordinary text that merely holds double
quotes is read as it is, quotes and all, and so is the file written as the refusal says."""

import csv
import io

import pytest

from jaxformer.data.parallel_text import DataError, read_tsv_column
from jaxformer.data.sources import get_builder, prepare
from jaxformer.data.tsv_quoting import csv_quoted
from tests.data.parallel_corpus import pairs, read, section, write_bytes

QUOTED = ('He said "hi" to her.', "Il lui a dit « salut ».")
FIX = (
    "write the file unquoted (pandas: to_csv(path, sep='\\t', header=False, index=False, quoting=csv.QUOTE_NONE), "
    "quoting=3; R: write.table(..., quote=FALSE)), or read it back with csv.reader(..., delimiter='\\t') and write "
    "each pair as source<TAB>target"
)


def written_by_csv(path, rows, **options):
    """`rows` as pandas' to_csv(path, sep="\t", header=False, index=False, **options) writes them:
    through Python's csv module, lines ended by \\n."""
    text = io.StringIO()
    csv.writer(text, delimiter="\t", lineterminator="\n", **options).writerows(rows)
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
