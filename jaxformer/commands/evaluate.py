"""Translate a test set and score it: cased detokenized sacreBLEU with its signature, chrF,
and lowercased tokenized BLEU (`jaxformer-evaluate`; `python evaluate.py` in a clone).

    jaxformer-evaluate --workdir runs/m30k --split test_2016_flickr
    jaxformer-evaluate --workdir runs/mine --split test      (data.name="parallel_files" with data.files.test)
    jaxformer-evaluate --workdir runs/m30k --source test.en --reference test.de --output hyp.de
"""

from __future__ import annotations

if __name__ == "__main__":  # `python -m`: launched as the console script is, before jax loads (launch.py)
    from jaxformer.commands.launch import run_as_main

    run_as_main("jaxformer.commands.evaluate")

import argparse
import dataclasses
import json
import logging
import time
from collections.abc import Callable, Iterable

import ml_collections

from jaxformer.commands.common import (
    FlagError,
    add_overwrite_flag,
    at_least,
    check_stdout_open,
    make_parser,
    path_text,
    print_report,
    run_command,
)
from jaxformer.commands.decoding_flags import (
    add_decoding_flags,
    check_search_flags,
    decode_settings_from_flags,
    final_search,
    translator_from_flags,
)
from jaxformer.commands.path_checks import check_readable_file, check_workdir, check_writable_file, one_file
from jaxformer.data.parallel_text import DataError, skipped_pairs_text
from jaxformer.data.tokenizer import Tokenizer
from jaxformer.decoding import sentence_batches
from jaxformer.decoding.scoring import (
    BLEU_TOKENIZERS,
    bleu_tokenizer,
    bleu_tokenizer_problem,
    corpus_scores,
    format_scores,
)
from jaxformer.errors import UserError
from jaxformer.files import write_text_atomically
from jaxformer.run.loading import load_checkpoint

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class FileLines:
    """Where a split's pairs are in the user's file, when pairs with an empty side were left out
    of it as it was prepared: `--output` keeps one line per line of the file."""

    numbers: list[int]  # the 1-based line of each pair scored
    total: int  # the lines of the file (of the first of them, up to the last pair scored, with --max_examples)


Pair = tuple[int, str, str]  # (1-based line in the user's file, source, reference)


def split_pairs(
    workdir: str, split: str, max_examples: int | None, tokenizers: tuple[Tokenizer, Tokenizer]
) -> tuple[list[str], list[str], FileLines | None]:
    """(sources, references) of a split of the run's own dataset and language pair, and where
    they are in the user's file if it had lines that are not scored (else None)."""
    from jaxformer.data.pipeline import read_records, record_text
    from jaxformer.data.sources import check_same_data, get_builder, load_split

    _, metadata, _ = load_checkpoint(workdir, "latest", params=False)
    data = metadata.config["data"]
    languages = (data["source_language"], data["target_language"])
    # The run's split only comes from the data it was trained on: with other or edited files a
    # held-out validation split could hold training pairs, and a test file would not be the run's.
    # Files of other splits may be gone: the split is then read from the copy prepared from them all.
    remedy = "restore the files, or score files of your own with --source and --reference"
    trained_on, trained_files = metadata.data_fingerprint, data.get("files")
    builder = get_builder(ml_collections.ConfigDict(data), prepared_from=trained_on)
    check_same_data(builder, trained_on, workdir, remedy, trained_files)  # files known up front: before preparing
    records = load_split(builder, split, languages, given_as=f"--split {split}")
    check_same_data(builder, trained_on, workdir, remedy, trained_files)  # fingerprinted once fetched
    numbers, total = _pair_lines(builder, split, len(records))
    # Read as far as needed: which records are scored is known once each is encoded.
    rows = read_records(records)
    pairs = ((number, record_text(r, languages[0]), record_text(r, languages[1])) for number, r in zip(numbers, rows))
    return _first_scored(split, pairs, total, max_examples, tokenizers)


def _pair_lines(builder, split: str, prepared: int) -> tuple[list[int], int]:
    """(the line of each of the split's `prepared` pairs in its file(s), their line count): lines
    with an empty side were left out as the split was prepared; tfds' own builders know no file."""
    located = builder.file_lines(split) if hasattr(builder, "file_lines") else None
    if located is None:
        return list(range(1, prepared + 1)), prepared
    numbers, total = located
    if len(numbers) != prepared:  # the fingerprint says the files are the run's: their pairs are the split's
        raise DataError(f"{split}: its files hold {len(numbers)} pairs with text on both sides, the split {prepared}")
    return numbers, total


