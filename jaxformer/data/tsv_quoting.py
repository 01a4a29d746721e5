"""A TSV file written by a CSV writer: pandas' `to_csv(sep="\\t")` wraps, by default, a field that
holds a double quote in double quotes and doubles each of its own (He said "hi" is written
"He said ""hi"" and the closing quote); R's `write.table` and pandas' `quoting=csv.QUOTE_ALL`
wrap every field. A TSV line is read as it is (as fairseq and t5x read theirs), so such a file
would be trained on, or scored, with the quotes its writer added. It is refused, naming the
line, rather than read as CSV, which would mangle ordinary text instead (`"Hi," she said.` is
text, a quote and all). A CSV writer also quotes a text that holds a tab or a line break, which
break the TSV line (a tab too many, or one record over two lines): that line's error names it."""

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
    reader = csv.reader((line + "\n" for line in lines[start - 1 :]), delimiter="\t", strict=True)
    try:
        fields = next(reader)
    except (csv.Error, StopIteration):
        return None
    end = start + reader.line_num - 1
    return (fields, end) if _as_a_csv_writer_writes("\n".join(lines[start - 1 : end]), fields) else None


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
        (fields, end), breaks = record, ("\t", "\n")
        column, text = next(((c, t) for c, t in enumerate(fields) if any(b in t for b in breaks)), (None, None))
        if column is None:
            continue
        held = " and a ".join(name for mark, name in zip(breaks, ("tab", "line break")) if mark in text)
        span = f"line {start} is" if start == end else f"lines {start}-{end} are"
        shown = _shown(_quoted(text).replace("\t", "\\t").replace("\n", "\\n"))
        return (
            f"{span} one CSV-quoted pair whose {SIDE_NAMES[column]} text {shown} holds a {held} in double quotes "
            f"(as pandas' to_csv writes such a text); a TSV line is read as it is, and its text cannot hold a tab or "
            f"line break: {WRITE_WITHOUT_BREAKS}"
        )
    return None


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
