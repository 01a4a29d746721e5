"""A CSV writer's record over lines that each still have one tab: a text holding both a tab and a
line break, in double quotes, as pandas' to_csv(sep="\t") writes it (pandas 3.1.1's bytes are
Python's csv module's, lines ended by \n; its excel-tab dialect ends them by \r\n). Every line
reads as a pair, so the file was read without a word as wrong pairs (`"a` -> `b`, `c"` -> `d`);
it is refused naming the lines, the text and the fix, before anything is prepared. Quotes that a
CSV writer does not write (`"Hi," she said.`, one left open, one closing before a letter) say
the file is text: it is read as it is, a quotation over two lines included."""

import csv

import pytest

from jaxformer.data.parallel_text import DataError, read_tsv_column, read_tsv_pairs
from tests.data.parallel_corpus import pairs, write_tsv
from tests.data.test_csv_quoted_tsv import BREAKS_FIX, refusal, written_by_csv

WRITERS = {
    "pandas": {},
    "pandas QUOTE_ALL": {"quoting": csv.QUOTE_ALL},
    "csv excel-tab": {"dialect": "excel-tab", "lineterminator": "\r\n"},
}
# (pair, the side named, its text as the error shows it, the lines the record takes)
SPANNING = {
    "source": (("Nom :\tAlice\nÂge : 30 ans", "名前：アリス、三十歳"), "source", '"Nom :\\tAlice\\nÂge : 30 ans"', 2),
    "target": (("Nom : Alice, 30 ans", "名前：アリス\n年齢：\t30"), "target", '"名前：アリス\\n年齢：\\t30"', 2),
    "both, a blank line": (("un\tdeux\n\ntrois", "一\n二\t三"), "source", '"un\\tdeux\\n\\ntrois"', 4),
    "doubled quotes": (
        ('Il a dit "oui\tnon"\npuis il est parti.', "彼は「はい」と言って去った。"),
        "source",
        '"Il a dit ""oui\\tnon""\\npuis il est parti."',
        2,
    ),
}


def written_text(path) -> str:
    with open(path, encoding="utf-8", newline="") as handle:
        return handle.read()


def spanning_error(path, side, shown, lines):
    line = written_text(path).split("\n")[20].rstrip("\r")  # line 21, as a TSV line is read
    source, target = line.split("\t")
    return (
        f"{path}: lines 21-{20 + lines} are one CSV-quoted pair whose {side} text {shown} holds a tab and a line "
        f"break in double quotes (as pandas' to_csv writes such a text), though each of its lines has one tab: "
        f"line 21 would be read as the pair {source!r} -> {target!r}; a TSV line is read as it is, and its text "
        f"cannot hold a tab or line break: {BREAKS_FIX}"
    )


@pytest.mark.parametrize("writer", WRITERS)
@pytest.mark.parametrize("shape", SPANNING)
def test_a_record_over_lines_of_one_tab_each_is_refused(tmp_path, writer, shape):
    pair, side, shown, lines = SPANNING[shape]
    train = written_by_csv(tmp_path / "train.tsv", [*pairs(0, 20), pair, *pairs(20, 5)], **WRITERS[writer])
    assert all(line.count("\t") == 1 or not line for line in written_text(train).splitlines())  # each reads as a pair
    assert refusal(tmp_path, train) == spanning_error(train, side, shown, lines)


def test_the_refused_lines_are_those_read_as_wrong_pairs_until_now(tmp_path):
    path = written_by_csv(tmp_path / "train.tsv", [*pairs(0, 20), ("a\tb\nc", "d"), *pairs(20, 5)])
    assert written_text(path).split("\n")[20:22] == ['"a\tb', 'c"\td']  # pandas 3.1.1 wrote these bytes
    with pytest.raises(DataError) as caught:
        list(read_tsv_pairs(path))
    assert str(caught.value).startswith(
        f'{path}: lines 21-22 are one CSV-quoted pair whose source text "a\\tb\\nc" holds a tab and a line break '
        f"in double quotes (as pandas' to_csv writes such a text), though each of its lines has one tab: line 21 "
        f"would be read as the pair '\"a' -> 'b'; "
    )
    # A language model reading either column reads those lines as wrong text too.
    for column in (0, 1):
        with pytest.raises(DataError, match=r"lines 21-22 are one CSV-quoted pair whose source text"):
            list(read_tsv_column(path, column))


OVER_TWO_LINES = [('"I went home.', "Je suis rentré."), ('Then I slept."', "Puis j'ai dormi.")]


def test_a_quotation_over_lines_is_refused_unless_another_quote_says_the_file_is_text(tmp_path):
    # Alone, it is byte for byte pandas' record of one pair ("I went home.<TAB>Je suis rentré.\nThen
    # I slept.", "Puis j'ai dormi."): refused, naming what each line would be read as.
    alone = write_tsv(tmp_path / "alone.tsv", [*pairs(0, 20), *OVER_TWO_LINES])
    with pytest.raises(DataError) as caught:
        list(read_tsv_pairs(alone))
    assert str(caught.value).startswith(
        f'{alone}: lines 21-22 are one CSV-quoted pair whose source text "I went home.\\tJe suis rentré.\\nThen I '
        "slept.\" holds a tab and a line break in double quotes (as pandas' to_csv writes such a text), though each "
        "of its lines has one tab: line 21 would be read as the pair '\"I went home.' -> 'Je suis rentré.'; "
    )
    # A quote elsewhere that no CSV writer writes, before or after it: the file is text, read as it is.
    for other in [('"Hi," she said.', "« Salut », dit-elle.")], [('He said "hi".', "Il a dit « salut ».")]:
        for rows in [*pairs(0, 5), *other, *OVER_TWO_LINES], [*pairs(0, 5), *OVER_TWO_LINES, *other]:
            path = write_tsv(tmp_path / "text.tsv", rows)
            assert [tuple(pair) for _, *pair in read_tsv_pairs(path)] == rows


@pytest.mark.parametrize(
    "texts",
    [
        # the target quotes too: the quote that opens it is one no CSV writer writes inside a field
        [('"I went home.', '"Je suis rentré.'), ('Then I slept."', "Puis j'ai dormi.\"")],
        [('"I went home.', "Je suis rentré."), ("Then I slept.", "Puis j'ai dormi.")],  # a quote never closed
        [('"Wait', "Attends"), ('for me" she said.', "m'a-t-elle dit.")],  # closed before text, not a tab
        [("Attends", '"Wait'), ("m'a-t-elle dit.", 'for me" she said.')],  # the same in the target
        [('He said: hi."', "Il a dit : salut."), ('"Yes."', '"Oui."')],  # a text ending in a quote; quotations
        [('"Hello," she said.', "« Bonjour », dit-elle."), ('""', "deux guillemets")],
    ],
)
def test_quotes_in_text_on_lines_of_one_tab_are_read_as_they_are(tmp_path, texts):
    rows = [*pairs(0, 10), *texts, *pairs(10, 3)]
    path = write_tsv(tmp_path / "train.tsv", rows)
    assert [tuple(pair) for _, *pair in read_tsv_pairs(path)] == rows