def _first_scored(
    name: str,
    pairs: Iterable[Pair],
    total: int,
    max_examples: int | None,
    tokenizers: tuple[Tokenizer, Tokenizer],
    place: Callable[[int, bool | None], str] = lambda number, source_side: f"line {number} of its files",
    first_empty: str | None = None,
) -> tuple[list[str], list[str], FileLines | None]:
    """(sources, references, where they are) of the first `max_examples` of `pairs` (of `total`
    lines) whose sides both encode to a piece. A side of zero-width spaces or control characters
    alone is empty to the model, as to translate, which gives such a source an empty output: it is
    left out as an empty line is, not scored as a sentence the model was given. `pairs` are read
    and encoded a chunk at a time, no further than the `max_examples`-th scored pair, as
    validation BLEU and the final choice count theirs (data/scored_pairs.py). The lines
    left out, both kinds, are said in one warning naming the first: `place(line, source side or
    None where not known)`, or `first_empty`, where the reader found the first empty line."""
    from jaxformer.data.scored_pairs import first_with_pieces

    pairs = iter(pairs)
    scored, no_piece = first_with_pieces(pairs, max_examples, tokenizers)  # {line: its source has no piece}
    count = len(scored) if max_examples is None else min(max_examples, len(scored))
    if count < len(scored) or (count and next(pairs, None) is not None):
        total = scored[count - 1][0]  # the lines read: up to the last pair scored
    numbers = [number for number, _, _ in scored[:count]]
    first = _first_left_out(numbers)
    first_place = place(first, no_piece[first]) if first in no_piece else first_empty or place(first, None)
    file_lines = _scored_lines(name, numbers, total, first_place)
    return [pair[1] for pair in scored[:count]], [pair[2] for pair in scored[:count]], file_lines


def _first_left_out(numbers: list[int]) -> int:
    """The first line missing from the ascending 1-based line `numbers`."""
    return next((index for index, number in enumerate(numbers, start=1) if number != index), len(numbers) + 1)


def _scored_lines(name: str, numbers: list[int], total: int, first_place: str) -> FileLines | None:
    """Where the pairs at lines `numbers` (of `total`) are, said in a warning (in the data reader's
    words, `first_place` naming the first line left out) when lines among them are not scored;
    None when every line is a pair."""
    if len(numbers) == total:
        return None
    if total > len(numbers):
        skipped = skipped_pairs_text(total - len(numbers), f"the first {total:,} lines of {name}", first_place)
        logger.warning("%s: --output writes them as empty lines", skipped)
    return FileLines(numbers, total)


def file_pairs(
    source: str, reference: str, max_examples: int | None, tokenizers: tuple[Tokenizer, Tokenizer]
) -> tuple[list[str], list[str], FileLines | None]:
    """(sources, references) of the first `max_examples` scored pairs of two line-aligned files, and
    where they are in them: a pair with an empty side is left out, as it is from a split. The
    reader's own warning is off: the one warning here counts the lines it left out too."""
    from jaxformer.data.parallel_text import SkipCounter, read_parallel_lines

    skipped = SkipCounter(report=False)
    pairs = list(read_parallel_lines(source, reference, skipped))
    return _first_scored(
        f"{source} / {reference}",
        pairs,
        len(pairs) + skipped.empty,
        max_examples,
        tokenizers,
        lambda number, source_side: f"{source if source_side is not False else reference}:{number}",
        skipped.first_empty,
    )


def bleu_tokenize(args: argparse.Namespace, run_config: dict) -> str:
    """The sacreBLEU tokenizer BLEU and lowercase BLEU are scored with: --bleu_tokenize, else the
    run's training.bleu_tokenize, else sacreBLEU's choice for the run's target language; a
    UserError in one line when it cannot be built here."""
    language = run_config["data"]["target_language"]
    tokenize = bleu_tokenizer(language, args.bleu_tokenize or run_config.get("training", {}).get("bleu_tokenize"))
    problem = bleu_tokenizer_problem(tokenize, language, "--bleu_tokenize")
    if problem:
        raise UserError(problem)
    return tokenize


def split_name(text: str) -> str:
    """--split: not empty, which would read as no --split given (or, beside --source, be ignored)."""
    if not text:
        raise argparse.ArgumentTypeError("must be a split's name, got an empty one")
    return text


def build_parser() -> argparse.ArgumentParser:
    parser = make_parser(__doc__)
    add_decoding_flags(parser)
    parser.add_argument(
        "--split",
        type=split_name,
        help="a split of the run's dataset, e.g. test_2016_flickr or validation (multi30k), test (parallel_files)",
    )
    parser.add_argument("--source", type=path_text, help="source file, one sentence per line (with --reference)")
    parser.add_argument("--reference", type=path_text, help="reference translations, line-aligned with --source")
    parser.add_argument("--max_examples", type=at_least(1), help="score only the first N pairs")
    parser.add_argument("--output", type=path_text, help="also write the translations here")
    parser.add_argument("--json", type=path_text, help="also write the scores here as JSON")
    parser.add_argument(
        "--bleu_tokenize",
        choices=BLEU_TOKENIZERS,
        help="sacreBLEU's tokenizer for BLEU and lowercase BLEU (default: the run's training.bleu_tokenize, "
        "else sacreBLEU's choice for its target language: zh, ja-mecab, ko-mecab, else 13a)",
    )
    add_overwrite_flag(parser, "--output or --json")
    return parser


