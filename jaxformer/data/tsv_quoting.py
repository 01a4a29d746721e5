"""A TSV file written by a CSV writer: pandas' `to_csv(sep="\\t")` wraps, by default, a field that
holds a double quote in double quotes and doubles each of its own (He said "hi" is written
"He said ""hi"" and the closing quote); R's `write.table` and pandas' `quoting=csv.QUOTE_ALL`
wrap every field. A TSV line is read as it is (as fairseq and t5x read theirs), so such a file
would be trained on, or scored, with the quotes its writer added. It is refused, naming the
line, rather than read as CSV, which would mangle ordinary text instead (`"Hi," she said.` is
text, a quote and all). A CSV writer also quotes a text that holds a tab or a line break, which
break the TSV line (a tab too many, or one record over two lines): that line's error names it.

A text holding both a tab and a line break can be written so that each of its lines still has
one tab: pandas writes the pair (a<TAB>b<NEWLINE>c, d) as `"a<TAB>b` and `c"<TAB>d`, read as the
pairs `"a` -> `b` and `c"` -> `d`. Every line looks right, so it is refused (`spanning_pair`)
where the file is one a CSV writer could have written and a record of it spans lines:

- read as CSV (tab-separated, strict: a quote opens a field only at its start, closes it only
  before a tab or the line's end, and is doubled in between) from each line with a quote that no
  record read before holds, the file is records of two fields each (or no text), each written
  as a writer writes it: in double quotes, its own doubled, or as it is where it holds no quote,
  tab or line break (`_as_a_csv_writer_writes`). A line without a quote is a record of its own;
- one of those records spans lines, each of which has one tab (or none and no text: a blank
  line inside the quotes); the first such is named. One whose line has another count of tabs
  is named by that line's error (`quoted_break`), as before.

Why every quote of the file: line by line, such a record is a field that opens with a quote
and a field of the same column on a later line that closes with one, no lone quote between,
which is also a quotation over two lines of text (`"I went home.` ... `Then I slept."`). A CSV
writer quotes every field that holds a quote, so a file with any quote it would not write
(`"Hi," she said.`, `He said "hi".`, a quote that closes before a letter, one left open at the
end) is text and is read as it is; text whose only quotes are such a quotation over lines, and
nothing else a writer would not write, is byte for byte what pandas writes for one pair, and is refused."""

from __future__ import annotations

import csv
import itertools
import pathlib
from collections.abc import Sequence

SIDE_NAMES = ("source", "target")
# Lines of text needed before "every field is in double quotes" says a writer quoted them all: one
# pair in quotes on both sides could be two quotations.
ALL_QUOTED_LINES = 2
WRITE_AS_TEXT = (
    "write the file unquoted (pandas: to_csv(path, sep='\\t', header=False, index=False, quoting=csv.QUOTE_NONE), "
    "quoting=3; R: write.table(..., quote=FALSE)), or read it back with csv.reader(..., delimiter='\\t') and write "
    "each pair as source<TAB>target"
)
# A text with a tab or line break has no TSV form: unquoted, it would split its line.
WRITE_WITHOUT_BREAKS = (
    "replace the tabs and line breaks in the text with spaces (pandas: df.replace(r'[\\t\\r\\n]+', ' ', regex=True); "
    "R: gsub('[\\t\\r\\n]+', ' ', column)) and write the file unquoted (pandas: to_csv(path, sep='\\t', header=False, "
    "index=False, quoting=csv.QUOTE_NONE); R: write.table(..., sep='\\t', quote=FALSE))"
)


def in_quotes(text: str) -> bool:
    """Whether `text` (stripped) opens and closes with a double quote."""
    return len(text) >= 2 and text[0] == text[-1] == '"'


def csv_quoted(text: str) -> bool:
    """Whether `text` (stripped) is a field as a CSV writer quotes one that holds a double quote:
    in double quotes, with every quote between them doubled, and at least one. A writer that
    quotes only where it must quotes no other field without a tab or line break, which break the
    TSV line (named as such); ordinary text seldom doubles each of its quotes."""
    if not in_quotes(text):
        return False
    inner = text[1:-1]
    return '""' in inner and '"' not in inner.replace('""', "")  # each run of quotes even