def run(args: argparse.Namespace) -> int:
    if bool(args.split) == bool(args.source or args.reference) or bool(args.source) != bool(args.reference):
        raise FlagError("give either --split, or both --source and --reference")
    check_workdir(args.workdir)
    check_search_flags(args)
    check_readable_file(args.source, "--source")
    check_readable_file(args.reference, "--reference")
    inputs = {"--source": args.source, "--reference": args.reference}
    check_writable_file(args.output, "--output", args.overwrite, inputs)
    check_writable_file(args.json, "--json", args.overwrite, inputs)
    if args.output and args.json and one_file(args.output, args.json):  # the scores would replace the translations
        raise FlagError(f"--output {args.output} and --json {args.json} are the same file")
    if args.json is None:  # the scores are printed: with stdout closed they would be lost once decoded
        check_stdout_open("--json")
    from jaxformer.data.sources import check_known_split  # the data stack: after the flags are checked
    from jaxformer.decoding.translator import Translator

    # A language model's run, or a search the model cannot run: refused before any data is read.
    settled = {}  # final/'s search and the settings, settled from the one read of the checkpoint's metadata

    def check_model(metadata):  # from the one read of the checkpoint's metadata, before its parameters
        if args.split:  # a split the run's dataset has not, where that is known before it is prepared
            check_known_split(metadata.config["data"], args.split, f"--split {args.split}")
        model_config = Translator.check_workdir(args.workdir, args.checkpoint, metadata)  # a translator's, first
        settled["chosen"] = chosen = final_search(args, metadata=metadata)
        settled["settings"] = decode_settings_from_flags(args, args.max_extra_length, chosen)
        settled["settings"].check_fits(model_config)
        bleu_tokenize(args, metadata.config)  # a tokenizer missing its module: before any data is read

    # The checkpoint read whole, its parameters verified against their checksums, before the split is
    # prepared or the files read: a damaged one (an array file cut short or gone, its array index gone)
    # is found before that work, as a damaged final choice is, with its remedy; the translator takes it,
    # and the tokenizers that say what is empty to the model.
    loaded = load_checkpoint(args.workdir, args.checkpoint, before_params=check_model)
    tokenizers = loaded[1].load_tokenizers()
    if args.split:
        sources, references, file_lines = split_pairs(args.workdir, args.split, args.max_examples, tokenizers)
        name = args.split
    else:
        sources, references, file_lines = file_pairs(args.source, args.reference, args.max_examples, tokenizers)
        name = args.source
    if not sources:
        where = args.split or f"{args.source} and {args.reference}"
        raise DataError(f"{where}: no pair with text on both sides, nothing to score")
    translator = translator_from_flags(args, settled["settings"], settled["chosen"], loaded, tokenizers)
    start = time.perf_counter()
    line_numbers = None if file_lines is None else file_lines.numbers  # a long sentence's warning names its line
    hypotheses = translator.translate(sources, progress=not args.no_progress, line_numbers=line_numbers)
    seconds = time.perf_counter() - start
    scores = corpus_scores(hypotheses, references, bleu_tokenize(args, loaded[1].config))
    settings = translator.settings
    searched_with = {  # the settings that chose the outputs: the others would not describe them
        "beam": dict(
            beam_size=settings.beam_size,
            alpha=settings.alpha,
            length_penalty=settings.length_penalty,
            stop=settings.stop,
            renormalize_after_bans=settings.renormalize_after_bans,  # greedy search and sampling: the same tokens
        ),
        # One key per batch: a sampled sentence depends on the sentences decoded with it.
        "sample": dict(
            temperature=settings.temperature, top_k=settings.top_k, seed=args.seed, batch_size=args.batch_size
        ),
        "greedy": {},
    }[settings.method]
    scores.update(
        workdir=str(args.workdir),
        checkpoint=str(args.checkpoint),
        step=translator.step,
        data=name,
        # The references decide the scores: two files scored against other references must not read alike.
        **({"reference": str(args.reference)} if args.reference else {}),
        method=settings.method,
        max_extra_length=settings.max_extra_length,  # every method's outputs stop there
        **searched_with,
        decode_seconds=seconds,
    )
    if args.output:
        lines = hypotheses
        if file_lines is not None:  # one line per line of the user's file
            lines = [""] * file_lines.total
            for number, hypothesis in zip(file_lines.numbers, hypotheses):
                lines[number - 1] = hypothesis
        # A line break a translation holds (a byte-fallback tokenizer's <0x0A>) would add a line: as translate writes.
        write_text_atomically(args.output, sentence_batches.as_lines(lines))
    if args.json:
        write_text_atomically(args.json, json.dumps(scores, indent=2))
    # After the files: a failed write of stdout leaves them written.
    search = f"beam {settings.beam_size}, alpha {settings.alpha:g}" if settings.method == "beam" else settings.method
    summary = f"{name}: {len(sources)} sentences, step {translator.step} ({args.checkpoint}), {search}, {seconds:.1f}s"
    print_report([summary, *format_scores(scores).split("\n")])
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_command(build_parser(), run, argv, log_level=logging.INFO)