def _shown(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _quoted(text: str) -> str:
    return '"' + text.replace('"', '""') + '"'


def _as_a_csv_writer_writes(raw: str, fields: Sequence[str]) -> bool:
    """Whether `raw` is `fields` as a CSV writer writes them: each in double quotes with its own
    doubled, or, where it holds no quote, tab or line break, as it is (a writer quoting minimally)."""
    forms = [[_quoted(text)] + ([text] if not any(c in text for c in '"\t\r\n') else []) for text in fields]
    return raw in {"\t".join(written) for written in itertools.product(*forms)}


def _opens_a_quote(line: str) -> bool:
    """Whether the last field of `line` opens a double quote that it does not close (a CSV field
    that goes on past the line break)."""
    last = line.rsplit("\t", 1)[-1]
    return last.startswith('"') and '"' not in last[1:].replace('""', "")


def _record(lines: Sequence[str], start: int) -> tuple[list[str], int] | None:
    """The fields of the CSV record that opens line `start` (1-based) and the line it ends on,
    where it reads as strict CSV (no text after a closing quote, no quote left open)."""
    reader = csv.reader((lines[index] + "\n" for index in range(start - 1, len(lines))), delimiter="\t", strict=True)
    try:
        fields = next(reader)
    except (csv.Error, StopIteration):
        return None
    end = start + reader.line_num - 1
    return (fields, end) if _as_a_csv_writer_writes("\n".join(lines[start - 1 : end]), fields) else None


def _one_pair(start: int, end: int, fields: Sequence[str], read_as: str = "") -> str | None:
    """The words "lines S-E are one CSV-quoted pair whose ... text ... holds a ..." (then `read_as`)
    and the fix, for the record `fields` on lines `start` to `end`; None where neither text holds
    a tab or line break."""
    breaks = ("\t", "\n")
    column, text = next(((c, t) for c, t in enumerate(fields) if any(b in t for b in breaks)), (None, None))
    if column is None:
        return None
    held = " and a ".join(name for mark, name in zip(breaks, ("tab", "line break")) if mark in text)
    span = f"line {start} is" if start == end else f"lines {start}-{end} are"
    shown = _shown(_quoted(text).replace("\t", "\\t").replace("\n", "\\n"))
    return (
        f"{span} one CSV-quoted pair whose {SIDE_NAMES[column]} text {shown} holds a {held} in double quotes "
        f"(as pandas' to_csv writes such a text){read_as}; a TSV line is read as it is, and its text cannot hold "
        f"a tab or line break: {WRITE_WITHOUT_BREAKS}"
    )


def quoted_break(lines: Sequence[str], number: int) -> str | None:
    """Why line `number` of `lines` (a TSV file's, without their line breaks) has not one tab,
    where a CSV writer made it so: a pair's text that holds a tab or a line break, written in
    double quotes, as one record on this line or from an earlier one (a line break). Ends the
    error that names the line; None where the line is no such record's (text with a quote in it)."""
    earlier = next((start for start in range(number - 1, 0, -1) if _opens_a_quote(lines[start - 1])), None)
    for start in (number, earlier):
        record = _record(lines, start) if start else None
        if record is None or record[1] < number or len(record[0]) != 2:
            continue
        named = _one_pair(start, record[1], record[0])
        if named:
            return named
    return None


def _reads_as_one_pair(line: str) -> bool:
    """Whether a TSV line is read as a pair: one tab, or none and no text (a blank line)."""
    return line.count("\t") == 1 or not line.strip()


def _written_in_one_line(line: str) -> bool:
    """Whether `line` is two fields as a CSV writer writes them, neither with a tab or line break:
    the common case, told without reading the line as CSV (much faster)."""
    fields = line.split("\t")
    return len(fields) == 2 and all(
        '"' not in text or text == _quoted(text[1:-1].replace('""', '"')) for text in fields
    )


def spanning_pair(lines: Sequence[str]) -> tuple[int, str] | None:
    """The first line of the first CSV record of `lines` (a TSV file's, without their line breaks)
    that spans lines each read as a pair, and why ("lines S-E are one CSV-quoted pair ..."),
    where the file reads as a CSV writer writes (the module's rule); else None. Only the records
    that open on a line with a quote are read as CSV: a line without one is a record of its own
    (as a line that is not two fields, it is refused for its tabs), and most corpora have few."""
    found, after = None, 0
    for index in (index for index, line in enumerate(lines) if '"' in line):
        if index < after or _written_in_one_line(lines[index]):  # a line of the record read last, or one pair
            continue
        record = _record(lines, index + 1)
        if record is None or (len(record[0]) != 2 and "".join(record[0]).strip()):
            return None  # a quote a CSV writer does not write: the file is text
        fields, after = record
        if found is None and after > index + 1 and all(map(_reads_as_one_pair, lines[index:after])):
            found = (index + 1, after, fields)
    if found is None:
        return None
    start, end, fields = found
    source, target = (_shown(text, 30) for text in lines[start - 1].split("\t"))
    read_as = f", though each of its lines has one tab: line {start} would be read as the pair {source!r} -> {target!r}"
    return start, _one_pair(start, end, fields, read_as)


class QuotingCheck:
    """Fed a TSV file's lines (their fields) one by one, says the first field that a CSV writer
    quoted (`line`), or, once all are fed, that every field read was in double quotes (`end`):
    each a DataError's message, naming the file and the line. `columns`: the fields read (0
    source, 1 target); a language model reads one."""

    def __init__(self, path: pathlib.Path, columns: Sequence[int]):
        self._path, self._columns = path, tuple(columns)
        self._lines_with_text, self._first_with_text, self._all_quoted = 0, None, True

    def line(self, number: int, fields: Sequence[str]) -> str | None:
        texts = [fields[column].strip() for column in self._columns]
        for column, text in zip(self._columns, texts):
            if csv_quoted(text):
                return (
                    f"{self._path}: line {number}'s {SIDE_NAMES[column]} text {_shown(text)} is CSV-quoted (in double "
                    "quotes, each of its own quotes doubled, as pandas' to_csv writes by default); a TSV line is read "
                    f"as it is, so its quotes would be trained on: {WRITE_AS_TEXT}"
                )
        if all(texts):  # a line with an empty side is skipped: it says nothing of the quoting
            self._lines_with_text += 1
            self._all_quoted = self._all_quoted and all(in_quotes(text) for text in texts)
            if self._first_with_text is None:
                self._first_with_text = (number, texts[0])
        return None

    def end(self) -> str | None:
        if not self._all_quoted or self._lines_with_text < ALL_QUOTED_LINES:
            return None
        number, text = self._first_with_text
        which = "text" if len(self._columns) == 1 else "source and target text"
        return (
            f"{self._path}: the {which} of all its {self._lines_with_text:,} lines is in double quotes (line {number}: "
            f"{_shown(text)}), as a CSV writer quoting every field writes it (pandas' quoting=csv.QUOTE_ALL, R's "
            f"write.table); a TSV line is read as it is, so its quotes would be trained on: {WRITE_AS_TEXT}"
        )
